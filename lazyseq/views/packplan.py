"""Plans of :func:`lazyseq.pack` and :func:`lazyseq.bucket`, from the sequences' lengths alone.

A packing plan is a list of *pieces* (a run ``start:start + size`` of sequence ``seq``) grouped
into rows (``row_ptr``: the pieces of row ``r`` are ``row_ptr[r]:row_ptr[r + 1]``). ``concat`` and
the window sort of ``bucket`` are vectorised numpy; first and best fit are sequential by nature: one
Python step per piece (best fit: a bisect in a sorted list of free space, first fit: one numpy
scan of the open rows), nothing per token. A row stays open for the pieces of the ``window``
sequences from the one that opened it, so a row holds sequences less than ``window`` apart. Measured on 2 cores, 1M sequences:
see the costs in docs/packing.md.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.node import length, read_many

__all__ = ["Lazy", "PackPlan", "source_lengths", "plan_pack", "plan_buckets"]

_READ_CHUNK = 1024  # sequences read at once by the one pass of len (bounded memory)


class Lazy:
    """A value computed once, at first use, shared by the copies ``at_epoch`` makes of a view (the
    box is shared, not copied) and pickled with the view once computed, so workers receive it."""

    def __init__(self) -> None:
        self.value: Any = None
        self._lock = threading.Lock()

    def get(self, compute: Callable[[], Any]) -> Any:
        v = self.value
        if v is None:
            with self._lock:  # thread workers asking at once compute it once
                if self.value is None:
                    self.value = compute()
                v = self.value
        return v

    def __getstate__(self) -> dict:
        return {"value": self.value}

    def __setstate__(self, state: dict) -> None:
        self.value, self._lock = state["value"], threading.Lock()


def source_lengths(seqs: Any, lengths: Any, where: str) -> np.ndarray:
    """The length of every sequence, as an int64 array: ``lengths`` if given, else ``seqs.sizes``
    (a Megatron indexed view has it), else one pass of ``len`` over the sequences, read in bulk."""
    n = length(seqs)
    if n is None:
        raise TypeError(f"{where}: the sequence has no len(); packing needs a finite sequence")
    if lengths is None:
        sizes = getattr(seqs, "sizes", None)
        if isinstance(sizes, np.ndarray) and sizes.ndim == 1 and sizes.dtype.kind in "iu" and len(sizes) == n:
            lengths = sizes
    if lengths is None:
        lengths = np.zeros(n, dtype=np.int64)
        for a in range(0, n, _READ_CHUNK):
            chunk = read_many(seqs, range(a, min(n, a + _READ_CHUNK)))
            lengths[a : a + len(chunk)] = [len(x) for x in chunk]
        return lengths
    out = np.asarray(lengths)
    if out.ndim != 1 or len(out) != n or (len(out) and out.dtype.kind not in "iu"):
        raise ValueError(f"{where}: lengths must be {n} ints, one per sequence; got shape {out.shape}, dtype {out.dtype}")
    out = out.astype(np.int64)
    if len(out) and out.min() < 0:
        raise ValueError(f"{where}: lengths must be >= 0; sequence {int(np.argmin(out))} has length {int(out.min())}")
    return out


class PackPlan:
    """Which pieces go in which row: pieces ``row_ptr[r]:row_ptr[r + 1]`` fill row ``r`` in order."""

    def __init__(self, seq: np.ndarray, start: np.ndarray, size: np.ndarray, row_ptr: np.ndarray, length: int):
        self.seq, self.start, self.size, self.row_ptr, self.length = seq, start, size, row_ptr, length

    @property
    def rows(self) -> int:
        return len(self.row_ptr) - 1

    def fill(self) -> float:
        """The fraction of token slots that hold tokens (1.0: no padding)."""
        return float(self.size.sum()) / (self.rows * self.length) if self.rows else 1.0


def plan_pack(lengths: np.ndarray, length: int, method: str, window: int, overflow: str) -> PackPlan:
    if method == "concat":
        return _concat(lengths, length)
    seq, start, size = _pieces(lengths, length, overflow)
    fit = _best_fit if method == "best_fit" else _first_fit
    bins = np.asarray(fit(size.tolist(), seq.tolist(), length, window), dtype=np.int64)
    order = np.argsort(bins, kind="stable")  # rows in bin order; a row's pieces in sequence order
    row_ptr = np.zeros((bins.max() + 2) if len(bins) else 1, dtype=np.int64)
    np.cumsum(np.bincount(bins, minlength=len(row_ptr) - 1), out=row_ptr[1:])
    return PackPlan(seq[order], start[order], size[order], row_ptr, length)


def _concat(lengths: np.ndarray, length: int) -> PackPlan:
    """One stream of every token cut every ``length``: a piece wherever a sequence or a row begins."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    starts = ends - lengths
    cuts = np.concatenate([starts[lengths > 0], np.arange(0, total, length, dtype=np.int64)])
    cuts.sort(kind="stable")  # two sorted runs: merged in linear time (np.union1d hashes: 10x slower)
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]] if len(cuts) else cuts
    piece_end = np.append(cuts[1:], total)
    seq = np.searchsorted(ends, cuts, side="right")  # the sequence whose span holds each cut
    row = cuts // length
    rows = -(-total // length)
    row_ptr = np.searchsorted(row, np.arange(rows + 1), side="left").astype(np.int64)
    return PackPlan(seq.astype(np.int64), cuts - starts[seq], piece_end - cuts, row_ptr, length)


def _pieces(lengths: np.ndarray, length: int, overflow: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces to pack: a sequence, or its first ``length`` tokens (truncate), or its runs of
    ``length`` tokens and the rest (split); empty sequences give none."""
    over = np.flatnonzero(lengths > length)
    if len(over) and overflow == "error":
        i = int(over[0])
        raise ValueError(f"pack: sequence {i} has {int(lengths[i])} tokens, more than length={length} "
                         f"(overflow='error'; {len(over)} such sequences); use overflow='split' or 'truncate'")
    if overflow == "truncate" or not len(over):
        seq = np.flatnonzero(lengths > 0)
        return seq, np.zeros(len(seq), dtype=np.int64), np.minimum(lengths[seq], length)
    count = -(-lengths // length)
    seq = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    first = np.repeat(np.cumsum(count) - count, count)
    start = (np.arange(len(seq), dtype=np.int64) - first) * length
    return seq, start, np.minimum(lengths[seq] - start, length)


def _best_fit(sizes: list[int], seqs: list[int], capacity: int, window: int) -> list[int]:
    """The row of each piece: the open row it leaves the least room in (the first such on ties),
    else a new row. A row stays open while the pieces come from sequences less than ``window``
    after the one that opened it. ``free`` is sorted, each entry ``room << 32 | row``: one bisect
    per piece; rows that closed are dropped when met, and all at once every ``window`` sequences."""
    free: list[int] = []
    opened: list[int] = []  # the sequence that opened each row
    out: list[int] = []
    purge_at = window
    for s, i in zip(sizes, seqs):
        oldest = i - window  # rows opened by this sequence or earlier are closed
        if i >= purge_at:
            free = [key for key in free if opened[key & 0xFFFFFFFF] > oldest]
            purge_at = i + window
        k = bisect_left(free, s << 32)
        while k < len(free) and opened[free[k] & 0xFFFFFFFF] <= oldest:
            del free[k]
        if k < len(free):
            key = free.pop(k)
            b, room = key & 0xFFFFFFFF, (key >> 32) - s
        else:
            b, room = len(opened), capacity - s
            opened.append(i)
        if room:
            insort(free, room << 32 | b)
        out.append(b)
    return out


def _first_fit(sizes: list[int], seqs: list[int], capacity: int, window: int) -> list[int]:
    """The row of each piece: the first open row with room for it, else a new row (rows open as in
    :func:`_best_fit`): one numpy scan of the open rows per piece (a piece of ``capacity`` tokens
    opens a row without a scan)."""
    room = np.zeros(len(sizes), dtype=np.int64)
    opened: list[int] = []
    out: list[int] = []
    lo = 0  # the first open row: rows open in sequence order, so they close in that order too
    for s, i in zip(sizes, seqs):
        while lo < len(opened) and opened[lo] <= i - window:
            lo += 1
        b = n = len(opened)
        if s < capacity and lo < n:
            fits = room[lo:n] >= s
            k = int(fits.argmax())
            if fits[k]:
                b = lo + k
        if b == n:
            opened.append(i)
            room[b] = capacity
        room[b] -= s
        out.append(b)
    return out


def plan_buckets(lengths: np.ndarray, max_tokens: int, window: int, multiple: int, seed: int, epoch: int,
                 drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """The batches of an epoch as ``(items, ptr)``: batch ``b`` is items ``items[ptr[b]:ptr[b+1]]``.

    The items in a random order of ``(seed, epoch)``, cut in windows of ``window``, each sorted by
    length and cut greedily where one more item would pass the budget; then the batches in a random
    order. With ``drop_last``, a window's last batch is left out unless the budget closed it."""
    rounded = -(-lengths // multiple) * multiple
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x6275636B])))
    perm = rng.permutation(len(lengths))
    win = np.arange(len(lengths)) // window
    items = perm[np.lexsort((lengths[perm], win))]  # within each window, shortest first
    starts, keep = _cut(rounded[items].tolist(), max_tokens, window, drop_last)
    stops = np.append(starts[1:], len(items))
    starts, stops = starts[keep], stops[keep]
    order = rng.permutation(len(starts))
    starts, sizes = starts[order], (stops - starts)[order]
    ptr = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(sizes, out=ptr[1:])
    pos = np.repeat(starts - ptr[:-1], sizes) + np.arange(ptr[-1], dtype=np.int64)
    return items[pos].astype(np.int64), ptr


def _cut(rounded: list[int], max_tokens: int, window: int, drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """Where each batch starts in the sorted items, and which batches to keep."""
    starts, keep = [], []
    count = longest = 0
    for i, r in enumerate(rounded):  # ascending within a window: r is the batch's longest so far
        window_starts = i % window == 0
        if window_starts or (count + 1) * r > max_tokens:
            if starts:  # the budget closed it, or the window's end did (then: was it full?)
                keep.append(not drop_last or not window_starts or (count + 1) * longest > max_tokens)
            starts.append(i)
            count = 0
        count, longest = count + 1, r
    if starts:
        keep.append(not drop_last or (count + 1) * longest > max_tokens)
    return np.asarray(starts, dtype=np.int64), np.asarray(keep, dtype=bool)
