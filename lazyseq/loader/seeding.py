"""The DataLoader's seeding of the global generators (``random``, ``numpy.random``, torch's CPU
generator): once per worker (:class:`WorkerInit`), and per item with ``seed_each_item=True``
(:class:`SeedEachItem`), so that a torch-style dataset drawing from them gets the same numbers for
item ``i`` whatever reads it. Per-item seeds come from smap's keyed hash (``views.mapping``)."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..core.node import each, is_finite, reader
from ..views.mapping import ItemSeed, seed_key

__all__ = ["SeedEachItem", "WorkerInit", "IN_PROCESS", "refused"]

IN_PROCESS = ("thread", "async")  # prefetch methods whose workers run in the reader's process


def refused(method: str) -> str:
    """Why ``seed_each_item`` cannot be had with workers in the reader's process."""
    return (f"DataLoader: seed_each_item=True seeds the global generators (random, numpy.random) before "
            f"each item, but the workers of method={method!r} run in the reader's process and share them, "
            "so items would draw each other's numbers; use worker processes (method='process', the "
            "default), num_workers=0, or give each item its own generator with "
            "lazyseq.smap(f, dataset, seed=seed): f(item, rng=g) draws from g, a pure function "
            "of (seed, epoch, index) that follows the loader's epoch, without global state")

_M63 = (1 << 63) - 1


def _torch_generator() -> Any:
    """torch's CPU generator if torch is imported in this process (never imported here: it costs
    seconds, and a dataset that uses torch has imported it already)."""
    torch = sys.modules.get("torch")
    return getattr(torch, "default_generator", None) if torch is not None else None


def seed_globals(words: np.ndarray) -> None:
    """Seed ``random`` (128 bits), ``numpy.random`` (32 bits: numpy's fast seeding path, 2 us
    against 15 us for an array seed) and torch's CPU generator (63 bits) from 4 uint32 words."""
    random.seed(int.from_bytes(words.tobytes(), "little"))
    np.random.seed(int(words[0]))
    gen = _torch_generator()
    if gen is not None:
        gen.manual_seed((int(words[1]) << 32 | int(words[2])) & _M63)


def save_globals() -> tuple:
    """The global generators' states, for :func:`restore_globals`."""
    gen = _torch_generator()
    return random.getstate(), np.random.get_state(), gen, None if gen is None else gen.get_state()


def restore_globals(saved: tuple) -> None:
    py, npy, gen, torch_state = saved
    random.setstate(py)
    np.random.set_state(npy)
    if gen is not None:
        gen.set_state(torch_state)


class SeedEachItem(View):
    """``dataset[i]`` read right after seeding the global generators from ``(seed, epoch, i)``. In
    the reader's process (``owner``, where the training loop draws from them too) each read (one
    item, or a batch's items) then puts the generators back as they were; a worker process skips
    that (~150 us a read) since nothing else draws from its generators but the reads.

    >>> import random
    >>> import lazyseq
    >>> from lazyseq.loader.seeding import SeedEachItem
    >>> draws = SeedEachItem(lazyseq.smap(lambda i: random.random(), range(5)), seed=0, epoch=0)
    >>> state = random.getstate()
    >>> draws[3] == draws[3] != draws[4], list(draws)[3] == draws[3], random.getstate() == state
    (True, True, True)
    >>> draws[3] != SeedEachItem(draws.src, seed=0, epoch=1)[3]
    True
    """

    def __init__(self, dataset: Any, seed: int, epoch: int, owner: int | None = None):
        self.src, self.seed, self.epoch = dataset, int(seed), int(epoch)
        self.owner = os.getpid() if owner is None else owner
        self.finite = is_finite(dataset)
        self._key = seed_key("DataLoader.seed_each_item", (self.seed, self.epoch))
        self._rd = reader(dataset)

    def _read(self, i: int) -> Any:
        seed_globals(ItemSeed(self._key, i).generate_state(4))
        return self._rd(i)

    def _get(self, i: int) -> Any:
        return self._get_many((i,))[0]

    def _get_many(self, idx: Sequence[int]) -> list:
        read = self._read
        if os.getpid() != self.owner:
            return [read(i) for i in idx]
        saved = save_globals()  # once per read: saving numpy's state costs ~100 us
        try:
            return [read(i) for i in idx]
        finally:
            restore_globals(saved)

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        if os.getpid() != self.owner:
            return each(self._read, idx, out)
        saved = save_globals()
        try:
            return each(self._read, idx, out)
        finally:
            restore_globals(saved)

    def describe(self) -> str:
        return f"seed_each_item(seed={self.seed}, epoch={self.epoch})"


class WorkerInit:
    """A worker's start: in a worker process, seeds the global generators from (seed, rank, epoch,
    worker), so workers, ranks and epochs draw different augmentations (torch leaves numpy alone,
    so its forked workers repeat each other's); then calls ``worker_init_fn``. A worker that runs in
    the reader's process (threads) shares the reader's generators: they are left alone, and
    ``seed_each_item`` is refused there."""

    def __init__(self, seed: int, rank: int, epoch: int, fn: Callable | None, seed_each_item: bool, method: str,
                 dataset: Any = None):
        self.seed, self.rank, self.epoch, self.fn = seed, rank, epoch, fn
        self.seed_each_item, self.method, self.owner = seed_each_item, method, os.getpid()
        self.dataset = dataset  # worker_info().dataset: pickled with the pipeline, so the worker's own copy

    def _words(self, worker: int) -> np.ndarray:
        return np.random.SeedSequence([self.seed, self.rank, self.epoch, worker]).generate_state(4)

    def worker_seed(self, worker: int) -> int:
        """worker_info().seed: 63 bits of the words the worker's global generators start from (a
        non-negative int64, so that it collates as one)."""
        w = self._words(worker)
        return int(w[0]) | (int(w[1]) & 0x7FFFFFFF) << 32

    def __call__(self, worker: int) -> None:
        if os.getpid() != self.owner:
            seed_globals(self._words(worker))
        elif self.seed_each_item:  # a backend whose workers live in the reader's process, not in IN_PROCESS
            raise ValueError(refused(self.method))
        if self.fn is not None:
            self.fn(worker)
