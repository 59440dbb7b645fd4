"""Soak: many epochs of a DataLoader with process workers leave the reader's resources flat.

Each soak test runs ``WARMUP`` epochs, takes a snapshot of the reader process (RSS, Python
objects, open file descriptors, OS threads, memory mappings), then runs ``soak_epochs`` more (30;
200 with ``pytest --soak``) and asserts after every epoch that descriptors and threads equal the
warm-up values, that objects, mappings and RSS stay within small bounds, that no child process is
left (or, with persistent workers, that the same workers are alive, flat, and none is a zombie),
and that nothing new sits in /dev/shm or is mapped from it. Items are small so that an epoch costs
~0.1 s. The last tests check the harness against deliberate leaks, and the copy-on-read that
``python -m lazyseq.bench memory`` measures (docs/memory.md).
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import multiprocessing
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
import pytest

import lazyseq

pytestmark = pytest.mark.soak

WARMUP = 5  # epochs before the reference snapshot: imports, caches and allocator pools settle
RSS_GROWTH = 4 * 2**20  # bytes the reader's RSS may grow after the warm-up (a 20 kB/epoch leak fails --soak)
BLOCKS_GROWTH = 1500  # Python objects (sys.getallocatedblocks); settling takes ~100-400, tinygrad's caches included
WORKER_RSS_GROWTH = 4 * 2**20  # the same as RSS_GROWTH, for each persistent worker
MAPS_GROWTH = 4  # memory mappings (malloc arenas may add one or two; a leaked slot pool adds one per epoch)
N, BATCH, NWORKERS = 256, 32, 2

DATA = [(np.full(16, i, np.float32), i) for i in range(N)]


@dataclass(frozen=True)
class Snapshot:
    rss: int
    blocks: int
    fds: int
    threads: int
    maps: int
    shm_mapped: Counter[str]  # /dev/shm files and memfds this process maps or has open, with repeats


def _shm_paths(me: psutil.Process) -> Counter[str]:
    paths = [m.path for m in me.memory_maps(grouped=False)] + [f.path for f in me.open_files()]
    return Counter(p for p in paths if p.startswith(("/dev/shm/", "/memfd:")))


def _trim() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``), so that the RSS
    counts what is held, not what the allocator keeps after a busy epoch (in a process that holds
    many libraries and threads, as a pytest-xdist worker does, that varies by megabytes)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # (not glibc: the RSS as it is)


def snapshot(me: psutil.Process) -> Snapshot:
    shm, maps = _shm_paths(me), len(me.memory_maps(grouped=False))
    gc.collect()
    _trim()
    return Snapshot(me.memory_info().rss, sys.getallocatedblocks(), me.num_fds(), me.num_threads(), maps, shm)


def shm_entries() -> set[str]:
    """lazyseq's names in /dev/shm and those of Python's shared_memory (as tests/conftest.py)."""
    return {n for n in os.listdir("/dev/shm") if "lazyseq" in n or n.startswith(("psm_", "wnsm_"))}


def labels_of(batch) -> list[int]:
    """The labels of one (images, labels) batch, checked against its images (numpy or tinygrad)."""
    x, y = (np.asarray(a.numpy()) if hasattr(a, "numpy") else a for a in batch)
    assert x.shape == (len(y), 16) and (x[:, 0] == y).all()
    return y.tolist()


class Soak:
    """Runs epochs and checks the reader after each against its state after the warm-up. Its own
    records are preallocated arrays, so that keeping them grows neither the RSS nor the objects."""

    def __init__(self, epochs: int):
        self.me, self.epochs = psutil.Process(), epochs
        self.shm_before = shm_entries()
        # multiprocessing's own helpers (a resource tracker, a forkserver) that earlier tests started
        self.children_before = {c.pid for c in self.me.children(recursive=True)}
        self.ref: Snapshot | None = None
        self.rss = np.zeros(WARMUP + epochs, np.int64)  # the reader's, after each epoch
        self.blocks = np.zeros(WARMUP + epochs, np.int64)
        self.worker_rss = np.zeros((WARMUP + epochs, NWORKERS), np.int64)  # persistent workers'
        self.orders = np.zeros(WARMUP + epochs, np.int64)  # a hash of each epoch's order

    def run(self, epoch: Callable[[int], None], workers_between: Callable[[], list[int]]) -> None:
        for e in range(WARMUP + self.epochs):
            epoch(e)
            self.check_children(e, workers_between())
            now = snapshot(self.me)
            self.rss[e], self.blocks[e] = now.rss, now.blocks
            if e + 1 == WARMUP:
                self.ref = now
            elif e + 1 > WARMUP:
                self.check(e, now)

    def check_children(self, e: int, expected: list[int]) -> None:
        """Only the expected workers are alive, none a zombie, nothing else started."""
        children = [c for c in self.me.children(recursive=True) if c.pid not in self.children_before]
        zombies = [c.pid for c in children if _status(c) == psutil.STATUS_ZOMBIE]
        assert not zombies, f"zombie children: {zombies}"
        assert sorted(c.pid for c in children) == sorted(expected), f"children {children}, expected {expected}"
        for k, c in enumerate(children[:NWORKERS]):
            self.worker_rss[e, k] = c.memory_info().rss

    def check(self, e: int, now: Snapshot) -> None:
        ref = self.ref
        assert ref is not None
        where = f"epoch {e} (warm-up snapshot after epoch {WARMUP - 1})"
        assert not now.shm_mapped - ref.shm_mapped, f"{where}: new shared memory mapped: {now.shm_mapped - ref.shm_mapped}"
        assert shm_entries() <= self.shm_before, f"{where}: new /dev/shm entries {shm_entries() - self.shm_before}"
        assert now.fds == ref.fds, f"{where}: {now.fds} open descriptors, {ref.fds} after the warm-up"
        assert now.threads == ref.threads, f"{where}: {now.threads} threads, {ref.threads} after the warm-up"
        assert now.maps <= ref.maps + MAPS_GROWTH, f"{where}: {now.maps} memory mappings, {ref.maps} after the warm-up"
        assert now.rss - ref.rss < RSS_GROWTH, f"{where}: RSS grew by {(now.rss - ref.rss) / 2**20:.1f} MiB"
        assert now.blocks - ref.blocks < BLOCKS_GROWTH, f"{where}: {now.blocks - ref.blocks} more Python objects"

    def check_workers_flat(self) -> None:
        grew = self.worker_rss[WARMUP:].max(axis=0) - self.worker_rss[WARMUP - 1]
        assert (grew < WORKER_RSS_GROWTH).all(), f"persistent workers' RSS grew by {grew / 2**20} MiB after the warm-up"

    def check_closed(self) -> None:
        """After close: no child, no shared memory, no descriptor more than after the warm-up; prints
        the figures (``pytest -s`` shows them)."""
        assert self.ref is not None
        self.check_children(-1, [])
        assert shm_entries() <= self.shm_before
        assert snapshot(self.me).fds <= self.ref.fds
        rss, blocks, ref = self.rss[WARMUP:], self.blocks[WARMUP:], self.ref
        workers = (self.worker_rss[WARMUP:].max(axis=0) - self.worker_rss[WARMUP - 1]) // 2**10
        print(f"\n{self.epochs} epochs after {WARMUP}: reader RSS {ref.rss / 2**20:.1f} MiB, growth max "
              f"{(rss.max() - ref.rss) // 2**10:+d} KiB, end {(rss[-1] - ref.rss) // 2**10:+d} KiB; objects: max "
              f"{blocks.max() - ref.blocks:+d}, end {blocks[-1] - ref.blocks:+d}; {ref.fds} fds, {ref.threads} "
              f"threads, {ref.maps} mappings; persistent workers' RSS growth (KiB): {workers.tolist()}")


def _status(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.NoSuchProcess:
        return "gone"


def make_loader(persistent: bool, to_tensor: bool = False) -> lazyseq.DataLoader:
    return lazyseq.DataLoader(DATA, batch_size=BATCH, shuffle=True, num_workers=NWORKERS, seed=0,
                              persistent_workers=persistent, to_tensor=to_tensor,
                              device="CPU" if to_tensor else None)


def full_epoch(loader: lazyseq.DataLoader, soak: Soak, e: int) -> None:
    got = [y for batch in loader for y in labels_of(batch)]  # a batch at a time: its slot is free at once
    assert sorted(got) == list(range(N))
    soak.orders[e] = hash(tuple(got))


def all_orders_differ(soak: Soak) -> bool:
    return len(set(soak.orders.tolist())) == len(soak.orders)


@pytest.mark.parametrize("to_tensor", [False, True], ids=["numpy", "tinygrad"])
def test_persistent_workers_stay_the_same_and_flat(soak_epochs, to_tensor):
    if to_tensor:
        pytest.importorskip("tinygrad")
    soak = Soak(soak_epochs)
    with make_loader(persistent=True, to_tensor=to_tensor) as loader:
        pids: list[int] = []

        def workers() -> list[int]:
            if not pids:
                pids.extend(loader.stats()["worker_pids"])
            return pids  # the same processes, every epoch

        soak.run(lambda e: full_epoch(loader, soak, e), workers)
        assert len(pids) == NWORKERS
    soak.check_workers_flat()
    soak.check_closed()
    assert all_orders_differ(soak)  # a new order every epoch


def test_workers_restarted_every_epoch_leave_nothing(soak_epochs):
    soak = Soak(soak_epochs)
    with make_loader(persistent=False) as loader:
        soak.run(lambda e: full_epoch(loader, soak, e), list)  # no worker outlives its epoch
    soak.check_closed()
    assert all_orders_differ(soak)


def test_a_new_loader_every_epoch_leaves_nothing(soak_epochs):
    soak = Soak(soak_epochs)

    def epoch(e: int) -> None:
        with make_loader(persistent=e % 2 == 0) as loader:
            loader.set_epoch(e)
            full_epoch(loader, soak, e)

    soak.run(epoch, list)
    soak.check_closed()
    assert all_orders_differ(soak)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
def test_epochs_left_early_leave_nothing(soak_epochs, persistent):
    """Leaving an epoch after a few batches (break, or an exception in the training step)."""
    soak = Soak(soak_epochs)
    with make_loader(persistent) as loader:
        pids: list[int] = []

        def epoch(e: int) -> None:
            loader.set_epoch(e)
            if e % 2:
                for k, _ in enumerate(loader):
                    if k == 2:
                        break
            else:
                with pytest.raises(KeyError):
                    for k, _ in enumerate(loader):
                        if k == 3:
                            raise KeyError("the training step failed")

        def workers() -> list[int]:
            if persistent and not pids:
                pids.extend(loader.stats()["worker_pids"])
            return pids

        soak.run(epoch, workers)
    if persistent:
        soak.check_workers_flat()
    soak.check_closed()


@pytest.mark.parametrize("leak", ["descriptor", "memory", "thread", "child", "objects", "shared memory"])
def test_the_checks_catch_each_kind_of_leak(leak):
    """The harness itself: an epoch that leaks one thing fails, naming it."""
    kept: list = []
    stop = threading.Event()

    def epoch(e: int) -> None:
        if leak == "descriptor":
            kept.append(os.open(os.devnull, os.O_RDONLY))
        elif leak == "memory":
            kept.append(np.ones(2 * 2**20, np.uint8))  # 2 MiB an epoch, touched
        elif leak == "thread":
            kept.append(threading.Thread(target=stop.wait, args=(30,)))
            kept[-1].start()
        elif leak == "child" and e == WARMUP:
            kept.append(multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,)))
            kept[-1].start()
        elif leak == "objects":
            kept.extend(object() for _ in range(200))
        elif leak == "shared memory" and e == WARMUP:  # a mapping only: its descriptor is closed
            fd = os.memfd_create("lazyseq")
            os.ftruncate(fd, mmap.PAGESIZE)
            kept.append(mmap.mmap(fd, mmap.PAGESIZE))
            os.close(fd)

    message = {"descriptor": "open descriptors", "memory": "RSS grew", "thread": "threads", "child": "children",
               "objects": "more Python objects", "shared memory": "new shared memory mapped"}[leak]
    try:
        with pytest.raises(AssertionError, match=message):
            Soak(20).run(epoch, list)
    finally:
        stop.set()
        for x in kept:
            if isinstance(x, int):
                os.close(x)
            elif isinstance(x, multiprocessing.process.BaseProcess):
                x.terminate()
                x.join(timeout=10)
            elif isinstance(x, threading.Thread):
                x.join(timeout=10)
            elif isinstance(x, mmap.mmap):
                x.close()


def test_copy_on_read_shows_in_the_workers_and_arrays_avoid_it():
    """The memory bench's claim, small: fork workers reading a list of Python objects copy it;
    reading the same data from numpy arrays (items made on read) does not."""
    from lazyseq.bench import memory

    n = 100_000
    gc.collect()
    before = psutil.Process().memory_info().rss
    data = memory.make_list(n)
    list_mb = (psutil.Process().memory_info().rss - before) / memory.MB
    eighth = np.random.default_rng(0).choice(n, n // 8, replace=False).tolist()
    on_list = _measure(memory, data, eighth)
    paths, labels = np.array([p for p, _ in data]), np.array([y for _, y in data])
    on_arrays = _measure(memory, lazyseq.smap(memory.row, paths, labels), eighth)
    assert on_list["items_per_epoch"] == on_arrays["items_per_epoch"] == [n // 8]
    copied = on_list["uss_mb"][-1] - on_arrays["uss_mb"][-1]
    assert copied > 0.4 * list_mb, f"list {list_mb:.0f} MB, workers' USS {on_list['uss_mb']} vs {on_arrays['uss_mb']}"


def _measure(memory, data, eighth) -> dict:
    loader, close = memory.lazyseq_loader(data, eighth)
    return memory.measure("", loader, 1, close)
