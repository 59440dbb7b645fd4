"""The View base class: keys, slices, index arrays, bulk reads, writes, errors and repr, once.

A view implements ``__len__`` and ``_get(i)`` (``i`` a valid non-negative ``int``); everything a
user can pass as a key is checked and normalised here, at the top, so views call each other's
``_get`` without re-checking. ``_get_many(idx)`` reads many valid indices in one call; views
override it where they can do better than a loop. ``_get_each(idx)`` does the same but does not
stop at an item that raises: prefetch workers evaluate chunks with it, so one bad item neither
loses nor re-computes the others.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .errors import EvaluationError, NotWrapped, wrap_error

__all__ = ["View", "Slice", "Gather", "Exhausted", "Failed", "gather", "take", "reader", "read_many", "read_each",
           "length"]


class Exhausted(IndexError):
    """The end of a sequence of unknown size (a ``uniter``, a source without ``len``) was reached.

    Iterating a view without ``len`` stops on this error only: any other ``IndexError`` met while
    reading an item is a bug in the pipeline (a bad gather index...) and is raised.
    """


class Failed:
    """An item of a ``_get_each`` result whose read raised: the exception, as ``_get`` raises it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def each(get: Callable[[int], Any], idx: Sequence[int]) -> list:
    """``[get(i) for i in idx]`` with ``Failed(error)`` for the items that raise (an ``Exhausted``
    too: the indices may come in any order, so the items after one may still be there)."""
    out: list = []
    add = out.append
    for i in idx:
        try:
            add(get(i))
        except Exception as e:
            add(Failed(e))
    return out


