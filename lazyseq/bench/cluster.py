"""Ray: ``prefetch(method='ray')`` against the process backend (the price of Ray on one node) and
against Ray Data doing the same map, on a local Ray instance with as many CPUs as workers.

- (a) items that cost ~1 ms of CPU each (a calibrated pure-Python loop) returning a small int:
  items/s over one pass in order, start-up included (actors, worker processes, Ray Data's
  executor), and the overhead per item: ``wall * workers / n - cost of an item``.
- (b) 4 MiB float32 arrays (``np.full``, almost free to compute): GB/s over one pass in order.

Ray Data: ``ray.data.range(n).map_batches(f, batch_format='numpy')`` read in order
(``preserve_order``) with ``iter_batches``; ``map_batches`` is Ray Data's fast path (a row map
costs more). For (b), Ray Data runs as a user of large items runs it: blocks and batches of
``BIG_BATCH`` items (32 MiB). With its defaults, ``range(200)`` is read as one block and
``map_batches`` gets every item in one 800 MB batch, past the object store given to both (256 MiB):
it spills to disk and runs at ~0.09 GB/s, a figure no user would accept, so it is no fair peer.
The process backend runs with shared memory sized for the 4 MiB items. Ray is an optional
dependency (``pip install 'lazyseq[ray]'``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import lazyseq
from lazyseq.bench.prefetch import Burn, calibrate

NWORKERS = 2
BIG = 4 << 20  # bytes per item in (b)
BIG_BATCH = 8  # Ray Data's blocks and batches in (b): 32 MiB (the default, one block of every item, spills)


class Work:
    """Item ``i`` for (a): ~1 ms of CPU, a small int."""

    def __init__(self, burn: Burn):
        self.burn = burn

    def __call__(self, i: int) -> int:
        return self.burn(i) & 0xFF

    def batch(self, batch: dict) -> dict:  # Ray Data's map_batches
        return {"v": np.array([self.burn(int(i)) & 0xFF for i in batch["id"]])}


def big(i: int) -> np.ndarray:
    return np.full(BIG // 4, i, dtype=np.float32)


def big_batch(batch: dict) -> dict:
    return {"x": np.stack([big(int(i)) for i in batch["id"]])}


def lazyseq_pass(seq: Any, n: int, method: str, **kw: Any) -> float:
    t = time.perf_counter()
    with lazyseq.prefetch(seq, NWORKERS, method=method, **kw) as p:
        for i in range(n):
            x = p[i]
            del x
    return time.perf_counter() - t


def ray_data_pass(fn: Any, n: int, key: str, batch: int | None = None) -> float:
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    t = time.perf_counter()
    if batch is None:
        ds = ray.data.range(n).map_batches(fn, batch_format="numpy", concurrency=NWORKERS)
    else:  # blocks and batches of `batch` items, what a user of large items sets (see the module's docstring)
        ds = ray.data.range(n, override_num_blocks=max(1, n // batch)).map_batches(
            fn, batch_format="numpy", batch_size=batch, concurrency=NWORKERS)
    count = 0
    for b in ds.iter_batches(batch_size=batch or 256, batch_format="numpy"):
        count += len(b[key])
    assert count == n, count
    return time.perf_counter() - t


def measure(n_small: int, n_big: int, rounds: int) -> dict:
    burn = calibrate()
    work = Work(burn)
    item_s = sorted(timed_item(work, i) for i in range(21))[10]
    small = lazyseq.smap(work, range(n_small))
    bigs = lazyseq.smap(big, range(n_big))
    shm = 2 * BIG * 10
    runs: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    for _ in range(rounds):  # alternate, so that the noise of a shared machine hits them alike
        for name, f in (("lazyseq ray", lambda: lazyseq_pass(small, n_small, "ray")),
                        ("lazyseq process", lambda: lazyseq_pass(small, n_small, "process")),
                        ("Ray Data", lambda: ray_data_pass(work.batch, n_small, "v"))):
            runs["a"].setdefault(name, []).append(f())
        for name, f in (("lazyseq ray", lambda: lazyseq_pass(bigs, n_big, "ray")),
                        ("lazyseq process", lambda: lazyseq_pass(bigs, n_big, "process", shm_size=shm)),
                        ("Ray Data", lambda: ray_data_pass(big_batch, n_big, "x", BIG_BATCH))):
            runs["b"].setdefault(name, []).append(f())
    best = {part: {k: min(v) for k, v in r.items()} for part, r in runs.items()}
    return {"item_s": item_s, "loop_turns": burn.n, "seconds": best}


def timed_item(f: Any, i: int) -> float:
    t = time.perf_counter()
    f(i)
    return time.perf_counter() - t


def report(m: dict, n_small: int, n_big: int, rounds: int) -> dict:
    a, b, item_s = m["seconds"]["a"], m["seconds"]["b"], m["item_s"]
    print(f"\n(a) {n_small} items of ~{item_s * 1e3:.2f} ms CPU each, {NWORKERS} workers, one pass in order "
          f"(start-up included); best of {rounds}")
    print(f"{'':18s}{'s':>8s}{'items/s':>10s}{'overhead us/item':>18s}")
    overhead = {k: (s * NWORKERS / n_small - item_s) * 1e6 for k, s in a.items()}
    for k, s in a.items():
        print(f"{k:18s}{s:8.2f}{n_small / s:10.0f}{overhead[k]:18.0f}")
    gbs = {k: n_big * BIG / s / 1e9 for k, s in b.items()}
    print(f"\n(b) {n_big} items of {BIG >> 20} MiB (float32 arrays), {NWORKERS} workers, one pass in order; best of {rounds}")
    print(f"{'':18s}{'s':>8s}{'GB/s':>8s}")
    for k, s in b.items():
        print(f"{k:18s}{s:8.2f}{gbs[k]:8.2f}")
    ratios = {
        "a_ray_vs_process": a["lazyseq process"] / a["lazyseq ray"],
        "a_ray_vs_ray_data": a["Ray Data"] / a["lazyseq ray"],
        "b_ray_vs_process": b["lazyseq process"] / b["lazyseq ray"],
        "b_ray_vs_ray_data": b["Ray Data"] / b["lazyseq ray"],
    }
    print("\nspeed ratios (> 1: lazyseq on Ray faster)")
    for k, v in ratios.items():
        print(f"  {k:22s}{v:6.2f}")
    met = ratios["a_ray_vs_ray_data"] >= 1 and ratios["b_ray_vs_ray_data"] >= 1
    print(f"target (issue #10): lazyseq on Ray at least as fast as Ray Data on both: {'met' if met else 'MISSED'}")
    return {"items_per_s": {k: n_small / s for k, s in a.items()}, "overhead_us_per_item": overhead,
            "gb_per_s": gbs, "ratios": ratios, "target_met": met}


def run(quick: bool = False) -> dict:
    try:
        import ray
    except ImportError:
        print("Ray is not installed: pip install 'lazyseq[ray]'")
        return {"scenario": "ray", "quick": quick, "skipped": "ray not installed"}
    n_small, n_big, rounds = (300, 12, 1) if quick else (4000, 200, 2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"{cores} cores, load average {load:.2f} before the run; Ray {ray.__version__}" if load is not None else "")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=NWORKERS, include_dashboard=False, log_to_driver=False,
                 object_store_memory=max(256 << 20, 3 * 10 * BIG * NWORKERS))
    try:
        m = measure(n_small, n_big, rounds)
    finally:
        if started:
            ray.shutdown()
    res = report(m, n_small, n_big, rounds)
    return {"scenario": "ray", "quick": quick, "cores": cores, "load_average": load, "ray": ray.__version__,
            "nworkers": NWORKERS, "item_ms": m["item_s"] * 1e3, "seconds": m["seconds"], **res}
