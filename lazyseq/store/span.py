"""A fixed field's rows across the open shards of a local store (memory maps), read as one array:
a bulk read over many shards is one fancy index per field instead of a ``np.take`` per field and
shard.

The shards are separate memory maps at unrelated addresses. :class:`Spans` covers them with one
read-only byte array whose row ``r`` is the ``row_bytes`` bytes starting ``r`` bytes after the
lowest table (a void dtype of ``row_bytes`` with stride 1): item ``j`` of shard ``k`` is row ``offsets[k] + j * row_bytes``,
and ``rows[r_array]`` copies those rows out in one call, as fancy indexing of one memory map does.
Only rows inside the tables are ever read: the tables' sizes are checked here against the
manifest's item counts, and :func:`lazyseq.store.gather.gather` reads through a snapshot only with
indices it checked (``0 <= idx < len(store)``, every shard they touch covered). The snapshot keeps
the tables, hence their memory maps, alive while it exists.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.jobslot import current, empty

__all__ = ["Spans"]


class _Memory:
    """``__array_interface__`` of the rows over ``[base, base + size)``, one every byte; holds the tables."""

    def __init__(self, base: int, rows: int, row_bytes: int, tables: list[np.ndarray]):
        # a row as one void scalar: fancy indexing copies each with one memcpy (4x faster than
        # uint8 rows of a 2-D array for 8-byte rows, 1.2x for 3 kB ones)
        self.__array_interface__ = {"data": (base, True), "shape": (rows,), "strides": (1,),
                                    "typestr": f"|V{row_bytes}", "version": 3}
        self.tables = tables


class _FieldSpan:
    __slots__ = ("rows", "offsets", "row_bytes", "dtype", "shape")

    def __init__(self, tables: dict[int, np.ndarray], nshards: int):
        first = next(iter(tables.values()))
        self.dtype, self.shape = first.dtype, first.shape[1:]
        self.row_bytes = first.dtype.itemsize * math.prod(self.shape)
        addr = {k: t.__array_interface__["data"][0] for k, t in tables.items()}
        base = min(addr.values())
        end = max(addr[k] + t.nbytes for k, t in tables.items())
        self.offsets = np.full(nshards, -1, np.int64)
        for k, a in addr.items():
            self.offsets[k] = a - base
        self.rows = np.asarray(_Memory(base, end - base - self.row_bytes + 1, self.row_bytes, list(tables.values())))

    def read(self, k: np.ndarray, j: np.ndarray, columns: bool) -> np.ndarray:
        x = self.rows[self.offsets[k] + j * self.row_bytes].view(self.dtype).reshape(len(k), *self.shape)
        if columns and current() is not None:  # a process worker: the column goes into the job's slot
            out = empty(x.shape, x.dtype)
            np.copyto(out, x)
            return out
        return x


class Spans:
    """A snapshot of the fixed fields' rows over the shards open when it was made (``opened``: the
    store's count of shard openings then). ``fields[f]``: field ``f``'s span, None for a variable
    field or one whose row shape differs between shards; ``covered[k]``: shard ``k`` is in it
    (``whole``: every shard is)."""

    __slots__ = ("opened", "covered", "whole", "fields")

    def __init__(self, opened: int, shards: dict[int, Any], nshards: int, rows: Any, nfields: int):
        self.opened = opened
        self.covered = np.zeros(nshards, bool)
        tables: list[dict[int, np.ndarray]] = [{} for _ in range(nfields)]
        for k, shard in shards.items():
            ts = shard.tables
            if not rows(k):
                continue  # empty: never in a span
            if any(t is not None and (not isinstance(t, np.ndarray) or len(t) != rows(k)) for t in ts):
                continue  # not the rows the manifest says: leave it to the shard-by-shard path
            self.covered[k] = True
            for f, t in enumerate(ts):
                if t is not None:
                    tables[f][k] = t
        self.whole = bool(self.covered.all())  # every shard: no need to look up which
        covered = int(self.covered.sum())  # a field fixed in some shards, variable in others: no span
        self.fields: list[_FieldSpan | None] = [
            _FieldSpan(ts, nshards) if ts and len(ts) == covered and _alike(ts) else None for ts in tables]

    def read(self, f: int, k: np.ndarray, j: np.ndarray, columns: bool) -> np.ndarray | None:
        """Field ``f``'s rows ``j`` of shards ``k`` (all covered), or None if it has no span."""
        span = self.fields[f]
        return None if span is None else span.read(k, j, columns)


def _alike(tables: dict[int, np.ndarray]) -> bool:
    first = next(iter(tables.values()))
    return 0 < first.dtype.itemsize * math.prod(first.shape[1:]) < 2**31 and all(
        t.shape[1:] == first.shape[1:] and t.dtype == first.dtype and t.flags.c_contiguous for t in tables.values())
