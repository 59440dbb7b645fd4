"""The read protocol: how a pipeline reads its sources by valid index, one item, many, or many
past failures, whether a source is a view or a plain sequence (list, array, range, dataset).

:class:`Node` is what every view answers to the views above it: ``_len``, ``_get(i)``,
``_get_many(idx)``, ``_get_each(idx)``, ``_set``, ``children`` and ``describe`` (and a repr
drawn from them). It takes only valid, non-negative ``int`` indices: checking and normalising
what a user passes as a key is :class:`lazyseq.core.base.View`'s job, done once at the top.
The helpers below read any source through the fastest path it has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Node", "Exhausted", "Failed", "each", "check_source", "reader", "bulk_reader", "sizer", "read_many",
           "columnar", "read_columns", "read_array",
           "read_each", "into", "length", "checks_keys", "is_finite", "describe_source"]


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


def each(get: Callable[[int], Any], idx: Sequence[int], out: list | None = None) -> list:
    """``[get(i) for i in idx]`` with ``Failed(error)`` for the items that raise (an ``Exhausted``
    too: the indices may come in any order, so the items after one may still be there), appended
    to ``out`` (a new list by default) as they are read."""
    if out is None:
        out = []
    add = out.append
    for i in idx:
        try:
            add(get(i))
        except Exception as e:
            add(Failed(e))
    return out


class Node(Sequence):
    """A lazy sequence as the views above it read it. Infinite views (and views of unknown size)
    set ``finite = False``; ``checks_keys = True`` says ``_get`` itself raises ``IndexError`` past
    the end and wraps negative keys, as a list does (a gather over it then checks nothing)."""

    finite: bool = True
    checks_keys: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__len__" in cls.__dict__ and "_len" not in cls.__dict__:  # a subclass written to len(): keep it
            cls._len = cls.__dict__["__len__"]

    def __len__(self) -> int:
        if self.finite:
            return self._len()
        raise TypeError(f"{self.describe()} has no len(): it is infinite or its size is unknown")

    def _len(self) -> int:
        """The length of a finite view; by default its one source's (``self.src``)."""
        return len(self.src)

    def _get(self, i: int) -> Any:
        raise NotImplementedError

    def _get_many(self, idx: Sequence[int]) -> list:
        get = self._get
        return [get(i) for i in idx]

    # What a view above binds once to read this one (reader, bulk_reader): ``_get`` and
    # ``_get_many``, or where a view knows at that time that its general case does not arise (no
    # pad, a plain list below...), a method doing only what is left: one read costs a few frames
    # per view, and a chain of views is read at every item.
    def _get_fn(self) -> Callable[[int], Any]:
        return self._get

    def _get_many_fn(self) -> Callable[[Sequence[int]], list]:
        return self._get_many

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        """``_get_many`` that goes past failures: an item whose read raises is ``Failed(error)``.

        The items are appended to ``out`` (a new list by default), which is returned. A view that
        can appends each item as soon as it is done, in order: a prefetch worker sends what is in
        ``out`` while a slow item holds up the rest. Whatever is in ``out`` is a finished item,
        even if the call is cut short by a ``BaseException``.

        Views that map indices or apply a function override it so that every item is read once;
        here, a view with a bulk read of its own tries it and, if it raises, reads item by item.
        """
        if type(self)._get_many is not Node._get_many:
            try:
                items = self._get_many(idx)
            except Exception:
                pass
            else:
                if out is None:
                    return items
                out.extend(items)
                return out
        return each(self._get, idx, out)

    def _set(self, i: int, value: Any) -> None:
        raise TypeError(
            f"{self.describe()} does not support item assignment: its items are computed, "
            "so there is nothing to write to; write to its source instead"
        )

    # -- reads by columns: a batch of a store without per-item objects (see read_columns) --------------
    def _columnar(self) -> bool:
        """Whether :meth:`_get_columns` can answer (a store, under views that only remap indices)."""
        return False

    def _get_columns(self, idx: np.ndarray) -> Any:
        """``default_collate`` of items ``idx`` (valid, an int64 array), built by columns; or
        NotImplemented, and the caller reads the items and collates them."""
        return NotImplemented

    def _get_array(self, idx: np.ndarray) -> np.ndarray:
        """Items ``idx`` of a sequence of ints (an index view) as one int64 array."""
        return int_array(self._get_many(idx.tolist()))

    def children(self) -> tuple:
        """The sequences this view reads from (for ``repr``)."""
        src = getattr(self, "src", None)
        return () if src is None else (src,)

    def describe(self) -> str:
        """A one-line description of this view alone, e.g. ``smap(decode)``."""
        return type(self).__name__.lower()

    def __repr__(self) -> str:
        return "\n".join(_tree(self, 0))

    def __str__(self) -> str:
        return self.__repr__()


