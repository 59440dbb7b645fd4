"""Datasets on disk: ``lazyseq.save`` and ``lazyseq.load`` against a hand-written numpy baseline and
Hugging Face ``datasets``, over the same items: a 3x32x32 uint8 image and an int label.

- (a) saving items that cost ~1 ms of CPU each: ``lazyseq.save`` with 2 worker processes against
  a single-process loop computing the same items and writing them into ``np.memmap`` ``.npy``
  files, flushed and fsync'd as lazyseq's shards are (items/s and the ratio).
- (b) random single-item reads: ``lazyseq.load`` against ``np.memmap`` indexing of the loop's
  files and ``datasets`` (an Arrow file built from those files, ``with_format('numpy')``): us/item.
- (c) one epoch in a shuffled order, in batches of 256 (``default_collate``; fancy indexing of
  the memory maps; ``dataset[indices]``): items/s.

The files sit in the page cache (just written): reads measure the formats, not the disk. The
readers alternate round by round, so that the noise of a shared machine hits them alike (reads:
the best round). ``datasets`` is optional (``pip install 'lazyseq[bench]'``): without it, its rows
say so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import lazyseq
from lazyseq.bench.prefetch import Burn, calibrate
from lazyseq.store.format import fsync_path

NWORKERS = 2
SHAPE = (3, 32, 32)
BATCH = 256
ITEM_BYTES = int(np.prod(SHAPE)) + 8
SHARDS = 32  # enough to keep both workers busy to the end (the last shards are short)
HF = "datasets"

TARGETS = {  # key: (what, comparison, threshold)
    "save_vs_loop": ("(a) save, 2 workers: lazyseq / single-process loop items/s", ">=", 1.6),
    "random_vs_memmap": ("(b) random reads: lazyseq / np.memmap us per item", "<=", 2.0),
    "random_vs_datasets": ("(b) random reads: datasets / lazyseq us per item", ">=", 10.0),
    "epoch_vs_memmap": ("(c) shuffled epoch: lazyseq / np.memmap items/s (issue #21)", ">=", 0.7),
}
PREFETCHED = f"lazyseq, {NWORKERS} processes"  # (c) through prefetch: each batch one shared-memory slot


class MakeItem:
    """Item ``i``: ~1 ms of pure-Python CPU (``burn``), then an image drawn from its result and
    a label. Module level, so that worker processes unpickle it by reference."""

    def __init__(self, burn: Burn):
        self.burn = burn

    def __call__(self, i: int) -> dict:
        seed = self.burn(i)
        return {"image": np.random.default_rng(seed).integers(0, 256, SHAPE, dtype=np.uint8), "label": i % 10}


# -- (a) saving ---------------------------------------------------------------------------------------
def save_loop(make: MakeItem, n: int, root: str) -> tuple[float, dict[str, str]]:
    """The baseline: one process computes the items in order and writes them into two
    ``.npy`` memory maps, then flushes and fsyncs them (and the directory)."""
    paths = {"image": os.path.join(root, "images.npy"), "label": os.path.join(root, "labels.npy")}
    t = time.perf_counter()
    images = np.lib.format.open_memmap(paths["image"], mode="w+", dtype=np.uint8, shape=(n, *SHAPE))
    labels = np.lib.format.open_memmap(paths["label"], mode="w+", dtype=np.int64, shape=(n,))
    for i in range(n):
        x = make(i)
        images[i] = x["image"]
        labels[i] = x["label"]
    for arr in (images, labels):
        arr.flush()
    del images, labels
    for p in (*paths.values(), root):
        fsync_path(p)
    return time.perf_counter() - t, paths


def shard_bytes(n: int) -> int:
    """The ``shard_bytes`` that cuts ``n`` items into about SHARDS shards."""
    return ITEM_BYTES * -(-n // SHARDS)


def save_lazyseq(make: MakeItem, n: int, path: str) -> float:
    t = time.perf_counter()
    lazyseq.save(lazyseq.smap(make, range(n)), path, nworkers=NWORKERS, method="process",
                 shard_bytes=shard_bytes(n), progress=False)
    return time.perf_counter() - t


# -- the readers ------------------------------------------------------------------------------------
def hf_rows(images: str, labels: str) -> Iterator[dict]:
    """The rows of the ``datasets`` table, read from the baseline's files (module level: datasets
    hashes the generator and its arguments, which are small here)."""
    img, lab = np.load(images, mmap_mode="r"), np.load(labels, mmap_mode="r")
    for i in range(len(lab)):
        yield {"image": np.asarray(img[i]), "label": int(lab[i])}


def build_hf(paths: dict[str, str], root: str) -> tuple[Any, float]:
    """An Arrow file of the same data, written by ``Dataset.from_generator`` under ``root``,
    memory-mapped, ``with_format('numpy')``; and the seconds it took."""
    cache, before = os.path.join(root, "hf-cache"), os.environ.get("HF_DATASETS_CACHE")
    os.environ["HF_DATASETS_CACHE"] = cache  # read when datasets is imported: keep out of the user's cache
    try:
        import datasets
    finally:
        if before is None:
            os.environ.pop("HF_DATASETS_CACHE")
        else:
            os.environ["HF_DATASETS_CACHE"] = before
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    features = datasets.Features({"image": datasets.Array3D(SHAPE, "uint8"), "label": datasets.Value("int64")})
    t = time.perf_counter()
    ds = datasets.Dataset.from_generator(hf_rows, features=features, cache_dir=cache,
                                         gen_kwargs={"images": paths["image"], "labels": paths["label"]})
    return ds.with_format("numpy"), time.perf_counter() - t


Readers = dict[str, Any]  # name -> the data: a Store, a pair of memory maps, a datasets.Dataset


def read_one(name: str, data: Any) -> Callable[[int], tuple]:
    """Item ``i`` as (image, label), as a user of each library reads it."""
    if name == "lazyseq.load":
        def one(i: int) -> tuple:
            x = data[i]
            return x["image"], x["label"]
    elif name == "np.memmap":
        images, labels = data

        def one(i: int) -> tuple:
            return images[i], int(labels[i])
    else:
        def one(i: int) -> tuple:
            x = data[i]
            return x["image"], x["label"]
    return one


def read_epoch(name: str, data: Any, n: int, seed: int) -> Iterator[tuple]:
    """One epoch in a shuffled order, in batches of BATCH: (images, labels) per batch."""
    if name == "lazyseq.load":
        for b in lazyseq.batch(lazyseq.shuffle(data, seed=seed), BATCH, collate_fn=lazyseq.default_collate):
            yield b["image"], b["label"]
        return
    order = np.random.default_rng(seed).permutation(n)
    for a in range(0, n, BATCH):
        idx = order[a : a + BATCH]
        if name == "np.memmap":
            yield data[0][idx], data[1][idx]
        else:
            b = data[idx]
            yield b["image"], b["label"]


def time_epochs_prefetched(store: Any, n: int, rounds: int) -> float:
    """Items per second of (c)'s loop read through ``prefetch(method='process')``: the best round,
    timed from the first batch (the workers' start-up is not counted; (c) runs in this process)."""
    best = 0.0
    for r in range(rounds):
        batches = lazyseq.batch(lazyseq.shuffle(store, seed=r), BATCH, collate_fn=lazyseq.default_collate)
        jobs = 2 * NWORKERS + 2  # slots of two batches each: without shm_size, batches would be pickled
        with lazyseq.prefetch(batches, NWORKERS, "process", max_buffered=jobs, shm_size=jobs * 2 * BATCH * ITEM_BYTES) as p:
            it = iter(p)
            count = len(next(it)["label"])
            t = time.perf_counter()
            for b in it:
                count += len(b["label"])
            seconds = time.perf_counter() - t
        assert count == n, count
        best = max(best, (n - min(n, BATCH)) / seconds) if seconds > 0 else best
    return best


def check_same(readers: Readers, make: MakeItem, n: int) -> None:
    """Every reader gives the items that ``make`` computes, before anything is timed."""
    for i in sorted({0, n - 1, *range(0, n, max(1, n // 25))}):
        want = make(i)
        for name, data in readers.items():
            image, label = read_one(name, data)(i)
            if not (np.array_equal(image, want["image"]) and int(label) == want["label"]):
                raise AssertionError(f"bench store: {name} gives another item {i} than the one saved")
    for name, data in readers.items():
        images, labels = next(read_epoch(name, data, n, 0))
        if np.shape(images) != (min(n, BATCH), *SHAPE) or np.shape(labels) != (min(n, BATCH),):
            raise AssertionError(f"bench store: {name} gives batches of shapes {np.shape(images)}, {np.shape(labels)}")


# -- (b) and (c) -----------------------------------------------------------------------------------
def time_random(readers: Readers, keys: dict[str, list[int]], rounds: int) -> dict[str, float]:
    """Microseconds per random read: the best of ``rounds``, the readers alternating."""
    best = {name: float("inf") for name in readers}
    for _ in range(rounds):
        for name, data in readers.items():
            one, ks = read_one(name, data), keys[name]
            t = time.perf_counter()
            for i in ks:
                one(i)
            best[name] = min(best[name], (time.perf_counter() - t) / len(ks) * 1e6)
    return best


def time_epochs(readers: Readers, n: int, rounds: int) -> dict[str, float]:
    """Items per second over a shuffled epoch in batches (a new order each round): the best round."""
    best = {name: 0.0 for name in readers}
    for r in range(rounds):
        for name, data in readers.items():
            t = time.perf_counter()
            count = sum(len(labels) for _, labels in read_epoch(name, data, n, r))
            seconds = time.perf_counter() - t
            assert count == n, (name, count)
            best[name] = max(best[name], n / seconds)
    return best


# -- printing and targets ----------------------------------------------------------------------------
def header() -> tuple[int, float | None]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"{cores} cores, load average {load:.2f} before the run" if load is not None else f"{cores} cores")
    if load is not None and load > 0.5 * cores:
        print("(the machine is busy: wall-clock figures, above all the saving ratio, will suffer)")
    return cores, load


def print_save(n: int, item_ms: float, burn: Burn, seconds: dict[str, float], shards: int) -> None:
    loop = seconds["single-process loop"]
    print(f"\n(a) saving {n} items (a {'x'.join(map(str, SHAPE))} uint8 image and an int label), each costing "
          f"~{item_ms:.2f} ms of CPU\n    (a pure-Python loop of {burn.n} turns, calibrated alone; "
          f"{loop / n * 1e3:.2f} ms per item in the single-process loop, writes included)")
    print(f"{'':22s}{'s':>8s}{'items/s':>10s}{'x loop':>9s}")
    for name, s in seconds.items():
        print(f"{name:22s}{s:8.2f}{n / s:10.0f}{loop / s:9.2f}")
    print("single-process loop: computes the items in order and writes them into two np.memmap .npy files\n"
          "  (images, labels); flush, then fsync of both files and of the directory\n"
          f"lazyseq.save: {NWORKERS} worker processes, each computing whole shards and writing them ({shards} shards of\n"
          f"  ~{shard_bytes(n) / 1e3:.0f} kB, each fsync'd), then the manifest (fsync'd, atomic rename); starting the\n"
          "  workers counts")


def print_reads(title: str, unit: str, values: dict[str, float | None], faster: Callable[[float, float], float],
                digits: int) -> None:
    """A table of ``values`` with the ratio to lazyseq (``faster(lazyseq, other)``: > 1 when lazyseq wins)."""
    mine = values["lazyseq.load"]
    print(title)
    print(f"{'':22s}{unit:>10s}{'lazyseq x':>11s}")
    for name, v in values.items():
        if v is None:
            print(f"{name:22s}{'not installed':>24s}")
        else:
            print(f"{name:22s}{v:10.{digits}f}{faster(mine, v):11.2f}")


def targets(values: dict[str, float | None]) -> dict:
    out = {}
    print("\ntargets (issue #9)")
    for key, (what, op, threshold) in TARGETS.items():
        v = values[key]
        met = None if v is None else (v >= threshold if op == ">=" else v <= threshold)
        out[key] = {"value": v, "target": f"{op} {threshold}", "met": met}
        shown = "  (datasets not installed)" if v is None else f"{v:8.2f}"
        verdict = "" if met is None else ("met" if met else "MISSED")
        print(f"  {what:58s}{shown:>10s}  {op} {threshold:<5g} {verdict}")
    return out


# -- the run ------------------------------------------------------------------------------------------
def measure(n: int, rounds: int, keys_hf: int, root: str, hf: bool) -> dict:
    burn = calibrate()
    make = MakeItem(burn)
    item_ms = sorted(_timed(make, i) for i in range(21))[10] * 1e3
    seconds = {}
    seconds["single-process loop"], paths = save_loop(make, n, root)
    seconds["lazyseq.save"] = save_lazyseq(make, n, os.path.join(root, "store"))
    store = lazyseq.load(os.path.join(root, "store"))
    readers: Readers = {"lazyseq.load": store,
                        "np.memmap": (np.load(paths["image"], mmap_mode="r"), np.load(paths["label"], mmap_mode="r"))}
    hf_build = None
    if hf:
        readers[HF], hf_build = build_hf(paths, root)
    check_same(readers, make, n)
    rng = np.random.default_rng(0)
    many = rng.integers(0, n, n).tolist()
    keys = {"lazyseq.load": many, "np.memmap": many, HF: many[:keys_hf]}
    random = time_random(readers, keys, rounds)
    epoch = time_epochs(readers, n, rounds)
    epoch[PREFETCHED] = time_epochs_prefetched(store, n, rounds)
    return {"burn": burn, "item_ms": item_ms, "seconds": seconds, "per_shard": store.per_shard,
            "shards": len(store.records), "random": random, "epoch": epoch, "hf_build": hf_build,
            "keys": {k: len(v) for k, v in keys.items()}}


def _timed(f: Callable[[int], Any], i: int) -> float:
    t = time.perf_counter()
    f(i)
    return time.perf_counter() - t


def run(quick: bool = False) -> dict:
    """Run (a), (b) and (c), print their tables and the targets; returns the results."""
    n, rounds, keys_hf = (500, 1, 100) if quick else (20_000, 3, 2_000)
    hf = importlib.util.find_spec(HF) is not None
    if not hf:
        print("(datasets is not installed: its rows are skipped; pip install 'lazyseq[bench]' to compare with it)")
    cores, load = header()
    root = tempfile.mkdtemp(prefix="lazyseq-bench-store-")
    try:
        m = measure(n, rounds, keys_hf, root, hf)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds, names = m["seconds"], ["lazyseq.load", "np.memmap", HF, PREFETCHED]
    print_save(n, m["item_ms"], m["burn"], seconds, m["shards"])
    random = {k: m["random"].get(k) for k in names[:3]}
    epoch = {k: m["epoch"].get(k) for k in names}
    print_reads(f"\n(b) random single-item reads, (image, label): {m['keys']['lazyseq.load']} random keys (datasets: "
                f"{keys_hf}); best of {rounds}", "us/item", random, lambda mine, v: v / mine, 2)
    if m["hf_build"] is not None:
        print(f"datasets: Dataset.from_generator over the loop's files took {m['hf_build']:.1f} s (an Arrow file, "
              "memory-mapped);\n  with_format('numpy') returns the images as int64 (its default for integers)")
    print_reads(f"\n(c) one epoch of {n} items in a shuffled order, batches of {BATCH}; best of {rounds}",
                "items/s", epoch, lambda mine, v: mine / v, 0)
    print("lazyseq: batch(shuffle(store), 256, collate_fn=default_collate), read by columns (one fancy index per\n"
          "  field across the shards' memory maps, no item built); np.memmap: fancy indexing of both maps by a\n"
          "  permutation's slice; datasets:\n"
          f"  dataset[indices]; {PREFETCHED}: the same batches through prefetch(method='process'), each batch\n"
          "  built in a shared-memory slot, timed from the first batch")
    loop, mine = seconds["single-process loop"], seconds["lazyseq.save"]
    values = {"save_vs_loop": loop / mine, "random_vs_memmap": random["lazyseq.load"] / random["np.memmap"],
              "random_vs_datasets": None if random[HF] is None else random[HF] / random["lazyseq.load"],
              "epoch_vs_memmap": epoch["lazyseq.load"] / epoch["np.memmap"]}
    res = {"scenario": "store", "quick": quick, "items": n, "cores": cores, "load_average": load,
           "nworkers": NWORKERS, "item_ms": m["item_ms"], "loop_turns": m["burn"].n, "datasets_installed": hf,
           "save_seconds": seconds, "save_items_per_s": {k: n / s for k, s in seconds.items()},
           "save_ratio_to_loop": {k: loop / s for k, s in seconds.items()},
           "shards": m["shards"], "per_shard": m["per_shard"],
           "random_us_per_item": {k: v for k, v in random.items() if v is not None},
           "random_keys": m["keys"], "epoch_items_per_s": {k: v for k, v in epoch.items() if v is not None},
           "datasets_build_seconds": m["hf_build"], "targets": targets(values)}
    res["load_average_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return res


if __name__ == "__main__":  # python -m lazyseq.bench store is the entry point; this also works
    run()
