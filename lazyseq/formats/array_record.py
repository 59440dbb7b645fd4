"""ArrayRecord files (Grain's format) read at random: :func:`array_record`.

The package's C++ reader (``array_record.python.array_record_module``) opens only a local path:
it reads no Python file. A local file is checked by the files layer (a regular file, no link),
then handed to the reader by path; a URL is copied once, through the files layer (ranged reads
pinned to its ETag), into ``cache_dir`` as a verified copy (as :mod:`.untar` keeps one), and that
copy is opened. ``len`` comes from each file's index (read at the view's making); a batch is one
``ArrayRecordReader.read(indices)`` per file.

The reader is opened lazily in each process (the view pickles without it; a forked child opens
its own: its parent's may hold threads), with the options for random access the reader's
documentation gives (``readahead_buffer_size:0,max_parallelism:0``: no read-ahead, no thread
pool; Grain's 32 KiB file buffer). A file the reader cannot open (truncated, garbage, empty) is one it reports as not
``ok()``: a :class:`~lazyseq.StoreError` naming it, as is any error of a read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..core.base import View
from ..core.decoded import fork_mark
from ..errors import RemoteReadError, StoreError
from ..files import is_url
from ..files.local import open_data
from ..files.remote import check_settings
from .sources import PartsEndToEnd, Remotes, list_files, need, open_source, shown

__all__ = ["array_record", "ArrayRecord"]

MODULE = "array_record.python.array_record_module"
OPTIONS = "readahead_buffer_size:0,max_parallelism:0"  # random access, no thread pool (fork-safe)
OPEN_READERS = 64  # readers a view keeps open per process (each holds a file descriptor)
BUFFER_BYTES = 32768  # the file reader's buffer Grain's ArrayRecordDataSource gives (a read is a record or a group)
SUFFIX = ".array_record"
CHUNK = 4 * 2**20


def _module() -> Any:
    return need(MODULE, "array_record", "lazyseq.array_record")


def _stat(path: str, where: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of the local file ``path``, checked by the files layer (regular, no link)."""
    try:
        fd, st = open_data(path, "an ArrayRecord file", root=os.path.dirname(os.path.abspath(path)))
    except FileNotFoundError:
        raise FileNotFoundError(f"lazyseq.array_record: {where} is missing") from None
    os.close(fd)
    return st.st_size, st.st_mtime_ns


def _open_reader(path: str, where: str) -> Any:
    try:
        reader = _module().ArrayRecordReader(path, OPTIONS, file_reader_buffer_size=BUFFER_BYTES)
    except ImportError:
        raise
    except Exception as e:
        raise StoreError(f"{where} is not a valid ArrayRecord file: {type(e).__name__}: {_text(e)}") from None
    if not reader.ok():  # (a file cut short, garbage or empty opens as not ok, with no records)
        raise StoreError(f"{where} is not a valid ArrayRecord file (truncated or not ArrayRecord: its reader is "
                         "not ok)")
    return reader


def _text(e: BaseException) -> str:
    return repr(" ".join(str(e).split())[:300])


def _copy(root: str, url: str, remotes: Remotes, where: str) -> tuple[str, Any]:
    """The verified local copy of the file at ``url`` under ``root`` (made if need be), and its ETag."""
    from .untar import _hash, _proves, _uid, write_fresh

    opened = open_source(url, "an ArrayRecord file", remotes)
    if opened.stamp is None:
        raise StoreError(f"{where}: its server gives no ETag, so lazyseq.array_record cannot keep a copy of this "
                         "version of it: copy the file to local disk and read it there")
    root = os.path.abspath(root)
    base = os.path.join(root, _hash(f"{_uid()}\0array_record\0{url}\0{opened.size}\0{opened.stamp}")[:40] + SUFFIX)
    if _proves(base, url, opened.size, opened.stamp):
        return base, opened.stamp

    def fill(f: Any) -> str:
        h = hashlib.blake2b()
        for a in range(0, opened.size, CHUNK):
            piece = opened.read(a, min(a + CHUNK, opened.size))
            f.write(piece)
            h.update(piece)
        return h.hexdigest()

    os.makedirs(root, exist_ok=True)
    digest = write_fresh(root, base, fill)
    record = {"source": _hash(url), "source_size": opened.size, "stamp": str(opened.stamp), "size": opened.size,
              "digest": digest}
    write_fresh(root, base + ".json", lambda f: f.write(json.dumps(record, sort_keys=True).encode()))
    return base, opened.stamp


