"""Batches by token budget (:func:`bucket`): fairseq-style buckets as a random-access view whose
batch order follows the DataLoader's epoch and seed."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..core.node import bulk_reader, check_source, is_finite
from ..errors import wrap_error
from ..helpers import fname
from .epochs import FollowsEpoch
from .packing import positive_int
from .packplan import Lazy, plan_buckets, source_lengths

__all__ = ["bucket"]


class Bucket(FollowsEpoch, View):
    takes_loader_seed = True  # seed=None: the DataLoader's seed (at_epoch binds it), 0 outside one

    def __init__(self, seqs: Any, max_tokens: int, lengths: Any, window: int, seed: int | None, epoch: int | None,
                 pad_to_multiple: int, collate_fn: Callable | None, drop_last: bool):
        self.src, self._rdm = check_source(seqs, "bucket"), bulk_reader(seqs)
        if not is_finite(seqs):
            raise TypeError("bucket: the sequence has no len(); bucketing needs a finite sequence")
        self.max_tokens = positive_int(max_tokens, "max_tokens", "bucket")
        self.window = positive_int(window, "window", "bucket")
        self.pad_to_multiple = positive_int(pad_to_multiple, "pad_to_multiple", "bucket")
        if seed is not None and (isinstance(seed, bool) or operator.index(seed) < 0):
            raise ValueError(f"bucket: seed must be None (the DataLoader's) or an int >= 0, got {seed!r}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"bucket: collate_fn must be callable, got {type(collate_fn).__name__}")
        self.seed = None if seed is None else operator.index(seed)
        self._seed = self.seed or 0
        self.lengths, self.collate_fn, self.drop_last = lengths, collate_fn, bool(drop_last)
        self._lengths = Lazy()  # shared by the copies of every epoch: lengths are read once
        self._init_epoch(epoch, "bucket")

    def _epoch_setup(self) -> None:
        self._plan: tuple[np.ndarray, np.ndarray] | None = None  # this epoch's batches, at first use

    def _sources_rebound(self) -> None:
        if self.lengths is None:
            self._lengths = Lazy()
        self._plan = None

    def item_lengths(self) -> np.ndarray:
        """The length of every item of the source (``lengths=``, ``.sizes``, or one pass of ``len``)."""
        return self._lengths.get(self._compute_lengths)

    def _compute_lengths(self) -> np.ndarray:
        lengths = source_lengths(self.src, self.lengths, "bucket")
        rounded = -(-lengths // self.pad_to_multiple) * self.pad_to_multiple
        over = np.flatnonzero(rounded > self.max_tokens)
        if len(over):
            i = int(over[0])
            raise ValueError(f"bucket: item {i} has {int(lengths[i])} tokens ({int(rounded[i])} rounded up to a multiple "
                             f"of {self.pad_to_multiple}), more than max_tokens={self.max_tokens} ({len(over)} such items)")
        return lengths

    def plan(self) -> tuple[np.ndarray, np.ndarray]:
        """``(items, ptr)``: batch ``b`` holds the source items ``items[ptr[b]:ptr[b + 1]]``."""
        p = self._plan
        if p is None:
            p = self._plan = plan_buckets(self.item_lengths(), self.max_tokens, self.window, self.pad_to_multiple,
                                          self._seed, self._epoch, self.drop_last)
        return p

    def _len(self) -> int:
        return len(self.plan()[1]) - 1

    def _items(self, b: int) -> list[int]:
        items, ptr = self.plan()
        return items[ptr[b] : ptr[b + 1]].tolist()

    def _get(self, b: int) -> Any:
        batch = self._rdm(self._items(b))
        if self.collate_fn is None:
            return batch
        try:
            return self.collate_fn(batch)
        except Exception as e:
            raise wrap_error(e, b, self)  # noqa: B904

    def _get_many(self, idx: Sequence[int]) -> list:
        return [self._get(b) for b in idx]

    def padded_tokens(self) -> np.ndarray:
        """Every batch's padded size: items x longest (rounded up to ``pad_to_multiple``)."""
        items, ptr = self.plan()
        lengths = self.item_lengths()[items]
        m = self.pad_to_multiple
        longest = np.maximum.reduceat(lengths, ptr[:-1]) if len(items) else np.zeros(0, np.int64)
        return np.diff(ptr) * (-(-longest // m) * m)

    def largest_items(self) -> list[int]:
        """The batches with the most padded tokens and with the most items: what sizes a slot."""
        if not len(self):
            return []
        return sorted({int(np.argmax(self.padded_tokens())), int(np.argmax(np.diff(self.plan()[1])))})

    def describe(self) -> str:
        seed = f"seed={self.seed}" if self.seed is not None else \
            "seed=None" if self._seed == 0 else f"seed={self._seed} (the loader's)"
        extra = f", pad_to_multiple={self.pad_to_multiple}" if self.pad_to_multiple > 1 else ""
        extra += ", drop_last" if self.drop_last else ""
        extra += f", collate_fn={fname(self.collate_fn)}" if self.collate_fn is not None else ""
        return f"bucket(max_tokens={self.max_tokens}, window={self.window}, {seed}, {self._epoch_text()}{extra})"


def bucket(seqs: Any, max_tokens: int, *, lengths: Any = None, window: int = 1024, seed: int | None = None,
           epoch: int | None = None, pad_to_multiple: int = 1, collate_fn: Callable | None = None,
           drop_last: bool = False) -> View:
    """Batches of ``seqs`` by token budget: each batch's padded size (items x longest, the longest
    rounded up to ``pad_to_multiple``) is at most ``max_tokens``.

    The items are put in a random order of ``(seed, epoch)``, cut in windows of ``window`` items,
    each window sorted by length and cut into batches where one more item would pass the budget;
    the batches then come in a random order of ``(seed, epoch)``. Every item is in exactly one batch
    (``drop_last=True`` leaves out each window's last batch unless the budget closed it or it is
    full). Batch ``b`` is the list of its items, or ``collate_fn`` of it (e.g.
    :func:`pad_collate`). An item longer than ``max_tokens`` after rounding raises, naming it.

    Lengths come from ``lengths``, else ``seqs.sizes``, else one pass of ``len``, at the first
    ``len()`` or read, once. ``epoch=None`` follows the DataLoader's epoch and ``seed=None`` takes
    its seed; outside a loader they are 0. ``len()`` may differ between epochs.

    >>> import lazyseq, numpy as np
    >>> seqs = [np.ones(n, np.int32) for n in [5, 2, 7, 3, 3, 8, 1, 4]]
    >>> b = lazyseq.bucket(seqs, max_tokens=8, seed=0)
    >>> sorted(len(x) for batch in b for x in batch) == sorted(len(s) for s in seqs)
    True
    >>> all(len(batch) * max(len(x) for x in batch) <= 8 for batch in b)
    True
    >>> padded = lazyseq.bucket(seqs, 16, seed=0, collate_fn=lazyseq.pad_collate)
    >>> sorted(x['tokens'].shape for x in padded)
    [(2, 5), (2, 8), (4, 3)]
    """
    return Bucket(seqs, max_tokens, lengths, window, seed, epoch, pad_to_multiple, collate_fn, drop_last)
