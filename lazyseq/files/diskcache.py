"""``cache_dir=``: whole objects (a store's shards, a corpus's .bin) kept on local disk after their
first read, so the next epoch, or the next process, reads them locally.

The directory is treated as a stranger's folder: whatever is in it is data that must prove itself.

- An entry is named by a hash of the user's uid, the object's whole URL (its query string included,
  which never shows in a name or a message), its ETag and size: ``<key>.bin``, the object's bytes,
  and ``<key>.json``, its record (the hash of the URL, the ETag, the size and the BLAKE2b digest of
  the bytes), written after the data. An object that changed is fetched again, never served stale.
- An entry is used only if it proves it is what it claims: a regular file (opened once with
  :func:`.local.open_data`: never through a link, never waiting on a FIFO) of this user, of the
  object's size, with a record of this user that names the same URL, ETag and size, and whose digest
  its bytes have; a store's shard must also have the manifest's CRC-32 (``crc32=``). The digest is
  computed once per process and entry (a whole read of the file on its first use: about 1 s per GB;
  the process that downloads an entry hashes it as it writes it). Anything else is fetched again into
  a fresh entry that replaces it; where nothing can replace it (a directory that is not empty, a file
  the directory's sticky bit protects), the fresh copy is served from a file of this process's own
  that is not kept.
- A download goes to a part file of a fresh random name (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
  0600), is fsynced and renamed into place: nobody reads a half-written entry, and a file planted in
  a predictable place is never written through or waited on. Processes sharing the directory take a
  lock file per entry (the same object is not downloaded twice at once); a waiting process gives up
  after ``timeout`` seconds without progress of the download.
- Past ``max_bytes``, the least recently used entries go: only the cache's own (a name of its pattern
  and a record of its own), never another file of the directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import secrets
import stat
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

from ..errors import RemoteReadError, StoreError
from .local import open_data
from .urls import redact

__all__ = ["DiskCache", "forget_verified"]

CHUNK = 8 * 2**20  # bytes of one ranged read while downloading
PARALLEL = 8  # ranged reads in flight while downloading
FORMAT = "lazyseq cache_dir entry"  # a record's "format"
RECORD_BYTES = 4096  # the most a record may be
ENTRY = re.compile(r"[0-9a-f]{40}\.bin")  # the name of an entry's data file
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS  # a part file: a fresh name, never through a link
_LOCK = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | _FLAGS  # a lock file: never through a link, never waiting

# (dev, inode, size, mtime, ctime) of an entry this process has hashed -> (its BLAKE2b digest, its CRC-32)
_verified: dict[tuple[int, ...], tuple[str, int]] = {}
_verified_lock = threading.Lock()


def forget_verified() -> None:
    """Forget the digests this process computed: every entry is hashed again on its next use (as
    in a new process)."""
    with _verified_lock:
        _verified.clear()


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file apart from one put in its place (a new inode, or new times)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _digest(fd: int) -> tuple[str, int]:
    """The BLAKE2b digest (hex) and the CRC-32 of the file open at ``fd``, read from its start."""
    h, crc, pos = hashlib.blake2b(), 0, 0
    while chunk := os.pread(fd, 1 << 22, pos):
        h.update(chunk)
        crc, pos = zlib.crc32(chunk, crc), pos + len(chunk)
    return h.hexdigest(), crc


def _url_hash(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _remove(path: str) -> None:
    """Remove what is at ``path``: a file, a link, a FIFO, an empty directory (a directory with
    files in it stays: it may be someone's)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)


class DiskCache:
    """Objects of ``remote`` under ``root``, at most ``max_bytes`` of them (None: no bound; checked
    with the remote's other settings, :func:`.remote.check_settings`). See the module's docstring."""

    def __init__(self, root: str, max_bytes: int | None, remote: Any):
        self.root, self.max_bytes, self.remote = os.path.abspath(root), max_bytes, remote
        os.makedirs(self.root, exist_ok=True)

    def key(self, url: str, size: int, etag: str) -> str:
        """The name of this version of ``url``'s entry (without suffix): a hash of the uid, the whole
        URL, the ETag and the size."""
        return hashlib.sha256(f"{_uid()}\0{url}\0{etag}\0{size}".encode("utf-8", "surrogatepass")).hexdigest()[:40]

    def _path(self, key: str, suffix: str) -> str:
        return os.path.join(self.root, key + suffix)

    def open(self, url: str, size: int, etag: str | None, crc32: int | None = None) -> int | None:
        """A read-only descriptor (at offset 0; the caller closes it) of the verified local copy of
        ``url`` (``size`` bytes, version ``etag``, of CRC-32 ``crc32`` if given), downloaded if there
        is none; None where the server gives no version tag to key it by (then every read goes to
        the server). ``TimeoutError``: another process holds the entry's lock and makes no progress;
        :class:`StoreError`: the object's CRC-32 is not ``crc32``."""
        if etag is None:
            return None
        key = self.key(url, size, etag)
        fd = self._valid(key, url, size, etag, crc32)
        if fd is not None:
            return fd
        with self._locked(key) as lock:
            fd = self._valid(key, url, size, etag, crc32)  # another process may have fetched it while we waited
            if fd is None:
                fd = self._download(url, key, size, etag, crc32, lock)
        with contextlib.suppress(OSError):
            self._evict(keep=key)
        return fd

    def map(self, url: str, size: int, etag: str | None, crc32: int | None = None) -> Any:
        """A read-only memory map of the verified local copy (:meth:`open`; ``b""`` for an empty
        object), or None (no ETag). It holds no descriptor, and stays valid if the entry goes."""
        fd = self.open(url, size, etag, crc32)
        if fd is None:
            return None
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
        finally:
            os.close(fd)

    # -- verification ------------------------------------------------------------------------------
    def _valid(self, key: str, url: str, size: int, etag: str, crc32: int | None) -> int | None:
        """The descriptor of entry ``key`` if it proves to be this object's copy (see the module's
        docstring), else None; its digest is computed on its first use in this process."""
        try:
            fd, st = open_data(self._path(key, ".bin"), "a cache_dir entry", root=self.root)
        except (OSError, StoreError):  # missing, a link, a FIFO, a directory ...
            return None
        try:
            rec = self._record(key, touch=True)
            if (rec is None or st.st_uid != _uid() or st.st_size != size or rec[0]["size"] != size
                    or rec[0]["url"] != _url_hash(url) or rec[0]["etag"] != etag):
                os.close(fd)
                return None
            ident = _identity(st)
            with _verified_lock:
                known = _verified.get(ident)
            if known is None:
                known = _digest(fd)
                with _verified_lock:
                    _verified[ident] = known
            if known[0] != rec[0]["blake2b"] or (crc32 is not None and known[1] != crc32):
                os.close(fd)
                return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _record(self, key: str, touch: bool = False) -> tuple[dict, os.stat_result] | None:
        """Entry ``key``'s record and its stat if it is one of this user's (a regular file, a JSON
        object of the right form); ``touch``: mark the entry's use (the record's mtime, for LRU)."""
        try:
            fd, st = open_data(self._path(key, ".json"), "a cache_dir record", root=self.root, max_bytes=RECORD_BYTES)
        except (OSError, StoreError):
            return None
        try:
            if st.st_uid != _uid():
                return None
            rec = json.loads(os.pread(fd, RECORD_BYTES, 0))
            if touch and os.utime in os.supports_fd:
                with contextlib.suppress(OSError):
                    os.utime(fd)
        except (ValueError, RecursionError, OSError):
            return None
        finally:
            os.close(fd)
        fields = {"url": str, "etag": str, "blake2b": str, "size": int}
        if (not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("key") != key
                or not all(type(rec.get(k)) is t for k, t in fields.items())):
            return None
        return rec, st

    # -- writing ----------------------------------------------------------------------------------
    def _part(self, key: str) -> tuple[int, str]:
        """A new part file of a fresh random name, opened read-write (mode 0600), and its path."""
        while True:
            path = self._path("." + key, f".{secrets.token_hex(8)}.part")
            try:
                return os.open(path, _NEW, 0o600), path
            except FileExistsError:  # 2**-64: someone put a file there
                continue

    def _place(self, part: str, path: str) -> bool:
        """Rename ``part`` to ``path`` (replacing a file, a link or a FIFO there, or an empty
        directory); False where it cannot be (a directory with files in it, a protected file)."""
        for _ in range(2):
            try:
                os.replace(part, path)
                return True
            except OSError:
                _remove(path)  # a FIFO or a file is replaced anyway; an empty directory goes
        return False

    def _download(self, url: str, key: str, size: int, etag: str, crc32: int | None, lock: int | None) -> int:
        """Fetch ``url`` into a part file, hashing it as it is written; rename it into place and
        write its record; its descriptor (the copy is served from it even if it could not be put in
        place)."""
        fd, part = self._part(key)
        placed = False
        try:
            h, crc, done = hashlib.blake2b(), 0, 0
            for start in range(0, size, CHUNK * PARALLEL):
                stops = range(start, min(size, start + CHUNK * PARALLEL), CHUNK)
                for blob in self.remote.read_ranges([(url, a, min(a + CHUNK, size)) for a in stops], cache=False):
                    _write_all(fd, blob)
                    h.update(blob)
                    crc, done = zlib.crc32(blob, crc), done + len(blob)
                if lock is not None:  # the progress that waiting processes watch
                    with contextlib.suppress(OSError):
                        os.pwrite(lock, b"%20d" % done, 0)
            if done != size:
                raise RemoteReadError(f"the download of {redact(url)} into {self.root} came out truncated", redact(url))
            if crc32 is not None and crc != crc32:
                raise StoreError(f"{redact(url)} does not match its manifest: its CRC-32 differs (the object was "
                                 "replaced or corrupted after the manifest was written); it was not kept in the cache")
            os.fsync(fd)
            placed = self._place(part, self._path(key, ".bin"))
            with _verified_lock:
                _verified[_identity(os.fstat(fd))] = (h.hexdigest(), crc)
            if placed:
                self._write_record(key, url, etag, size, h.hexdigest())
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        finally:
            if not placed:
                with contextlib.suppress(OSError):
                    os.unlink(part)
        return fd

    def _write_record(self, key: str, url: str, etag: str, size: int, digest: str) -> None:
        """Write entry ``key``'s record (a part file renamed into place); an entry left without one
        is fetched again on its next use."""
        rec = {"format": FORMAT, "version": 1, "key": key, "url": _url_hash(url), "etag": etag, "size": size,
               "blake2b": digest}
        with contextlib.suppress(OSError):
            fd, part = self._part(key)
            try:
                _write_all(fd, json.dumps(rec).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            if not self._place(part, self._path(key, ".json")):
                os.unlink(part)

    # -- the lock -----------------------------------------------------------------------------------
    def _lock_file(self, key: str) -> int | None:
        """A descriptor of entry ``key``'s lock file, a regular file of this user's (anything else in
        its place is removed first); None if there can be none."""
        path = self._path(key, ".lock")
        for _ in range(2):
            try:
                fd = os.open(path, _LOCK, 0o600)
            except OSError:
                fd = -1
            if fd >= 0:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_uid == _uid():
                    return fd
                os.close(fd)
            _remove(path)
        return None

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[int | None]:
        """Hold entry ``key``'s lock (its descriptor; None where no lock file can be made: then
        downloads are not shared); wait while its holder makes progress on the download (the lock goes
        with a process that dies), and give up after ``timeout`` seconds without any."""
        import fcntl

        fd = self._lock_file(key)
        if fd is None:
            yield None
            return
        try:
            seen, since = b"", time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    progress = os.pread(fd, 20, 0)
                    if progress != seen:
                        seen, since = progress, time.monotonic()
                    elif time.monotonic() - since > self.remote.timeout:
                        raise TimeoutError(f"another process has been downloading {self._path(key, '.bin')} into the "
                                           f"cache for {self.remote.timeout:g} s without progress") from None
                    time.sleep(0.05)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    # -- eviction -----------------------------------------------------------------------------------
    def _evict(self, keep: str) -> None:
        """Past ``max_bytes``, remove the least recently used entries (their record's time), but
        ``keep``: only the cache's own, a data file of its name pattern with a record of this user's
        (a user's ``corpus.bin`` in the directory is never touched)."""
        if self.max_bytes is None:
            return
        entries = []
        with os.scandir(self.root) as found:
            for e in found:
                if not ENTRY.fullmatch(e.name):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile
                    continue
                rec = self._record(e.name[:-4]) if stat.S_ISREG(st.st_mode) and st.st_uid == _uid() else None
                if rec is not None and rec[0]["size"] == st.st_size:
                    entries.append((rec[1].st_mtime_ns, st.st_size, e.name[:-4]))
        total = sum(s for _, s, _ in entries)
        for _, s, key in sorted(entries):  # oldest use first; a reader's open map of it stays valid
            if total <= self.max_bytes:
                break
            if key != keep:
                self._drop(key)
                total -= s

    def _drop(self, key: str) -> None:
        """Remove entry ``key``: its data, its record, and its lock file unless a process holds it."""
        import fcntl

        for suffix in (".bin", ".json"):
            with contextlib.suppress(OSError):
                os.unlink(self._path(key, suffix))
        fd = self._lock_file(key)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(self._path(key, ".lock"))
            except OSError:
                pass
            finally:
                os.close(fd)
