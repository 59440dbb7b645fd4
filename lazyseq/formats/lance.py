"""Lance datasets read at random, where they lie: :func:`lance`.

A view reads one version of the dataset, the one current when it was made (a worker reopens
exactly that version). Its blocks are the version's fragments (``.cuts``, ``.block_rows``), their
rows counted from the manifest alone, deleted rows left out. Reads go through Lance's own random
access, ``take``, never a whole fragment (one may hold millions of rows): a batch is one ``take``;
a single read takes its *window*, the few neighbouring rows of its fragment that a ``take`` of one
row costs about as much as (at most ``WINDOW_ROWS`` rows and about ``WINDOW_BYTES`` of data files),
and keeps ``cache`` windows per process, so reading rows in order costs one ``take`` per window.

The manifest is data from elsewhere: a local dataset's data and deletion files are checked when
the view is made (each a regular file inside the dataset, not a link, of the size the manifest
says), and whatever Lance raises, a Rust panic included, becomes a :class:`~lazyseq.StoreError`
naming the dataset, its version and the fragments read.

This module is ``lazyseq.formats.lance``: the ``lance`` package (pylance) is imported by absolute
name inside functions (:func:`~lazyseq.formats.sources.need`), never at ``import lazyseq``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..core.node import each, into
from ..errors import StoreError
from ..files import is_url, local_path
from .blocks import Blocks
from .sources import need, reader_errors, shown
from .values import Rows, collate

__all__ = ["lance", "Lance"]

WHAT = "a Lance dataset"
# A take of 256 neighbouring rows costs ~1.1 times one of a single row (1,024: ~1.3-1.5 times; measured on
# 100,000 rows of 4 columns), and rows may be images: a window is at most this many rows and about this
# many bytes of data files.
WINDOW_ROWS = 256
WINDOW_BYTES = 2**20


def _pylance() -> Any:
    return need("lance", "lance", "lazyseq.lance")


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """Lance's exceptions as StoreError naming ``what``; a Rust panic too (pyo3's PanicException
    derives from BaseException, so it would pass an ``except Exception``)."""
    try:
        with reader_errors(what):
            yield
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        text = " ".join(str(e).split())[:300]
        raise StoreError(f"{what} is not valid: Lance failed reading it (a panic: {text!r})") from None


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _check_folder(path: str) -> None:
    """A local dataset: a real folder (not a link) holding ``_versions/``."""
    st = _lstat(path)
    if st is None:
        raise FileNotFoundError(f"{path} ({WHAT}) is missing")
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path} ({WHAT}) is a symbolic link: lazyseq.lance reads a dataset where it lies, not through "
                         f"a link; give the folder it points to ({os.path.realpath(path)})")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path} is not {WHAT}: it is a file, a Lance dataset is a folder (_versions/, data/)")
    versions = _lstat(os.path.join(path, "_versions"))
    if versions is None or not stat.S_ISDIR(versions.st_mode):
        raise StoreError(f"{path} is not {WHAT}: it has no _versions/ folder of manifests")


class Lance(Blocks):
    """Rows of one version of a Lance dataset: see :func:`lance`. Blocks are fragments; reads are
    Lance ``take`` calls (:meth:`_get`, :meth:`_get_many`), so :meth:`Blocks._decode`, which would
    decode a whole fragment, is never called; the cache holds windows of rows instead."""

    checks_keys = False
    fork_safe = False  # Lance's runtime threads do not survive a fork: process workers start by forkserver
    decodes_blocks = False  # reads take windows of rows, not whole fragments
    _transient = ("_ds", "_pid")

    def __init__(self, uri: Any, columns: Sequence[str] | None, cache: int, storage_options: dict | None, strict: bool):
        _pylance()
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 1:
            raise ValueError(f"lazyseq.lance: cache must be an int >= 1 (windows of rows kept), got {cache!r}")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"lazyseq.lance: storage_options must be a dict, got a {type(storage_options).__name__}")
        if not isinstance(uri, (str, os.PathLike)):
            raise TypeError(f"lazyseq.lance: uri must be a path or URL, got a {type(uri).__name__}")
        uri = os.fspath(uri)
        self.uri = uri.rstrip("/") if is_url(uri) else os.path.normpath(local_path(uri))
        self.name = self.uri.rsplit("/", 1)[-1] if is_url(self.uri) else os.path.basename(self.uri)
        self.storage_options, self.strict = (dict(storage_options) if storage_options else None), bool(strict)
        if not is_url(self.uri):
            _check_folder(self.uri)
        ds = self._open(None)
        self.version = int(ds.version)
        self.stamp = _stamp(ds)
        self.fragment_ids, rows, self.sizes = self._fragments(ds)
        self.schema, self.columns = self._select(columns, ds.schema)
        live = max(sum(rows), 1)  # the files hold deleted rows too: bytes per row over-estimated, the window smaller
        self.window = max(1, min(WINDOW_ROWS, WINDOW_BYTES * live // max(sum(self.sizes), 1)))
        self._set_blocks(rows, cache)
        self._ds, self._pid = ds, os.getpid()

    # -- the dataset -------------------------------------------------------------------------------
    def _where_said(self) -> str:
        return f"{shown(self.uri)} ({WHAT}, version {getattr(self, 'version', 'latest')})"

    def _open(self, version: int | None) -> Any:
        lance_ = _pylance()
        try:
            with _errors(self._where_said()):
                return lance_.dataset(self.uri, version=version, storage_options=self.storage_options)
        except StoreError as e:
            if "was not found" in str(e) and "_versions" in str(e):
                raise FileNotFoundError(f"{shown(self.uri)} ({WHAT}) is missing: it has no manifest "
                                        "(_versions/)") from None
            raise

    def _dataset(self) -> Any:
        """The dataset opened in this process (a worker, a forked child: reopened at the view's version)."""
        ds = getattr(self, "_ds", None)
        if ds is not None and self._pid == os.getpid():
            return ds
        ds = self._open(self.version)
        if not is_url(self.uri):
            _check_folder(self.uri)
        ids, rows, sizes = self._fragments(ds)
        if ids != self.fragment_ids or rows != self._rows or sizes != self.sizes or (self.strict and _stamp(ds) != self.stamp):
            raise StoreError(f"{self._where_said()} changed since this view was made (its manifest was rewritten: other "
                             f"fragments, rows, sizes{' or timestamp' * self.strict}): make the view again")
        self._ds, self._pid = ds, os.getpid()
        return ds

    def _reopen(self) -> None:
        self._ds, self._pid = None, None  # opened at the first read: unpickling reads nothing

    def _fragments(self, ds: Any) -> tuple[list[int], list[int], list[int]]:
        """Each fragment's id, live rows (physical less deleted) and data files' bytes, from the
        manifest; a local dataset's files checked on disk."""
        ids, rows, sizes = [], [], []
        with _errors(f"{self._where_said()}: its manifest"):
            fragments = [f.metadata for f in ds.get_fragments()]
        for m in fragments:
            where = f"{self._where_said()}, fragment {m.id}"
            deleted = m.deletion_file.num_deleted_rows if m.deletion_file is not None else 0
            if deleted is None:  # written without the count: Lance reads the deletion file
                with _errors(where):
                    deleted = m.physical_rows - ds.get_fragment(m.id).count_rows()
            if not (m.physical_rows >= 0 and 0 <= deleted <= m.physical_rows):
                raise StoreError(f"{where} is corrupted: its manifest says {m.physical_rows} rows, {deleted} of them deleted")
            ids.append(int(m.id))
            rows.append(int(m.physical_rows - deleted))
            sizes.append(sum(self._check_file(where, "data", f.path, f.file_size_bytes, getattr(f, "base_id", None))
                             for f in m.files))
            if m.deletion_file is not None and not is_url(self.uri):
                self._check_file(where, "deletion", m.deletion_file.path(m.id), None, getattr(m.deletion_file, "base_id", None))
        return ids, rows, sizes

    def _check_file(self, where: str, kind: str, rel: str, size: int | None, base: Any) -> int:
        """A file the manifest lists: a relative path inside the dataset; locally a regular file
        (not a link) of ``size`` bytes when the manifest says. Its size (0 when unknown). A file of
        another base (a dataset spread over several places, ``base``) is Lance's to find."""
        parts = rel.replace("\\", "/").split("/")
        if not rel or rel.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise StoreError(f"{where} is corrupted: its {kind} file {rel!r} is not a path inside the dataset")
        if is_url(self.uri) or base is not None:
            return int(size or 0)
        path = os.path.join(self.uri, *(["data"] if kind == "data" else []), *parts)
        st = _lstat(path)
        if st is None:
            raise StoreError(f"{where}: its {kind} file {path} is missing (the manifest lists it): the dataset is incomplete")
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a file"
            raise StoreError(f"{where}: its {kind} file {path} is {what}: only regular files inside the dataset are read")
        if size is not None and st.st_size != size:
            raise StoreError(f"{where}: its {kind} file {path} is {st.st_size} bytes, the manifest says {size}: it was "
                             "truncated or rewritten")
        return int(st.st_size)

    def _select(self, columns: Sequence[str] | None, schema: Any) -> tuple[Any, list[str]]:
        if columns is None:
            return schema, list(schema.names)
        if isinstance(columns, str):
            raise TypeError("lazyseq.lance: columns must be a list of column names, got a str: use [name]")
        wanted = list(columns)
        unknown = [c for c in wanted if c not in schema.names]
        if unknown:
            raise KeyError(f"lazyseq.lance: no column {unknown[0]!r} in {shown(self.uri)}; its columns are {schema.names}")
        names = [n for n in schema.names if n in wanted]
        return need("pyarrow", "lance", "lazyseq.lance").schema([schema.field(n) for n in names]), names

    # -- reads -------------------------------------------------------------------------------------
    def _take(self, idx: Sequence[int]) -> Rows:
        """Rows ``idx`` (valid view indices, any order, repeats allowed) in one Lance ``take``."""
        a = np.asarray(idx, dtype=np.int64)
        blocks = np.unique(np.searchsorted(np.asarray(self._starts, dtype=np.int64), a, side="right") - 1)
        ids = [self.fragment_ids[b] for b in blocks.tolist()]
        where = f"{self._where_said()}, {len(a)} row{'s' * (len(a) != 1)} of fragment{'s' * (len(ids) != 1)} " + \
            ", ".join(map(str, ids[:8])) + ", ..." * (len(ids) > 8)
        ds = self._dataset()
        with _errors(where):
            table = ds.take(a, columns=self.columns)
            if table.num_rows != len(a):
                raise StoreError(f"{where} is corrupted: Lance gave {table.num_rows} rows for {len(a)} asked")
            return Rows(table)

    def _window(self, key: tuple[int, int]) -> Rows:
        b, k = key
        start = self._starts[b] + k * self.window
        return self._take(range(start, min(start + self.window, self._starts[b + 1])))

    def _get(self, i: int) -> Any:
        b, j = self._where(i)
        k, r = divmod(j, self.window)
        return self._decoded.get((b, k), self._window).row(r)  # a held window takes no lock

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._take(idx).rows(range(len(idx))) if len(idx) else []

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        try:
            items = self._get_many(idx)
        except Exception:  # read row by row: only the rows that fail are Failed
            return each(lambda i: self._take([i]).row(0), idx, out)
        return into(out, items)

    def _get_columns(self, idx: np.ndarray) -> Any:
        """``default_collate`` of items ``idx`` from one Lance ``take``, built by columns (or NotImplemented)."""
        return collate(self._take(idx).table) if len(idx) else NotImplemented

    def held(self) -> list[tuple[int, int]]:
        """The windows of rows held now, least recently used first: ``(block, k)`` holds rows
        ``k * window`` to ``(k + 1) * window`` of block (fragment) ``block``."""
        return self._decoded.held()

    # -- description -------------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The dataset's name (its folder's, without where it lies), version, fragments' rows and
        the selected columns; with ``strict`` the version's timestamp too: no data read."""
        return {"dataset": self.name, "version": self.version, "rows": len(self), "fragments": self._rows,
                "columns": self.columns, "stamp": self.stamp if self.strict else None}

    def nbytes(self) -> int:
        """The size of the version's data files, in bytes (as the manifest says, or as they are locally)."""
        return sum(self.sizes)

    def describe(self) -> str:
        return f"lance({self.name}, version {self.version}, {self.blocks} fragments, {len(self.columns)} columns)"


def _stamp(ds: Any) -> str:
    """When the version was written (in its manifest): tells a version rewritten under the same number."""
    with _errors(f"{shown(ds.uri)} ({WHAT}): its version"):
        got = ds.get_version() if hasattr(ds, "get_version") else next(v for v in ds.versions() if v["version"] == ds.version)
    return str(got["timestamp"])


def lance(uri: Any, *, columns: Sequence[str] | None = None, storage_options: dict | None = None, cache: int = 4,
          strict: bool = True) -> Lance:
    """The rows of a Lance dataset (the version current now) as a random-access view of dicts
    ``{column: value}``.

    ``uri``: the dataset's folder or URL (``s3://``, ``gs://``, ``az://``: Lance's own object store,
    ``storage_options`` as Lance takes them, e.g. ``aws_endpoint``, ``allow_http``). ``columns``: the
    top-level columns to read (default all), kept in schema order. Values follow
    :mod:`lazyseq.formats.values` (numbers as numpy scalars, lists of numbers as 1-D arrays,
    strings, bytes, dicts, None) and equal ``ds.take(...)``'s rows; deleted rows are not there.

    A batch read is one Lance ``take``; a single read takes its window of neighbouring rows (up
    to ``WINDOW_ROWS``, about ``WINDOW_BYTES`` of data), ``cache`` windows kept per process, so
    reads in order are cheap. ``.cuts`` gives ``block_shuffle`` its blocks, one per fragment.
    The view pickles without data (a worker reopens the same version and refuses it if its
    manifest changed); its fingerprint holds the dataset's name, version and fragments' rows, and
    with ``strict`` (the default) the version's timestamp. Needs pylance
    (``pip install 'lazyseq[lance]'``).

    >>> import os, tempfile, pyarrow as pa, lance as pylance
    >>> d = os.path.join(tempfile.mkdtemp(), "t.lance")
    >>> _ = pylance.write_dataset(pa.table({"x": [1, 2, 3], "s": ["a", "b", None]}), d, max_rows_per_file=2)
    >>> v = lance(d)
    >>> len(v), v[2], v.cuts, v.block_rows
    (3, {'x': np.int64(3), 's': None}, [2], (2, 1))
    """
    return Lance(uri, columns, cache, storage_options, strict)
