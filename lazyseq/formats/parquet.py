"""Parquet files read at random, where they lie: :func:`parquet`.

``len`` comes from the footers alone (read once, concurrently). Item ``i`` decodes the row group
that holds it, only the selected columns (at most ``cache`` decoded row groups per process, least
recently used out, each decoded once however many threads ask); a batch decodes each of its row
groups once. Over a URL a decode first fetches the byte ranges of its column chunks, all at once
(neighbours joined, the rest concurrent), each carrying the object's version.

The footers are data from elsewhere: their totals, each column chunk's byte range and the rows a
row group decodes to are checked, and what pyarrow refuses becomes a :class:`~lazyseq.StoreError`
naming the file and the row group.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Sequence
from typing import Any

from ..errors import StoreError
from ..files.remote import check_settings
from .blocks import Blocks
from .footer import MAX_FOOTER, Chunk, Footer, parse
from .pages import PageReader, simple
from .sources import Opened, Remotes, list_files, need, open_source, reader_errors, shown
from .values import Rows

__all__ = ["parquet", "Parquet"]

WHAT = "a Parquet file"
FOOTER_THREADS = 16  # footers read at once when a view opens many files
PAGES_PER_COLUMN = 4  # decoded pages kept per selected column and per row group of `cache`
PAGE_READS = 4 * 2**20  # local files: single reads go page by page in row groups of this many bytes (selected) or more
SPARSE = 64  # a bulk read takes a row group's rows from their pages when it asks for one in 64 or fewer
TAIL = 64 * 2**10  # the last bytes read first: the footer of most files (one request over a URL)


def _plan(md: Any, names: Sequence[str]) -> list[tuple[str, int, list[tuple[int, bool]]]]:
    """``(name, position among the file's top-level fields, [(leaf column, repeated)])`` of each
    selected column."""
    top = md.schema.to_arrow_schema().names
    leaves: dict[str, list[tuple[int, bool]]] = {n: [] for n in names}
    for c in range(md.num_columns):
        col = md.schema.column(c)
        for n in names:
            if col.path == n or col.path.startswith(n + "."):
                leaves[n].append((c, col.max_repetition_level > 0))
    return [(n, top.index(n), leaves[n]) for n in names]


class Parquet(Blocks):
    """Rows of Parquet files: see :func:`parquet`."""

    checks_keys = False
    _transient = ("_opened", "_remotes", "_plans", "_pages")

    def __init__(self, paths: Any, columns: Sequence[str] | None, cache: int, settings: dict, strict: bool):
        need("pyarrow.parquet", "parquet", "lazyseq.parquet")
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 1:
            raise ValueError(f"lazyseq.parquet: cache must be an int >= 1 (row groups kept decoded), got {cache!r}")
        check_settings(**{k: v for k, v in settings.items() if k in ("block_cache", "cache_dir_bytes", "timeout")})
        self.settings, self.strict = dict(settings), bool(strict)
        self._remotes = Remotes(self.settings)
        files = list_files(paths, (".parquet",), "lazyseq.parquet", self._remotes)
        self.names, self.paths = [n for n, _ in files], [p for _, p in files]
        self._opened: dict[int, tuple[Opened, Any, Footer]] = {}
        self._plans: dict[int, list] = {}  # file -> its selected columns' leaves (per process): _plan
        self._pages: PageReader | None = None  # single reads from pages where files have an offset index
        with concurrent.futures.ThreadPoolExecutor(min(FOOTER_THREADS, len(self.paths))) as pool:
            footers = list(pool.map(self._open, range(len(self.paths))))
        self.sizes = [o.size for o, _, _ in footers]
        self.stamps = [o.stamp for o, _, _ in footers]
        self.schema, self.columns = self._select(columns, [md for _, md, _ in footers])
        self._files_rows = [[md.row_group(r).num_rows for r in range(md.num_row_groups)] for _, md, _ in footers]
        self._block_of = [(k, r) for k, rows in enumerate(self._files_rows) for r in range(len(rows))]
        self._set_blocks([n for rows in self._files_rows for n in rows], cache)
        self._simple = [simple(self.schema.field(n).type) for n in self.columns]  # columns a page can answer for

    # -- files -----------------------------------------------------------------------------------
    def _open(self, k: int) -> tuple[Opened, Any, Footer]:
        """File ``k`` opened in this process: ``(opened, pyarrow metadata, column chunks' facts)``,
        its footer read and checked by :mod:`.footer` before pyarrow parses what is left of it."""
        got = self._opened.get(k)
        if got is not None:
            return got
        path = self.paths[k]
        opened = open_source(path, WHAT, self._remotes)
        foot = _footer(opened, shown(path))
        rows, chunks = foot.rows, foot.chunks
        with reader_errors(f"{shown(path)} ({WHAT}): its footer"):
            md = need("pyarrow.parquet", "parquet", "lazyseq.parquet").read_metadata(
                need("pyarrow", "parquet", "lazyseq.parquet").BufferReader(foot.small))
        if md.num_row_groups != len(rows) or any(md.row_group(r).num_rows != n for r, n in enumerate(rows)):
            raise StoreError(f"{shown(path)} ({WHAT}) is corrupted: pyarrow reads its footer otherwise")
        leaves = [md.schema.column(c).path for c in range(md.num_columns)]
        for r, group in enumerate(chunks):
            if [c.path for c in group] != leaves:
                raise StoreError(f"{shown(path)} ({WHAT}) is corrupted: row group {r} holds the column chunks "
                                 f"{_short([c.path for c in group])}, its schema the columns {_short(leaves)}")
        if hasattr(self, "sizes"):  # reopened (in a worker): the file the view was made from, or an error
            self._check_same(k, opened, rows)
        return self._opened.setdefault(k, (opened, md, foot))

    def _check_same(self, k: int, opened: Opened, rows: list[int]) -> None:
        same = opened.size == self.sizes[k] and rows == self._files_rows[k]
        if self.strict and opened.stamp != self.stamps[k]:
            same = False
        if not same:
            raise StoreError(f"{shown(self.paths[k])} ({WHAT}) changed since this view was made ({self.sizes[k]} bytes, "
                             f"then {opened.size}{', or another modification time or ETag' * self.strict}): make the "
                             "view again over the files as they are now")

    def _reopen(self) -> None:
        self._opened, self._remotes, self._plans, self._pages = {}, Remotes(self.settings), {}, None

    def _select(self, columns: Sequence[str] | None, footers: list) -> tuple[Any, list[str]]:
        """The schema of the selected columns (every file's, checked alike) and their names in schema order."""
        with reader_errors(f"{shown(self.paths[0])} ({WHAT}): its schema"):
            schemas = [md.schema.to_arrow_schema() for md in footers]
        for k, schema in enumerate(schemas):
            twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
            if twice:
                raise StoreError(f"{shown(self.paths[k])} ({WHAT}) has more than one column named {twice[0]!r}: rewrite "
                                 "it with distinct column names")
        first = schemas[0]
        if columns is None:
            names = list(first.names)
        else:
            if isinstance(columns, str):
                raise TypeError("lazyseq.parquet: columns must be a list of column names, got a str: use [name]")
            wanted = list(columns)
            unknown = [c for c in wanted if c not in first.names]
            if unknown:
                raise KeyError(f"lazyseq.parquet: no column {unknown[0]!r} in {shown(self.paths[0])}; its columns are "
                               f"{first.names}")
            names = [n for n in first.names if n in wanted]
        for k, schema in enumerate(schemas[1:], 1):
            for n in names:
                if n not in schema.names:
                    raise StoreError(f"{shown(self.paths[k])} ({WHAT}) has no column {n!r}, which "
                                     f"{shown(self.paths[0])} has: the files of one view share their columns")
                a, b = first.field(n).type, schema.field(n).type
                if a != b:
                    raise StoreError(f"{shown(self.paths[k])} ({WHAT}): column {n!r} is {b}, in {shown(self.paths[0])} "
                                     f"it is {a}: the files of one view share their schema")
        return need("pyarrow", "parquet", "lazyseq.parquet").schema([first.field(n) for n in names]), names

    # -- blocks ----------------------------------------------------------------------------------
    def _plan(self, k: int, md: Any) -> list:
        plan = self._plans.get(k)
        if plan is None:
            plan = self._plans[k] = _plan(md, self.columns)
        return plan

    def _get(self, i: int) -> Any:
        b, j = self._where(i)
        rows = self._decoded.peek(b)  # a held row group: no lock
        if rows is not None:
            return rows.row(j)
        row = self._from_pages(b, j)
        return row if row is not None else self._block(b).row(j)

    def _paged(self, b: int) -> tuple | None:
        """``(opened, footer, plan, file, row group)`` where the rows of block ``b`` can be read page by
        page (every selected column a simple one-leaf column with an offset index; a local file's
        row group large enough), else None."""
        k, r = self._block_of[b]
        opened, md, foot = self._open(k)
        plan = self._plan(k, md)
        if not all(ok and len(leaves) == 1 and foot.chunks[r][leaves[0][0]].index is not None
                   for ok, (_, _, leaves) in zip(self._simple, plan)):
            return None
        if opened.remote is None and sum(foot.chunks[r][c].nbytes for _, _, leaves in plan for c, _ in leaves) < PAGE_READS:
            return None  # a small row group of a local file decodes faster whole than page by page
        return opened, foot, plan, k, r

    def _from_pages(self, b: int, j: int) -> dict | None:
        """Row ``j`` of block ``b`` from the one page of each column that holds it, or None where a
        column cannot be read so (:mod:`.pages`)."""
        paged = self._paged(b)
        if paged is None:
            return None
        opened, foot, plan, k, r = paged
        if self._pages is None:
            self._pages = PageReader(PAGES_PER_COLUMN * self.cache * max(1, len(self.columns)))
        where = f"{shown(self.paths[k])} ({WHAT}), row group {r}"
        values = self._pages.row(opened, foot, [((k, r, leaves[0][0]), pos) for _, pos, leaves in plan],
                                 self._rows[b], j, where)
        return dict(zip(self.columns, values))

    def _sparse_ok(self, b: int, n: int) -> bool:
        return n * SPARSE <= self._rows[b] and self._paged(b) is not None

    def _sparse(self, b: int, js: list[int]) -> list | None:
        """Rows ``js`` of block ``b`` (not held) from their pages where they are few (one in
        ``SPARSE`` of its rows or fewer) and pages can be read, else None."""
        if not self._sparse_ok(b, len(js)):
            return None
        return [self._from_pages(b, j) for j in js]

    def _decode(self, b: int) -> Rows:
        k, r = self._block_of[b]
        opened, md, foot = self._open(k)
        where = f"{shown(self.paths[k])} ({WHAT}), row group {r}"
        ranges = []
        for c, repeated in [leaf for _, _, leaves in self._plan(k, md) for leaf in leaves]:
            chunk = foot.chunks[r][c]
            ranges.append(_chunk_range(chunk, opened.size, where))
            if not repeated and chunk.values != self._rows[b]:
                raise StoreError(f"{where} is corrupted: column {chunk.path!r} holds {chunk.values} values, the row group "
                                 f"{self._rows[b]} rows")
        pq = need("pyarrow.parquet", "parquet", "lazyseq.parquet")
        held = (opened.remote.remote.holding([opened.remote.request(a, z) for a, z in ranges if z > a])
                if opened.remote is not None else contextlib.nullcontext())
        with held, reader_errors(where):
            table = pq.ParquetFile(opened.source(), metadata=md, pre_buffer=False).read_row_group(
                r, columns=self.columns, use_threads=False)
            table.validate(full=True)  # offsets inside their buffers, UTF-8 strings: pyarrow's decoder checks neither
        if table.num_rows != self._rows[b]:
            raise StoreError(f"{where} is corrupted: it decodes to {table.num_rows} rows, its footer says {self._rows[b]}")
        return Rows(table)

    # -- description -----------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The files' names (relative to a folder given), sizes, row groups' rows and selected
        columns; with ``strict`` their modification times (URLs: ETags) too: no data read."""
        return {"files": self.names, "bytes": self.sizes, "rows": self._files_rows, "columns": self.columns,
                "stamps": [str(s) for s in self.stamps] if self.strict else None}

    def nbytes(self) -> int:
        """The size of the files, in bytes."""
        return sum(self.sizes)

    def describe(self) -> str:
        return f"parquet({len(self.paths)} file{'s' * (len(self.paths) != 1)}, {len(self.columns)} columns)"


def _short(names: list[str]) -> str:
    text = repr(names)
    return text if len(text) <= 200 else text[:200] + "...]"


def _footer(opened: Opened, name: str) -> Footer:
    """The footer of a Parquet file, its length checked against the file before it is read."""
    size = opened.size
    if size < 12 or opened.read(0, 4) != b"PAR1":
        raise StoreError(f"{name} ({WHAT}) is not a Parquet file: it does not start with PAR1 ({size} bytes)")
    tail = opened.read(max(0, size - TAIL), size)
    n = int.from_bytes(tail[-8:-4], "little")
    if tail[-4:] != b"PAR1" or n > size - 12 or n > MAX_FOOTER:
        raise StoreError(f"{name} ({WHAT}) is not a Parquet file, or is truncated: its footer "
                         f"{'does not end with PAR1' if tail[-4:] != b'PAR1' else f'says it takes {n} bytes of {size}'}")
    meta = tail[-8 - n : -8] if n + 8 <= len(tail) else opened.read(size - 8 - n, size - 8)
    return parse(meta, f"{name}")


def _chunk_range(chunk: Chunk, size: int, where: str) -> tuple[int, int]:
    """The byte range of a column chunk (from its dictionary page, if any), every offset checked to
    lie inside the file's data (after the leading magic, before the footer)."""
    offsets = [chunk.data] if chunk.dictionary is None else [chunk.data, chunk.dictionary]
    start, stop = min(offsets), min(offsets) + chunk.nbytes
    if not (4 <= start and max(offsets) < stop <= size - 8):
        raise StoreError(f"{where} is corrupted: column {chunk.path!r} says its pages start at "
                         f"{', '.join(map(str, offsets))} and take {chunk.nbytes} bytes, outside the file's "
                         f"data (bytes 4 to {size - 8})")
    return start, stop


def parquet(paths: Any, *, columns: Sequence[str] | None = None, cache: int = 4, storage_options: dict | None = None,
            block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int | None = None,
            timeout: float = 30.0, strict: bool = True) -> Parquet:
    """The rows of Parquet files as a random-access view of dicts ``{column: value}``.

    ``paths``: a path or URL, a list of them, or a folder or URL prefix (every ``*.parquet`` under
    it, by relative path; hidden names such as ``_SUCCESS``, ``_metadata`` and ``.crc`` files
    skipped). ``columns``: the top-level columns to read (default all), kept in schema order.
    Values follow :mod:`lazyseq.formats.values` (numbers as numpy scalars, lists of numbers as
    1-D arrays, strings, bytes, dicts, None) and equal ``pyarrow.parquet.read_table``'s rows.

    A read decodes the row group that holds the row (``cache`` of them kept per process); ``.cuts``
    gives ``block_shuffle`` its blocks, one per row group. ``storage_options``, ``block_cache``,
    ``cache_dir``, ``cache_dir_bytes`` and ``timeout`` are those of :func:`lazyseq.load` for URLs.
    The view pickles without data (a worker opens the files itself and refuses them if they
    changed); its fingerprint holds the files' names, sizes and rows, and with ``strict`` (the
    default) their modification times or ETags: ``strict=False`` lets a resume run over a copy.
    Needs pyarrow (``pip install 'lazyseq[parquet]'``).

    >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"x": [1, 2, 3], "s": ["a", "b", None]}), os.path.join(d, "a.parquet"), row_group_size=2)
    >>> v = parquet(d)
    >>> len(v), v[2], v.cuts
    (3, {'x': np.int64(3), 's': None}, [2])
    """
    settings = {"storage_options": storage_options, "block_cache": block_cache, "cache_dir": cache_dir,
                "cache_dir_bytes": cache_dir_bytes, "timeout": timeout}
    return Parquet(paths, columns, cache, settings, strict)