class View(Sequence):
    """A lazy sequence. Subclasses implement ``__len__`` and ``_get``; infinite views (and views of
    unknown size) set ``finite = False`` and have no ``len``."""

    finite: bool = True
    checks_keys: bool = False  # see checks_keys()

    # -- what a subclass provides ----------------------------------------------------------------
    def __len__(self) -> int:
        raise TypeError(f"{self.describe()} has no len(): it is infinite or its size is unknown")

    def _get(self, i: int) -> Any:
        raise NotImplementedError

    def _get_many(self, idx: Sequence[int]) -> list:
        get = self._get
        return [get(i) for i in idx]

    def _get_each(self, idx: Sequence[int]) -> list:
        """``_get_many`` that goes past failures: an item whose read raises is ``Failed(error)``.

        Views that map indices or apply a function override it so that every item is read once;
        here, a view with a bulk read of its own tries it and, if it raises, reads item by item.
        """
        if type(self)._get_many is not View._get_many:
            try:
                return self._get_many(idx)
            except Exception:
                pass
        return each(self._get, idx)

    def _set(self, i: int, value: Any) -> None:
        raise TypeError(
            f"{self.describe()} does not support item assignment: its items are computed, "
            "so there is nothing to write to; write to its source instead"
        )

    def _slice(self, r: range) -> View:
        """The view of items ``r`` (a valid range of this view's indices)."""
        return Slice(self, r)

    def children(self) -> tuple:
        """The sequences this view reads from (for ``repr``)."""
        src = getattr(self, "src", None)
        return () if src is None else (src,)

    def describe(self) -> str:
        """A one-line description of this view alone, e.g. ``smap(decode)``."""
        return type(self).__name__.lower()

    # -- reads -----------------------------------------------------------------------------------
    def __getitem__(self, key):
        if type(key) is not int:
            try:
                key = operator.index(key)
            except TypeError:
                return self._subview(key)
        if self.finite:
            n = self.__len__()
            if key < 0:
                key += n
            if key < 0 or key >= n:
                raise IndexError(f"index {key if key >= 0 else key - n} out of range for {self.describe()} of length {n}")
        elif key < 0:
            raise IndexError(f"negative index {key} on {self.describe()}, which has no len(): index from the start")
        try:
            return self._get(key)
        except (IndexError, NotWrapped):
            raise
        except EvaluationError as e:
            _note(e, key, self)
            raise
        except Exception as e:
            raise wrap_error(e, key, self)  # noqa: B904 (wrap_error sets __cause__)

    def __iter__(self) -> Iterator:
        get, i = self._get, -1
        try:
            if self.finite:
                for i in range(self.__len__()):
                    yield get(i)
            else:
                for i in itertools.count():
                    try:
                        item = get(i)
                    except Exhausted:  # a view of unknown size (uniter) ran out
                        return
                    yield item
        except EvaluationError as e:
            _note(e, i, self)
            raise
        except Exception as e:
            raise wrap_error(e, i, self)  # noqa: B904

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        # Sequence.index stops at the first IndexError, which would hide an inner one (a bad gather
        # index) as "not found"; a slice's iteration raises it.
        first = range(self.__len__())[start:stop].start if self.finite else start
        for i, v in enumerate(self[start:stop]):
            if v is value or v == value:
                return first + i
        raise ValueError(f"{value!r} is not in {self.describe()}")

    def __bool__(self) -> bool:
        return not self.finite or self.__len__() > 0

    def _subview(self, key) -> View:
        if isinstance(key, slice):
            if self.finite:
                return self._slice(range(self.__len__())[key])
            return _infinite_slice(self, key)
        return gather(self, self._index_array(key))

    def _index_array(self, key) -> list[int]:
        """Check and normalise a list or array of indices (or a boolean mask)."""
        if isinstance(key, (str, bytes, tuple, dict)) or not hasattr(key, "__len__"):
            raise TypeError(
                f"{self.describe()} indices must be integers, slices, or lists/arrays of integers, "
                f"not {type(key).__name__}"
            )
        arr = np.asarray(key)
        if arr.ndim != 1:
            raise TypeError(f"{self.describe()}: index arrays must be 1-D, got shape {arr.shape}")
        if arr.dtype == bool:
            n = self.__len__()
            if len(arr) != n:
                raise IndexError(f"boolean mask of length {len(arr)} for {self.describe()} of length {n}")
            return np.flatnonzero(arr).tolist()
        if arr.size == 0:
            return []
        if arr.dtype.kind not in "iu":
            raise TypeError(
                f"{self.describe()} index arrays must hold integers, not {arr.dtype} (first: {arr[0]!r})"
            )
        arr = arr.astype(np.int64, copy=False)
        if self.finite:
            n = self.__len__()
            bad = (arr < -n) | (arr >= n)
            if bad.any():
                raise IndexError(f"index {arr[bad][0]} out of range for {self.describe()} of length {n}")
            arr = np.where(arr < 0, arr + n, arr)
        elif (arr < 0).any():
            raise IndexError(f"negative index {arr[arr < 0][0]} on {self.describe()}, which has no len()")
        return arr.tolist()

    # -- writes ----------------------------------------------------------------------------------
    def __setitem__(self, key, value) -> None:
        if type(key) is not int:
            try:
                key = operator.index(key)
            except TypeError:
                return self._set_many(key, value)
        if self.finite:
            n = self.__len__()
            if key < 0:
                key += n
            if key < 0 or key >= n:
                raise IndexError(f"assignment index out of range for {self.describe()} of length {n}")
        elif key < 0:
            raise IndexError(f"negative index {key} on {self.describe()}, which has no len()")
        self._set(key, value)

    def _set_many(self, key, values) -> None:
        if isinstance(key, slice):
            targets = range(self.__len__())[key] if self.finite else _infinite_range(self, key)
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

    # -- repr ------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return "\n".join(_tree(self, 0))

    def __str__(self) -> str:
        return self.__repr__()


def raised(err: BaseException, i: int, view: View) -> BaseException:
    """The exception ``view[i]`` raises when ``view._get(i)`` raised ``err``."""
    if isinstance(err, (IndexError, NotWrapped)):
        return err
    if isinstance(err, EvaluationError):
        _note(err, i, view)
        return err
    return wrap_error(err, i, view)


def _note(err: EvaluationError, i: int, view: View) -> None:
    """Say which top-level read led to an error raised deeper in the pipeline."""
    desc = view.describe()
    if err.view != desc or err.item != i:
        err.add_note(f"while reading item {i} of {desc}")


def _tree(node: Any, depth: int, seen: set | None = None) -> list[str]:
    seen = set() if seen is None else seen
    if not isinstance(node, View):
        return [describe_source(node)]
    head = node.describe()
    try:
        head += f"  len={len(node)}"
    except TypeError:
        pass
    kids = node.children()
    if depth >= 8 and kids:
        return [head, "└─ ..."]
    if id(node) in seen:
        return [head + "  (shown above)"]
    seen.add(id(node))
    lines = [head]
    for k, kid in enumerate(kids):
        last = k == len(kids) - 1
        sub = _tree(kid, depth + 1, seen)
        lines.append(("└─ " if last else "├─ ") + sub[0])
        lines.extend(("   " if last else "│  ") + s for s in sub[1:])
    return lines


