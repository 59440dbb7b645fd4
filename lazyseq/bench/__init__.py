"""Benchmarks, one module per scenario: ``python -m lazyseq.bench {views,prefetch,...}``.

Each compares lazyseq with a peer measured in the same run and reports ratios, since absolute
times on shared machines say little.
"""
