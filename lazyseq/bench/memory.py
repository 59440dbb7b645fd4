"""Copy-on-read: the memory of fork workers reading a dataset the parent holds as Python objects.

A list of ``N`` small Python objects in the parent (``(path, label)`` tuples: a 23-character
``str`` and an ``int``, as a list of image files is; N = 1,500,000, 200,000 with ``--quick``) is
shared with fork workers page by page, until they read it: reading an object writes its
reference count, so every page a worker reads is copied into the worker (PyTorch issue #13246).
It takes fewer reads than every item: an epoch reads a random eighth of the items (the same
``N / 8`` every epoch, in a new order), yet a 4 kB page holds some 50 of these objects, so nearly
every page has one that is read. Each loader runs 3 epochs (2 with ``--quick``) with 2
persistent fork workers, batch 512, ``shuffle=True``, the default collate; a thread samples
every worker's USS (the pages only that process holds) and PSS (its pages, shared ones divided
among their sharers) with psutil every 0.1 s; a row reports the largest value of each epoch,
averaged over the workers.

Rows: torch's ``DataLoader`` (over ``Subset(data, eighth)``) and ``lazyseq.DataLoader`` (over
``lazyseq.gather(data, eighth)``) over the list, then over the same data as numpy arrays (the
paths as a fixed-width ``'U'`` array, the labels as int64; items made ``(str, int)`` again when
read: for lazyseq, ``lazyseq.smap(row, paths, labels)``), then ``lazyseq.load`` of the same
items saved with ``lazyseq.save`` (memory-mapped files: the workers map the pages, the page
cache holds them). The list is deleted before the numpy and store rows run (the store is saved
from the arrays). torch is optional (its rows are skipped). Peak memory: ~1.4 GB in all.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import lazyseq

NWORKERS, BATCH = 2, 512
MB = 1e6


def make_list(n: int) -> list[tuple[str, int]]:
    """``n`` (path, label) tuples: three objects each (a tuple, a str, an int: ~150 bytes)."""
    return [(f"train/{i % 1000:03d}/{i:09d}.jpg", 1000 + i % 1000) for i in range(n)]


def row(path: np.str_, label: np.int64) -> tuple[str, int]:
    """An item of the arrays as the list held it: numpy scalars pickle ~50x slower than str and int."""
    return str(path), int(label)


class ArrayDataset:
    """The list as two numpy arrays, for torch (a map-style dataset)."""

    def __init__(self, paths: np.ndarray, labels: np.ndarray):
        self.paths, self.labels = paths, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return row(self.paths[i], self.labels[i])


class Sampler:
    """Samples the USS and PSS of the parent's children every ``period`` seconds, in a thread;
    keeps, per epoch, the largest value of each child."""

    def __init__(self, period: float = 0.1):
        self.period, self.epoch = period, 0
        self.peaks: dict[int, dict[int, tuple[int, int]]] = {}  # epoch -> pid -> (uss, pss)
        import psutil  # imported when the bench runs: the package's modules import without it

        self.me, self._stop = psutil.Process(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lazyseq-bench-memory", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        import psutil

        peaks = self.peaks.setdefault(self.epoch, {})
        for child in self.me.children():
            try:
                m = child.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            uss, pss = peaks.get(child.pid, (0, 0))
            peaks[child.pid] = (max(uss, m.uss), max(pss, m.pss))

    def per_epoch(self) -> tuple[list[float], list[float]]:
        """Per epoch: the mean over workers of their peak USS, and of their peak PSS, in MB."""
        uss, pss = [], []
        for e in sorted(self.peaks):
            values = list(self.peaks[e].values())
            uss.append(sum(u for u, _ in values) / len(values) / MB if values else 0.0)
            pss.append(sum(p for _, p in values) / len(values) / MB if values else 0.0)
        return uss, pss


def measure(name: str, loader: Any, epochs: int, close: Callable[[], None]) -> dict:
    """Runs ``epochs`` epochs of ``loader``, sampling its workers; counts each epoch's items."""
    seconds, counts = [], []
    try:
        with Sampler() as sampler:
            for e in range(epochs):
                sampler.epoch = e
                t = time.perf_counter()
                counts.append(sum(len(labels) for _, labels in loader))
                sampler.sample()  # the end of the epoch, while the persistent workers still live
                seconds.append(time.perf_counter() - t)
    finally:
        close()
    uss, pss = sampler.per_epoch()
    print(f"  {name:34s}" + "".join(f"{u:8.0f}" for u in uss) + " |" + "".join(f"{p:8.0f}" for p in pss)
          + f" | {sum(seconds) / len(seconds):6.2f}")
    return {"uss_mb": uss, "pss_mb": pss, "seconds": seconds, "items_per_epoch": counts}


