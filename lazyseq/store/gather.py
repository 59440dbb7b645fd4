"""The store's one bulk read: items ``idx`` (any order, any shards) as a list of items, or by columns
as ``default_collate`` would stack them.

``batch(shuffle(store), k, collate_fn=default_collate)`` and the DataLoader's batches of a store
come here by columns (``node.read_columns``). Over many shards of a local store, a fixed field is
one fancy index across the shards' memory maps (:mod:`.span`); within one shard (and for remote
shards, variable fields, shapes that differ between shards) it is one ``np.take`` per shard into
the batch's array (in a process worker, straight into the job's shared-memory slot), and no item
is ever built. A bulk read of items (``store._get_many``, a prefetch job) reads the same way and
cuts the columns into items: rows of a gathered copy (read-only, as the memory map's views are),
or zero-copy views of the memory map where the indices are a consecutive run of one shard.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..core.jobslot import empty
from . import format as fmt

__all__ = ["gather"]

Group = tuple[Any, np.ndarray | None, np.ndarray]  # (shard, positions in idx or None: all, indices in the shard)


def _groups(store: Any, k: np.ndarray, j: np.ndarray) -> list[Group]:
    """The shards items ``k * per_shard + j`` touch, each with where its items go and its own indices."""
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
    """A field's values, one per item, read at arbitrary indices (variable arrays, strings, None;
    a fixed field whose shape differs between shards, item by item)."""
    if len(groups) == 1:
        return _pick(groups[0][0], f, groups[0][2])
    out: list = [None] * n
    for shard, pos, js in groups:
        for p, v in zip(pos.tolist(), _pick(shard, f, js)):
            out[p] = v
    return out


def _pick(shard: Any, f: int, js: np.ndarray) -> list:
    pick = shard.picks[f]
    return pick(js) if pick is not None else list(map(shard.ones[f], js.tolist()))


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
    per = store.per_shard
    lo, hi = int(idx.min()), int(idx.max())
    k, j = np.divmod(idx, per)
    # over many shards, one read per field (.span); only with indices inside the store, so that
    # no row outside the tables is ever read
    spans = store._spans(k) if lo // per != hi // per and 0 <= lo and hi < store.n else None
    cols = _columns(store, k, j, spans, n, columns)
    build = store._build
    if columns:
        return build(cols)
    rows = [_rows(c, f) for c, f in zip(cols, store.fields)]
    return list(map(build, zip(*rows))) if rows else [build(()) for _ in range(n)]


def _columns(store: Any, k: np.ndarray, j: np.ndarray, spans: Any, n: int, columns: bool) -> list:
    cols: list = [None] * len(store.fields)
    rest = list(range(len(cols)))
    if spans is not None:
        for f in rest:
            cols[f] = spans.read(f, k, j, columns)
            if cols[f] is not None and not columns:
                cols[f].flags.writeable = False  # items are read-only, as the memory map's views are
        rest = [f for f in rest if cols[f] is None]
    if not rest:
        return cols
    groups = _groups(store, k, j)
    with store._holding(groups):  # a remote store: every range of the read fetched at once
        for f in rest:
            col = _fixed(groups, f, n, columns) if groups[0][0].tables[f] is not None else None
            if col is None:
                col = _picked(groups, f, n)
                if columns:
                    col = _stacked(col, f"field {fmt.shown(store.fields[f]['path'])}")
            cols[f] = col
    return cols
