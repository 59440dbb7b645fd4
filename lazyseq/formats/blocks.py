"""The view every format of this package is: rows stored in blocks (Parquet row groups, Arrow
record batches, Lance fragments), a few decoded blocks kept per process.

A format says how many rows each block holds (known when the view is made, from footers or
metadata alone) and how to decode one block (:meth:`Blocks._decode`, returning
:class:`~lazyseq.formats.values.Rows` or any object with ``row(j)`` and ``rows(js)``). This class
does the rest once: ``len``, item ``i`` -> (block, row) by bisection, the cache of ``cache``
decoded blocks (:class:`~lazyseq.core.decoded.DecodedCache`: each decoded once, however many
threads ask), bulk reads grouped by block (each block decoded once per batch, held blocks first),
reads past failures, ``.cuts`` for ``block_shuffle``, and pickling without data (a subclass names
its per-process state in ``_transient``; a worker opens its own files).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from ..core.base import View
from ..core.decoded import DecodedCache
from ..core.node import Failed, into
from .values import collate

__all__ = ["Blocks"]


class Blocks(View):
    """Rows in blocks; a subclass calls :meth:`_set_blocks` in ``__init__`` and implements
    :meth:`_decode` and ``describe``."""

    _transient: tuple[str, ...] = ()  # attributes made per process (open files), dropped by pickling
    decodes_blocks = True  # a read decodes its whole block, so block_shuffle's window should fit in `cache`

    def _set_blocks(self, rows: Sequence[int], cache: int) -> None:
        """``rows[b]``: the rows of block ``b``; ``cache``: decoded blocks kept in memory at most."""
        self.cache = int(cache)
        self._rows = [int(n) for n in rows]
        self._starts = list(itertools.accumulate(self._rows, initial=0))  # block b holds rows starts[b] to starts[b + 1]
        self._decoded = DecodedCache(self.cache)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_decoded", *self._transient):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._decoded = DecodedCache(self.cache)
        self._reopen()

    def _reopen(self) -> None:
        """Make the per-process state named in ``_transient`` (after unpickling)."""

    # -- what a format implements --------------------------------------------------------------
    def _decode(self, b: int) -> Any:
        """Block ``b``'s rows (``.row(j)``, ``.rows(js)``), checked to hold ``self._rows[b]`` rows."""
        raise NotImplementedError

    # -- shape -----------------------------------------------------------------------------------
    def _len(self) -> int:
        return self._starts[-1]

    @property
    def blocks(self) -> int:
        """The number of blocks."""
        return len(self._rows)

    @property
    def block_rows(self) -> tuple[int, ...]:
        """The rows of every block, in order."""
        return tuple(self._rows)

    @property
    def cuts(self) -> list[int]:
        """The index where each block after the first starts: ``block_shuffle(v, v.cuts, seed)``
        shuffles this data reading a few blocks at a time."""
        return self._starts[1:-1]

    def held(self) -> list[int]:
        """The blocks decoded in memory now, least recently used first."""
        return self._decoded.held()

    # -- reads -----------------------------------------------------------------------------------
    def _where(self, i: int) -> tuple[int, int]:
        b = bisect.bisect_right(self._starts, i) - 1  # past empty blocks, which start where the next one does
        return b, i - self._starts[b]

    def _block(self, b: int) -> Any:
        return self._decoded.get(b, self._decode)

    def _get(self, i: int) -> Any:
        b, j = self._where(i)
        rows = self._decoded.peek(b)  # a held block: no lock
        return (rows if rows is not None else self._block(b)).row(j)

    def _grouped(self, idx: Sequence[int], past_failures: bool) -> list:
        """Decode every block once for all its rows in ``idx``: the blocks in memory first, then
        the others in order."""
        a = np.asarray(idx, dtype=np.int64)
        out: list = [None] * len(a)
        held = set(self._decoded.held())
        for b, ats in self._groups(a):
            try:
                js = (a[ats] - self._starts[b]).tolist()
                rows = None if b in held else self._sparse(b, js)
                if rows is None:
                    rows = self._block(b).rows(js)
            except Exception as e:
                if not past_failures:
                    raise
                rows = [Failed(e)] * len(ats)
            for at, row in zip(ats.tolist(), rows):
                out[at] = row
            rows = None  # not held while the next block is decoded: the cache bound holds
        return out

    def _groups(self, a: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(block, positions in a)`` of every block the keys ``a`` fall in: the blocks in memory
        first (a batch across two shuffle windows then never evicts a block it still needs), then
        the others in order."""
        where = np.searchsorted(np.asarray(self._starts, dtype=np.int64), a, side="right") - 1
        sort = np.argsort(where, kind="stable")
        blocks, first = np.unique(where[sort], return_index=True)
        held = set(self._decoded.held())
        return sorted(zip(blocks.tolist(), np.split(sort, first[1:])), key=lambda g: g[0] not in held)

    def _sparse_ok(self, b: int, n: int) -> bool:
        """Whether :meth:`_sparse` would read ``n`` rows of block ``b`` (not held) without decoding it."""
        return False

    def _sparse(self, b: int, js: list[int]) -> list | None:
        """Rows ``js`` of block ``b``, not held, read without decoding the block (a format that can:
        Parquet's pages), or None: the block is decoded."""
        return None

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._grouped(idx, False)

    # -- reads by columns: a batch without per-item objects ----------------------------------------
    def _columnar(self) -> bool:
        return True

    def _get_columns(self, idx: np.ndarray) -> Any:
        """``default_collate`` of items ``idx`` built from the decoded blocks' columns (numpy gathers
        and slices of their buffers: :meth:`Rows.columns`), or where a column is not read so, from
        one Arrow ``take`` per block; NotImplemented where items would not stack so
        (:func:`~lazyseq.formats.values.collate`)."""
        a = np.asarray(idx, dtype=np.int64)
        if not len(a):
            return NotImplemented
        parts: list[tuple[np.ndarray, list]] = []
        groups = self._groups(a)
        held = set(self._decoded.held())
        if any(b not in held and self._sparse_ok(b, len(ats)) for b, ats in groups):
            return NotImplemented  # the items, read from their pages, then collated
        for b, ats in groups:
            block = self._block(b)
            names = getattr(block, "names", None)
            cols = block.columns(a[ats] - self._starts[b]) if hasattr(block, "columns") else None
            block = None  # not held while the next block is decoded: the cache bound holds
            if cols is None:
                return self._take_columns(a)
            if any(c is NotImplemented for c in cols):
                return NotImplemented
            parts.append((ats, cols))
        return _merge(names, parts, len(a))

    def _take_columns(self, a: np.ndarray) -> Any:
        """:meth:`_get_columns` by Arrow: one ``take`` per block, the parts joined, then collated."""
        import pyarrow as pa

        parts, order = [], []
        for b, ats in self._groups(a):
            block = self._block(b)
            if getattr(block, "table", None) is None:
                return NotImplemented
            parts.append(block.table.take(pa.array(a[ats] - self._starts[b])))
            order.append(ats)
            block = None  # not held while the next block is decoded: the cache bound holds
        table = pa.concat_tables([pa.Table.from_batches([p]) if isinstance(p, pa.RecordBatch) else p for p in parts])
        sort = np.concatenate(order)
        if not (np.diff(sort) > 0).all():  # back to the order asked
            table = table.take(pa.array(np.argsort(sort, kind="stable")))
        return collate(table)

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        return into(out, self._grouped(idx, True))


def _merge(names: list[str], parts: list[tuple[np.ndarray, list]], n: int) -> Any:
    """The columns of ``parts`` (each block's positions in the batch and its columns) as one batch
    in the order asked; NotImplemented where blocks' arrays differ in shape (lists of other lengths)."""
    if len(parts) == 1 and (parts[0][0] == np.arange(n)).all():
        return dict(zip(names, parts[0][1]))
    out = {}
    back = np.argsort(np.concatenate([ats for ats, _ in parts]), kind="stable") if n > 1 else np.zeros(n, np.int64)
    for c, name in enumerate(names):
        first = parts[0][1][c]
        if isinstance(first, np.ndarray):
            if any(p[1][c].shape[1:] != first.shape[1:] or p[1][c].dtype != first.dtype for p in parts):
                return NotImplemented
            col = np.empty((n, *first.shape[1:]), first.dtype)
            for ats, cols in parts:
                col[ats] = cols[c]
        else:  # the parts' values one after the other, then put in the order asked
            col = list(itemgetter(*back.tolist())(list(itertools.chain.from_iterable(p[1][c] for p in parts))))
        out[name] = col
    return out
