"""What every format of this package shares about its files: listing a folder or URL prefix,
opening a file through the files layer for pyarrow (a local memory map, or ranged reads of a URL
with its version pinned), the file's identity (for pickling and fingerprints), and turning a
reader's exception into a :class:`~lazyseq.StoreError` naming the file.

No reader of this package opens a file itself: a local file is opened once by
:func:`lazyseq.files.local.open_data` (``O_NOFOLLOW | O_NONBLOCK``, a regular file in its folder)
and handed to pyarrow as a buffer; a URL is a :class:`~lazyseq.files.RemoteFile` (one HEAD, then
ranged GETs carrying the object's version), or with ``cache_dir`` its verified local copy.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.decoded import fork_mark
from ..errors import RemoteReadError, StoreError
from ..files import DiskCache, Remote, RemoteFile, is_url, local_path, redact
from ..files.local import open_data

__all__ = ["need", "Opened", "open_source", "list_files", "Remotes", "RangeFile", "reader_errors", "shown"]

HIDDEN = ("_", ".")  # names Spark, Hive and Hadoop give to what is not data (_SUCCESS, _metadata, .crc)


def need(module: str, extra: str, what: str) -> Any:
    """``import module``, or ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs the {module.split('.')[0]} package: pip install 'lazyseq[{extra}]'") from None


def shown(path: str) -> str:
    """How messages name a file: a URL without its secrets, a local path as it is."""
    return redact(path) if is_url(path) else path


class Remotes:
    """One :class:`Remote` per URL scheme, made in this process with the view's settings."""

    def __init__(self, settings: dict):
        self.settings = dict(settings)
        self._by_scheme: dict[str, Remote] = {}

    def __getstate__(self) -> dict:
        return {"settings": self.settings}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["settings"])

    def of(self, url: str) -> Remote:
        scheme = url.split("://", 1)[0].lower()
        remote = self._by_scheme.get(scheme)
        if remote is None:
            remote = self._by_scheme.setdefault(scheme, Remote(url, **self.settings))
        return remote


# -- listing ---------------------------------------------------------------------------------------
def _walk(root: str, suffixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(relative name, path)`` of the data files under the folder ``root``, by relative path."""
    found = []
    for here, dirs, files in os.walk(root):  # links to folders are not followed
        dirs[:] = [d for d in dirs if not d.startswith(HIDDEN)]
        for f in files:
            if f.endswith(suffixes) and not f.startswith(HIDDEN):
                path = os.path.join(here, f)
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return sorted(found)


def _find(url: str, remote: Remote, suffixes: tuple[str, ...]) -> list[tuple[str, str]]:
    base = url.rstrip("/")
    try:
        listed = remote.fs.find(base)
    except Exception as e:
        raise RemoteReadError(f"{redact(base)} cannot be listed ({type(e).__name__}): give the files' URLs",
                              redact(base)) from None
    scheme = base.split("://", 1)[0]
    prefix = base.split("://", 1)[1]
    found = []
    for p in listed:
        p = str(p)
        full = p if "://" in p else f"{scheme}://{p}"
        rel = p[len(prefix):].lstrip("/") if p.startswith(prefix) else p.rsplit("/", 1)[-1]
        parts = rel.split("/")
        if rel and parts[-1].endswith(suffixes) and not any(x.startswith(HIDDEN) for x in parts):
            found.append((rel, full))
    return sorted(found)


def list_files(paths: Any, suffixes: tuple[str, ...], what: str, remotes: Remotes) -> list[tuple[str, str]]:
    """``(name, path or URL)`` of every file ``paths`` names: a file, a folder or URL prefix (every
    file ending in ``suffixes`` under it, by relative path; hidden names and folders skipped), or a
    list of those. ``name`` (a relative path, or a base name) identifies the file in fingerprints."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError(f"{what}: no paths given")
    out: list[tuple[str, str]] = []
    for p in items:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"{what}: paths must be paths or URLs, got a {type(p).__name__}")
        p = os.fspath(p)
        if is_url(p):
            # the file system made here, in the caller's thread: the views open their files in threads
            # next, and the client's first imports, made in a worker thread, once failed ("signal only
            # works in main thread") in a doctest
            remotes.of(p).fs  # noqa: B018
            out += [(p.rstrip("/").rsplit("/", 1)[-1], p)] if p.endswith(suffixes) else _find(p, remotes.of(p), suffixes)
        elif os.path.isdir(local_path(p)) and not os.path.islink(local_path(p)):
            found = _walk(local_path(p), suffixes)
            if not found:
                raise FileNotFoundError(f"{what}: no {' or '.join('*' + s for s in suffixes)} file under {p}")
            out += found
        else:
            out.append((os.path.basename(local_path(p)), local_path(p)))
    if not out:
        names = [shown(os.fspath(p)) for p in items]
        raise FileNotFoundError(f"{what}: no {' or '.join('*' + s for s in suffixes)} file in {names}")
    return out


def read_by_part(idx: Sequence[int], where: Callable[[int], tuple[int, int]],
                 read: Callable[[int, list[int]], list]) -> list:
    """Items ``idx`` of a view stored in parts (shards), one bulk read per part: ``where(i)`` is
    ``(part, j)``, ``read(part, js)`` the items ``js`` of that part; the items in the order asked."""
    out: list = [None] * len(idx)
    by_part: dict[int, list[tuple[int, int]]] = {}
    for at, i in enumerate(idx):
        k, j = where(int(i))
        by_part.setdefault(k, []).append((at, j))
    for k, pairs in by_part.items():
        for (at, _), item in zip(pairs, read(k, [j for _, j in pairs])):
            out[at] = item
    return out


