"""The View base class: Python list semantics for keys, slices, index arrays and writes, once.

A view implements ``_get(i)`` (``i`` a valid non-negative ``int``) and, when its length is not
its source's, ``_len()`` (see :class:`lazyseq.core.node.Node` for the whole read protocol). Everything a
user can pass as a key is checked and normalised here, at the top, so views call each other's
``_get`` without re-checking.

:class:`Remap` serves views whose item ``i`` is item ``_map(i)`` of one source (slices, cycle,
shard, shuffle): single reads, bulk reads, reads past failures and writes all follow from that one
mapping. Views over several parts derive from :class:`lazyseq.core.routed.Routed`.

:class:`Gather` lives here because an index-array key (``v[[3, 1]]``) builds one; the public
``lazyseq.gather``/``take`` that make one are in :mod:`lazyseq.views.indexing`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import EvaluationError, raised, wrap_error
from .keys import compose, index_array, span
from .node import (
    Exhausted,
    Failed,
    Node,
    bulk_reader,
    check_source,
    checks_keys,
    columnar,
    each,
    into,
    is_finite,
    length,
    read_array,
    read_columns,
    read_each,
    read_many,
    reader,
    sizer,
)

__all__ = ["View", "Remap", "Slice", "InfiniteSlice", "Gather"]


class View(Node):
    """A lazy sequence. Subclasses implement ``_get`` (and ``_len`` when the length is not the
    source's); infinite views (and views of unknown size) set ``finite = False`` and have no ``len``."""

    def _slice(self, r: range) -> View:
        """The view of items ``r`` (a valid range of this view's indices)."""
        return Slice(self, r)

    def _key(self, key: int, what: str = "index") -> int:
        """A valid non-negative index for the int ``key``, or IndexError as a list raises it."""
        if self.finite:
            n = self._len()
            if key < 0:
                key += n
            if key < 0 or key >= n:
                raise IndexError(f"{what} {key if key >= 0 else key - n} out of range for {self.describe()} of length {n}")
        elif key < 0:
            raise IndexError(f"negative {what} {key} on {self.describe()}, which has no len(): index from the start")
        return key

    # -- reads -----------------------------------------------------------------------------------
    def __getitem__(self, key):
        if type(key) is not int:
            try:
                key = operator.index(key)
            except TypeError:
                return self._subview(key)
        if not (self.finite and 0 <= key < self._len()):  # the common case costs no call to _key
            key = self._key(key)
        try:
            return self._get(key)
        except Exception as e:
            raise raised(e, key, self)  # noqa: B904 (an error is wrapped once, with its cause)

    def __iter__(self) -> Iterator:
        get, i = self._get, -1
        try:
            if self.finite:
                for i in range(self._len()):
                    yield get(i)
            else:
                for i in itertools.count():
                    try:
                        item = get(i)
                    except Exhausted:  # a view of unknown size (uniter) ran out
                        return
                    yield item
        except EvaluationError as e:
            raise raised(e, i, self)  # noqa: B904
        except Exception as e:  # an IndexError too: iteration does not end on a bad inner index
            raise wrap_error(e, i, self)  # noqa: B904

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        # Sequence.index stops at the first IndexError, which would hide an inner one (a bad gather
        # index) as "not found"; a slice's iteration raises it.
        # a Python int: a numpy start would wrap (np.int8(127) + 1) and leak into the result
        first = range(self._len())[start:stop].start if self.finite else 0 if start is None else operator.index(start)
        for i, v in enumerate(self[start:stop]):
            if v is value or v == value:
                return first + i
        raise ValueError(f"{value!r} is not in {self.describe()}")

    def __bool__(self) -> bool:
        return not self.finite or self._len() > 0

    def _repr_html_(self) -> str:
        """Notebooks: the tree, the length and the first items (thumbnails for images), read only
        when shown, bounded in time (:mod:`lazyseq.core.html`)."""
        from .html import view_html

        return view_html(self)

    def _subview(self, key) -> View:
        if isinstance(key, slice):
            if self.finite:
                return self._slice(range(self._len())[key])
            return _infinite_slice(self, key)
        return Gather(self, self._index_array(key))

    def _index_array(self, key) -> list[int]:
        """Check and normalise a list or array of indices (or a boolean mask)."""
        if self.finite:
            return index_array(key, self._len(), self.describe())
        return index_array(key, None, self.describe(), mask_len=lambda: len(self))

    # -- writes ----------------------------------------------------------------------------------
    def __setitem__(self, key, value) -> None:
        if type(key) is not int:
            try:
                key = operator.index(key)
            except TypeError:
                return self._set_many(key, value)
        self._set(self._key(key, "assignment index"), value)

    def _set_many(self, key, values) -> None:
        if isinstance(key, slice):
            targets = range(self._len())[key] if self.finite else _infinite_range(self, key)
            if targets is None:
                raise ValueError(f"{self.describe()} has no len(): cannot assign to an open-ended slice, give a stop")
        else:
            targets = self._index_array(key)
        if not hasattr(values, "__len__") or isinstance(values, (str, bytes)):
            values = list(values)
        if len(values) != len(targets):
            raise ValueError(
                f"{self.describe()} only supports one-to-one assignment: {len(targets)} items "
                f"selected, {len(values)} given (views cannot grow or shrink)"
            )
        for i, v in zip(targets, values):
            self._set(i, v)


# -- one source, remapped --------------------------------------------------------------------------
class Remap(View):
    """A view whose item ``i`` is item ``_map(i)`` of its one source ``src``.

    A subclass sets ``src`` (and calls :meth:`_bind`) and provides ``_map`` (and ``_map_many``
    where it maps many indices faster than one by one); reads, bulk reads, reads past failures and
    writes follow. ``_map`` may be an instance attribute (a bound builtin is the fastest call).
    """

    src: Any

    def _bind(self, src: Any, where: str) -> None:
        self.src, self._rd, self._rdm = check_source(src, where), reader(src), bulk_reader(src)

    def _map(self, i: int) -> int:
        raise NotImplementedError

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        m = self._map
        return [m(i) for i in idx]

    def _get(self, i: int) -> Any:
        return self._rd(self._map(i))

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._rdm(self._map_many(idx))

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        try:
            js = self._map_many(idx)
        except IndexError:  # a bad index from a gather that leaves the checks to us: item by item
            return each(self._get, idx, out)
        return read_each(self.src, js, out)

    def _set(self, i: int, value: Any) -> None:
        self.src[self._map(i)] = value

    # reads by columns (node.read_columns): the indices go down the chain as one array
    def _map_array(self, idx: np.ndarray) -> np.ndarray:
        """``_map_many`` on an int64 array, giving one (remaps that can, vectorise it)."""
        return np.asarray(self._map_many(idx.tolist()), dtype=np.int64)

    def _columnar(self) -> bool:
        return columnar(self.src)

    def _get_columns(self, idx: np.ndarray) -> Any:
        return read_columns(self.src, self._map_array(idx))

    def _get_array(self, idx: np.ndarray) -> np.ndarray:
        return read_array(self.src, self._map_array(idx))


class Slice(Remap):
    """Items ``r`` (a range) of ``src``; slices of slices fold into one range."""

    checks_keys = True  # range indexing does

    def __init__(self, src: Any, r: range):
        self._bind(src, "slice")
        self.r, self._map = r, r.__getitem__
        self._n = span(r)
        self._len = itertools.repeat(self._n).__next__  # a fixed length, returned by a C call

    def __getitem__(self, key):
        # a slice tops many chains (v[a:b][i]): an int key inside it is read in this one frame
        if type(key) is int and 0 <= key < self._n:
            try:
                return self._rd(self.r[key])
            except Exception as e:
                raise raised(e, key, self)  # noqa: B904 (as View.__getitem__)
        return View.__getitem__(self, key)

    def _map_array(self, idx: np.ndarray) -> np.ndarray:
        return self.r.start + idx * self.r.step

    def _slice(self, r: range) -> View:
        sub = compose(self.r.start, self.r.step, r)
        return self.src._slice(sub) if isinstance(self.src, View) else Slice(self.src, sub)

    def __reduce__(self):
        return (Slice, (self.src, self.r))

    def describe(self) -> str:
        r = self.r
        return f"slice[{r.start}:{r.stop}:{r.step}]" if r.step != 1 else f"slice[{r.start}:{r.stop}]"


class InfiniteSlice(Remap):
    """Items ``start, start + step, ...`` of an infinite view (``step > 0``)."""

    finite = False

    def __init__(self, src: View, start: int, step: int):
        self._bind(src, "slice")
        self.start, self.step = start, step

    def _map(self, i: int) -> int:
        return self.start + i * self.step

    def _slice(self, r: range) -> View:
        return Slice(self.src, compose(self.start, self.step, r))

    def describe(self) -> str:
        return f"slice[{self.start}::{self.step}]"


def _infinite_range(view: View, key: slice) -> range | None:
    """The finite range a slice selects from a view without len, or None if it is unbounded."""
    step = 1 if key.step is None else operator.index(key.step)
    if step == 0:
        raise ValueError("slice step cannot be zero")
    start = None if key.start is None else operator.index(key.start)
    stop = None if key.stop is None else operator.index(key.stop)
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        raise IndexError(
            f"{view.describe()} has no len(): slice bounds relative to the end are meaningless; "
            "use non-negative bounds"
        )
    if step > 0:
        return None if stop is None else range(start or 0, stop, step)
    if start is None:
        raise IndexError(f"{view.describe()} has no len(): a negative-step slice needs a start")
    return range(start, -1 if stop is None else stop, step)


def _infinite_slice(view: View, key: slice) -> View:
    r = _infinite_range(view, key)
    if r is None:
        start, step = operator.index(key.start or 0), 1 if key.step is None else operator.index(key.step)
        if isinstance(view, InfiniteSlice):
            return InfiniteSlice(view.src, view.start + start * view.step, step * view.step)
        return InfiniteSlice(view, start, step)
    return view._slice(r) if r else Slice(view, r)


# -- several sources, routed -----------------------------------------------------------------------
# -- gather: the view an index array returns --------------------------------------------------------
class Gather(View):
    """Items ``indexes`` of ``src``, in that order (see :func:`lazyseq.gather`)."""

    def __init__(self, src: Any, indexes: Any):
        self.src, self.indexes = check_source(src, "gather"), check_source(indexes, "gather indexes")
        self._rd, self._ird, self._srcfinite = reader(src), reader(indexes), is_finite(src)
        self._rdm = bulk_reader(src)
        self._list = isinstance(indexes, (list, tuple, range))
        # A source that checks keys itself (a list, a map over one...) is read without checking
        # here; its IndexError is then turned into a clear one below.
        self._trust = checks_keys(src)
        self.checks_keys = checks_keys(indexes)
        self.finite = is_finite(indexes)
        # lengths through _len for views: len() overflows past sys.maxsize (gather(v, arange(10**30)))
        self._n, self._srclen = sizer(indexes) if self.finite else None, sizer(src) if self._srcfinite else None
        if self.finite:
            self._len = self._n  # one call less per read of a view above (a batch asks on every read)

    def _len(self) -> int:
        return self._n()

    def _slice(self, r: range) -> View:
        # A gather of the sliced indexes, so that `.indexes` is `indexes[key]` (as in seqtools):
        # lists and tuples are copied (the items a reader will read anyway), arrays and ranges
        # sliced for free, other sequences sliced lazily.
        ind = self.indexes
        if isinstance(ind, (list, tuple, range, np.ndarray)):
            # r is non-empty from 0 up (an empty one may start at -1), it may stop at -1 going down
            return Gather(self.src, ind[slice(r.start, r.stop if r.stop >= 0 else None, r.step) if r else slice(0)])
        return Gather(self.src, ind._slice(r) if isinstance(ind, View) else Slice(ind, r))

    def _index(self, j: Any) -> int:
        if type(j) is not int:
            j = operator.index(j)
        n = self._srclen() if self._srcfinite else None
        if j < 0 and n is not None:
            j += n
        if j < 0 or (n is not None and j >= n):
            raise IndexError(f"{self.describe()}: index {j if n is None or j >= 0 else j - n} is out of range "
                             f"for its source of length {n}")
        return j

    def _get(self, i: int) -> Any:
        j = self._ird(i)
        if self._trust:
            try:
                return self._rd(j)
            except IndexError:
                self._index(j)
                raise
        return self._rd(self._index(j))

    def _indices(self, idx: Sequence[int], read: Callable[[Any, Sequence[int]], list]) -> list:
        """The entries ``idx`` of the index list (an index view is read with ``read``), unchecked."""
        ind = self.indexes
        if self._list:
            return [ind[i] for i in idx]
        if isinstance(ind, np.ndarray):
            return ind[np.asarray(idx, dtype=np.int64)].tolist() if len(idx) > 32 else [int(ind[i]) for i in idx]
        return read(ind, idx)

    def _get_many_fn(self) -> Callable[[Sequence[int]], list]:
        return self._gather_trusted if self._trust and type(self)._get_many is Gather._get_many else self._get_many

    def _gather_trusted(self, idx: Sequence[int]) -> list:
        """``_get_many`` over a source that checks its keys itself: its IndexError, if any, is
        then turned into a clear one naming our bad index."""
        ind = self.indexes
        if not self._list:
            js = self._indices(idx, read_many)
        elif type(idx) is range and idx.step == 1 and 0 <= idx.start and idx.stop <= len(ind):
            js = ind[idx.start : idx.stop]  # a batch reads a run of positions: one slice (never a short one)
        else:
            js = list(map(ind.__getitem__, idx))
        try:
            return self._rdm(js)
        except IndexError:
            for j in js:
                self._index(j)
            raise

    def _get_many(self, idx: Sequence[int]) -> list:
        if self._trust:
            return self._gather_trusted(idx)
        js = list(map(self.indexes.__getitem__, idx)) if self._list else self._indices(idx, read_many)
        return self._rdm([self._index(j) for j in js])  # checked: an IndexError now is the source's own

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        raw = self._indices(idx, read_each)  # an index view's failing items fail ours
        items: list = [None] * len(idx)
        at, js = [], []  # where the readable items go, and their source indices
        for k, j in enumerate(raw):
            if type(j) is Failed:
                items[k] = j
                continue
            if not self._trust:
                try:
                    j = self._index(j)
                except Exception as e:
                    items[k] = Failed(e)
                    continue
            at.append(k)
            js.append(j)
        for k, j, x in zip(at, js, read_each(self.src, js)):
            if self._trust and type(x) is Failed and isinstance(x.error, IndexError) \
                    and not isinstance(x.error, Exhausted):
                try:  # as _get does: an IndexError from the source may be a bad index of ours
                    self._index(j)
                except IndexError as e:
                    x = Failed(e)
            items[k] = x
        return into(out, items)

    def _set(self, i: int, value: Any) -> None:
        self.src[self._index(self._ird(i))] = value

    # reads by columns: the index entries as one array, checked as _index does (else the item path)
    def _source_array(self, idx: np.ndarray) -> np.ndarray | None:
        try:
            js = read_array(self.indexes, idx)
        except (TypeError, ValueError, IndexError, OverflowError):  # not ints: the item path says why
            return None
        if self._srcfinite:
            n = self._srclen()
            if len(js) and js.min() < 0:  # negative entries count from the end, as in _index
                js = np.where(js < 0, js + n, js)
            if len(js) and (js.min() < 0 or js.max() >= n):
                return None
        elif len(js) and js.min() < 0:
            return None
        return js

    def _columnar(self) -> bool:
        return columnar(self.src)

    def _get_columns(self, idx: np.ndarray) -> Any:
        js = self._source_array(idx)
        return NotImplemented if js is None else read_columns(self.src, js)

    def _get_array(self, idx: np.ndarray) -> np.ndarray:
        js = self._source_array(idx)
        return View._get_array(self, idx) if js is None else read_array(self.src, js)

    def children(self) -> tuple:
        return (self.src, self.indexes) if isinstance(self.indexes, View) else (self.src,)

    def describe(self) -> str:
        n = length(self.indexes)
        return f"gather({'unbounded' if n is None else n} indexes)"

