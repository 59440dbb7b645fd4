"""Arrow IPC files and Hugging Face datasets read at random, where they lie: :func:`arrow`.

A source is a list of *parts* (an IPC file, or a table held in memory), each a run of record
batches; the view's blocks are the parts' batches in order. A Hugging Face dataset adds two maps
in front: *segments* (the runs of rows of its parts that its table is made of: a ``select`` of a
range slices a file) and *indices* (its row mapping: ``shuffle``, ``select``, ``filter``, ``sort``,
``train_test_split``), so item ``i`` is ``ds[i]``'s row.

Local files are memory mapped and their batches read as views of the map (:mod:`.ipc`); a batch is
checked in full (``RecordBatch.validate(full=True)``) when first decoded, so garbled offsets or
UTF-8 raise :class:`~lazyseq.StoreError` rather than reading outside the file or a crash.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import StoreError
from ..files import is_url
from ..files.remote import check_settings
from .blocks import Blocks
from .hf import is_saved, plan_dataset, plan_folder
from .ipc import SUFFIXES, WHAT, Index, index_file, pyarrow, table_index
from .sources import Opened, Remotes, list_files, open_source, reader_errors, shown
from .values import Rows

__all__ = ["arrow", "Arrow"]

CACHE_LOCAL, CACHE_URL = 4096, 16  # decoded record batches kept per process by default (see arrow's cache)
OPEN_THREADS = 16  # files opened (and over URLs their footers read) at once when a view is made



class Arrow(Blocks):
    """Rows of Arrow IPC files or of a Hugging Face dataset: see :func:`arrow`."""

    checks_keys = False
    _transient = ("_opened", "_remotes", "_order", "_valid")

    def __init__(self, plan: dict, columns: Sequence[str] | None, cache: int | None, settings: dict, strict: bool):
        pyarrow()
        if cache is None:  # mapped or in memory: a decoded batch is views; over a URL it holds its bytes
            cache = CACHE_URL if any(isinstance(p, str) and is_url(p) for p in plan["paths"]) else CACHE_LOCAL
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 1:
            raise ValueError(f"lazyseq.arrow: cache must be an int >= 1 (record batches kept decoded), got {cache!r}")
        self.settings, self.strict = dict(settings), bool(strict)
        self.names, self.paths = plan["names"], plan["paths"]  # paths[k]: a path, a URL, or a table held in memory
        self._listed = plan.get("listed")  # the file that lists the sources (a dataset's state.json), if any
        self.segments = plan.get("segments")  # [(part, first row, rows)], or None: every part's rows, in order
        self.indices = plan.get("indices")  # None, ("memory", array) or (source k, first, rows): an indices file
        self._remotes, self._opened = plan.get("remotes") or Remotes(self.settings), plan.get("opened", {})
        with concurrent.futures.ThreadPoolExecutor(min(OPEN_THREADS, len(self.paths))) as pool:
            indexes = list(pool.map(self._open, range(len(self.paths))))
        self.sizes = [o.size if o is not None else None for o, _ in indexes]
        self.stamps = [o.stamp if o is not None else None for o, _ in indexes]
        self._files_rows = [ix.rows for _, ix in indexes]
        self.parts = [(k, {n: n for n in indexes[k][1].schema.names} if r is None else r) for k, r in plan["parts"]]
        self.schema, self.columns = self._select(columns, plan.get("default_columns"), [ix.schema for _, ix in indexes])
        self._block_of = [(p, r) for p, (k, _) in enumerate(self.parts) for r in range(len(self._files_rows[k]))]
        self._set_blocks([n for k, _ in self.parts for n in self._files_rows[k]], cache)
        self._set_segments()
        self._order = self._indices_array()
        self._valid: set[tuple[int, int]] = set()  # (source, batch) of memory maps checked in full in this process

    # -- sources ---------------------------------------------------------------------------------
    def _open(self, k: int) -> tuple[Opened | None, Index]:
        """Source ``k`` opened and indexed in this process (a table in memory: its batches)."""
        got = self._opened.get(k)
        if got is not None:
            return got
        src = self.paths[k]
        if not isinstance(src, str):
            return self._opened.setdefault(k, (None, table_index(src)))
        try:
            opened = open_source(src, WHAT, self._remotes)
        except FileNotFoundError:
            if self._listed is None:
                raise
            raise StoreError(f"{shown(src)} ({WHAT}) is missing: {self._listed} lists it") from None
        index = index_file(opened, f"{shown(src)} ({WHAT})")
        if hasattr(self, "sizes"):  # reopened (in a worker): the file the view was made from, or an error
            same = opened.size == self.sizes[k] and index.rows == self._files_rows[k]
            if not same or (self.strict and opened.stamp != self.stamps[k]):
                raise StoreError(f"{shown(src)} ({WHAT}) changed since this view was made ({self.sizes[k]} bytes, then "
                                 f"{opened.size}{', or another modification time or ETag' * self.strict}): make the "
                                 "view again over the files as they are now")
        return self._opened.setdefault(k, (opened, index))

    def _reopen(self) -> None:
        self._opened, self._remotes, self._valid = {}, Remotes(self.settings), set()
        self._order = self._indices_array()

    def _select(self, columns: Sequence[str] | None, default: Sequence[str] | None, schemas: list) -> tuple[Any, list[str]]:
        """The schema of the selected view columns (every part's, checked alike) and their names."""
        k0, names0 = self.parts[0]
        field0 = {view: schemas[k0].field(col) for view, col in names0.items()}
        order = list(names0)
        if columns is None:
            names = [n for n in order if default is None or n in default]
        else:
            if isinstance(columns, str):
                raise TypeError("lazyseq.arrow: columns must be a list of column names, got a str: use [name]")
            unknown = [c for c in columns if c not in field0]
            if unknown:
                raise KeyError(f"lazyseq.arrow: no column {unknown[0]!r} in {self._shown(k0)}; its columns are {order}")
            names = [n for n in order if n in columns]
        for k, renames in self.parts[1:]:
            for n in names:
                if n not in renames:
                    raise StoreError(f"{self._shown(k)} has no column {n!r}, which {self._shown(k0)} has: the files of "
                                     "one view share their columns")
                a, b = field0[n].type, schemas[k].field(renames[n]).type
                if a != b:
                    raise StoreError(f"{self._shown(k)}: column {n!r} is {b}, in {self._shown(k0)} it is {a}: the files "
                                     "of one view share their schema")
        return pyarrow().schema([field0[n].with_name(n) for n in names]), names

    def _shown(self, k: int) -> str:
        src = self.paths[k]
        return f"{shown(src)} ({WHAT})" if isinstance(src, str) else "a table held in memory"

    # -- the row maps: item -> data row (indices) -> base row (segments) -------------------------
    def _set_segments(self) -> None:
        """``_seg_starts[s]``: the data row where segment ``s`` starts; ``_seg_base[s]``: its base row."""
        part_rows = [sum(self._files_rows[k]) for k, _ in self.parts]
        part_base = [0, *np.cumsum(part_rows).tolist()]
        segments = self.segments if self.segments is not None else [(p, 0, n) for p, n in enumerate(part_rows)]
        self._seg_starts, self._seg_base, at = [], [], 0
        for p, first, n in segments:
            if not (0 <= p < len(part_rows) and 0 <= first and 0 <= n and first + n <= part_rows[p]):
                raise ValueError(f"lazyseq.arrow: rows {first} to {first + n} of part {p}, which holds "
                                 f"{part_rows[p] if 0 <= p < len(part_rows) else 'no'} rows")
            self._seg_starts.append(at)
            self._seg_base.append(part_base[p] + first)
            at += n
        self._data_rows = at
        self._identity = self._seg_base == self._seg_starts and at == self._starts[-1]

    def _indices_array(self) -> np.ndarray | None:
        """The dataset's row mapping in this process (an indices file is read here), checked."""
        if self.indices is None:
            return None
        if self.indices[0] == "memory":
            _check_indices(self.indices[1], self._data_rows, "the dataset's row mapping (held in memory)")
            return self.indices[1]
        k, first, n = self.indices
        _, index = self._open(k)
        where = self._shown(k)
        with reader_errors(where):
            col = pyarrow().Table.from_batches(index.batches or [], index.schema).column("indices").slice(first, n)
            out = col.to_numpy().astype(np.int64) if len(col) else np.zeros(0, np.int64)
        if len(out) != n:
            raise StoreError(f"{where} holds {first + len(out)} indices, {first + n} are expected")
        _check_indices(out, self._data_rows, where)
        out.flags.writeable = False
        return out

    def _len(self) -> int:
        return self._data_rows if self._order is None else len(self._order)

    def _base(self, i: int) -> int:
        d = i if self._order is None else int(self._order[i])
        if self._identity:
            return d
        s = bisect.bisect_right(self._seg_starts, d) - 1
        return self._seg_base[s] + d - self._seg_starts[s]

    def _bases(self, idx: Sequence[int]) -> list[int]:
        d = np.asarray(idx, dtype=np.int64)
        if self._order is not None:
            d = self._order[d]
        if not self._identity:
            starts = np.asarray(self._seg_starts, dtype=np.int64)
            s = np.searchsorted(starts, d, side="right") - 1
            d = np.asarray(self._seg_base, dtype=np.int64)[s] + d - starts[s]
        return d.tolist()

    def _get(self, i: int) -> Any:
        return super()._get(self._base(i))

    def _get_many(self, idx: Sequence[int]) -> list:
        return super()._get_many(self._bases(idx))

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        return super()._get_each(self._bases(idx), out)

    @property
    def cuts(self) -> list[int]:
        """Where each run of items from one record batch starts (the first run's start, 0, left out):
        ``block_shuffle(v, v.cuts, seed)`` shuffles reading a few batches at a time. Over files in
        order these are the batches' starts; over a dataset's row mapping (a shuffle, a filter),
        the runs its order makes (a shuffled order: nearly one item each, so ``block_shuffle``
        reads at random, as the dataset itself does)."""
        if self._order is None and self._identity:
            return super().cuts
        base = np.asarray(self._bases(range(len(self))), dtype=np.int64)
        block = np.searchsorted(np.asarray(self._starts, dtype=np.int64), base, side="right") - 1
        return (np.flatnonzero(np.diff(block)) + 1).tolist()

    # -- blocks ----------------------------------------------------------------------------------
    def _decode(self, b: int) -> Rows:
        p, r = self._block_of[b]
        k, renames = self.parts[p]
        opened, index = self._open(k)
        where = f"{self._shown(k)}, record batch {r}"
        with reader_errors(where):
            if index.batches is not None:
                batch = index.batches[r]
            else:
                o, m, body = index.blocks[r]
                with opened.remote.remote.holding([opened.remote.request(o, o + m + body)]):
                    reader = pyarrow().ipc.open_file(opened.source())
                    if reader.num_record_batches != len(index.blocks):
                        raise StoreError(f"{where}: the file now has {reader.num_record_batches} record batches, its "
                                         f"footer said {len(index.blocks)}")
                    batch = reader.get_batch(r)
            batch = batch.select([renames[n] for n in self.columns]).rename_columns(self.columns)
            if index.batches is None or (k, r) not in self._valid:  # a mapped batch checked once per process
                batch.validate(full=True)
                if index.batches is not None:
                    self._valid.add((k, r))
            if batch.num_rows != self._rows[b]:
                raise StoreError(f"{where} is corrupted: it decodes to {batch.num_rows} rows, its metadata says "
                                 f"{self._rows[b]}")
            return Rows(batch)

    # -- description -----------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The files' names, sizes, batches' rows, the selected columns, the dataset's segments and
        row mapping (an indices file by its identity; tables and indices held in memory by a hash
        of their data); with ``strict`` the files' modification times (URLs: ETags) too."""
        memory = {k: _digest(src) for k, src in enumerate(self.paths) if not isinstance(src, str)}
        indices = self.indices
        if indices is not None and indices[0] == "memory":
            indices = hashlib.blake2b(np.ascontiguousarray(indices[1]).tobytes(), digest_size=16).hexdigest()
        return {"files": self.names, "bytes": self.sizes, "rows": self._files_rows, "columns": self.columns,
                "parts": [[k, sorted(r.items())] for k, r in self.parts], "segments": self.segments, "indices": indices,
                "tables": memory or None, "stamps": [str(s) for s in self.stamps] if self.strict else None}

    def nbytes(self) -> int:
        """The size of the files (and tables in memory), in bytes."""
        return sum(s if s is not None else src.nbytes for s, src in zip(self.sizes, self.paths))

    def describe(self) -> str:
        files = sum(isinstance(p, str) for p in self.paths)
        mapped = ", a row mapping" * (self.indices is not None)
        return f"arrow({files} file{'s' * (files != 1)}, {len(self.columns)} columns{mapped})"


def _check_indices(a: np.ndarray, rows: int, where: str) -> None:
    if len(a) and (int(a.min()) < 0 or int(a.max()) >= rows):
        raise StoreError(f"{where}: its row mapping names row {int(a.max()) if int(a.min()) >= 0 else int(a.min())}, "
                         f"the dataset has {rows} rows")


def _digest(table: Any) -> str:
    """A hash of a table's data (its IPC stream), for the fingerprint of a dataset held in memory."""
    pa = pyarrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return hashlib.blake2b(sink.getvalue(), digest_size=16).hexdigest()


def arrow(source: Any, *, columns: Sequence[str] | None = None, split: str | None = None, cache: int | None = None,
          storage_options: dict | None = None, block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None,
          cache_dir_bytes: int | None = None, timeout: float = 30.0, strict: bool = True) -> Arrow:
    """The rows of Arrow IPC files or of a Hugging Face dataset as a random-access view of dicts.

    ``source``: an Arrow IPC file (``.arrow``, ``.feather`` v2, ``.ipc``; the file or the stream
    format), a folder or URL prefix of them or a list of those (as :func:`~lazyseq.parquet`'s
    ``paths``); a folder written by ``datasets.Dataset.save_to_disk`` (the files its ``state.json``
    lists; a ``DatasetDict`` folder with ``split=``); or a ``datasets.Dataset`` (or ``DatasetDict``
    with ``split=``): its files and its row mapping, so a shuffled, selected, filtered or split
    dataset gives ``ds[i]``'s row as item ``i``. ``columns``: those to read (default: all, or the
    dataset's format columns), in schema order. Values follow :mod:`lazyseq.formats.values`;
    ``datasets`` features that need decoding (``Image``, ``Audio``) are read as their storage
    (dicts of ``bytes`` and ``path``), never decoded or unpickled.

    Local files are memory mapped: numbers are views of the map, copied by nothing but the item.
    ``cache``: record batches kept decoded per process; None: ``CACHE_LOCAL`` (4096) for files
    on local disk and tables in memory, whose decoded batches are views of the map (each costs
    little more than its offsets), ``CACHE_URL`` (16) over URLs, where each holds its bytes.
    ``.cuts`` (for ``block_shuffle``) are the record batches' starts, or over a row mapping where
    its runs of items from one batch start. Over a URL a file-format file reads its footer, then
    each record batch by ranges; a stream-format file is read whole into memory once per process
    (at most 1 GiB; with ``cache_dir`` a local copy). The view pickles without data, except the
    tables and row mapping of a dataset held in memory (``Dataset.from_dict``), which travel with
    it. ``storage_options`` to ``strict``: as :func:`~lazyseq.parquet`. Needs pyarrow
    (``pip install 'lazyseq[parquet]'``); a ``datasets.Dataset`` object needs ``lazyseq[hf]``.

    >>> import os, tempfile, pyarrow as pa
    >>> path = os.path.join(tempfile.mkdtemp(), "a.arrow")
    >>> schema = pa.schema({"x": pa.int64(), "s": pa.string()})
    >>> with pa.ipc.new_file(path, schema) as w:
    ...     w.write_batch(pa.record_batch({"x": [1, 2], "s": ["a", "b"]}, schema=schema))
    ...     w.write_batch(pa.record_batch({"x": [3], "s": [None]}, schema=schema))
    >>> v = arrow(path)
    >>> len(v), v[2], v.cuts
    (3, {'x': np.int64(3), 's': None}, [2])
    """
    pyarrow()
    settings = {"storage_options": storage_options, "block_cache": block_cache, "cache_dir": cache_dir,
                "cache_dir_bytes": cache_dir_bytes, "timeout": timeout}
    check_settings(**{k: v for k, v in settings.items() if k in ("block_cache", "cache_dir_bytes", "timeout")})
    remotes = Remotes(settings)
    if type(source).__module__.split(".")[0] == "datasets":
        if isinstance(source, dict):  # a DatasetDict
            if split not in source:
                raise ValueError(f"lazyseq.arrow: give split=, one of {list(source)}")
            source = source[split]
        elif split is not None:
            raise ValueError("lazyseq.arrow: split= is for a DatasetDict")
        plan = plan_dataset(source, remotes)
    elif is_saved(source, remotes):
        plan = plan_folder(source, split, remotes)
    else:
        if split is not None:
            raise ValueError("lazyseq.arrow: split= is for a DatasetDict (a folder or object)")
        files = list_files(source, SUFFIXES, "lazyseq.arrow", remotes)
        plan = {"names": [n for n, _ in files], "paths": [p for _, p in files], "parts": [(k, None) for k in range(len(files))]}
    plan.setdefault("remotes", remotes)
    return Arrow(plan, columns, cache, settings, strict)
