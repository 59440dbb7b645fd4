"""The store's one bulk read: items ``idx`` (any order, any shards) as a list of items, or by columns
as ``default_collate`` would stack them, with one gather per field and shard.

``batch(shuffle(store), k, collate_fn=default_collate)`` and the DataLoader's batches of a store
come here by columns (``node.read_columns``): a fixed field is one ``np.take`` per shard into the
batch's array (in a process worker, straight into the job's shared-memory slot), and no item is
ever built. A bulk read of items (``store._get_many``, a prefetch job) reads the same way and cuts
the columns into items: rows of a gathered copy (read-only, as the memory map's views are), or
zero-copy views of the memory map where the indices are a consecutive run of one shard.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..jobslot import empty
from . import format as fmt

__all__ = ["gather"]

Group = tuple[Any, np.ndarray | None, np.ndarray]  # (shard, positions in idx or None: all, indices in the shard)


def _groups(store: Any, idx: np.ndarray) -> list[Group]:
    """The shards ``idx`` touches, each with where its items go and its own indices."""
    per = store.per_shard
    k = idx // per
    j = idx - k * per
    if k[0] == k[-1] and (len(k) < 3 or (k == k[0]).all()):
        return [(store._shard(int(k[0])), None, j)]
    order = np.argsort(k, kind="stable")
    ks = k[order]
    cuts = [0, *(np.flatnonzero(ks[1:] != ks[:-1]) + 1).tolist(), len(ks)]
    store._open_many([int(ks[a]) for a in cuts[:-1]])
    return [(store._shard(int(ks[a])), order[a:b], j[order[a:b]]) for a, b in itertools.pairwise(cuts)]


def _run(js: np.ndarray) -> slice | None:
    """``js`` as a slice when it is a consecutive increasing run."""
    a = int(js[0])
    return slice(a, a + len(js)) if int(js[-1]) - a == len(js) - 1 and (len(js) < 3 or (np.diff(js) == 1).all()) else None


def _fixed(groups: list[Group], f: int, n: int, columns: bool) -> np.ndarray | list | None:
    """A fixed field's column: its rows, gathered; None if its shape differs between shards."""
    tables = [g[0].tables[f] for g in groups]
    row = tables[0].shape[1:]
    if any(t.shape[1:] != row for t in tables):
        return None
    if len(groups) == 1:
        js = groups[0][2]
        run = None if columns else _run(js)
        if run is not None:
            return tables[0][run]  # a view of the memory map (items share it, as single reads do)
        out = empty((n, *row), tables[0].dtype) if columns else np.empty((n, *row), tables[0].dtype)
        np.take(tables[0], js, axis=0, out=out, mode="clip")  # valid indices; "raise" would copy via a buffer
    else:
        out = empty((n, *row), tables[0].dtype) if columns else np.empty((n, *row), tables[0].dtype)
        for t, (_, pos, js) in zip(tables, groups):
            out[pos] = np.take(t, js, axis=0, mode="clip")
    if not columns:
        out.flags.writeable = False  # items are read-only, whether views of the map or rows of a copy
    return out


def _picked(groups: list[Group], f: int, n: int) -> list:
    """A field's values, one per item, read at arbitrary indices (variable arrays, strings, None)."""
    if len(groups) == 1:
        return groups[0][0].picks[f](groups[0][2])
    out: list = [None] * n
    for shard, pos, js in groups:
        for p, v in zip(pos.tolist(), shard.picks[f](js)):
            out[p] = v
    return out


def _stacked(values: list, what: str) -> Any:
    """A variable field's values as ``default_collate`` stacks them: one array if every shape is
    the same (ValueError naming the item otherwise), a list for strings, bytes and None."""
    first = values[0]
    if not isinstance(first, np.ndarray):
        return values
    for k, v in enumerate(values):
        if v.shape != first.shape:
            raise ValueError(f"{what}: sample 0 has shape {first.shape} but sample {k} has shape {v.shape}")
    out = empty((len(values), *first.shape), first.dtype)
    np.stack(values, out=out)
    return out


def _rows(col: Any, field: dict) -> list:
    """A gathered column cut into the values items hold: Python numbers, numpy scalars, arrays."""
    if not isinstance(col, np.ndarray):
        return col
    if field["kind"] in fmt.PYTHON:
        return col.tolist()
    if field["kind"] == "array" and col.ndim == 1:  # 0-d arrays, not numpy scalars
        return [col[t, ...] for t in range(len(col))]
    return list(col)


def gather(store: Any, idx: np.ndarray, columns: bool) -> Any:
    """Items ``idx`` (valid, an int64 array) of ``store``: by columns, the batch ``default_collate``
    makes of them (built with the store's own structure), else the list of the items."""
    n = len(idx)
    if not n:
        return []
    groups = _groups(store, idx)
    with store._holding(groups):  # a remote store: every range of the read fetched at once
        cols = _columns(store, groups, n, columns)
    build = store._build
    if columns:
        return build(cols)
    rows = [_rows(c, f) for c, f in zip(cols, store.fields)]
    return list(map(build, zip(*rows))) if rows else [build(()) for _ in range(n)]


def _columns(store: Any, groups: list[Group], n: int, columns: bool) -> list:
    cols = []
    for f, field in enumerate(store.fields):
        col = _fixed(groups, f, n, columns) if groups[0][0].tables[f] is not None else None
        if col is None:
            col = _picked(groups, f, n)
            if columns:
                col = _stacked(col, f"field {field['path']}")
        cols.append(col)
    return cols
