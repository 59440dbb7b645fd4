"""A file for readers that take one (``np.load``, ``pickle.load``, pyarrow): :func:`open_file` opens a
local path as usual, and an object in object storage as a read-only, seekable binary file over
ranged reads (or, with ``cache_dir``, its whole copy on local disk).

What reading a remote file costs: one HEAD when it opens (its size and version), then one ranged
GET per read-ahead window. The window starts at ``WINDOW`` bytes (a small file, whatever its
reader asks, is one GET) and doubles while the reads go on in order, up to ``MAX_WINDOW`` (a
large file read whole: a few requests, their parts sent concurrently); a seek elsewhere starts
it again. A read larger than the window goes straight into the caller's buffer.
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO

from .diskcache import DiskCache
from .remote import Remote, RemoteFile, Version
from .urls import is_url, local_path, redact

__all__ = ["open_file", "RangedRaw", "read_into", "WINDOW", "MAX_WINDOW", "PART"]

WINDOW = 4 * 2**20  # the first read-ahead of a remote file: a small file is one request
MAX_WINDOW = 64 * 2**20  # the read-ahead doubles up to this while the reads go on in order
PART = 8 * 2**20  # a large read goes out as parts of this size ...
PARALLEL = 8  # ... this many at once
BUFFER = 256 * 2**10  # the BufferedReader's own buffer, over the read-ahead


def read_into(remote: Remote, url: str, start: int, out: memoryview, cache: bool = True, version: Version | None = None) -> None:
    """Bytes ``start`` to ``start + len(out)`` of ``url`` (of ``version``, else as ``remote`` last
    opened it) into ``out``: parts of ``PART`` bytes, up to ``PARALLEL`` of them at once (so no
    single request holds a large read)."""
    n, tail = len(out), (version,) if version is not None else ()
    for base in range(0, n, PART * PARALLEL):
        reqs = [(url, start + a, start + min(a + PART, n), *tail) for a in range(base, min(n, base + PART * PARALLEL), PART)]
        for r, blob in zip(reqs, remote.read_ranges(reqs, cache)):
            out[r[1] - start : r[2] - start] = blob


class RangedRaw(io.RawIOBase):
    """The raw, read-only, seekable file of a :class:`RemoteFile` (wrap it in ``io.BufferedReader``:
    :func:`open_file` does). ``fileno()`` raises ``io.UnsupportedOperation``: it has none."""

    def __init__(self, f: RemoteFile):
        super().__init__()
        self._f, self._pos, self._window = f, 0, WINDOW
        self._ahead, self._at, self._end = b"", 0, -1  # the read-ahead, where it starts; where the last fetch ended

    @property
    def name(self) -> str:
        return redact(self._f.url)

    @property
    def size(self) -> int:
        return self._f.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _open(self) -> None:
        if self.closed:
            raise ValueError(f"I/O operation on closed file {self.name}")

    def readinto(self, b: Any) -> int:
        self._open()
        out = memoryview(b).cast("B")
        pos, size = self._pos, self._f.size
        n = max(0, min(len(out), size - pos))
        if not n:
            return 0
        if not self._at <= pos < self._at + len(self._ahead):  # outside the read-ahead
            self._window = min(2 * self._window, MAX_WINDOW) if pos == self._end else WINDOW
            if n >= self._window:  # straight into the caller's buffer
                self._f.request(pos, pos + n)  # checked against the object's size
                read_into(self._f.remote, self._f.url, pos, out[:n], version=self._f.version)
                self._ahead, self._at, self._end = b"", 0, pos + n
                self._pos = pos + n
                return n
            stop = min(size, pos + self._window)
            self._f.request(pos, stop)
            self._ahead, buf = b"", bytearray(stop - pos)
            read_into(self._f.remote, self._f.url, pos, memoryview(buf), version=self._f.version)  # on failure, nothing kept
            self._ahead, self._at, self._end = buf, pos, stop
        k = pos - self._at
        n = min(n, len(self._ahead) - k)
        out[:n] = memoryview(self._ahead)[k : k + n]
        self._pos = pos + n
        return n

    def readall(self) -> bytes:
        self._open()
        buf = bytearray(max(0, self._f.size - self._pos))
        got = self.readinto(buf) if buf else 0
        while got < len(buf):
            got += self.readinto(memoryview(buf)[got:])
        return bytes(buf)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._open()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._f.size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence ({whence!r}, should be 0, 1 or 2)")
        pos = base + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._open()
        return self._pos

    def close(self) -> None:
        self._ahead = b""
        super().close()

    def __repr__(self) -> str:
        return f"RangedRaw({self.name!r}, {self._f.size} bytes)"


def open_file(path: str | os.PathLike, remote: Remote | None = None, **settings: Any) -> BinaryIO:
    """The file at ``path``, opened for reading in binary mode; close it (``with``) when done.

    A local path (or ``file://`` URL) is ``open(path, 'rb')``. A URL is read over ranged reads
    through ``remote`` (a :class:`Remote` whose settings, block cache and connections it shares;
    else one made with ``settings``: ``storage_options``, ``block_cache``, ``cache_dir``,
    ``cache_dir_bytes``, ``timeout``) as an ``io.BufferedReader``: seekable, ``name`` the URL
    without its secrets, no ``fileno()``. With ``cache_dir``, the object is downloaded whole into
    it (:class:`DiskCache`, keyed by URL and ETag, verified before use) and that local copy is opened."""
    if not is_url(path):
        return open(local_path(path), "rb")
    if remote is None:
        remote = Remote(path, **settings)
    f = remote.open(path)
    if remote.cache_dir is not None:
        fd = DiskCache(remote.cache_dir, remote.cache_dir_bytes, remote).open(path, f.size, f.etag)
        if fd is not None:  # the verified entry, as opened: its eviction or replacement cannot touch it
            local = os.fdopen(fd, "rb")
            local.raw.name = redact(path)  # type: ignore[attr-defined]
            return local
    return io.BufferedReader(RangedRaw(f), buffer_size=BUFFER)  # type: ignore[return-value]