def torch_loader(data: Any, eighth: list[int]) -> tuple[Any, Callable[[], None]]:
    import torch.utils.data

    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(data, eighth), batch_size=BATCH, shuffle=True,
                                         num_workers=NWORKERS, persistent_workers=True, multiprocessing_context="fork")
    return loader, lambda: _stop_torch(loader)


def _stop_torch(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)
    if it is not None:
        it._shutdown_workers()
        loader._iterator = None


def lazyseq_loader(data: Any, eighth: list[int]) -> tuple[Any, Callable[[], None]]:
    loader = lazyseq.DataLoader(lazyseq.gather(data, eighth), batch_size=BATCH, shuffle=True, num_workers=NWORKERS, seed=0,
                                persistent_workers=True, multiprocessing_context="fork", to_tensor=False)
    return loader, loader.close


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _rows(peers: Iterable[str], data: Any, eighth: list[int], epochs: int, suffix: str, out: dict) -> None:
    for peer in peers:
        make = torch_loader if peer == "torch" else lazyseq_loader
        loader, close = make(data, eighth)
        out[f"{peer}, {suffix}"] = got = measure(f"{peer}, {suffix}", loader, epochs, close)
        if got["items_per_epoch"] != [len(eighth)] * epochs:
            raise RuntimeError(f"memory bench: {peer}, {suffix} read {got['items_per_epoch']} items per epoch, "
                               f"not {len(eighth)}")


def run(quick: bool = False) -> dict:
    n, epochs = (200_000, 2) if quick else (1_500_000, 3)
    if importlib.util.find_spec("psutil") is None:
        raise SystemExit("bench memory: measuring the workers' memory needs psutil: pip install 'lazyseq[bench]' (or psutil)")
    peers = ["torch", "lazyseq"] if _have_torch() else ["lazyseq"]
    if "torch" not in peers:
        print("(torch is not installed: its rows are skipped; pip install 'lazyseq[bench]')")
    res: dict[str, Any] = {"scenario": "memory", "quick": quick, "items": n, "epochs": epochs, "nworkers": NWORKERS,
                           "batch_size": BATCH, "peers": peers, "machine": _machine(), "rows": {}}
    gc.collect()
    before = _rss()
    data = make_list(n)
    res["list_mb"] = (_rss() - before) / MB
    eighth = np.random.default_rng(0).choice(n, n // 8, replace=False).tolist()
    print(f"{n} (path, label) tuples in a list: {res['list_mb']:.0f} MB in the parent; {NWORKERS} fork workers, "
          f"persistent, batch {BATCH}, {n // 8} random items per epoch; {res['machine']}")
    print(f"  {'per worker, MB':34s}" + "".join(f"{'USS e' + str(e):>8s}" for e in range(epochs)) + " |"
          + "".join(f"{'PSS e' + str(e):>8s}" for e in range(epochs)) + " | s/epoch")
    rows = res["rows"]
    _rows(peers, data, eighth, epochs, "Python list", rows)
    paths, labels = np.array([p for p, _ in data]), np.array([y for _, y in data], np.int64)
    del data
    gc.collect()
    res["numpy_mb"] = (paths.nbytes + labels.nbytes) / MB
    if "torch" in peers:
        _rows(["torch"], ArrayDataset(paths, labels), eighth, epochs, "numpy arrays", rows)
    items = lazyseq.smap(row, paths, labels)  # the list's items, from the arrays
    _rows(["lazyseq"], items, eighth, epochs, "numpy arrays", rows)
    root = tempfile.mkdtemp(prefix="lazyseq-bench-memory-")
    try:
        t = time.perf_counter()
        lazyseq.save(items, os.path.join(root, "list"), nworkers=NWORKERS, progress=False)
        res["save_seconds"] = time.perf_counter() - t
        del items, paths, labels
        store = lazyseq.load(os.path.join(root, "list"))
        res["store_mb"] = store.nbytes() / MB
        _rows(["lazyseq"], store, eighth, epochs, "saved store (lazyseq.load)", rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"numpy arrays: {res['numpy_mb']:.0f} MB; store: {res['store_mb']:.0f} MB on disk, "
          f"saved in {res['save_seconds']:.1f} s")
    return res


def _have_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a None in sys.modules (tests hide peers so)
        return False


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