class PartsEndToEnd:
    """The reads of a view whose items lie in parts end to end (shards, files, chunks): ``_starts``
    (each part's first index, then the length) and ``_part(k, js)`` (the items ``js`` of part ``k``)
    make ``_where``, ``_get`` and ``_get_many`` (a bulk read: one ``_part`` call per part).
    :meth:`_setup_parts` makes ``_starts``; :meth:`_reader` opens part ``k`` once per process
    (``_open(k)``; a forked child calls the view's ``_setup()`` and opens its own)."""

    def _setup_parts(self, counts: Iterable[int]) -> None:
        counts = list(counts)
        self._readers: dict[int, Any] = {}
        self._locks = [threading.Lock() for _ in counts]
        self._fork = fork_mark()
        self._starts = list(itertools.accumulate(counts, initial=0))

    def _open(self, k: int) -> Any:
        raise NotImplementedError

    def _reader(self, k: int) -> Any:
        got = self._readers.get(k)
        if got is not None:
            return got
        if self._fork != fork_mark():  # a forked child: the parent's locks may be held, its connections its own
            self._remotes = Remotes(self.settings)  # type: ignore[attr-defined]
            self._setup()  # type: ignore[attr-defined]
        with self._locks[k]:
            got = self._readers.get(k)
            if got is None:
                got = self._readers[k] = self._open(k)
        return got

    def _part(self, k: int, js: Sequence[int]) -> list:
        raise NotImplementedError

    def _where(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self._starts, i) - 1  # type: ignore[attr-defined]
        return k, i - self._starts[k]  # type: ignore[attr-defined]

    def _get(self, i: int) -> Any:
        k, j = self._where(i)
        return self._part(k, [j])[0]

    def _get_many(self, idx: Sequence[int]) -> list:
        return read_by_part(idx, self._where, self._part)


# -- opening ---------------------------------------------------------------------------------------
@dataclass
class Opened:
    """A file as this process opened it: its bytes (``buffer``: a memory map, or ``remote``: a
    :class:`RemoteFile`), its size and its stamp (local: ``mtime_ns``; a URL: its ETag, else None)."""

    path: str
    size: int
    stamp: Any
    buffer: Any = None
    remote: RemoteFile | None = None

    def read(self, a: int, b: int) -> bytes:
        """Bytes ``a`` to ``b`` (inside the file: the caller checked)."""
        return bytes(self.buffer[a:b]) if self.remote is None else self.remote.read(a, b)

    def read_many(self, ranges: list[tuple[int, int]]) -> list[Any]:
        """The bytes of each range (over a URL: requested at once; locally views of the map, no copy)."""
        if self.remote is None:
            return [memoryview(self.buffer)[a:b] for a, b in ranges]
        return self.remote.remote.read_ranges([self.remote.request(a, b) for a, b in ranges])

    def source(self) -> Any:
        """A new pyarrow file over these bytes (cheap: made per decode, so threads share nothing)."""
        pa = need("pyarrow", "parquet", "reading Arrow data")
        if self.remote is None:
            return pa.BufferReader(pa.py_buffer(self.buffer))
        return pa.PythonFile(RangeFile(self.remote), mode="r")


def open_source(path: str, what: str, remotes: Remotes) -> Opened:
    """``path`` opened the one way (see the module's docstring)."""
    if not is_url(path):
        try:
            fd, st = open_data(path, what, root=os.path.dirname(os.path.abspath(path)))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} ({what}) is missing") from None
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
        except (OSError, ValueError) as e:
            raise StoreError(f"{path} ({what}) cannot be memory-mapped: {getattr(e, 'strerror', None) or e}") from None
        finally:
            os.close(fd)  # the map holds no descriptor
        return Opened(path, st.st_size, st.st_mtime_ns, buffer=mm)
    remote = remotes.of(path)
    f = remote.open(path)
    if remote.cache_dir is not None:
        mm = DiskCache(remote.cache_dir, remote.cache_dir_bytes, remote).map(path, f.size, f.etag)
        if mm is not None:
            return Opened(path, f.size, f.etag, buffer=mm)
    return Opened(path, f.size, f.etag, remote=f)


class RangeFile(io.RawIOBase):
    """A read-only file over a :class:`RemoteFile` that asks for exactly the bytes read (pyarrow
    coalesces its own reads; the block cache and the ranges a decode holds answer first)."""

    def __init__(self, f: RemoteFile):
        super().__init__()
        self._f, self._pos = f, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._f.size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._f.size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek to {base + offset}, before the start of {redact(self._f.url)}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        stop = self._f.size if n is None or n < 0 else min(self._f.size, self._pos + n)
        data = self._f.read(self._pos, stop) if stop > self._pos else b""
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


@contextlib.contextmanager
def reader_errors(what: str) -> Iterator[None]:
    """Turn what a reader raises on bad bytes into a :class:`StoreError` naming ``what`` (lazyseq's
    own errors and a missing file pass as they are)."""
    try:
        yield
    except (StoreError, RemoteReadError, FileNotFoundError):
        raise
    except Exception as e:
        text = " ".join(str(e).split())[:300]
        raise StoreError(f"{what} is not valid: {type(e).__name__}: {text!r}") from None
