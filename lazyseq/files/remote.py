"""Reading objects in object storage by byte ranges, through fsspec: :class:`Remote` is a dataset's
location (its URL, the fsspec file system, the read settings) and :class:`RemoteFile` one object
of it, read like a buffer (``f[a:b]``).

What a read costs: one ranged GET per range asked for, unless the block cache holds it. A bulk
read (:meth:`Remote.holding`) sorts its ranges, joins neighbours (gaps under ``GAP`` bytes) into
one request, sends the requests concurrently, and serves the ranges to the thread that asked until
it leaves the ``with`` block.

Each object is read as the version it was opened (:meth:`Remote.open` or :meth:`Remote.info`: its
size, ETag, S3 VersionId): every ranged GET carries it, and an object that changed since raises
:class:`RemoteReadError` rather than mixing two versions; the block cache keys its ranges by
version too. A read has one deadline, ``timeout`` seconds (more for a large bulk read: one
``timeout`` per round of the connection pool and per 32 MiB), shared by all its tries and all its
concurrent requests; a failed request is retried with backoff within it. A response of the wrong
length or range is a failure (a connection lost mid-transfer never yields part of an item). A
read that found no answer within its deadline makes the reads that start in the next ``timeout``
seconds fail at once: a stalled server costs a loop over many items one ``timeout``, not one each.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import RemoteReadError
from .connect import (
    Backoff,
    Changed,
    Version,
    WrongLength,
    _real,
    _retryable,
    _timed_out,
    _unreachable,
    fetch_ranges,
    filesystem,
    pool_size,
)
from .urls import ANY_URL, join, redact

__all__ = ["Remote", "RemoteFile", "Version", "GAP", "MAX_REQUEST", "PER_TIMEOUT"]

GAP = 64 * 1024  # neighbouring ranges closer than this go out as one request (more bytes, not more time)
MAX_REQUEST = 16 * 2**20  # ... unless the joined request would be larger
PER_TIMEOUT = 32 * 2**20  # a read bringing more bytes than this gets one more `timeout` per PER_TIMEOUT
Request = tuple  # (url, start, stop, version): version a connect.Version or None; (url, start, stop): as last opened


def _why(e: BaseException, url: str, timeout: float) -> str:
    """What went wrong with a request to ``url``, for a message: a timeout says so and after how long, a
    host that cannot be reached is named (redacted), and no exception shows as its bare name and a colon."""
    text = _scrub(str(e), url)
    name = f"{type(e).__name__}: {text}" if text else type(e).__name__
    if _timed_out(e):
        return f"timed out: no answer within {timeout:g} s ({name})"
    if _unreachable(e):
        scheme, _, rest = redact(url).partition("://")
        host = f"the host {rest.split('/', 1)[0]}" if scheme.lower() in ("http", "https") else "the storage endpoint"
        return f"cannot reach {host} ({name}): check the URL, and that the server is up and reachable from here"
    return name


class RangeCache:
    """The block cache: bytes read, keyed by (url, start, stop), least recently used out past
    ``capacity`` bytes. Item reads ask for the same ranges each time, so exact keys suffice."""

    def __init__(self, capacity: int):
        self.capacity, self.size = capacity, 0
        self._d: OrderedDict[Request, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Request) -> bytes | None:
        with self._lock:
            b = self._d.get(key)
            if b is not None:
                self._d.move_to_end(key)
            return b

    def drop(self, url: str) -> None:
        """Forget every range of ``url``."""
        with self._lock:
            for key in [k for k in self._d if k[0] == url]:
                self.size -= len(self._d.pop(key))

    def put(self, key: Request, b: bytes) -> None:
        if len(b) > self.capacity // 4:  # one large read would push everything else out
            return
        with self._lock:
            if key in self._d:
                return
            self._d[key] = b
            self.size += len(b)
            while self.size > self.capacity:
                self.size -= len(self._d.popitem(last=False)[1])


def check_settings(block_cache: int = 64 * 2**20, cache_dir_bytes: int | None = None, timeout: float = 30.0) -> None:
    """ValueError for a setting of :class:`Remote` that cannot work (for who takes them before a read)."""
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f"timeout={timeout!r}: give the seconds a read may take, retries included (> 0)")
    if not (isinstance(block_cache, int) and block_cache >= 0):
        raise ValueError(f"block_cache={block_cache!r}: give the bytes of the block cache (0 turns it off)")
    if cache_dir_bytes is not None and not (isinstance(cache_dir_bytes, int) and cache_dir_bytes > 0):
        raise ValueError(f"cache_dir_bytes={cache_dir_bytes!r}: give the most bytes the cache may hold, or None")


class Remote:
    """A location in object storage (``s3://bucket/train``, ``https://host/data``, any fsspec URL)
    with its read settings; pickles as its URL and settings, so each process (a prefetch worker)
    opens its own connections.

    ``storage_options`` go to fsspec (credentials, endpoint) and are never shown: the repr and
    every message use the URL without user info or query string."""

    def __init__(self, url: str, storage_options: dict | None = None, block_cache: int = 64 * 2**20,
                 cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int | None = None, timeout: float = 30.0):
        check_settings(block_cache, cache_dir_bytes, timeout)
        self.url, self.shown = url.rstrip("/"), redact(url.rstrip("/"))
        self.options = dict(storage_options or {})
        self.block_cache, self.timeout = block_cache, float(timeout)
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_dir_bytes = cache_dir_bytes
        self.cache = RangeCache(block_cache) if block_cache else None
        self.requests = self.bytes_read = 0  # what went out, for stats and the bench
        self._fs: Any = None
        self._pid = os.getpid()
        self._held = threading.local()
        self._lock = threading.Lock()
        self._versions: dict[str, Version] = {}  # each object as it was when last opened
        self._quiet: tuple[float, float] | None = None  # (when, the read's budget): a read got no answer in time

    def __reduce__(self):
        return (Remote, (self.url, self.options, self.block_cache, self.cache_dir, self.cache_dir_bytes, self.timeout))

    def __repr__(self) -> str:
        return f"Remote({self.shown!r})"

    # -- the file system ---------------------------------------------------------------------------
    def _forked(self) -> None:
        """In a forked child: new locks (a parent's thread may have held one at the fork), a new
        cache, no file system (its connections and event loop are the parent's)."""
        if self._pid != os.getpid():
            self._lock, self._pid, self._fs, self._versions, self._quiet = threading.Lock(), os.getpid(), None, {}, None
            self.cache = RangeCache(self.block_cache) if self.block_cache else None

    @property
    def fs(self) -> Any:
        """The fsspec file system, made in this process (a forked child makes its own)."""
        self._forked()
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs = filesystem(self.url, self.options, self.timeout)
        return self._fs

    def join(self, name: str, what: str = "a file") -> str:
        """The URL of the object ``name`` (a plain name) under this location."""
        return join(self.url, name, what)

    # -- whole objects -----------------------------------------------------------------------------
    def info(self, url: str, tries: Backoff | None = None) -> dict:
        """``{"size", "etag", "version_id", "modified"}`` of the object at ``url`` (one HEAD request),
        which the reads of ``url`` then carry (:meth:`open`). ``etag``: a strong ETag, or None where the
        server gives none (or a weak one): the object is then unversioned, whatever its ``modified``
        (a Last-Modified date, one second coarse, says nothing of a change within that second)."""
        protocol = self.url.split("://", 1)[0].lower()
        extra = {"refresh": True} if protocol in ("s3", "s3a") else {}  # a HEAD, not s3fs's listing cache
        d = self._retry(lambda left: self.fs.info(url, **extra, **self._call(left)), url, None, tries)
        if d.get("size") is None:
            raise RemoteReadError(f"{redact(url)} does not say its size: a server must answer HEAD with Content-Length",
                                  redact(url))
        etag, vid = d.get("ETag") or d.get("etag"), d.get("VersionId")
        etag = str(etag) if etag and not str(etag).startswith("W/") else None
        vid = str(vid) if vid not in (None, "", "null") else None
        modified = d.get("LastModified") or d.get("Last-Modified") or d.get("mtime") or d.get("updated")
        version = Version(int(d["size"]), etag, vid)
        if self._versions.get(url, version) != version and self.cache is not None:
            self.cache.drop(url)  # the object was replaced: its old ranges are of no more use
        self._versions[url] = version
        return {"size": version.size, "etag": etag, "version_id": vid, "modified": None if modified is None else str(modified)}

    def read_whole(self, url: str, limit: int, what: str) -> bytes:
        """The object at ``url`` (a manifest, an index), refused if larger than ``limit`` bytes: its
        HEAD and its GETs one read, under one deadline."""
        tries = Backoff(self.timeout)
        size = self.info(url, tries)["size"]
        if size > limit:
            raise RemoteReadError(f"{redact(url)} is {size} bytes: larger than any {what} ({limit} bytes at most)", redact(url))
        part = 8 * 2**20  # parts sent at once: no single GET has to carry it all
        reqs = [(url, a, min(a + part, size), self._versions[url]) for a in range(0, size, part)]
        tries.window, tries.tries = max(tries.window, self.budget(len(reqs), size)), 0  # (the GETs' tries are counted)
        segments = self._fetch_joined(reqs, cache=False, tries=tries)
        return b"".join(self._slice(segments, r) for r in reqs)

    def open(self, url: str, size: int | None = None) -> RemoteFile:
        """The object at ``url`` as a :class:`RemoteFile`, read as the version found now; ``size``:
        what the caller's index says it holds, checked against the object's length before any read."""
        d = self.info(url)
        if size is not None and d["size"] != size:
            raise RemoteReadError(f"{redact(url)} is {d['size']} bytes, its index says {size}: the object is truncated "
                                  "or was replaced", redact(url))
        return RemoteFile(self, url, d["size"], d["etag"], self._versions[url])

    # -- ranges ------------------------------------------------------------------------------------
    def budget(self, requests: int, nbytes: int) -> float:
        """The seconds a read of ``requests`` requests bringing ``nbytes`` bytes may take, its tries
        included: ``timeout`` per round of the connection pool and per ``PER_TIMEOUT`` bytes."""
        protocol = self.url.split("://", 1)[0].lower()
        rounds = math.ceil(requests / max(1, pool_size(self.fs, protocol)))
        return self.timeout * max(1, rounds, math.ceil(nbytes / PER_TIMEOUT))

    def _versioned(self, r: Request) -> Request:
        """``r`` with its version: a request of three carries the version ``url`` was last opened as."""
        return r if len(r) == 4 else (*r, self._versions.get(r[0]))

    @contextlib.contextmanager
    def holding(self, requests: Sequence[Request]) -> Iterator[None]:
        """Fetch ``requests`` at once (neighbours joined, the rest concurrent) and serve reads inside
        them to this thread until the block ends, whatever the block cache keeps."""
        self._forked()
        cache = self.cache
        requests = [self._versioned(r) for r in requests]
        segments = self._fetch_joined([r for r in requests if cache is None or cache.get(r) is None])
        stack = self._held.__dict__.setdefault("stack", [])
        stack.append(segments)
        try:
            yield
        finally:
            stack.pop()

    def _from_held(self, r: Request) -> bytes | None:
        for segments in reversed(getattr(self._held, "stack", ())):
            found = segments.get((r[0], r[3]))
            if found:
                starts, blobs = found
                k = bisect.bisect_right(starts, r[1]) - 1
                if k >= 0 and starts[k] + len(blobs[k]) >= r[2]:
                    return blobs[k][r[1] - starts[k] : r[2] - starts[k]]
        return None

    @staticmethod
    def _slice(segments: dict, r: Request) -> bytes:
        starts, blobs = segments[(r[0], r[3])]
        s = bisect.bisect_right(starts, r[1]) - 1
        return blobs[s][r[1] - starts[s] : r[2] - starts[s]]

    def read_ranges(self, requests: Sequence[Request], cache: bool = True) -> list[bytes]:
        """The bytes of each ``(url, start, stop[, version])``: held, cached, or fetched at once
        (``cache=False``: a download that would only push the block cache's ranges out)."""
        self._forked()
        out: list[bytes | None] = [None] * len(requests)
        missing = []
        for k, r in enumerate(requests):
            if r[1] == r[2]:  # an empty value (b"", an empty array): nothing to ask for
                out[k] = b""
                continue
            r = self._versioned(r)
            got = self._from_held(r)
            if got is None and cache and self.cache is not None:
                got = self.cache.get(r)
            if got is None:
                missing.append((k, r))
            out[k] = got
        if missing:
            segments = self._fetch_joined([r for _, r in missing], cache)
            for k, r in missing:
                out[k] = self._slice(segments, r)
        return out  # type: ignore[return-value]

    def _fetch_joined(self, requests: Sequence[Request], cache: bool = True, tries: Backoff | None = None) -> dict:
        """Fetch ``requests`` (with their versions) as few joined requests, sent concurrently; per
        (url, version), the sorted starts of the fetched segments and their bytes. Each asked range
        goes into the block cache, keyed by its version."""
        joined: list[list[Any]] = []
        requests = [r for r in requests if r[2] > r[1]]
        if not requests:
            return {}
        for url, a, b, v in sorted(set(requests), key=lambda r: r[:3]):  # (two versions of a url are never joined)
            last = joined[-1] if joined else None
            if (last is not None and last[0] == url and last[3] == v and a <= last[2] + GAP
                    and max(b, last[2]) - last[1] <= MAX_REQUEST):
                last[2] = max(last[2], b)
            else:
                joined.append([url, a, b, v])
        blobs = self._get(joined, tries)
        segments: dict[tuple, tuple[list[int], list[bytes]]] = {}
        for (url, a, _, v), blob in zip(joined, blobs):
            starts, bs = segments.setdefault((url, v), ([], []))
            starts.append(a)
            bs.append(blob)
        if cache and self.cache is not None:
            for r in requests:
                if r[2] - r[1] <= self.cache.capacity // 4:
                    self.cache.put(r, self._slice(segments, r))
        return segments

    def _get(self, joined: list[list[Any]], tries: Backoff | None = None) -> list[bytes]:
        """The bytes of each ``[url, start, stop, version]``, retried with backoff until the read's
        deadline (``tries``; else one of :meth:`budget` from now)."""
        out: list[bytes | None] = [None] * len(joined)
        if tries is None:
            tries = Backoff(self.budget(len(joined), sum(b - a for _, a, b, _ in joined)))
        pending, sent, protocol = list(range(len(joined))), 0, self.url.split("://", 1)[0].lower()
        errors: dict[int, BaseException] = {}
        self._check_quiet(joined[0], tries)
        while pending:
            tries.tries += 1
            sent += len(pending)
            try:
                results = fetch_ranges(self.fs, protocol, [tuple(joined[k]) for k in pending], tries.left())
            except Exception as e:  # the whole batch failed (a missing package, a closed loop): each range so
                results = [e] * len(pending)
            still = []
            for k, r in zip(pending, results):
                _, a, b, _ = joined[k]
                if isinstance(r, bytes | bytearray) and len(r) == b - a:
                    out[k] = bytes(r)
                    continue
                if isinstance(r, BaseException):
                    r = _real(r)
                elif len(r) > b - a:  # never retried: each try would bring the whole object again
                    r = WrongLength(f"the server sent {len(r)} bytes for a range of {b - a}: it ignores Range "
                                    "requests (a dataset's server must answer them)")
                else:
                    r = ConnectionError(f"the server sent {len(r)} bytes for a range of {b - a} (a lost connection?)")
                if not _retryable(r):
                    raise self._failed(joined[k], r, tries)
                errors[k] = r
                still.append(k)
            pending = still
            if pending and not tries.again():
                raise self._failed(joined[pending[0]], errors[pending[0]], tries)
        with self._lock:
            self.requests += sent
            self.bytes_read += sum(b - a for _, a, b, _ in joined)
        return out  # type: ignore[return-value]

    def _call(self, left: float) -> dict:
        """The keywords of one try of a call to an async file system: its share of the deadline."""
        return {"timeout": max(left, 0.01)} if getattr(self.fs, "async_impl", False) else {}

    def _retry(self, fn: Any, url: str, rng: tuple[int, int] | None, tries: Backoff | None = None) -> Any:
        """``fn(seconds left)``, retried with backoff until the deadline of ``tries`` (else ``timeout`` from now)."""
        tries = tries or Backoff(self.timeout)
        self._check_quiet([url, *(rng or (None, None))], tries)
        while True:
            tries.tries += 1
            failure = None
            try:
                return fn(tries.left())
            except Exception as e:  # raised below, outside this block: no __context__ keeps the library's
                failure = _real(e)  # exception, whose text may hold the URL's secrets
            if isinstance(failure, FileNotFoundError):
                raise FileNotFoundError(f"{redact(url)} does not exist")
            if not _retryable(failure) or not tries.again():
                raise self._failed([url, *(rng or (None, None))], failure, tries)

    def _check_quiet(self, req: list[Any], tries: Backoff) -> None:
        """Fail at once while an earlier read of this location got no answer within its deadline,
        less than ``timeout`` seconds ago: a stalled server costs a loop over many items one timeout."""
        quiet, now = self._quiet, time.monotonic()
        if quiet is not None and now < quiet[0] + self.timeout:
            url, a, b = req[:3]
            what = f"bytes {a}-{b - 1} of " if a is not None and b > a else ""
            raise RemoteReadError(f"could not read {what}{redact(url)}: not tried: a read of {self.shown} got no answer "
                                  f"within {quiet[1]:g} s, {now - quiet[0]:.1f} s ago; its reads are sent again "
                                  f"{quiet[0] + self.timeout - now:.1f} s from now (timeout={self.timeout:g})", redact(url),
                                  (a, b) if a is not None else None)

    def _failed(self, req: list[Any], e: BaseException, tries: Backoff) -> RemoteReadError:
        url, a, b = req[:3]
        what = f"bytes {a}-{b - 1} of " if a is not None and b > a else ""
        if isinstance(e, Changed):
            return RemoteReadError(f"could not read {what}{redact(url)}: it changed since it was opened ({_scrub(str(e), url)}); "
                                   "no byte of the new version was used: load the store (or open the file) again to read "
                                   "the new version", redact(url), (a, b) if a is not None else None)
        cause = "it is missing" if isinstance(e, FileNotFoundError) else _why(e, url, tries.window)
        after = f" {tries.spent()}{'' if _timed_out(e) else f' (timeout={self.timeout:g})'}" if _retryable(e) else ""
        if _timed_out(e):  # the server gave no answer in time: the next reads do not wait for it again at once
            self._quiet = (time.monotonic(), tries.window)
        return RemoteReadError(f"could not read {what}{redact(url)}{after}: {cause}", redact(url),
                               (a, b) if a is not None else None)


class RemoteFile:
    """One object of a :class:`Remote`, read like a read-only buffer: ``f[a:b]`` is its bytes
    ``a`` to ``b`` (checked against its length first), from the held ranges, the block cache or
    one ranged GET, always of the version it was opened as (``version``, a :class:`Version`)."""

    __slots__ = ("remote", "url", "size", "etag", "version")

    def __init__(self, remote: Remote, url: str, size: int, etag: str | None, version: Version | None = None):
        self.remote, self.url, self.size, self.etag = remote, url, size, etag
        if version is None:  # what the remote's last info() of url found, if it is this object; else its size and ETag
            pinned = remote._versions.get(url)
            version = pinned if pinned is not None and pinned[:2] == (size, etag) else Version(size, etag)
        self.version = version

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("a RemoteFile is read by slices with step 1")
        return self.read(s.start or 0, self.size if s.stop is None else s.stop)

    def request(self, a: int, b: int) -> Request:
        """The request for bytes ``a`` to ``b`` of this version, refused unless they lie inside the object."""
        if not 0 <= a <= b <= self.size:
            raise RemoteReadError(f"bytes {a}-{b - 1} lie outside {redact(self.url)} ({self.size} bytes)",
                                  redact(self.url), (a, b))
        return (self.url, a, b, self.version)

    def read(self, a: int, b: int) -> bytes:
        return self.remote.read_ranges([self.request(a, b)])[0] if b > a else b""

    def __repr__(self) -> str:
        return f"RemoteFile({redact(self.url)!r}, {self.size} bytes)"


def _scrub(text: str, url: str) -> str:
    """An error's text without the secrets a library may have put in it (URLs with their query)."""
    return ANY_URL.sub(lambda m: redact(m.group(0)), text.replace(url, redact(url)))[:300]
