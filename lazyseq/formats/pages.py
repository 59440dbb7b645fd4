"""One row of a Parquet column read from the page that holds it, where the file has an offset
index: the reads of :func:`lazyseq.parquet` that do not decode a whole row group.

A writer that keeps a page index (Spark, parquet-mr, ``pyarrow.parquet.write_table(...,
write_page_index=True)``) records where each data page of a column chunk lies and its first row.
For a single read of a row whose row group is not decoded, each selected column with one leaf of
a simple type (numbers, strings, binary, lists of those) reads its dictionary page (if any) and
the one data page of the row, and decodes them as a one-page Parquet file whose footer lazyseq
writes (:func:`page_file`); decoded pages are kept, a few per column. Other columns (structs,
maps, nested lists, timestamps whose time zone only the file's Arrow schema knows) and files
without an offset index decode the row group, as before.

Everything read is checked: the offset index's pages lie inside their column chunk, in order,
starting at row 0, and a page decodes to the rows the index gives it.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from typing import Any

from ..core.decoded import DecodedCache
from ..errors import StoreError
from .footer import Chunk, Footer
from .sources import Opened, need, reader_errors
from .thrift import BINARY, I32, I64, LIST, STRUCT, Reader, ThriftError, Writer, get_int, get_structs

__all__ = ["PageReader", "PageIndex", "offset_index", "page_file", "simple", "subtree"]

MAX_INDEX = 64 * 2**20  # bytes: an offset index larger than this is refused


class PageIndex(tuple):
    """``(first rows, locations)``: the first row of each data page and its ``(offset, bytes)``."""

    def page(self, j: int) -> int:
        return bisect.bisect_right(self[0], j) - 1


def offset_index(raw: bytes, chunk: Chunk, rows: int, where: str) -> PageIndex:
    """The offset index of ``chunk`` (a row group of ``rows`` rows) from its bytes, checked."""
    try:
        locs = get_structs(Reader(raw).struct(0), 1, "its page locations")
        pages = [(get_int(p, 3, "a first row"), get_int(p, 1, "an offset"), get_int(p, 2, "a size")) for p in locs]
    except (ThriftError, TypeError, ValueError, IndexError, KeyError, RecursionError) as e:
        raise StoreError(f"{where} is corrupted: the offset index of column {chunk.path!r} cannot be read ({e})") from None
    end = min(chunk.data, chunk.dictionary if chunk.dictionary is not None else chunk.data) + chunk.nbytes
    ok = bool(pages) and pages[0][0] == 0 and pages[0][1] >= chunk.data
    ok = ok and all(f0 < f1 and o0 + s0 <= o1 and s0 > 0 for (f0, o0, s0), (f1, o1, _) in itertools.pairwise(pages))
    ok = ok and pages[-1][0] < max(rows, 1) and pages[-1][1] + pages[-1][2] <= end and pages[-1][2] > 0
    ok = ok and (chunk.dictionary is None or chunk.dictionary < pages[0][1])
    if not ok:
        raise StoreError(f"{where} is corrupted: the offset index of column {chunk.path!r} does not describe pages "
                         f"inside its column chunk, in order, from row 0 to its {rows} rows")
    return PageIndex(([f for f, _, _ in pages], [(o, s) for _, o, s in pages]))


def subtree(schema: list[dict], field: int) -> list[dict]:
    """The schema elements of top-level field ``field`` (the element and its descendants, in order)."""
    at, k = 1, 0
    while at < len(schema):
        size = _size(schema, at)
        if k == field:
            return schema[at : at + size]
        at, k = at + size, k + 1
    raise IndexError(field)


def _size(schema: list[dict], at: int) -> int:
    """The number of elements of the subtree rooted at ``schema[at]``."""
    n, todo = 0, 1
    while todo:
        if at + n >= len(schema):
            raise ThriftError("its schema ends inside a group")
        children = schema[at + n].get(5, (I32, 0))[1]
        todo += children - 1
        n += 1
    return n


def simple(arrow_type: Any) -> bool:
    """Whether a column of this Arrow type reads the same from a one-page file as from its row group
    (a single leaf whose Python values do not depend on the file's Arrow schema)."""
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def page_values(header: bytes, where: str) -> int:
    """The value count of the data page whose bytes start with ``header`` (v1 or v2 data page)."""
    try:
        h = Reader(header).struct(0)
        body = h.get(5) or h.get(8)
        if body is None or body[0] != STRUCT:
            raise ThriftError("it is not a data page")
        return get_int(body[1], 1, "its value count")
    except (ThriftError, TypeError, ValueError, IndexError, KeyError, RecursionError) as e:
        raise StoreError(f"{where} is corrupted: a data page's header cannot be read ({e})") from None


def page_file(foot: Footer, field: int, chunk: Chunk, dictionary: Any, page: Any, rows: int, values: int) -> bytes:
    """A Parquet file of one column (top-level field ``field``), one row group of ``rows`` rows:
    the ``dictionary`` page (or b"") then the data ``page``, with a footer written here."""
    meta = dict(chunk.meta)
    first = 4 + len(dictionary)
    meta[5] = (I64, values)
    meta[6] = meta[7] = (I64, len(dictionary) + len(page))
    meta[9] = (I64, first)
    if dictionary:
        meta[11] = (I64, 4)
    else:
        meta.pop(11, None)
    root = {3: (I32, 0), 4: (BINARY, b"schema"), 5: (I32, 1)}
    column = {2: (I64, 4), 3: (STRUCT, meta)}
    group = {1: (LIST, (STRUCT, [column])), 2: (I64, len(dictionary) + len(page)), 3: (I64, rows)}
    fm = {1: (I32, 1), 2: (LIST, (STRUCT, [root, *subtree(foot.schema, field)])), 3: (I64, rows),
          4: (LIST, (STRUCT, [group]))}
    if foot.created_by is not None:
        fm[6] = foot.created_by
    w = Writer()
    w.struct(fm)
    body = bytes(w.out)
    return b"".join((b"PAR1", dictionary, page, body, struct.pack("<I", len(body)), b"PAR1"))


class PageReader:
    """The pages of one view in one process: offset indexes read once, decoded pages kept (at most
    ``capacity``, least recently used out). Holds no reference to the view."""

    def __init__(self, capacity: int):
        self.indexes: dict[tuple[int, int, int], PageIndex] = {}
        self.pages = DecodedCache(capacity)

    def row(self, opened: Opened, foot: Footer, cols: list[tuple[tuple[int, int, int], int]], rows: int, j: int,
            where: str) -> list:
        """Row ``j`` of each leaf column ``key = (file, row group, leaf)`` of ``cols`` (with its
        top-level field in the schema), the row group holding ``rows`` rows: the offset indexes
        not read yet are fetched at once, then the pages not held, at once (two round trips over
        a URL, whatever the number of columns)."""
        todo = [(key, foot.chunks[key[1]][key[2]]) for key, _ in cols if key not in self.indexes]
        if todo:
            raws = opened.read_many([_index_range(opened, chunk, where) for _, chunk in todo])
            for (key, chunk), raw in zip(todo, raws):
                self.indexes[key] = offset_index(raw, chunk, rows, where)
        wanted = [(key, field, foot.chunks[key[1]][key[2]], self.indexes[key].page(j)) for key, field in cols]
        missing = [w for w in wanted if self.pages.peek((*w[0], w[3])) is None]
        fetched: dict = {}
        if missing:
            ranges = [r for key, _, chunk, p in missing for r in _page_ranges(chunk, self.indexes[key], p)]
            parts = iter(opened.read_many(ranges))
            for key, _, chunk, p in missing:
                fetched[(*key, p)] = (next(parts), next(parts) if chunk.dictionary is not None else b"")
        out = []
        for key, field, chunk, p in wanted:
            index, got = self.indexes[key], fetched.get((*key, p))
            first, get = self.pages.get((*key, p), lambda _, c=chunk, f=field, i=index, q=p, g=got: _decode(
                opened, foot, f, c, i, q, rows, where, g))
            out.append(get(j - first))
        return out


def _index_range(opened: Opened, chunk: Chunk, where: str) -> tuple[int, int]:
    off, n = chunk.index  # type: ignore[misc]
    if not (4 <= off and 0 < n <= MAX_INDEX and off + n <= opened.size - 8):
        raise StoreError(f"{where} is corrupted: the offset index of column {chunk.path!r} says it lies at bytes "
                         f"{off} to {off + n}, outside the file's data")
    return off, off + n


def _page_ranges(chunk: Chunk, index: PageIndex, p: int) -> list[tuple[int, int]]:
    """The byte ranges of data page ``p`` and of the column chunk's dictionary page (if any)."""
    off, size = index[1][p]
    return [(off, off + size)] + ([(chunk.dictionary, index[1][0][0])] if chunk.dictionary is not None else [])


def _decode(opened: Opened, foot: Footer, field: int, chunk: Chunk, index: PageIndex, p: int, rows: int,
            where: str, got: tuple[bytes, bytes] | None = None) -> tuple[int, Any]:
    """``(first row, getter)`` of data page ``p`` of ``chunk``, decoded as a one-page file; ``got``:
    the page's bytes and its dictionary's, where they were fetched already."""
    from .values import getter

    first = index[0][p]
    stop = index[0][p + 1] if p + 1 < len(index[0]) else rows
    if got is None:
        parts = opened.read_many(_page_ranges(chunk, index, p))
        got = parts[0], (parts[1] if len(parts) > 1 else b"")
    page, dictionary = got
    if len(page) < 1 or (chunk.dictionary is not None and len(dictionary) < 1):
        raise StoreError(f"{where} is corrupted: an empty page")
    where = f"{where}, column {chunk.path!r}, page {p}"
    data = page_file(foot, field, chunk, dictionary, page, stop - first, page_values(page, where))
    pa, pq = need("pyarrow", "parquet", "lazyseq.parquet"), need("pyarrow.parquet", "parquet", "lazyseq.parquet")
    with reader_errors(where):
        table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read_row_group(0, use_threads=False)
        table.validate(full=True)
    if table.num_rows != stop - first:
        raise StoreError(f"{where} is corrupted: it decodes to {table.num_rows} rows, its offset index says {stop - first}")
    return first, getter(table.column(0))
