"""One walker over nested items (a sample, a batch): what is a container, what is a leaf.

The rule, for every part of lazyseq that looks inside items (shared-memory transport, caches,
``default_collate``, ``to_tensor``, shared-memory sizing):

- a ``dict`` or dict subclass is a container of its values; a subclass is rebuilt from ``x.copy()``
  so it keeps its type and state (``OrderedDict``, a ``defaultdict``'s factory);
- a ``list`` or list subclass is a container, rebuilt as ``type(x)(items)``;
- a ``tuple`` is a container; a namedtuple is rebuilt as ``type(x)(*items)``, another tuple
  subclass as ``type(x)(items)``;
- everything else is a leaf: arrays, numbers, ``str``, ``bytes``, ``None``, other objects
  (other ``Mapping`` types included).

Measured against ``optree.tree_map`` (0.20) on one sample: a bare int 0.27 vs 4.0 us, an
``(array, int)`` pair 1.1 vs 3.8 us, a small nested dict 2.7 vs 9.4 us; 64 pairs 46 vs 40 us. Items
are mostly small, so the walker is written here rather than taken from optree.

>>> from lazyseq.core import tree
>>> tree.map(lambda v: v * 2, {"x": (1, 2), "y": [3]})
{'x': (2, 4), 'y': [6]}
>>> list(tree.leaves({"x": (1, 2), "y": [3]}))
[1, 2, 3]
"""

from __future__ import annotations

from builtins import map as _map
from collections.abc import Callable, Iterator, Sequence
from operator import is_not
from typing import Any

__all__ = ["map", "leaves", "transpose", "is_container"]


def is_container(x: Any) -> bool:
    """Whether the walker looks inside ``x`` (a dict, list or tuple, or a subclass of one)."""
    return isinstance(x, (dict, list, tuple))


def _rebuild(x: Any, items: list) -> Any:
    t = type(x)
    if t is list:
        return items
    if t is tuple:
        return tuple(items)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return t(*items)
    return t(items)


def _rebuild_dict(x: dict, values: list) -> dict:
    if type(x) is dict:
        return dict(zip(x, values))
    out = x.copy()
    for k, v in zip(x, values):
        out[k] = v
    return out


def map(fn: Callable[[Any], Any], x: Any) -> Any:
    """``x`` with ``fn`` applied to every leaf. A container none of whose leaves changed (``fn``
    returned the very same objects) is returned as it is, not copied.

    >>> import collections
    >>> from lazyseq.core import tree
    >>> P = collections.namedtuple("P", "a b")
    >>> tree.map(str, P(1, [2]))
    P(a='1', b=['2'])
    >>> x = (1, "a")
    >>> tree.map(lambda v: v, x) is x
    True
    """
    t = type(x)
    if t is list or t is tuple or (t is not dict and isinstance(x, (list, tuple))):
        items = [map(fn, v) for v in x]
        return _rebuild(x, items) if any(_map(is_not, items, x)) else x
    if t is dict or isinstance(x, dict):
        values = [map(fn, v) for v in x.values()]
        return _rebuild_dict(x, values) if any(_map(is_not, values, x.values())) else x
    return fn(x)


def leaves(x: Any) -> Iterator[Any]:
    """Every leaf of ``x``, in order (dicts in their key order)."""
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    else:
        yield x


def transpose(fn: Callable[[list], Any], xs: Sequence[Any], what: str = "items") -> Any:
    """Zip a list of structures of the same shape into one structure whose leaves are
    ``fn([leaf of xs[0], leaf of xs[1], ...])`` (what ``default_collate`` does). The shape is that
    of ``xs[0]``; a structure that differs raises ``ValueError`` naming the item.

    >>> from lazyseq.core import tree
    >>> tree.transpose(sum, [{"a": (1, 2)}, {"a": (10, 20)}])
    {'a': (11, 22)}
    """
    first = xs[0]
    if isinstance(first, dict):
        for k, x in enumerate(xs):
            if not isinstance(x, dict) or x.keys() != first.keys():
                raise ValueError(f"{what} 0 and {k} have different structures: keys {list(first)} and "
                                 f"{list(x) if isinstance(x, dict) else type(x).__name__}")
        return _rebuild_dict(first, [transpose(fn, [x[key] for x in xs], what) for key in first])
    if isinstance(first, (list, tuple)):
        for k, x in enumerate(xs):
            if not isinstance(x, (list, tuple)) or len(x) != len(first):
                got = f"{len(x)} parts" if isinstance(x, (list, tuple)) else type(x).__name__
                raise ValueError(f"{what} 0 and {k} have different structures: {len(first)} parts and {got}")
        return _rebuild(first, [transpose(fn, list(col), what) for col in zip(*xs)])
    return fn(list(xs))
