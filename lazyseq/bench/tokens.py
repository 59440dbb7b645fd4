"""Language-model data: ``lazyseq.megatron`` against tinygrad's MLPerf loader
(``examples/mlperf/dataloader.py``), on the same inputs, results compared.

- (a) the GPT sample index (documents' order, sample boundaries, samples' order) for 1M documents
  (heavy-tailed lengths, ~1000 tokens on average) and 1M samples of 2048 tokens: ``gpt(...).index()``
  against the index steps of tinygrad's ``GPTDataset`` constructor (``_build_doc_idx``,
  ``_build_sample_idx``, ``_build_shuffle_idx``, run on the same sizes: its file loading and
  pickling are left out), in total and for the boundaries alone. Both shuffle with
  ``np.random.RandomState``, which identity requires and which bounds the total ratio (~16x).
- (b) the blend assignment of 1M samples over 3 datasets: ``assign`` against
  ``BlendedGPTDataset._build_blend_idx``.
- (c) tokens/s of blended samples (2 corpora, 2048 tokens) through ``DataLoader`` with 2 workers to
  tinygrad Tensors, against tinygrad's ``iterate_llama3_dataset`` loop (which reads in the training
  process and yields unrealised ``NPY`` Tensors); both timed from their first batch.
- (d) packing: the fill fraction (tokens / token slots) and rows/s of ``lazyseq.pack`` for each
  method (concat, first_fit, best_fit) against Grain's ``FirstFitPackIterDataset`` (8 and 64
  packing bins, ``shuffle_bins=False``) on the same sequences in the same order (heavy-tailed
  lengths, at most the row length), every row read; and tokens/s of packed rows of a Megatron
  corpus through ``DataLoader`` (2 workers, to tinygrad Tensors) against a plain loop over the rows
  (one process, numpy batches). Without grain installed, lazyseq's rows alone.

The tinygrad rows need a checkout of tinygrad (its wheel has no ``examples/``):
``python -m lazyseq.bench tokens --tinygrad /path/to/tinygrad``; without it, lazyseq's rows alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROUNDS = 3  # lazyseq's builds: the best of 3 (tinygrad's run once: they take seconds to minutes)
TARGETS = {
    "index_vs_tinygrad": ("(a) GPT index, whole: tinygrad s / lazyseq s", ">=", 10.0),
    "boundaries_vs_tinygrad": ("(a) sample boundaries alone: tinygrad s / lazyseq s", ">=", 30.0),
    "blend_seconds": ("(b) blend of 1M samples, 3 datasets: lazyseq s", "<=", 2.0),
    "best_fit_fill_vs_grain": ("(d) best_fit fill / Grain's best fill (8 or 64 bins)", ">=", 1.0),
}
PACK_METHODS = ("concat", "first_fit", "best_fit")
GRAIN_BINS = (8, 64)


def _tinygrad(root: str | None) -> Any:
    if root is None:
        return None
    path = Path(root).resolve() / "examples" / "mlperf" / "dataloader.py"
    if not path.exists():
        raise SystemExit(f"--tinygrad {root}: no examples/mlperf/dataloader.py there (give a checkout of tinygrad)")
    sys.path.insert(0, str(Path(root).resolve()))
    spec = importlib.util.spec_from_file_location("tinygrad_mlperf_dataloader", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


def _sizes(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(1 + (rng.pareto(1.5, n) * 500).astype(np.int64), 50_000).astype(np.int32)


def _index_files(root: str, sizes: np.ndarray) -> str:
    """A corpus with these sizes whose ``.bin`` is sparse (no tokens written: the index needs none)."""
    from lazyseq.megatron.idx import HEADER, MAGIC

    prefix = os.path.join(root, "sizes")
    pointers = np.zeros(len(sizes), "<i8")
    np.cumsum(sizes[:-1].astype(np.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(HEADER.pack(MAGIC, 1, 8, len(sizes), len(sizes) + 1))
        f.write(sizes.astype("<i4").data)
        f.write(pointers.data)
        f.write(np.arange(len(sizes) + 1, dtype="<i8").data)
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(sizes.sum(dtype=np.int64)) * 2)
    return prefix


def index_build(root: str, n_docs: int, n_samples: int, seq: int, tg: Any) -> dict:
    from lazyseq import megatron
    from lazyseq.megatron import samples

    prefix = _index_files(root, _sizes(n_docs))
    mine = mine_b = np.inf
    for _ in range(ROUNDS):  # the best round: a shared machine's noise hits short runs hardest
        v = megatron.gpt(prefix, n_samples, seq, seed=1234, cache=False)
        t = time.perf_counter()
        doc_idx, sample_idx, shuffle_idx = v.index()
        mine = min(mine, time.perf_counter() - t)
        t = time.perf_counter()  # the documents' lengths in order, then the boundaries, as tinygrad's loop does
        samples.boundaries(v.docs.sizes[doc_idx].astype(np.int64), n_samples, seq)
        mine_b = min(mine_b, time.perf_counter() - t)
    out = {"docs": n_docs, "samples": n_samples, "seq_length": seq, "epochs": len(doc_idx) // n_docs,
           "lazyseq_s": mine, "lazyseq_boundaries_s": mine_b}
    if tg is not None:
        g = object.__new__(tg.GPTDataset)  # the constructor's index steps, on the same sizes
        g.samples, g.seqlen, g.shuffle, g.rng = n_samples, seq, True, np.random.RandomState(1234)
        g.indexed_dataset = SimpleNamespace(sizes=v.docs.sizes.copy(), count=n_docs)
        t = time.perf_counter()
        g.doc_idx = _quiet(g._build_doc_idx)
        t1 = time.perf_counter()
        g.sample_idx = _quiet(g._build_sample_idx)
        t2 = time.perf_counter()
        g.shuffle_idx = _quiet(g._build_shuffle_idx)
        t3 = time.perf_counter()
        same = all(np.array_equal(a, b) for a, b in
                   ((doc_idx, g.doc_idx), (sample_idx, g.sample_idx), (shuffle_idx, g.shuffle_idx)))
        if not same:
            raise AssertionError("lazyseq's GPT index differs from tinygrad's")
        out |= {"tinygrad_s": t3 - t, "tinygrad_boundaries_s": t2 - t1, "identical": same}
    return out


def blend_build(n: int, tg: Any) -> dict:
    from lazyseq.megatron.blending import assign, weights_and_counts

    w, _ = weights_and_counts([0.5, 0.3, 0.2], n)
    best = np.inf
    for _ in range(ROUNDS):
        t = time.perf_counter()
        a, b = assign(w, n)
        best = min(best, time.perf_counter() - t)
    out = {"samples": n, "lazyseq_s": best}
    if tg is not None:
        g = object.__new__(tg.BlendedGPTDataset)
        g.weights, g.samples, g.datasets = w, n, [None] * 3
        t = time.perf_counter()
        ta, tb = _quiet(g._build_blend_idx)
        out["tinygrad_s"] = time.perf_counter() - t
        out["identical"] = bool(np.array_equal(a, ta) and np.array_equal(b, tb))
        if not out["identical"]:
            raise AssertionError("lazyseq's blend assignment differs from tinygrad's")
    return out


def throughput(root: str, n_docs: int, n_samples: int, seq: int, batch: int, tg: Any) -> dict:
    import lazyseq
    from lazyseq import megatron

    rng = np.random.default_rng(5)
    prefixes = [os.path.join(root, f"corpus{k}") for k in range(2)]
    for k, p in enumerate(prefixes):
        megatron.write(p, (rng.integers(0, 32000, int(s), dtype=np.uint16) for s in _sizes(n_docs, k)))
    b = megatron.blend(prefixes, [1.0, 1.0], n_samples, seq, seed=0, cache=False)
    b[0]  # the index, built once (as on a real run, where it is cached)
    out = {"samples": n_samples, "seq_length": seq, "batch": batch}
    for key, to_tensor in (("lazyseq", True), ("lazyseq_numpy", False)):
        loader = lazyseq.DataLoader(b, batch_size=batch, shuffle=False, num_workers=2, to_tensor=to_tensor)
        with loader:  # timed from the first batch: the workers' start is reported apart
            t0 = time.perf_counter()
            it = iter(loader)
            next(it)
            t, tokens = time.perf_counter(), 0
            for x in it:
                tokens += int(np.prod(x.shape))
            out[f"{key}_tokens_s"] = tokens / (time.perf_counter() - t)
            out[f"{key}_first_batch_s"] = t - t0
    if tg is not None:
        g = _quiet(tg.BlendedGPTDataset, [Path(p) for p in prefixes], [1.0, 1.0], n_samples, seq, 0, True)
        it = tg.iterate_llama3_dataset(g, batch)
        next(it)
        t, tokens = time.perf_counter(), 0
        for x in it:
            tokens += int(np.prod(x.shape))
        out["tinygrad_tokens_s"] = tokens / (time.perf_counter() - t)
    return out


def _grain() -> Any:
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # absl's warning about jax's profiler
            import grain
    except ImportError:
        return None
    return grain


def _rows_per_s(rows) -> tuple[int, float]:
    t, n = time.perf_counter(), 0
    for _ in rows:
        n += 1
    return n, n / (time.perf_counter() - t)


def packing(root: str, n_seqs: int, length: int, batch: int) -> dict:
    """(d): fill and rows/s of each method against Grain, then packed rows through DataLoader."""
    import lazyseq
    from lazyseq import megatron

    rng = np.random.default_rng(7)
    lengths = np.minimum(_sizes(n_seqs, 7), length)  # whole sequences: Grain's packing truncates longer ones
    seqs = [rng.integers(0, 32000, int(n), dtype=np.uint16) for n in lengths]
    tokens = int(lengths.sum())
    out: dict = {"sequences": n_seqs, "tokens": tokens, "length": length, "batch": batch,
                 "fill": {}, "rows": {}, "rows_per_s": {}, "grain_bins": list(GRAIN_BINS)}
    for method in PACK_METHODS:
        rows = lazyseq.pack(seqs, length, method=method)
        t = time.perf_counter()
        out["fill"][method] = rows.fill()  # the plan, from the lengths alone
        out.setdefault("plan_s", {})[method] = time.perf_counter() - t
        n, out["rows_per_s"][method] = _rows_per_s(rows[i] for i in range(len(rows)))
        out["rows"][method] = n
    grain = _grain()
    out["grain_installed"] = grain is not None
    if grain is None:
        print("(grain is not installed: lazyseq's packing rows only; pip install grain==0.2.18)")
    else:
        for bins in GRAIN_BINS:
            ds = grain.MapDataset.source([{"tokens": s} for s in seqs]).to_iter_dataset()
            packed = grain.experimental.FirstFitPackIterDataset(ds, length_struct={"tokens": length},
                                                                num_packing_bins=bins, shuffle_bins=False)
            key = f"grain first_fit, {bins} bins"
            n, out["rows_per_s"][key] = _rows_per_s(packed)
            out["rows"][key], out["fill"][key] = n, tokens / (n * length)
    # packed rows of a Megatron corpus through DataLoader (2 workers, tinygrad Tensors) and a plain loop
    prefix = os.path.join(root, "packed")
    megatron.write(prefix, seqs)
    rows = lazyseq.pack(megatron.indexed(prefix), length)
    len(rows)  # the plan, built once (workers receive it)
    t, got = time.perf_counter(), 0
    for b in range(0, len(rows) - batch + 1, batch):  # the plain loop: one process, numpy batches
        items = [rows[i] for i in range(b, b + batch)]
        x = {k: np.stack([r[k] for r in items]) for k in items[0]}
        got += x["tokens"].size
    out["plain_loop_tokens_s"] = got / (time.perf_counter() - t)
    for key, to_tensor in (("lazyseq", True), ("lazyseq_numpy", False)):
        loader = lazyseq.DataLoader(rows, batch_size=batch, shuffle=False, drop_last=True, num_workers=2,
                                    to_tensor=to_tensor)
        with loader:  # timed from the first batch, as in (c)
            t0 = time.perf_counter()
            it = iter(loader)
            next(it)
            t, got = time.perf_counter(), 0
            for x in it:
                got += int(np.prod(x["tokens"].shape))
            out[f"{key}_tokens_s"] = got / (time.perf_counter() - t)
            out[f"{key}_first_batch_s"] = t - t0
    return out


def run(quick: bool = False, tinygrad: str | None = None) -> dict:
    """Run (a), (b) and (c), print them and the targets; returns the results."""
    from lazyseq.bench.store import header

    tg = _tinygrad(tinygrad)
    if tg is None:
        print("(no --tinygrad checkout: lazyseq's rows only)")
    cores, load = header()
    root = tempfile.mkdtemp(prefix="lazyseq-bench-tokens-")
    try:
        a = index_build(root, *((20_000, 20_000, 2048) if quick else (1_000_000, 1_000_000, 2048)), tg)
        b = blend_build(20_000 if quick else 1_000_000, tg)
        c = throughput(root, *((500, 64, 512, 8) if quick else (20_000, 8192, 2048, 16)), tg)
        d = packing(root, *((1000, 2048, 8) if quick else (20_000, 2048, 16)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print(a, b, c)
    _print_packing(d)
    grain_fill = max((d["fill"].get(f"grain first_fit, {k} bins", np.nan) for k in GRAIN_BINS), default=np.nan)
    values = {"index_vs_tinygrad": a.get("tinygrad_s", np.nan) / a["lazyseq_s"],
              "boundaries_vs_tinygrad": a.get("tinygrad_boundaries_s", np.nan) / a["lazyseq_boundaries_s"],
              "blend_seconds": b["lazyseq_s"], "best_fit_fill_vs_grain": d["fill"]["best_fit"] / grain_fill}
    print("\ntargets" + (" (quick: small inputs, not the targets' sizes)" if quick else ""))
    for key, (what, op, bound) in TARGETS.items():
        v = values[key]
        peer = "grain" if key.endswith("grain") else "tinygrad"
        ok = f"n/a (no {peer})" if np.isnan(v) else ("met" if (v >= bound if op == ">=" else v <= bound) else "MISSED")
        print(f"  {what} {op} {bound}: {v:.2f}  {ok}")
    values = {k: (None if np.isnan(v) else float(v)) for k, v in values.items()}  # JSON has no NaN
    return {"cores": cores, "load": load, "index": a, "blend": b, "throughput": c, "packing": d, "targets": values}


def _print_packing(d: dict) -> None:
    print(f"\n(d) packing {d['sequences']} sequences ({d['tokens']} tokens, heavy-tailed lengths <= {d['length']}) "
          f"into rows of {d['length']}, every row read; Grain: FirstFitPackIterDataset, num_packing_bins "
          + " and ".join(map(str, d["grain_bins"])) + ", shuffle_bins=False"
          + ("" if d["grain_installed"] else " (not installed)"))
    print(f"{'':30s}{'rows':>8s}{'fill':>8s}{'rows/s':>10s}")
    for key, fill in d["fill"].items():
        print(f"{key:30s}{d['rows'][key]:8d}{fill:8.4f}{d['rows_per_s'][key]:10.0f}")
    print(f"packed best_fit rows of a Megatron corpus in batches of {d['batch']}: DataLoader, 2 workers, to tinygrad "
          f"Tensors {d['lazyseq_tokens_s'] / 1e6:.1f} M tokens/s (first batch after {d['lazyseq_first_batch_s']:.2f} s), "
          f"to numpy {d['lazyseq_numpy_tokens_s'] / 1e6:.1f} M tokens/s; "
          f"plain loop (one process, numpy) {d['plain_loop_tokens_s'] / 1e6:.1f} M tokens/s "
          f"({d['lazyseq_tokens_s'] / d['plain_loop_tokens_s']:.1f}x)")


def _print(a: dict, b: dict, c: dict) -> None:
    print(f"\n(a) GPT index: {a['docs']} documents, {a['samples']} samples of {a['seq_length']} tokens, "
          f"{a['epochs']} epochs")
    print(f"{'':28s}{'lazyseq s':>11s}{'tinygrad s':>12s}{'ratio':>8s}")
    for what, key in (("whole index", ""), ("sample boundaries alone", "_boundaries")):
        mine, theirs = a[f"lazyseq{key}_s"], a.get(f"tinygrad{key}_s")
        print(f"{what:28s}{mine:11.3f}" + (f"{theirs:12.3f}{theirs / mine:7.1f}x" if theirs else f"{'-':>12s}"))
    if "identical" in a:
        print("identical doc_idx, sample_idx and shuffle_idx: yes")
    print(f"\n(b) blend assignment, {b['samples']} samples of 3 datasets: lazyseq {b['lazyseq_s']:.3f} s"
          + (f", tinygrad {b['tinygrad_s']:.3f} s ({b['tinygrad_s'] / b['lazyseq_s']:.1f}x), identical"
             if "tinygrad_s" in b else ""))
    print(f"\n(c) {c['samples']} blended samples of {c['seq_length']} tokens in batches of {c['batch']}: "
          f"DataLoader, 2 workers, to tinygrad Tensors {c['lazyseq_tokens_s'] / 1e6:.1f} M tokens/s "
          f"(first batch after {c['lazyseq_first_batch_s']:.2f} s: workers' start), "
          f"to numpy (to_tensor=False) {c['lazyseq_numpy_tokens_s'] / 1e6:.1f} M tokens/s"
          + (f"; tinygrad's iterate_llama3_dataset {c['tinygrad_tokens_s'] / 1e6:.1f} M tokens/s"
             f" ({c['lazyseq_tokens_s'] / c['tinygrad_tokens_s']:.1f}x)" if "tinygrad_tokens_s" in c else ""))