class ArrayRecord(PartsEndToEnd, View):
    """The records of ArrayRecord files: see :func:`array_record`."""

    checks_keys = False

    def __init__(self, paths: Any, settings: dict):
        check_settings(timeout=settings["timeout"])
        _module()
        self.settings = dict(settings)
        cache_dir = settings.get("cache_dir")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"lazyseq.array_record: cache_dir must be a folder's path, got a {type(cache_dir).__name__}")
        self._remotes = Remotes({k: settings[k] for k in ("storage_options", "timeout")})
        self.files = list_files(paths, (SUFFIX,), "lazyseq.array_record", self._remotes)
        self._setup()
        self.stamps: list[tuple[int, Any]] = []
        counts = []
        for k in range(len(self.files)):
            with self._locks[k]:
                counts.append(int(self._reader(k).num_records()))
            self.stamps.append(self._seen[k])
        self.counts = tuple(counts)
        self._starts = list(itertools.accumulate(self.counts, initial=0))

    def _setup(self) -> None:
        self._readers: OrderedDict[int, Any] = OrderedDict()  # the open ones, least recently used first
        self._seen: dict[int, tuple[int, Any]] = {}
        self._locks = [threading.Lock() for _ in self.files]  # (one read at a time per reader: its state is shared)
        self._open_lock = threading.Lock()
        self._fork = fork_mark()

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in ("settings", "files", "stamps", "counts", "_starts")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._remotes = Remotes({k: self.settings[k] for k in ("storage_options", "timeout")})
        self._setup()

    def _where_file(self, k: int) -> str:
        return shown(self.files[k][1])

    def _local(self, k: int) -> tuple[str, tuple[int, Any]]:
        """File ``k``'s local path (a URL's verified copy) and its identity ``(size, mtime or ETag)``."""
        path, where = self.files[k][1], self._where_file(k)
        if not is_url(path):
            return path, _stat(path, where)
        root = self.settings.get("cache_dir")
        if root is None:
            from .tarcache import default_root

            root = os.path.join(default_root(), "array_record")
        try:
            copy, etag = _copy(os.fspath(root), path, self._remotes, where)
        except FileNotFoundError:
            raise FileNotFoundError(f"lazyseq.array_record: {where} is missing") from None
        return copy, (os.stat(copy).st_size, etag)

    def _reader(self, k: int) -> Any:
        """File ``k``'s reader in this process, opened if need be (the caller holds ``_locks[k]``)."""
        with self._open_lock:
            got = self._readers.get(k)
            if got is not None:
                self._readers.move_to_end(k)
                return got
        where = self._where_file(k)
        try:
            path, seen = self._local(k)
        except FileNotFoundError:
            if len(self.stamps) > k:  # (gone since the view was made: the data's fault, not the caller's)
                raise StoreError(f"{where} is missing (it was there when this view was made)") from None
            raise
        if len(self.stamps) > k and seen != self.stamps[k]:
            raise StoreError(f"{where} changed since this view was made (another size, modification time or "
                             "ETag): make the view again over the files as they are now")
        got = _open_reader(path, where)
        if hasattr(self, "counts") and int(got.num_records()) != self.counts[k]:
            n = got.num_records()
            got.close()
            raise StoreError(f"{where} holds {n} records, {self.counts[k]} when this view was made")
        self._seen[k] = seen
        with self._open_lock:
            self._readers[k] = got
            self._close_some(keep=k)
        return got

    def _close_some(self, keep: int) -> None:
        """Close the least recently used readers past OPEN_READERS (each holds a descriptor), those
        no thread is reading (the caller holds ``_open_lock``)."""
        for old in list(self._readers):
            if len(self._readers) <= OPEN_READERS:
                return
            if old != keep and self._locks[old].acquire(blocking=False):
                try:
                    self._readers.pop(old).close()
                finally:
                    self._locks[old].release()

    # -- shape and reads -------------------------------------------------------------------------
    def _len(self) -> int:
        return self._starts[-1]

    @property
    def cuts(self) -> list[int]:
        """The index where each file after the first starts: ``block_shuffle(v, v.cuts, seed)``."""
        return self._starts[1:-1]

    def _part(self, k: int, js: Sequence[int]) -> list[bytes]:
        if self._fork != fork_mark():  # a forked child: the parent's locks may be held, its readers its own
            self._remotes = Remotes({k: self.settings[k] for k in ("storage_options", "timeout")})
            self._setup()
        try:
            with self._locks[k]:
                got = self._reader(k).read([int(j) for j in js])
        except (StoreError, RemoteReadError, FileNotFoundError):
            raise
        except Exception as e:
            at = f"record {js[0]}" if len(js) == 1 else f"records {list(js)[:8]}"
            raise StoreError(f"{self._where_file(k)} ({at}) cannot be read: {type(e).__name__}: {_text(e)}") from None
        if len(got) != len(js):
            raise StoreError(f"{self._where_file(k)} gave {len(got)} records for {len(js)} asked")
        return [bytes(b) for b in got]

    # -- description -----------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The files' names, sizes, record counts and modification times (URLs: ETags), as seen
        when the view was made. Reads no record."""
        return {"files": [name for name, _ in self.files], "bytes": [s for s, _ in self.stamps],
                "stamps": [str(t) for _, t in self.stamps], "records": list(self.counts)}

    def nbytes(self) -> int:
        """The size of the files, in bytes."""
        return sum(s for s, _ in self.stamps)

    def describe(self) -> str:
        return f"array_record({len(self.files)} file{'s' * (len(self.files) != 1)})"


def array_record(paths: Any, *, storage_options: dict | None = None, cache_dir: str | os.PathLike | None = None,
                 timeout: float = 30.0) -> ArrayRecord:
    """The records of ArrayRecord files (Grain's format: ``pip install 'lazyseq[array_record]'``)
    as a random-access view of ``bytes``: item ``i`` is what ``ArrayRecordReader.read([j])`` gives.

    ``paths``: a file, a list of files, a folder (every ``*.array_record`` file in it, sorted), or
    URLs (``s3://``, ``https://``...) of files or of a prefix. ``len`` and ``.cuts`` (each file's
    start: ``block_shuffle(v, v.cuts, seed)`` shuffles reading a few files at a time) come from
    the files' indexes, read when the view is made. A read is one ``ArrayRecordReader.read`` (a
    batch: one per file): its group decompressed (``group_size:1``, the writer's default: the record). The
    reader opens only local files: a URL is copied once, whole, into ``cache_dir`` (default
    ``~/.cache/lazyseq/array_record``), a copy verified by its digest and keyed by the URL, its
    size and ETag. ``storage_options``, ``timeout``: as :func:`~lazyseq.parquet`'s. The view
    pickles without its readers (each process opens its own).

    >>> import os, tempfile
    >>> from array_record.python.array_record_module import ArrayRecordWriter
    >>> root = tempfile.mkdtemp()
    >>> for k in range(2):
    ...     w = ArrayRecordWriter(os.path.join(root, f"part-{k}.array_record"), "group_size:1")
    ...     for r in (b"a", b"bc", b""):
    ...         w.write(r)
    ...     w.close()
    >>> v = array_record(root)
    >>> v, v[1], v[-1], v.cuts
    (array_record(2 files)  len=6, b'bc', b'', [3])
    """
    settings = {"storage_options": storage_options, "cache_dir": cache_dir, "timeout": timeout}
    return ArrayRecord(paths, settings)
