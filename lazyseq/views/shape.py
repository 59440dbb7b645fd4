"""Views that group or join sequences: batch, unbatch, collate, concatenate, split."""

from __future__ import annotations

import bisect
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..core.base import Slice, View
from ..core.node import Exhausted, bulk_reader, check_source, columnar, is_finite, length, read_columns, read_many, reader, sizer
from ..core.routed import Routed
from ..errors import wrap_error
from ..helpers import fname

__all__ = ["Pad", "batch", "unbatch", "collate", "concatenate", "split"]


class Pad:
    """A padding value for :func:`batch`, so that ``None`` itself can be the padding.

    ``batch(seq, k, pad=None)`` means "no padding", as in seqtools; ``pad=Pad(None)`` pads with
    ``None``.

    >>> import lazyseq
    >>> list(lazyseq.batch([1, 2, 3], 2, pad=lazyseq.Pad(None)))
    [[1, 2], [3, None]]
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Pad({self.value!r})"

    def __reduce__(self):
        return (Pad, (self.value,))


class Batch(View):
    def __init__(self, seq: Any, k: int, drop_last: bool, pad: Any, collate_fn: Callable | None):
        self.src, self._rd, self._rdm = check_source(seq, "batch"), reader(seq), bulk_reader(seq)
        self.k = operator.index(k)
        if self.k < 1:
            raise ValueError(f"batch: k must be >= 1, got {k}")
        if drop_last and pad is not None:
            warnings.warn("batch: pad is ignored because drop_last=True drops the incomplete batch",
                          UserWarning, stacklevel=3)
            pad = None
        self.drop_last, self.padded = drop_last, pad is not None
        self.pad = pad.value if isinstance(pad, Pad) else pad
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"batch: collate_fn must be callable, got {type(collate_fn).__name__}")
        self.collate_fn = collate_fn
        self.finite = is_finite(seq)
        self._srclen = sizer(seq) if self.finite else None
        self._by_columns: bool | None = None  # known at the first read: see _columns

    def _columns(self) -> bool:
        """Whether a batch is read by columns (``node.read_columns``): with ``default_collate``
        (marked ``by_columns``) over a source that can, e.g. ``batch(shuffle(store), k,
        collate_fn=default_collate)``: one gather per field and shard, no item built."""
        by = self._by_columns
        if by is None:
            by = self._by_columns = bool(getattr(self.collate_fn, "by_columns", False)) and self.finite \
                and not self.padded and columnar(self.src)
        return by

    def _len(self) -> int:
        full, rest = divmod(len(self.src), self.k)
        return full + (1 if rest and not self.drop_last else 0)

    def _bounds(self, i: int) -> tuple[int, int]:
        start = i * self.k
        return start, (min(start + self.k, len(self.src)) if self.finite else start + self.k)

    def _get_fn(self) -> Callable[[int], Any]:
        listed = self.finite and not self.padded and not getattr(self.collate_fn, "by_columns", False)
        return self._get_listed if listed and type(self)._get is Batch._get else self._get

    def _get_listed(self, i: int) -> Any:
        """``_get`` of a finite batch without pad that does not read by columns."""
        start = i * self.k
        stop = start + self.k
        n = self._srclen()
        items = self._rdm(range(start, stop if stop < n else n))
        return items if self.collate_fn is None else self._collate(items, i)

    def _get(self, i: int) -> Any:
        k = self.k
        start = i * k
        stop = start + k
        if self.finite:
            n = self._srclen()
            if stop > n:
                stop = n
            if self._by_columns or (self._by_columns is None and self._columns()):
                try:
                    out = read_columns(self.src, np.arange(start, stop, dtype=np.int64))
                except ValueError:  # items default_collate refuses (shapes differ): it says why, below
                    out = NotImplemented
                if out is not NotImplemented:
                    return out
            items = self._rdm(range(start, stop))
        else:
            items = self._get_unsized(start, stop)
            stop = start + len(items)
        if self.padded and stop - start < k:
            items.extend([self.pad] * (k - (stop - start)))
        return items if self.collate_fn is None else self._collate(items, i)

    def _collate(self, items: list, i: int) -> Any:
        try:
            return self.collate_fn(items)
        except Exception as e:
            raise wrap_error(e, i, self)  # noqa: B904

    def _get_unsized(self, start: int, stop: int) -> list:
        """The items of a batch of a source of unknown size: the last batch may be short."""
        items, rd = [], self._rd
        try:
            for j in range(start, stop):
                items.append(rd(j))
        except Exhausted:
            if not items or self.drop_last:
                raise
        return items

    def _set(self, i: int, value: Any) -> None:
        start, stop = self._bounds(i)
        value = list(value)
        n = stop - start
        if len(value) != n and not (self.padded and len(value) == self.k):
            raise ValueError(f"{self.describe()}: batch {i} holds {n} items, {len(value)} given")
        for j, v in zip(range(start, stop), value):
            self.src[j] = v

    def _part(self, i: int) -> View:
        return Slice(self.src, range(*self._bounds(i)))

    def describe(self) -> str:
        extra = ", drop_last" if self.drop_last else f", pad={self.pad!r}" if self.padded else ""
        fn = f", collate_fn={fname(self.collate_fn)}" if self.collate_fn is not None else ""
        return f"batch({self.k}{extra}{fn})"


def batch(seq: Any, k: int, drop_last: bool = False, pad: Any = None, collate_fn: Callable | None = None) -> View:
    """``seq`` in groups of ``k`` items: item ``i`` is ``[seq[i*k], ..., seq[i*k + k - 1]]``.

    The last group may be shorter: ``drop_last=True`` leaves it out, ``pad`` fills it up to ``k``
    items (``Pad(None)`` pads with ``None``). ``collate_fn`` turns each list of items into a batch,
    e.g. ``np.stack``. Differences from seqtools: no extra padding batch when ``len(seq) % k == 0``;
    ``pad`` with ``drop_last=True`` warns (seqtools logged it where nobody saw). Writing a batch
    writes its items to ``seq``.

    >>> import lazyseq
    >>> b = lazyseq.batch(list(range(10)), 4, pad=-1)
    >>> b[0], b[-1], len(b)
    ([0, 1, 2, 3], [8, 9, -1, -1], 3)
    >>> len(lazyseq.batch(range(8), 4, pad=-1))
    2
    """
    return Batch(seq, k, drop_last, pad, collate_fn)


class Unbatch(View):
    def __init__(self, seq: Any, batch_size: int, last_batch_size: int | None):
        self.src, self._rd = check_source(seq, "unbatch"), reader(seq)
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"unbatch: batch_size must be >= 1, got {batch_size}")
        self.last_batch_size = self.batch_size if not last_batch_size else operator.index(last_batch_size)
        if not 0 < self.last_batch_size <= self.batch_size:
            raise ValueError(f"unbatch: need 0 < last_batch_size <= batch_size, got {last_batch_size}")
        self.finite = is_finite(seq)

    def _len(self) -> int:
        n = len(self.src)
        return 0 if n == 0 else (n - 1) * self.batch_size + self.last_batch_size

    def _get(self, i: int) -> Any:
        b, j = divmod(i, self.batch_size)
        return self._rd(b)[j]

    def _get_many(self, idx: Sequence[int]) -> list:
        out, cur, items, bs = [], -1, None, self.batch_size
        for i in idx:  # read each batch once for a run of its items
            b, j = divmod(i, bs)
            if b != cur:
                cur, items = b, self._rd(b)
            out.append(items[j])
        return out

    def __iter__(self) -> Iterator:
        n = len(self) if self.finite else None
        done = 0
        for items in self.src:
            for x in items:
                if done == n:
                    return
                yield x
                done += 1

    def _set(self, i: int, value: Any) -> None:
        b, j = divmod(i, self.batch_size)
        src = self.src
        if isinstance(src, (Batch, Split)):
            src._part(b)[j] = value
        elif isinstance(src, View):  # its batches may be computed (copies): a write would be lost
            raise TypeError(f"{self.describe()} writes only through batch(...) or split(...) or a stored "
                            f"sequence of batches, not {src.describe()}: write to the source instead")
        else:
            src[b][j] = value

    def describe(self) -> str:
        return f"unbatch({self.batch_size})"


def unbatch(seq: Any, batch_size: int, last_batch_size: int | None = None) -> View:
    """The items of a sequence of batches, one by one: the inverse of :func:`batch`.

    Every batch holds ``batch_size`` items but the last, which holds ``last_batch_size``
    (default: ``batch_size``).

    >>> import lazyseq
    >>> u = lazyseq.unbatch([[0, 1, 2], [3, 4, 5], [6, 7]], 3, last_batch_size=2)
    >>> len(u), u[4], list(u)
    (8, 4, [0, 1, 2, 3, 4, 5, 6, 7])
    """
    return Unbatch(seq, batch_size, last_batch_size)


class Collate(View):
    def __init__(self, seqs: Sequence[Any]):
        self.seqs = tuple(check_source(s, "collate") for s in seqs)
        if not self.seqs:
            raise ValueError("collate: give at least one sequence")
        lens = {length(s) for s in self.seqs} - {None}
        if len(lens) > 1:
            raise ValueError(f"collate: the sequences have different lengths {sorted(lens)}")
        self._rds = tuple(reader(s) for s in self.seqs)
        self.finite = bool(lens)

    def _len(self) -> int:
        return min(n for n in map(length, self.seqs) if n is not None)

    def _get(self, i: int) -> tuple:
        return tuple([rd(i) for rd in self._rds])

    def _get_many(self, idx: Sequence[int]) -> list:
        return list(zip(*[read_many(s, idx) for s in self.seqs]))

    def _set(self, i: int, value: Any) -> None:
        value = tuple(value)
        if len(value) != len(self.seqs):
            raise ValueError(f"{self.describe()}: an item is a tuple of {len(self.seqs)} values, {len(value)} given")
        for s, v in zip(self.seqs, value):
            s[i] = v

    def children(self) -> tuple:
        return self.seqs

    def describe(self) -> str:
        return f"collate({len(self.seqs)} sequences)"


def collate(seqs: Sequence[Any]) -> View:
    """Item ``i`` is the tuple of item ``i`` of every sequence (a lazy ``zip``); writes unzip.

    >>> import lazyseq
    >>> c = lazyseq.collate([[1, 2, 3, 4], 'abcd', [5, 6, 7, 8]])
    >>> c[2]
    (3, 'c', 7)
    """
    return Collate(seqs)


class Concatenate(Routed):
    def __init__(self, seqs: Sequence[Any]):
        flat: list = []
        for s in seqs:
            flat.extend(s.seqs if isinstance(s, Concatenate) else [check_source(s, "concatenate")])
        self.seqs = tuple(flat)
        self._rds = tuple(reader(s) for s in self.seqs)
        self.offsets = [0]
        for k, s in enumerate(self.seqs):
            n = length(s)
            if n is None:
                if k != len(self.seqs) - 1:
                    raise ValueError(f"concatenate: sequence {k} has no len(), so nothing after it "
                                     "could be reached; only the last sequence may be infinite")
                self.finite = False
                break
            self.offsets.append(self.offsets[-1] + n)

    @property
    def sequences(self) -> tuple:
        """The sequences, nested concatenations flattened (seqtools' name for ``seqs``)."""
        return self.seqs

    def _len(self) -> int:
        return self.offsets[-1]

    def _where(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.offsets, i) - 1
        return k, i - self.offsets[k]

    def describe(self) -> str:
        return f"concatenate({len(self.seqs)} sequences)"


def concatenate(seqs: Sequence[Any]) -> View:
    """The items of every sequence, one sequence after the other; writes go to the owner.

    >>> import lazyseq
    >>> cat = lazyseq.concatenate([[0, 1, 2, 3], [4, 5], [6, 7, 8]])
    >>> cat[5], list(cat)
    (5, [0, 1, 2, 3, 4, 5, 6, 7, 8])
    """
    return Concatenate(seqs)


class Split(View):
    def __init__(self, seq: Any, edges: Any):
        self.src = check_source(seq, "split")
        n = len(seq)
        if not hasattr(edges, "__len__"):  # an int (a numpy array has __index__ too)
            parts = operator.index(edges) + 1
            if parts < 1 or n % parts:
                raise ValueError(f"split: {parts - 1} cuts give {parts} parts, which must divide the length {n}")
            step = n // parts
            self.starts, self.stops = list(range(0, n, step)) if step else [], list(range(step, n + 1, step)) if step else []
        elif len(edges) and not hasattr(edges[0], "__len__"):
            self.starts, self.stops = [], []
            for e in edges:  # cut points: the start and the end are implicit
                start = self.stops[-1] if self.stops else 0
                self.starts.append(start)  # already clipped: the previous stop
                self.stops.append(max(0, min(operator.index(e), n)))
            self.starts.append(self.stops[-1])
            self.stops.append(n)
        else:
            self.starts = [max(0, min(operator.index(a), n)) for a, _ in edges]
            self.stops = [max(0, min(operator.index(b), n)) for _, b in edges]

    def _len(self) -> int:
        return len(self.starts)

    def _get(self, i: int) -> Any:
        return self.src[self.starts[i] : self.stops[i]]

    def _part(self, i: int) -> View:
        return Slice(self.src, range(self.starts[i], self.stops[i]))

    def _set(self, i: int, value: Any) -> None:
        part = self._part(i)
        value = list(value)
        if len(value) != len(part):
            raise ValueError(f"{self.describe()}: part {i} holds {len(part)} items, {len(value)} given")
        for j, v in zip(part.r, value):
            self.src[j] = v

    def describe(self) -> str:
        return f"split({len(self.starts)} parts)"


def split(seq: Any, edges: Any) -> View:
    """``seq`` cut into consecutive parts; each part is ``seq[start:stop]`` (the source's own slice).

    ``edges`` is an int (that many cuts into equal parts, which must divide ``len(seq)``), a list
    of cut positions (the start and the end are implicit), or a list of ``(start, stop)`` pairs.
    Positions are clipped to ``[0, len(seq)]`` (seqtools clipped starts to ``len(seq) - 1``, so a
    part starting at the end held the last item again).

    >>> import lazyseq
    >>> data = ['aa', 'ab', 'ac', 'ad', 'ba', 'bb', 'ca', 'cb', 'cc', 'cd']
    >>> list(lazyseq.split(data, [4, 6]))
    [['aa', 'ab', 'ac', 'ad'], ['ba', 'bb'], ['ca', 'cb', 'cc', 'cd']]
    >>> list(lazyseq.split(data, [(0, 2), (4, 6), (6, 8)]))
    [['aa', 'ab'], ['ba', 'bb'], ['ca', 'cb']]
    >>> list(lazyseq.split(list(range(6)), 2))
    [[0, 1], [2, 3], [4, 5]]
    """
    return Split(seq, edges)