_SHOWN_LEVELS = 9  # a repr shows a pipeline this deep; below, how many levels it leaves out


def _tree(node: Any, depth: int, seen: set | None = None) -> list[str]:
    seen = set() if seen is None else seen
    if not isinstance(node, Node):
        return [describe_source(node)]
    head = node.describe()
    if node.finite:
        head += f"  len={len(node)}"
    kids = node.children()
    if depth >= _SHOWN_LEVELS - 1 and kids:
        n = _levels_below(node)
        return [head, f"└─ ... ({n} more level{'s' * (n != 1)})"]
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


def _levels_below(node: Node) -> int:
    """How many levels a tree shows under ``node`` (one for its sources, one for theirs ...)."""
    level, n, seen = [node], 0, {id(node)}
    while level:
        level = [k for v in level if isinstance(v, Node) for k in v.children() if id(k) not in seen and not seen.add(id(k))]
        n += bool(level)
    return n


_NODE_TYPES: dict[type, bool] = {}


def fork_unsafe(src: Any, most: int = 10_000) -> str | None:
    """The description of a view in ``src``'s tree that a forked child cannot read (its class says
    ``fork_safe = False``: a Lance dataset, whose runtime threads do not survive a fork), or None;
    at most ``most`` views are looked at."""
    stack, seen = [src], set()
    while stack and len(seen) < most:
        node = stack.pop()
        if not is_node(node) or id(node) in seen:
            continue
        seen.add(id(node))
        if getattr(node, "fork_safe", True) is False:
            return node.describe()
        stack.extend(node.children())
        stack.append(getattr(node, "src", None))  # a view that shows no children (save's shard writer) still reads it
    return None


def is_node(src: Any) -> bool:
    """``isinstance(src, Node)``, without the ABC machinery's cost on every read (``Node`` is a
    ``Sequence``, so a plain ``isinstance`` runs Python code: ~0.4 us, as much as a whole read)."""
    t = type(src)
    known = _NODE_TYPES.get(t)
    if known is None:
        known = _NODE_TYPES[t] = issubclass(t, Node)
    return known


def describe_source(src: Any) -> str:
    """One line for a plain source (list, array, range, dataset)."""
    if is_node(src):
        return src.describe()
    if isinstance(src, np.ndarray):
        return f"ndarray(shape={src.shape}, dtype={src.dtype})"
    if isinstance(src, range):
        return repr(src)
    try:
        return f"{type(src).__name__}  len={len(src)}"
    except TypeError:
        return type(src).__name__


# -- reading any source ------------------------------------------------------------------------------
def check_source(src: Any, where: str) -> Any:
    if is_node(src) or hasattr(src, "__getitem__"):
        return src
    hint = " (an iterator: wrap it with lazyseq.uniter(...))" if hasattr(src, "__next__") else ""
    raise TypeError(f"{where}: expected a sequence (an object with __getitem__), got {type(src).__name__}{hint}")


