"""What a DataLoader reads, before and around prefetch: ``Plan``, the batches of any epoch (what
workers need and nothing of the loader), and ``Epochs``, the batches of every epoch as one
infinite view that persistent workers keep across epochs."""

from __future__ import annotations

import bisect
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..core.base import View
from ..core.node import read_many
from ..core.routed import Routed
from ..views.epochs import at_epoch
from ..views.faults import tally
from ..views.indexing import arange, gather
from ..views.mapping import smap
from ..views.order import shard, shuffle
from ..views.shape import batch
from .batching import default_collate
from .seeding import SeedEachItem

__all__ = ["Epochs", "Plan", "ToTensor"]


class Plan:
    """The batches of any epoch, before prefetch: what workers need, and nothing of the loader."""

    def __init__(self, dataset: Any, batch_size: int | None, shuffle: bool, sampler: Any, batch_sampler: Any,
                 collate_fn: Callable | None, drop_last: bool, seed: int, rank: int, world_size: int,
                 seed_each_item: bool, bound: tuple[int, Any] | None = None):
        self.dataset, self.batch_size, self.shuffle, self.sampler = dataset, batch_size, shuffle, sampler
        self.batch_sampler, self.collate_fn, self.drop_last, self.seed = batch_sampler, collate_fn, drop_last, seed
        self.rank, self.world_size, self.seed_each_item = rank, world_size, seed_each_item
        self.owner = os.getpid()  # the reader's process: seed_each_item puts its generators back
        self.bound = bound  # (epoch, the dataset bound to it): workers receive its plans with it

    def data(self, epoch: int) -> Any:
        """The dataset with the views built with ``epoch=None`` following ``epoch`` (and those that take
        the loader's seed, its seed): O(views); its length asked at once, so plans are made here."""
        if self.bound is None or self.bound[0] != epoch:
            data = at_epoch(self.dataset, epoch, self.seed)
            len(data)
            self.bound = (epoch, data)
        return self.bound[1]

    def __call__(self, epoch: int, order: Any = None, start: int = 0) -> View:
        """The batches of ``epoch`` (its order: ``order`` for a custom sampler), this rank's share of
        its global order from item ``start`` on."""
        data = self.data(epoch)
        data = SeedEachItem(data, self.seed, epoch, self.owner) if self.seed_each_item else data
        if self.batch_sampler is not None:
            lists = order if order is not None else [list(b) for b in self.batch_sampler]
            lists = shard(lists[start:], self.rank, self.world_size, self.drop_last)
            return smap(_BatchReader(data, self.collate_fn or default_collate), lists)
        if self.sampler is not None:
            idx = order if order is not None else list(self.sampler)
        elif self.shuffle:
            idx = shuffle(arange(len(data)), self.seed, epoch)
        else:
            idx = arange(len(data))
        idx = shard(idx[start:] if start else idx, self.rank, self.world_size, drop_remainder=self.drop_last)
        items = gather(data, idx)
        if self.batch_size is None:
            return smap(self.collate_fn, items) if self.collate_fn is not None else items
        return batch(items, self.batch_size, drop_last=self.drop_last, collate_fn=self.collate_fn or default_collate)


class _BatchReader:
    """Reads and collates one list of dataset indices (batch_sampler mode)."""

    def __init__(self, dataset: Any, collate: Callable):
        self.dataset, self.collate = dataset, collate

    def __call__(self, indices: list[int]) -> Any:
        return self.collate(read_many(self.dataset, indices) if isinstance(self.dataset, View)
                            else [self.dataset[i] for i in indices])


class ToTensor:
    """The loader's last stage: ``fn(batch, device=device, **kw)`` (``to_tensor``, ``to_torch``...)."""

    def __init__(self, fn: Callable, device: Any, name: str = "to_tensor", **kw: Any):
        self.fn, self.device, self.kw = fn, device, kw
        self.__qualname__ = name if device is None else f"{name}[{device}]"  # for repr trees

    def __call__(self, x: Any) -> Any:
        return self.fn(x, device=self.device, **self.kw)


class Epochs(Routed):
    """The batches of every epoch from ``(epoch, start)`` on, as one infinite view that persistent
    workers keep across epochs: the ``first`` batches of ``epoch`` from item ``start`` of its global
    order, then every batch of each later epoch. Each epoch's view is made when first read; an epoch
    may have its own number of batches (a ``bucket`` dataset), counted when first needed.

    ``skipped``: the items ``on_error`` views replaced while this copy read each epoch's batches,
    by epoch. The workers run ahead into the next epochs, and the views may be shared by every
    epoch, so the skips are told apart here, where each read knows its epoch: every read of an
    epoch's part is tallied (the failures of this thread's reads only, so thread workers reading
    several epochs at once keep them apart), nothing per item. The prefetch carries the process
    workers' dicts back (its ``report``) without knowing what the keys are; the DataLoader reads
    the epoch it needs."""

    finite = False
    seqs = ()
    _AHEAD = 64  # epochs a read may look past without finding a batch (empty epochs): then it is past the end

    def __init__(self, make: Callable[..., View], epoch: int, start: int, first: int):
        self.make, self.epoch, self.start, self.first = make, epoch, start, first
        self._ends = [first]  # the index just past each epoch's last batch, from `epoch` on
        self._cache: tuple[int, View] | None = None
        self.skipped: dict[int, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # a copy (a worker's) counts its own skips
        return {**self.__dict__, "_cache": None, "skipped": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def _count_next(self) -> None:
        e = self.epoch + len(self._ends)
        self._ends.append(self._ends[-1] + len(self._part(e)))

    def offset(self, epoch: int, start: int) -> int | None:
        """Where the batches of ``epoch`` from item ``start`` begin; None: not in this view."""
        if (epoch, start) == (self.epoch, self.start):
            return 0
        if start == 0 and epoch > self.epoch:
            while len(self._ends) < epoch - self.epoch:
                self._count_next()
            return self._ends[epoch - self.epoch - 1]
        return None

    def _where(self, i: int) -> tuple[int, int]:
        if i < self.first:
            return self.epoch, i
        ends, added = self._ends, 0
        while ends[-1] <= i:
            if added == self._AHEAD:
                raise IndexError(f"{self.describe()}: no batch at {i} ({added} epochs without one)")
            self._count_next()
            added += 1
        k = bisect.bisect_right(ends, i)
        return self.epoch + k, i - ends[k - 1]

    def _counted(self, e: int, read: Callable[[Any], Any], arg: Any) -> Any:
        """``read(arg)``, a read of epoch ``e``'s part: the items on_error views replace meanwhile
        count as ``e``'s."""
        n = [0]
        try:
            with tally(n):
                return read(arg)
        finally:
            if n[0]:
                with self._lock:
                    self.skipped[e] = self.skipped.get(e, 0) + n[0]

    def _get(self, i: int) -> Any:
        e, j = self._where(i)
        return self._counted(e, self._reader(e), j)

    def _read_part(self, e: int, read: Callable[[Any, Sequence[int]], list], js: list[int]) -> list:
        return self._counted(e, functools.partial(read, self._part(e)), js)  # Routed's bulk reads, counted

    def _part(self, e: int) -> View:
        c = self._cache
        if c is None or c[0] != e:
            c = self._cache = (e, self.make(e, None, self.start if e == self.epoch else 0))
        return c[1]

    def _reader(self, e: int) -> Callable[[int], Any]:
        return self._part(e)._get

    def describe(self) -> str:
        return f"epochs(from {self.epoch}, {self.first} batches in the first)"
