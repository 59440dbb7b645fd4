"""Packing variable-length sequences into fixed rows (:func:`pack`): a random-access view whose
row ``r`` reads only the sequences it holds. The plan (which pieces go in which row) lives in
:mod:`lazyseq.views.packplan`."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..core.node import bulk_reader, check_source, is_finite
from .packplan import Lazy, PackPlan, plan_pack, source_lengths

__all__ = ["pack"]

METHODS = ("concat", "first_fit", "best_fit")
OVERFLOWS = ("split", "truncate", "error")


def positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int >= 1, got {value!r}")
    value = operator.index(value)
    if value < 1:
        raise ValueError(f"{where}: {name} must be >= 1, got {value}")
    return value


class Pack(View):
    def __init__(self, seqs: Any, length: int, method: str, window: int, lengths: Any, overflow: str, pad_id: Any):
        self.src, self._rdm = check_source(seqs, "pack"), bulk_reader(seqs)
        if not is_finite(seqs):
            raise TypeError("pack: the sequence has no len(); packing needs a finite sequence")
        if method not in METHODS:
            raise ValueError(f"pack: method must be one of {METHODS}, got {method!r}")
        if overflow not in OVERFLOWS:
            raise ValueError(f"pack: overflow must be one of {OVERFLOWS}, got {overflow!r}")
        self.length, self.window = positive_int(length, "length", "pack"), positive_int(window, "window", "pack")
        self.method, self.overflow, self.pad_id, self.lengths = method, overflow, pad_id, lengths
        self._plan = Lazy()
        self._positions = np.arange(self.length, dtype=np.int32)

    def plan(self) -> PackPlan:
        """The plan, computed at the first call (the first ``len()`` or read) from the lengths alone."""
        return self._plan.get(self._compute_plan)

    def _compute_plan(self) -> PackPlan:
        lengths = source_lengths(self.src, self.lengths, "pack")
        return plan_pack(lengths, self.length, self.method, self.window, self.overflow)

    def _sources_rebound(self) -> None:
        # at_epoch gave this copy a source that reads another epoch: plan again, from its lengths
        if self.lengths is None:
            self._plan = Lazy()

    def fill(self) -> float:
        """The fraction of the rows' token slots that hold tokens (the rest is padding)."""
        return self.plan().fill()

    def _len(self) -> int:
        return self.plan().rows

    def _get(self, i: int) -> dict:
        return self._rows([i])[0]

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._rows(idx)

    def _rows(self, idx: Sequence[int]) -> list[dict]:
        p = self.plan()
        ptr, seq = p.row_ptr, p.seq
        spans = [(int(ptr[r]), int(ptr[r + 1])) for r in idx]
        wanted = list(dict.fromkeys(x for a, b in spans for x in seq[a:b].tolist()))  # each sequence read once
        got = dict(zip(wanted, self._rdm(wanted)))
        return [self._row(p, a, b, got) for a, b in spans]

    def _row(self, p: PackPlan, a: int, b: int, got: dict) -> dict:
        first = np.asarray(got[int(p.seq[a])])
        n = self.length
        # plain memory, not lazyseq.empty: a row is most often stacked into a batch (default_collate
        # puts the batch in the worker's slot); rows in the slot too would need it twice as large
        tokens = np.empty((n,), first.dtype)
        segment_ids, positions = np.empty((n,), np.int32), np.empty((n,), np.int32)
        at = 0
        for k, (s, start, size) in enumerate(zip(p.seq[a:b].tolist(), p.start[a:b].tolist(), p.size[a:b].tolist())):
            x = got[s]
            if len(x) < start + size:
                raise ValueError(f"pack: sequence {s} has {len(x)} tokens, but its lengths said at least "
                                 f"{start + size}: were the lengths given for another sequence?")
            tokens[at : at + size] = x[start : start + size]
            segment_ids[at : at + size] = k + 1
            positions[at : at + size] = self._positions[:size]
            at += size
        tokens[at:] = self.pad_id
        segment_ids[at:] = 0
        positions[at:] = 0
        return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}

    def largest_items(self) -> list[int]:
        """Items as large as any (for sizing shared-memory slots): every row has ``length`` tokens."""
        return [0] if len(self) else []

    def describe(self) -> str:
        win = "" if self.method == "concat" else f", window={self.window}"
        over = "" if self.method == "concat" or self.overflow == "split" else f", overflow={self.overflow!r}"
        return f"pack({self.method}, length={self.length}{win}{over})"


def pack(seqs: Any, length: int, *, method: str = "best_fit", window: int = 1024, lengths: Any = None,
         overflow: str = "split", pad_id: Any = 0) -> View:
    """Variable-length sequences packed into rows of ``length`` tokens, with random access.

    Row ``r`` is ``{'tokens': (length,), 'segment_ids': (length,) int32, 'positions': (length,)
    int32}``: the row's segments are numbered from 1 (0 marks padding, whose tokens are ``pad_id``),
    and positions restart at 0 in each segment. Every token of every sequence is in exactly one row
    (empty sequences in none); each segment is a consecutive run of one sequence's tokens.

    - ``method='concat'``: one stream of all tokens cut every ``length`` (sequences split across
      rows, Megatron-style; only the last row is padded).
    - ``'first_fit'`` / ``'best_fit'``: whole sequences packed into rows (bins) within each
      ``window`` of consecutive sequences, in their order: into the first row with room, or the
      one left with the least room; deterministic. ``overflow`` says what happens to a sequence
      longer than ``length``: ``'split'`` into pieces of ``length`` (each a segment of its own),
      ``'truncate'`` to its first ``length`` tokens, ``'error'`` raises naming it.

    The plan (which pieces go in which row) is computed from lengths alone: ``lengths`` if given,
    else ``seqs.sizes`` (a Megatron indexed view), else one pass of ``len`` over ``seqs``; at the
    first ``len()`` or read, not when built, and once: it is pickled with the view, so workers
    receive it. Reading a row reads only its own sequences. The plan does not depend on the epoch
    (nothing is random in it): shuffle the rows with :func:`shuffle` or the DataLoader.

    >>> import lazyseq, numpy as np
    >>> docs = [np.arange(1, 6), np.arange(10, 13), np.arange(20, 24), np.arange(30, 32)]
    >>> rows = lazyseq.pack(docs, 8)
    >>> len(rows), rows[0]['tokens']
    (2, array([ 1,  2,  3,  4,  5, 10, 11, 12]))
    >>> rows[0]['segment_ids'], rows[0]['positions']
    (array([1, 1, 1, 1, 1, 2, 2, 2], dtype=int32), array([0, 1, 2, 3, 4, 0, 1, 2], dtype=int32))
    >>> rows[1]['tokens'], rows[1]['segment_ids']
    (array([20, 21, 22, 23, 30, 31,  0,  0]), array([1, 1, 1, 1, 2, 2, 0, 0], dtype=int32))
    >>> rows.fill()
    0.875
    """
    return Pack(seqs, length, method, window, lengths, overflow, pad_id)
