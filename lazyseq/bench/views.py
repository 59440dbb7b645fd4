"""View overhead: a random read through a 5-view pipeline (smap, gather, batch, smap, slice),
against the same calls written by hand in one function, and against seqtools."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import lazyseq


def _pipeline(lib: Any, data: list, idx: list, k: int, f1: Callable, f2: Callable):
    return lib.smap(f2, lib.batch(lib.gather(lib.smap(f1, data), idx), k))[10 : len(data) // k - 10 : 3]


def _time(read: Callable[[int], Any], keys: list[int], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for k in keys:
            read(k)
        best = min(best, time.perf_counter() - t)
    return best / len(keys)


def run(quick: bool = False) -> dict:
    n, k = 100_000, 4
    data = list(range(n))
    idx = np.random.default_rng(0).permutation(n).tolist()
    f1, f2 = (lambda x: x + 1), len

    def hand(i: int) -> int:
        b = 10 + 3 * i
        return f2([f1(data[idx[j]]) for j in range(b * k, min(b * k + k, n))])

    peers: dict[str, Callable[[int], Any]] = {"hand-written": hand}
    peers["lazyseq"] = _pipeline(lazyseq, data, idx, k, f1, f2).__getitem__
    try:
        import seqtools

        peers["seqtools"] = _pipeline(seqtools, data, idx, k, f1, f2).__getitem__
    except ImportError:
        print("(seqtools is not installed: pip install 'lazyseq[bench]' to compare with it)")
    m = len(_pipeline(lazyseq, data, idx, k, f1, f2))
    rng = random.Random(0)
    keys = [rng.randrange(m) for _ in range(5_000 if quick else 50_000)]
    for name, read in peers.items():  # same answers before timing anything
        assert [read(i) for i in keys[:200]] == [hand(i) for i in keys[:200]], name
    times = {name: [] for name in peers}
    for _ in range(2 if quick else 5):  # alternate the peers round by round
        for name, read in peers.items():
            times[name].append(_time(read, keys, 1))
    best = {name: min(ts) for name, ts in times.items()}
    base = best["hand-written"]
    print("random read through smap -> gather -> batch(4) -> smap -> slice")
    print(f"{'':14s}{'us/read':>10s}{'x hand':>9s}")
    for name, t in best.items():
        print(f"{name:14s}{t * 1e6:10.2f}{t / base:9.2f}")
    return {"scenario": "views", "us_per_read": {k: v * 1e6 for k, v in best.items()},
            "ratio_to_hand": {k: v / base for k, v in best.items()}}
