"""prefetch over 2 worker processes, side by side with seqtools 1.4.1 and PyTorch's DataLoader.

Four scenarios, every loader with 2 workers, the loaders alternating round by round so that the
noise of a shared machine hits them alike (throughput: the best round; start-up: the median):

- ``large``: 4 MiB float32 items (``np.full((1024, 1024), i)``), the reader sums each: GB/s.
  lazyseq twice (the item made by numpy and copied into the slot; the item written straight into
  ``lazyseq.empty``), seqtools without and with ``shm_size``, torch's DataLoader.
- ``tiny``: small ints read in order: microseconds per item.
- ``compute``: items costing ~1 ms of CPU each (a pure-Python loop calibrated at start): items/s,
  and the ratio to the same loop run in the reader.
- ``startup``: construction to the first item, fork start method: milliseconds.

Throughput is timed from the second item to the last (the first item pays the start-up, measured
on its own). The CPU columns add up the CPU time of the reader and of its workers (from /proc) per
item: other work on the machine disturbs them less than the wall clock. seqtools and torch are
optional (``pip install 'lazyseq[bench]'``): a missing peer is skipped with a message.
"""

from __future__ import annotations

import gc
import importlib.util
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None

import numpy as np

import lazyseq

NWORKERS = 2
SHAPE = (1024, 1024)
ITEM_BYTES = SHAPE[0] * SHAPE[1] * 4
MAX_BUFFERED = 10
SHM_SIZE = MAX_BUFFERED * (ITEM_BYTES + ITEM_BYTES // 8)  # one 4.5 MiB slot per buffered item

TARGETS = {  # key: (what, comparison, threshold)
    "large_copy_vs_seqtools_shm": ("large, copied: lazyseq / seqtools-with-shm GB/s", ">=", 1.2),
    "large_copy_vs_torch": ("large, copied: lazyseq / torch DataLoader GB/s", ">=", 3.0),
    "large_empty_vs_seqtools_shm": ("large, lazyseq.empty: lazyseq / seqtools-with-shm GB/s", ">=", 1.8),
    "tiny_us_per_item": ("tiny items: lazyseq us per item", "<", 2.0),
    "compute_vs_plain_loop": ("~1 ms items: lazyseq / plain loop items/s", ">=", 1.6),
    "startup_ms": ("first item with fork, 2 workers: lazyseq ms", "<", 30.0),
}


# -- item functions: module level, so that torch's workers (and spawn) can pickle them ---------------
def full_numpy(i: int) -> np.ndarray:
    return np.full(SHAPE, i, np.float32)


def full_empty(i: int) -> np.ndarray:
    out = lazyseq.empty(SHAPE, np.float32)
    out.fill(i)
    return out


def identity(i: int) -> int:
    return i


class Burn:
    """An item that costs ``n`` turns of a pure-Python loop (calibrated to ~1 ms)."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, i: int) -> int:
        s = i
        for k in range(self.n):
            s ^= k
        return s


def timed(f: Callable[[int], Any], i: int) -> float:
    t = time.perf_counter()
    f(i)
    return time.perf_counter() - t


def calibrate(seconds: float = 1e-3) -> Burn:
    """A Burn of about ``seconds`` on this machine (the fastest of a few tries: the least disturbed)."""
    probe = Burn(20_000)
    best = min(timed(probe, 0) for _ in range(7))
    return Burn(max(1, round(probe.n * seconds / best)))


class MapDataset:
    """A map-style dataset for torch's DataLoader (len + getitem, no torch import needed)."""

    def __init__(self, f: Callable[[int], Any], n: int):
        self.f, self.n = f, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.f(i)


# -- loaders: open -> (iterator, close) ------------------------------------------------------------
Opener = Callable[[], tuple[Iterator, Callable[[], dict]]]


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def open_lazyseq(f: Callable, n: int, shm_size: int = 0, context: str | None = None) -> Opener:
    def open_() -> tuple[Iterator, Callable[[], dict]]:
        p = lazyseq.prefetch(lazyseq.smap(f, range(n)), nworkers=NWORKERS, method="process",
                             max_buffered=MAX_BUFFERED, shm_size=shm_size, mp_context=context)

        def close() -> dict:
            stats = p.stats()
            p.close()
            return stats

        return iter(p), close

    return open_


def open_seqtools(f: Callable, n: int, shm_size: int = 0) -> Opener:
    def open_() -> tuple[Iterator, Callable[[], dict]]:
        import seqtools

        box = [seqtools.prefetch(seqtools.smap(f, range(n)), nworkers=NWORKERS, method="process",
                                 max_buffered=MAX_BUFFERED, shm_size=shm_size)]

        def close() -> dict:  # its workers stop when the prefetch object is collected
            box.clear()
            gc.collect()
            return {}

        return iter(box[0]), close

    return open_


def open_torch(f: Callable, n: int, context: str | None = None) -> Opener:
    def open_() -> tuple[Iterator, Callable[[], dict]]:
        from torch.utils.data import DataLoader

        dl = DataLoader(MapDataset(f, n), batch_size=None, num_workers=NWORKERS, multiprocessing_context=context)
        box = [iter(dl)]

        def close() -> dict:
            it = box.pop()
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
            gc.collect()
            return {}

        return box[0], close

    return open_


def open_plain(f: Callable, n: int) -> Opener:
    def open_() -> tuple[Iterator, Callable[[], dict]]:
        return map(f, range(n)), dict

    return open_


def cpu_seconds() -> float:
    """CPU seconds used so far by this process (all its threads) and its child processes: those
    already reaped (getrusage) and the live ones (from /proc, so on Linux only)."""
    live = multiprocessing.active_children()  # reaps the finished ones first
    total = time.process_time()
    if resource is not None:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += ru.ru_utime + ru.ru_stime
    for child in live:
        try:
            with open(f"/proc/{child.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


STEADY_FROM = 50  # items after which a loader counts as warmed up (its slots faulted in, its chunks grown)


def read_all(opener: Opener, consume: Callable[[int, Any], None]) -> tuple[float, int, float, dict, float | None]:
    """Open a loader, read its first item, then time reading the rest; close it. Returns the
    seconds, the number of items timed, the CPU seconds the reader and the workers spent meanwhile,
    what close() reports (lazyseq's stats), and the seconds from item STEADY_FROM on (None if fewer)."""
    it, close = opener()
    stats: dict = {}
    steady_start = None
    try:
        x = next(it)
        consume(0, x)
        del x
        count = 0
        cpu = cpu_seconds()
        t = time.perf_counter()
        for count, x in enumerate(it, 1):
            consume(count, x)
            if count == STEADY_FROM:
                steady_start = time.perf_counter()
        end = time.perf_counter()
        seconds = end - t
        cpu = cpu_seconds() - cpu
        x = None
    finally:
        it = None
        stats = close()
    return seconds, count, cpu, stats, None if steady_start is None else end - steady_start


def first_item(opener: Opener) -> float:
    t = time.perf_counter()
    it, close = opener()
    x = next(it)
    seconds = time.perf_counter() - t
    assert x == 0, x
    x = it = None
    close()
    return seconds


def check_sum(total: Callable[[Any], float]) -> Callable[[int, Any], None]:
    expected = float(SHAPE[0] * SHAPE[1])

    def consume(i: int, x: Any) -> None:
        s = total(x)
        if i % 97 == 0 and abs(s - i * expected) > 1e-6 * i * expected:
            raise AssertionError(f"item {i}: sum {s}, expected {i * expected}")

    return consume


def np_sum(x: np.ndarray) -> float:
    return float(x.sum())


def torch_sum(x: Any) -> float:
    return x.sum().item()


def ignore(i: int, x: Any) -> None:
    pass


def no_children(where: str) -> None:
    left = multiprocessing.active_children()
    if left:
        raise RuntimeError(f"bench prefetch: {where} left child processes running: {left}")


# -- the scenarios -----------------------------------------------------------------------------------
class Runs:
    """A loader's rounds: items/s of the best round, CPU per item (reader + workers, median)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.steady: list[float | None] = []  # seconds from item STEADY_FROM on
        self.items: list[int] = []
        self.cpu: list[float] = []
        self.stats: dict = {}

    def rate(self) -> float:
        return max(n / s for n, s in zip(self.items, self.seconds))

    def steady_rate(self) -> float | None:
        rates = [(n - STEADY_FROM) / s for n, s in zip(self.items, self.steady) if s]
        return max(rates) if rates else None

    def cpu_per_item(self) -> float:
        return statistics.median(c / n for c, n in zip(self.cpu, self.items))

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "items_timed": self.items, "cpu_seconds": self.cpu,
                "steady_seconds": self.steady}


def alternate(loaders: dict[str, tuple[Opener, Callable]], rounds: int) -> dict[str, Runs]:
    """Every loader once per round, in turn."""
    runs = {name: Runs() for name in loaders}
    for _ in range(rounds):
        for name, (opener, consume) in loaders.items():
            seconds, count, cpu, stats, steady = read_all(opener, consume)
            r = runs[name]
            r.seconds.append(seconds)
            r.steady.append(steady)
            r.items.append(count)
            r.cpu.append(cpu)
            r.stats = stats
            no_children(name)
    return runs


def details(runs: dict[str, Runs]) -> dict:
    return {"rounds": {k: r.as_dict() for k, r in runs.items()},
            "lazyseq_stats": {k: r.stats for k, r in runs.items() if r.stats}}


def large(quick: bool, peers: set[str], rounds: int | None = None) -> dict:
    n, rounds = (60, 1) if quick else (400, rounds or 8)  # short rounds: more of them
    loaders: dict[str, tuple[Opener, Callable]] = {
        "lazyseq copy": (open_lazyseq(full_numpy, n, SHM_SIZE), check_sum(np_sum)),
        "lazyseq empty": (open_lazyseq(full_empty, n, SHM_SIZE), check_sum(np_sum)),
    }
    if "seqtools" in peers:
        loaders["seqtools"] = (open_seqtools(full_numpy, n), check_sum(np_sum))
        loaders["seqtools shm"] = (open_seqtools(full_numpy, n, SHM_SIZE), check_sum(np_sum))
    if "torch" in peers:
        loaders["torch"] = (open_torch(full_numpy, n), check_sum(torch_sum))
    runs = alternate(loaders, rounds)
    gbps = {name: r.rate() * ITEM_BYTES / 1e9 for name, r in runs.items()}
    steady = {name: (r.steady_rate() or 0.0) * ITEM_BYTES / 1e9 for name, r in runs.items()}
    cpu_ms = {name: r.cpu_per_item() * 1e3 for name, r in runs.items()}
    copy, empty = gbps["lazyseq copy"], gbps["lazyseq empty"]
    print(f"\n(a) {n} items of 4 MiB float32, the reader sums each; {NWORKERS} workers, max_buffered="
          f"{MAX_BUFFERED}, shm_size={SHM_SIZE / 2**20:.0f} MiB; best of {rounds}")
    print(f"{'':16s}{'GB/s':>8s}{'copy x':>9s}{'empty x':>9s}{'steady GB/s':>13s}{'CPU ms/item':>13s}")
    for name, v in gbps.items():
        print(f"{name:16s}{v:8.2f}{copy / v:9.2f}{empty / v:9.2f}{steady[name]:13.2f}{cpu_ms[name]:13.2f}")
    print("copy x / empty x: lazyseq's GB/s (item copied into the slot / written into lazyseq.empty) over the\n"
          f"row's; steady: from item {STEADY_FROM} on (slots faulted in); CPU: reader + workers per item (median round)")
    return {"items": n, "gb_per_s": gbps, "steady_gb_per_s": steady, "cpu_ms_per_item": cpu_ms,
            "ratio_copy": {k: copy / v for k, v in gbps.items()},
            "ratio_empty": {k: empty / v for k, v in gbps.items()}, **details(runs)}


def tiny(quick: bool, peers: set[str], rounds: int | None = None) -> dict:
    n, n_peer, rounds = (10_000, 1_000, 1) if quick else (100_000, 10_000, rounds or 3)
    loaders: dict[str, tuple[Opener, Callable]] = {"lazyseq": (open_lazyseq(identity, n), ignore)}
    if "seqtools" in peers:
        loaders["seqtools"] = (open_seqtools(identity, n_peer), ignore)
    if "torch" in peers:
        loaders["torch"] = (open_torch(identity, n_peer), ignore)
    runs = alternate(loaders, rounds)
    us = {name: 1e6 / r.rate() for name, r in runs.items()}
    cpu_us = {name: r.cpu_per_item() * 1e6 for name, r in runs.items()}
    counts = {name: r.items[0] + 1 for name, r in runs.items()}
    print(f"\n(b) tiny items (ints) read in order: lazyseq {n} items, seqtools and torch {n_peer} (they are "
          f"slow); best of {rounds}")
    print(f"{'':16s}{'items':>8s}{'us/item':>10s}{'x lazyseq':>11s}{'CPU us/item':>13s}")
    for name, v in us.items():
        print(f"{name:16s}{counts[name]:8d}{v:10.2f}{v / us['lazyseq']:11.1f}{cpu_us[name]:13.2f}")
    return {"items": counts, "us_per_item": us, "cpu_us_per_item": cpu_us,
            "ratio": {k: v / us["lazyseq"] for k, v in us.items()}, **details(runs)}


def compute(quick: bool, peers: set[str], rounds: int | None = None) -> dict:
    n, rounds = (150, 1) if quick else (1000, rounds or 5)
    burn = calibrate()
    item_ms = statistics.median(timed(burn, i) for i in range(21)) * 1e3
    loaders: dict[str, tuple[Opener, Callable]] = {"plain loop": (open_plain(burn, n), ignore),
                                                   "lazyseq": (open_lazyseq(burn, n), ignore)}
    if "seqtools" in peers:
        loaders["seqtools"] = (open_seqtools(burn, n), ignore)
    if "torch" in peers:
        loaders["torch"] = (open_torch(burn, n), ignore)
    runs = alternate(loaders, rounds)
    rate = {name: r.rate() for name, r in runs.items()}
    cpu_ms = {name: r.cpu_per_item() * 1e3 for name, r in runs.items()}
    plain = rate["plain loop"]
    print(f"\n(c) {n} items of ~{item_ms:.2f} ms CPU each (a pure-Python loop of {burn.n} turns); best of {rounds}")
    print(f"{'':16s}{'items/s':>9s}{'x plain':>9s}{'lazyseq x':>11s}{'CPU ms/item':>13s}")
    for name, v in rate.items():
        print(f"{name:16s}{v:9.0f}{v / plain:9.2f}{rate['lazyseq'] / v:11.2f}{cpu_ms[name]:13.2f}")
    return {"items": n, "item_ms": item_ms, "loop_turns": burn.n, "items_per_s": rate, "cpu_ms_per_item": cpu_ms,
            "ratio_to_plain": {k: v / plain for k, v in rate.items()},
            "ratio_lazyseq": {k: rate["lazyseq"] / v for k, v in rate.items()}, **details(runs)}


def startup(quick: bool, peers: set[str], rounds: int | None = None) -> dict:
    tries, n = (2, 100) if quick else (rounds or 7, 1000)
    openers: dict[str, Opener] = {"lazyseq": open_lazyseq(identity, n, context="fork"),
                                  "lazyseq shm": open_lazyseq(identity, n, SHM_SIZE, context="fork")}
    if "seqtools" in peers:  # seqtools uses the default context: fork on Linux before 3.14
        openers["seqtools"] = open_seqtools(identity, n)
        openers["seqtools shm"] = open_seqtools(identity, n, SHM_SIZE)
    if "torch" in peers:
        openers["torch"] = open_torch(identity, n, context="fork")
    times: dict[str, list[float]] = {name: [] for name in openers}
    for _ in range(tries):
        for name, opener in openers.items():
            times[name].append(first_item(opener))
            no_children(name)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    print(f"\n(d) construction to first item, fork, {NWORKERS} workers (shm: {SHM_SIZE / 2**20:.0f} MiB pool); "
          f"median of {tries}")
    print(f"{'':16s}{'ms':>8s}{'x lazyseq':>11s}")
    for name, v in ms.items():
        print(f"{name:16s}{v:8.1f}{v / ms['lazyseq']:11.1f}")
    return {"tries": tries, "ms": ms, "all_ms": {k: [s * 1e3 for s in v] for k, v in times.items()},
            "ratio": {k: v / ms["lazyseq"] for k, v in ms.items()}}


PARTS = {"large": large, "tiny": tiny, "compute": compute, "startup": startup}


def targets(res: dict) -> dict:
    a, b, c, d = (res.get(k, {}) for k in PARTS)
    values = {
        "large_copy_vs_seqtools_shm": a.get("ratio_copy", {}).get("seqtools shm"),
        "large_copy_vs_torch": a.get("ratio_copy", {}).get("torch"),
        "large_empty_vs_seqtools_shm": a.get("ratio_empty", {}).get("seqtools shm"),
        "tiny_us_per_item": b.get("us_per_item", {}).get("lazyseq"),
        "compute_vs_plain_loop": c.get("ratio_to_plain", {}).get("lazyseq"),
        "startup_ms": d.get("ms", {}).get("lazyseq"),
    }
    out = {}
    print("\ntargets (DESIGN.md section 7)")
    for key, (what, op, threshold) in TARGETS.items():
        if key.split("_", 1)[0] not in res:  # a part not run
            continue
        v = values[key]
        met = None if v is None else (v >= threshold if op == ">=" else v < threshold)
        out[key] = {"value": v, "target": f"{op} {threshold}", "met": met}
        shown = "  (peer not installed)" if v is None else f"{v:8.2f}"
        verdict = "" if met is None else ("met" if met else "MISSED")
        print(f"  {what:58s}{shown:>10s}  {op} {threshold:<5g} {verdict}")
    return out


def run(quick: bool = False, only: list[str] | None = None, rounds: int | None = None) -> dict:
    """Run the scenarios (``only``: a subset of large, tiny, compute, startup; ``rounds``: rounds per
    loader, start-up tries) and print their tables and the targets; returns the results."""
    unknown = set(only or ()) - set(PARTS)
    if unknown:
        raise SystemExit(f"bench prefetch: unknown part(s) {sorted(unknown)}; choose among {sorted(PARTS)}")
    peers = set()
    for name, pip in (("seqtools", "seqtools==1.4.1"), ("torch", "torch==2.13.0")):
        if have(name):
            peers.add(name)
        else:
            print(f"({name} is not installed: skipped; pip install 'lazyseq[bench]' (or {pip!r}) to compare with it)")
    if "torch" in peers:
        import torch

        torch.set_num_threads(1)  # the reader sums on one core, as numpy does; workers use 1 anyway
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"{cores} cores, load average {load:.2f} before the run" if load is not None else f"{cores} cores")
    if load is not None and load > 0.5 * (cores or 1):
        print("(the machine is busy: wall-clock figures, above all the compute-bound ratio, will suffer; the CPU\n"
              " columns (reader + workers) are less sensitive to other work)")
    res: dict[str, Any] = {"scenario": "prefetch", "quick": quick, "nworkers": NWORKERS, "cores": cores,
                           "load_average": load, "peers": sorted(peers),
                           "skipped": sorted({"seqtools", "torch"} - peers)}
    for name, part in PARTS.items():
        if not only or name in only:
            res[name] = part(quick, peers, rounds)
    res["targets"] = targets(res)
    res["load_average_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return res


if __name__ == "__main__":  # python -m lazyseq.bench prefetch is the entry point; this also works
    run()