def reader(src: Any) -> Callable[[int], Any]:
    """The fastest single-item read of ``src`` for a valid non-negative int index."""
    if is_node(src):
        return src._get_fn()
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
    if is_node(src):
        return src._get_many(idx)
    return list(map(src.__getitem__ if hasattr(src, "__len__") else _UnsizedReader(src), idx))


def sizer(src: Any) -> Callable[[], int]:
    """``len`` bound to a finite ``src`` once, without the finiteness check of ``Node.__len__``
    (a view reads its source's length on every read; one frame less counts there)."""
    return src._len if is_node(src) else src.__len__


def bulk_reader(src: Any) -> Callable[[Sequence[int]], list]:
    """:func:`read_many` bound to ``src`` once: what a view keeps to read its source in bulk on
    every read without asking again what the source is."""
    return src._get_many_fn() if is_node(src) else _ManyReader(reader(src))


class _ManyReader:
    __slots__ = ("get",)

    def __init__(self, get: Callable[[int], Any]):
        self.get = get

    def __call__(self, idx: Sequence[int]) -> list:
        return list(map(self.get, idx))

    def __reduce__(self):
        return (_ManyReader, (self.get,))


def into(out: list | None, items: list) -> list:
    """``items`` appended to ``out``: what a ``_get_each`` that computes its items all at once
    returns (``items`` itself when no ``out`` was given)."""
    if out is None:
        return items
    out.extend(items)
    return out


def read_each(src: Any, idx: Sequence[int], out: list | None = None) -> list:
    """:func:`read_many` going past failures: ``Failed(error)`` for each item that raises,
    appended to ``out`` as they are read (see ``Node._get_each``)."""
    if is_node(src):
        return src._get_each(idx) if out is None else src._get_each(idx, out)
    return each(src.__getitem__ if hasattr(src, "__len__") else _UnsizedReader(src), idx, out)


def columnar(src: Any) -> bool:
    """Whether :func:`read_columns` of ``src`` can build a batch by columns."""
    return is_node(src) and src._columnar()


def read_columns(src: Any, idx: np.ndarray) -> Any:
    """``default_collate`` of the valid items ``idx`` (an int64 array) of ``src``, gathered one
    column per field (a store under views that only remap indices), without building an item;
    NotImplemented where ``src`` cannot."""
    return src._get_columns(idx) if is_node(src) else NotImplemented


def read_array(src: Any, idx: np.ndarray) -> np.ndarray:
    """Items ``idx`` (an int64 array) of a sequence of ints, as an int64 array, vectorised through
    index views (aranges, ranges, arrays, remaps)."""
    if is_node(src):
        return src._get_array(idx)
    if isinstance(src, range):
        return src.start + idx * src.step
    if isinstance(src, np.ndarray) and src.ndim == 1 and src.dtype.kind in "iu":
        return int_array(src[idx])
    return int_array(list(map(src.__getitem__, idx.tolist())))


def int_array(values: Any) -> np.ndarray:
    """``values`` as an int64 array; TypeError unless they are all ints that fit (floats are not
    indices, and a uint64 past 2**63 must not wrap round to a negative index)."""
    a = np.asarray(values)
    if len(a) and (a.dtype.kind not in "iu" or a.ndim != 1 or (a.dtype == np.uint64 and a.max() >= 2**63)):
        raise TypeError(f"expected ints, got {a.dtype} values")
    return a.astype(np.int64, copy=False)


def length(src: Any) -> int | None:
    """``len(src)``, or None for an infinite view or a source without len."""
    if is_node(src):
        return src._len() if src.finite else None
    try:
        return len(src)
    except TypeError:
        return None


_CHECKED = (list, tuple, range, str, bytes, np.ndarray)


def checks_keys(src: Any) -> bool:
    """Whether ``src`` itself wraps negative int keys and raises IndexError past its end, as a list
    does; views that do so set ``checks_keys = True``."""
    return src.checks_keys if is_node(src) else isinstance(src, _CHECKED)


def is_finite(src: Any) -> bool:
    return src.finite if is_node(src) else hasattr(src, "__len__")
