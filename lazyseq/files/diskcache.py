"""``cache_dir=``: whole objects (a store's shards, a corpus's .bin) kept on local disk after their
first read, so the next epoch, or the next process, reads them locally.

An entry is keyed by the object's URL (redacted) and its ETag, so an object that changed is
fetched again, never served stale. It is downloaded under a lock file (processes sharing the
directory never fetch the same object twice at once), into a temporary name, then renamed:
nobody ever reads a half-written entry. Past ``max_bytes``, the least recently used entries go.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

from ..errors import RemoteReadError
from .urls import redact

__all__ = ["DiskCache"]

CHUNK = 8 * 2**20  # bytes of one ranged read while downloading
PARALLEL = 8  # ranged reads in flight while downloading


class DiskCache:
    """Objects of ``remote`` under ``root``, at most ``max_bytes`` of them (None: no bound; checked
    with the remote's other settings, :func:`.remote.check_settings`)."""

    def __init__(self, root: str, max_bytes: int | None, remote: Any):
        self.root, self.max_bytes, self.remote = os.path.abspath(root), max_bytes, remote
        os.makedirs(self.root, exist_ok=True)

    def entry(self, url: str, size: int, etag: str) -> str:
        """The local path of the entry for this version of ``url``."""
        key = hashlib.sha256(f"{redact(url)}\0{etag}\0{size}".encode()).hexdigest()[:40]
        return os.path.join(self.root, f"{key}.bin")

    def local(self, url: str, size: int, etag: str | None) -> str | None:
        """A local copy of ``url`` (``size`` bytes, version ``etag``), downloaded if missing; None
        where the server gives no version tag to key it by (then every read goes to the server)."""
        if etag is None:
            return None
        path = self.entry(url, size, etag)
        if self._fresh(path, size):
            return path
        with self._locked(path):
            if not self._fresh(path, size):  # another process may have fetched it while we waited
                self._download(url, size, path)
        self._evict(keep=path)
        return path

    def _fresh(self, path: str, size: int) -> bool:
        try:
            if os.path.getsize(path) != size:
                return False
            os.utime(path)  # its last use, for the least-recently-used order
            return True
        except OSError:
            return False

    def _download(self, url: str, size: int, path: str) -> None:
        part = path + ".part"
        # O_NOFOLLOW: in a shared cache_dir, a link put in the entry's (predictable) place must not
        # make this process write through it
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            for start in range(0, size, CHUNK * PARALLEL):
                stops = range(start, min(size, start + CHUNK * PARALLEL), CHUNK)
                for blob in self.remote.read_ranges([(url, a, min(a + CHUNK, size)) for a in stops], cache=False):
                    f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        if os.path.getsize(part) != size:
            raise RemoteReadError(f"the download of {redact(url)} into {self.root} came out truncated", redact(url))
        os.replace(part, path)

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        """Hold the entry's lock file; wait while its holder makes progress on the download (the
        lock goes with a process that dies), and give up after ``timeout`` seconds without any."""
        import fcntl

        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            seen, since = -1, time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    grown = _size(path + ".part")
                    if grown != seen:
                        seen, since = grown, time.monotonic()
                    elif time.monotonic() - since > self.remote.timeout:
                        raise TimeoutError(f"another process has been downloading {redact(path)} into the cache for "
                                           f"{self.remote.timeout:g} s without progress") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _evict(self, keep: str) -> None:
        if self.max_bytes is None:
            return
        entries = []
        for e in os.scandir(self.root):
            if e.name.endswith(".bin") and e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                entries.append((st.st_mtime, st.st_size, e.path))
        total = sum(s for _, s, _ in entries)
        for _, s, p in sorted(entries):  # oldest use first; a reader's open map of it stays valid
            if total <= self.max_bytes:
                break
            if p != keep:
                with contextlib.suppress(OSError):
                    os.unlink(p)
                    total -= s
                with contextlib.suppress(OSError):
                    os.unlink(p + ".lock")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1