def describe_source(src: Any) -> str:
    """One line for a plain source (list, array, range, dataset)."""
    if isinstance(src, View):
        return src.describe()
    if isinstance(src, np.ndarray):
        return f"ndarray(shape={src.shape}, dtype={src.dtype})"
    if isinstance(src, range):
        return repr(src)
    try:
        return f"{type(src).__name__}  len={len(src)}"
    except TypeError:
        return type(src).__name__


def fname(f: Callable) -> str:
    """A short name for a function in descriptions."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
    return name.replace(".<locals>", "")


# Set by lazyseq.prefetch.slots: inside a process worker, copies arrays out of the job's shared-memory
# slot. Views that keep items beyond the read (add_cache) keep ``keepable(item)``.
keepable_hook: Callable[[Any], Any] | None = None


def keepable(value: Any) -> Any:
    return value if keepable_hook is None else keepable_hook(value)


# -- helpers views use on their sources ------------------------------------------------------------
def check_source(src: Any, where: str) -> Any:
    if isinstance(src, View) or hasattr(src, "__getitem__"):
        return src
    hint = " (an iterator: wrap it with lazyseq.uniter(...))" if hasattr(src, "__next__") else ""
    raise TypeError(f"{where}: expected a sequence (an object with __getitem__), got {type(src).__name__}{hint}")


def reader(src: Any) -> Callable[[int], Any]:
    """The fastest single-item read of ``src`` for a valid non-negative int index."""
    if isinstance(src, View):
        return src._get
    return src.__getitem__ if hasattr(src, "__len__") else _UnsizedReader(src)


class _UnsizedReader:
    """Reads a source without len (old iteration protocol): its IndexError marks the end."""

    __slots__ = ("src",)

    def __init__(self, src: Any):
        self.src = src

    def __call__(self, i: int) -> Any:
        try:
            return self.src[i]
        except IndexError as e:
            raise Exhausted(*e.args) from None

    def __reduce__(self):
        return (_UnsizedReader, (self.src,))


def read_many(src: Any, idx: Sequence[int]) -> list:
    """Read valid indices ``idx`` of ``src`` in one call."""
    if isinstance(src, View):
        return src._get_many(idx)
    return list(map(src.__getitem__ if hasattr(src, "__len__") else _UnsizedReader(src), idx))


def read_each(src: Any, idx: Sequence[int]) -> list:
    """:func:`read_many` going past failures: ``Failed(error)`` for each item that raises."""
    if isinstance(src, View):
        return src._get_each(idx)
    return each(src.__getitem__ if hasattr(src, "__len__") else _UnsizedReader(src), idx)


def length(src: Any) -> int | None:
    """``len(src)``, or None for an infinite view or a source without len."""
    if isinstance(src, View):
        return src.__len__() if src.finite else None
    try:
        return len(src)
    except TypeError:
        return None


_CHECKED = (list, tuple, range, str, bytes, np.ndarray)


def checks_keys(src: Any) -> bool:
    """Whether ``src`` itself wraps negative int keys and raises IndexError past its end, as a list
    does; views that do so set ``checks_keys = True``."""
    return src.checks_keys if isinstance(src, View) else isinstance(src, _CHECKED)


def is_finite(src: Any) -> bool:
    return src.finite if isinstance(src, View) else hasattr(src, "__len__")


class Routed(View):
    """A view whose item ``i`` is item ``j`` of sequence ``k`` of ``seqs``, for ``(k, j) = _where(i)``."""

    seqs: tuple
    _rds: tuple

    def _where(self, i: int) -> tuple[int, int]:
        raise NotImplementedError

    def _get(self, i: int) -> Any:
        k, j = self._where(i)
        return self._rds[k](j)

    def _set(self, i: int, value: Any) -> None:
        k, j = self._where(i)
        self.seqs[k][j] = value

    def children(self) -> tuple:
        return self.seqs


# -- slices ----------------------------------------------------------------------------------------
class Slice(View):
    """Items ``r`` (a range) of ``src``; slices of slices fold into one range."""

    checks_keys = True  # range indexing does

    def __init__(self, src: Any, r: range):
        self.src, self.r, self._rd, self._srcview = src, r, reader(src), isinstance(src, View)

    def __len__(self) -> int:
        return len(self.r)

    def _get(self, i: int) -> Any:
        return self._rd(self.r[i])

    def _get_many(self, idx: Sequence[int]) -> list:
        r = self.r
        js = [r[i] for i in idx]
        return self.src._get_many(js) if self._srcview else list(map(self._rd, js))

    def _get_each(self, idx: Sequence[int]) -> list:
        r = self.r
        try:
            js = [r[i] for i in idx]
        except IndexError:  # a bad index from a gather that leaves the checks to us: item by item
            return each(self._get, idx)
        return read_each(self.src, js)

    def _set(self, i: int, value: Any) -> None:
        self.src[self.r[i]] = value

    def _slice(self, r: range) -> View:
        sub = compose(self.r.start, self.r.step, r)
        return self.src._slice(sub) if isinstance(self.src, View) else Slice(self.src, sub)

    def describe(self) -> str:
        r = self.r
        return f"slice[{r.start}:{r.stop}:{r.step}]" if r.step != 1 else f"slice[{r.start}:{r.stop}]"


class InfiniteSlice(View):
    """Items ``start, start + step, ...`` of an infinite view (``step > 0``)."""

    finite = False

    def __init__(self, src: View, start: int, step: int):
        self.src, self.start, self.step, self._rd = src, start, step, reader(src)

    def _get(self, i: int) -> Any:
        return self._rd(self.start + i * self.step)

    def _set(self, i: int, value: Any) -> None:
        self.src[self.start + i * self.step] = value

    def _slice(self, r: range) -> View:
        return Slice(self.src, compose(self.start, self.step, r))

    def describe(self) -> str:
        return f"slice[{self.start}::{self.step}]"


def compose(start: int, step: int, r: range) -> range:
    """The indices ``start + k * step`` for ``k`` in ``r``, as a range (a slice of a slice)."""
    first, st = start + r.start * step, step * r.step
    return range(first, first + len(r) * st, st)


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
    return view._slice(r) if len(r) else Slice(view, r)


# -- gather: the view an index array returns --------------------------------------------------------
class Gather(View):
    def __init__(self, src: Any, indexes: Any):
        self.src, self.indexes = check_source(src, "gather"), check_source(indexes, "gather indexes")
        self._rd, self._ird, self._srcfinite = reader(src), reader(indexes), is_finite(src)
        self._srcview, self._list = isinstance(src, View), isinstance(indexes, (list, tuple, range))
        # A source that checks keys itself (a list, a map over one...) is read without checking
        # here; its IndexError is then turned into a clear one below.
        self._trust = checks_keys(src)
        self.checks_keys = checks_keys(indexes)
        self.finite = is_finite(indexes)

    def __len__(self) -> int:
        if not self.finite:
            return View.__len__(self)
        return len(self.indexes)

    def _index(self, j: Any) -> int:
        if type(j) is not int:
            j = operator.index(j)
        n = len(self.src) if self._srcfinite else None
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

    def _get_many(self, idx: Sequence[int]) -> list:
        js = self._indices(idx, read_many)
        if not self._trust:
            js = [self._index(j) for j in js]
        try:
            return self.src._get_many(js) if self._srcview else list(map(self._rd, js))
        except IndexError:
            for j in js:
                self._index(j)
            raise

    def _get_each(self, idx: Sequence[int]) -> list:
        raw = self._indices(idx, read_each)  # an index view's failing items fail ours
        out: list = [None] * len(idx)
        at, js = [], []  # where the readable items go, and their source indices
        for k, j in enumerate(raw):
            if type(j) is Failed:
                out[k] = j
                continue
            if not self._trust:
                try:
                    j = self._index(j)
                except Exception as e:
                    out[k] = Failed(e)
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
            out[k] = x
        return out

    def _set(self, i: int, value: Any) -> None:
        self.src[self._index(self._ird(i))] = value

    def children(self) -> tuple:
        return (self.src, self.indexes) if isinstance(self.indexes, View) else (self.src,)

    def describe(self) -> str:
        n = length(self.indexes)
        return f"gather({'unbounded' if n is None else n} indexes)"


def gather(seq: Any, indexes: Any) -> View:
    """The items of ``seq`` at ``indexes``, in that order: ``[seq[i] for i in indexes]``, lazily.

    ``indexes`` is any sequence of ints (a list, a numpy array, another view); negative indexes
    count from the end of ``seq``. Writes go through to ``seq``.

    >>> import lazyseq
    >>> words = ['d', 'e', 'h', 'l', 'o', 'r', 'w', ' ']
    >>> ''.join(lazyseq.gather(words, [2, 1, 3, 3, 4, 7, 6, 4, 5, 3, 0]))
    'hello world'
    """
    return Gather(seq, indexes)


def take(seq: Any, indexes: Any) -> View:
    """Alias of :func:`gather`.

    >>> import lazyseq
    >>> list(lazyseq.take([10, 20, 30], [2, -3]))
    [30, 10]
    """
    return Gather(seq, indexes)
