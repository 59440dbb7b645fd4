"""Reading objects in object storage by byte ranges, through fsspec: :class:`Remote` is a dataset's
location (its URL, the fsspec file system, the read settings) and :class:`RemoteFile` one object
of it, read like a buffer (``f[a:b]``).

What a read costs: one ranged GET per range asked for, unless the block cache holds it. A bulk
read (:meth:`Remote.holding`) sorts its ranges, joins neighbours (gaps under ``GAP`` bytes) into
one request, sends the requests concurrently, and serves the ranges to the thread that asked until
it leaves the ``with`` block. A failed or timed-out request is retried with backoff until
``timeout`` seconds have passed since the read began; a response of the wrong length is a failure
(a connection lost mid-transfer never yields part of an item).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import RemoteReadError
from .connect import RedirectRefused, WrongLength, filesystem, http_ranges
from .urls import ANY_URL, join, redact

__all__ = ["Remote", "RemoteFile", "GAP", "MAX_REQUEST"]

GAP = 64 * 1024  # neighbouring ranges closer than this go out as one request (more bytes, not more time)
MAX_REQUEST = 16 * 2**20  # ... unless the joined request would be larger
Request = tuple[str, int, int]  # (url, start, stop)


_NETWORK = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "google", "gcsfs", "adlfs", "azure")


def _status(e: BaseException) -> int | None:
    """The HTTP status of a failed request: aiohttp's ``.status``, botocore's response metadata."""
    status = getattr(e, "status", None) or getattr(e, "code", None)
    if isinstance(status, int):
        return status
    meta = (getattr(e, "response", None) or {}) if isinstance(getattr(e, "response", None), dict) else {}
    status = meta.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _retryable(e: BaseException) -> bool:
    """A failure that another try may not have: timeouts, lost connections, 5xx, 408, 425, 429.
    Not: a missing or forbidden object, a refused redirect, any other 4xx, a programming error
    (an unknown protocol, a missing package, a TypeError)."""
    final = FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError | RedirectRefused | WrongLength
    if isinstance(e, final):
        return False
    status = _status(e)
    if status is not None and 400 <= status < 500:
        return status in (408, 425, 429)
    return isinstance(e, OSError | TimeoutError) or type(e).__module__.split(".")[0] in _NETWORK


def _timed_out(e: BaseException) -> bool:
    """A request that got no answer in time (fsspec's FSTimeoutError, aiohttp's, botocore's timeouts)."""
    return isinstance(e, TimeoutError) or any("Timeout" in c.__name__ for c in type(e).__mro__)


def _unreachable(e: BaseException) -> bool:
    """A connection that could not be made: refused, no such host (aiohttp, botocore); not a TLS failure."""
    names = [c.__name__ for c in type(e).__mro__]
    if any("SSL" in n or "Certificate" in n for n in names):
        return False
    return isinstance(e, ConnectionRefusedError) or "ClientConnectorError" in names or "EndpointConnectionError" in names


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


def _real(e: BaseException) -> BaseException:
    """The failure behind ``e``: fsspec's HTTP ``info()`` turns any failure of its HEAD and GET (a
    503, a timeout, a refused redirect) into FileNotFoundError, the real one as its cause; s3fs
    turns a missing bucket into one too (a 404: still missing)."""
    cause = e.__cause__
    if isinstance(e, FileNotFoundError) and cause is not None and _status(cause) not in (404, 410):
        return cause
    return e


class Backoff:
    """The tries of one read or write: waits of 50 ms doubling up to 2 s between them, as long as
    the next try would start within ``window`` seconds of the first."""

    def __init__(self, window: float):
        self.window, self.start, self.delay, self.tries = window, time.monotonic(), 0.05, 0

    def left(self) -> float:
        """Seconds of the window not used yet (a try's own timeout)."""
        return self.window - (time.monotonic() - self.start)

    def again(self) -> bool:
        """After a failed try: wait and say True, or say False when the window is spent."""
        if time.monotonic() - self.start + self.delay >= self.window:
            return False
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 2.0)
        return True

    def spent(self) -> str:
        return f"after {self.tries} tr{'ies' if self.tries > 1 else 'y'} in {time.monotonic() - self.start:.1f} s"


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
        self._versions: dict[str, str | None] = {}  # the ETag each object had when last opened

    def __reduce__(self):
        return (Remote, (self.url, self.options, self.block_cache, self.cache_dir, self.cache_dir_bytes, self.timeout))

    def __repr__(self) -> str:
        return f"Remote({self.shown!r})"

    # -- the file system ---------------------------------------------------------------------------
    def _forked(self) -> None:
        """In a forked child: new locks (a parent's thread may have held one at the fork), a new
        cache, no file system (its connections and event loop are the parent's)."""
        if self._pid != os.getpid():
            self._lock, self._pid, self._fs, self._versions = threading.Lock(), os.getpid(), None, {}
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
    def info(self, url: str) -> dict:
        """``{"size": bytes, "etag": str | None}`` of the object at ``url`` (one HEAD request)."""
        d = self._retry(lambda: self.fs.info(url, **self._call()), url, None)
        tag = d.get("ETag") or d.get("etag") or d.get("LastModified") or d.get("Last-Modified") or d.get("mtime")
        if d.get("size") is None:
            raise RemoteReadError(f"{redact(url)} does not say its size: a server must answer HEAD with Content-Length",
                                  redact(url))
        return {"size": int(d["size"]), "etag": str(tag) if tag is not None else None}

    def read_whole(self, url: str, limit: int, what: str) -> bytes:
        """The object at ``url`` (a manifest, an index), refused if larger than ``limit`` bytes."""
        size = self.info(url)["size"]
        if size > limit:
            raise RemoteReadError(f"{redact(url)} is {size} bytes: larger than any {what} ({limit} bytes at most)", redact(url))
        part = 8 * 2**20  # parts sent at once: no single GET has to carry it all within the timeout
        return b"".join(self.read_ranges([(url, a, min(a + part, size)) for a in range(0, size, part)], cache=False))

    def open(self, url: str, size: int | None = None) -> RemoteFile:
        """The object at ``url`` as a :class:`RemoteFile`; ``size``: what the caller's index says
        it holds, checked against the object's length before any read."""
        d = self.info(url)
        if self._versions.get(url, d["etag"]) != d["etag"] and self.cache is not None:
            self.cache.drop(url)  # the object was replaced: its old ranges must not be served
        self._versions[url] = d["etag"]
        if size is not None and d["size"] != size:
            raise RemoteReadError(f"{redact(url)} is {d['size']} bytes, its index says {size}: the object is truncated "
                                  "or was replaced", redact(url))
        return RemoteFile(self, url, d["size"], d["etag"])

    # -- ranges ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding(self, requests: Sequence[Request]) -> Iterator[None]:
        """Fetch ``requests`` at once (neighbours joined, the rest concurrent) and serve reads inside
        them to this thread until the block ends, whatever the block cache keeps."""
        self._forked()
        cache = self.cache
        segments = self._fetch_joined([r for r in requests if cache is None or cache.get(r) is None])
        stack = self._held.__dict__.setdefault("stack", [])
        stack.append(segments)
        try:
            yield
        finally:
            stack.pop()

    def _from_held(self, url: str, a: int, b: int) -> bytes | None:
        for segments in reversed(getattr(self._held, "stack", ())):
            found = segments.get(url)
            if found:
                starts, blobs = found
                k = bisect.bisect_right(starts, a) - 1
                if k >= 0 and starts[k] + len(blobs[k]) >= b:
                    return blobs[k][a - starts[k] : b - starts[k]]
        return None

    def read_ranges(self, requests: Sequence[Request], cache: bool = True) -> list[bytes]:
        """The bytes of each ``(url, start, stop)``: held, cached, or fetched at once (``cache=False``:
        a download that would only push the block cache's ranges out)."""
        self._forked()
        out: list[bytes | None] = [None] * len(requests)
        missing = []
        for k, (url, a, b) in enumerate(requests):
            if a == b:  # an empty value (b"", an empty array): nothing to ask for
                out[k] = b""
                continue
            got = self._from_held(url, a, b)
            if got is None and cache and self.cache is not None:
                got = self.cache.get((url, a, b))
            if got is None:
                missing.append(k)
            out[k] = got
        if missing:
            segments = self._fetch_joined([requests[k] for k in missing], cache)
            for k in missing:
                url, a, b = requests[k]
                starts, blobs = segments[url]
                s = bisect.bisect_right(starts, a) - 1
                out[k] = blobs[s][a - starts[s] : b - starts[s]]
        return out  # type: ignore[return-value]

    def _fetch_joined(self, requests: Sequence[Request], cache: bool = True) -> dict[str, tuple[list[int], list[bytes]]]:
        """Fetch ``requests`` as few joined requests, sent concurrently; per URL, the sorted starts
        of the fetched segments and their bytes. Each asked range goes into the block cache."""
        joined: list[list[Any]] = []
        requests = [r for r in requests if r[2] > r[1]]
        if not requests:
            return {}
        for url, a, b in sorted(set(requests)):
            last = joined[-1] if joined else None
            if last is not None and last[0] == url and a <= last[2] + GAP and max(b, last[2]) - last[1] <= MAX_REQUEST:
                last[2] = max(last[2], b)
            else:
                joined.append([url, a, b])
        blobs = self._get(joined)
        segments: dict[str, tuple[list[int], list[bytes]]] = {}
        for (url, a, _), blob in zip(joined, blobs):
            starts, bs = segments.setdefault(url, ([], []))
            starts.append(a)
            bs.append(blob)
        if cache and self.cache is not None:
            for url, a, b in requests:
                if b - a > self.cache.capacity // 4:
                    continue
                starts, bs = segments[url]
                s = bisect.bisect_right(starts, a) - 1
                self.cache.put((url, a, b), bs[s][a - starts[s] : b - starts[s]])
        return segments

    def _get(self, joined: list[list[Any]]) -> list[bytes]:
        """The bytes of each ``[url, start, stop]``, retried with backoff within ``timeout``."""
        out: list[bytes | None] = [None] * len(joined)
        pending, tries, sent = list(range(len(joined))), Backoff(self.timeout), 0
        errors: dict[int, BaseException] = {}
        while pending:
            tries.tries += 1
            sent += len(pending)
            results = self._cat_ranges([joined[k] for k in pending], max(tries.left(), 0.01))
            still = []
            for k, r in zip(pending, results):
                _, a, b = joined[k]
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
            self.bytes_read += sum(b - a for _, a, b in joined)
        return out  # type: ignore[return-value]

    def _cat_ranges(self, reqs: list[list[Any]], timeout: float) -> list[Any]:
        fs = self.fs
        urls, starts, stops = [r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs]
        try:  # each request is bounded by the socket timeouts set in connect.filesystem; this bounds the batch
            if self.url.split("://", 1)[0].lower() in ("http", "https"):  # bodies read no further than asked
                return http_ranges(fs, reqs, timeout + 4 * self.timeout)
            if getattr(fs, "async_impl", False):
                return fs.cat_ranges(urls, starts, stops, on_error="return", timeout=timeout + 4 * self.timeout)
            return fs.cat_ranges(urls, starts, stops, on_error="return")
        except Exception as e:  # the whole batch timed out or failed: each of its ranges failed so
            return [e] * len(reqs)

    def _call(self) -> dict:
        return {"timeout": self.timeout} if getattr(self.fs, "async_impl", False) else {}

    def _retry(self, fn: Any, url: str, rng: tuple[int, int] | None) -> Any:
        tries = Backoff(self.timeout)
        while True:
            tries.tries += 1
            failure = None
            try:
                return fn()
            except Exception as e:  # raised below, outside this block: no __context__ keeps the library's
                failure = _real(e)  # exception, whose text may hold the URL's secrets
            if isinstance(failure, FileNotFoundError):
                raise FileNotFoundError(f"{redact(url)} does not exist")
            if not _retryable(failure) or not tries.again():
                raise self._failed([url, *(rng or (None, None))], failure, tries)

    def _failed(self, req: list[Any], e: BaseException, tries: Backoff) -> RemoteReadError:
        url, a, b = req
        what = f"bytes {a}-{b - 1} of " if a is not None and b > a else ""
        cause = "it is missing" if isinstance(e, FileNotFoundError) else _why(e, url, self.timeout)
        after = f" {tries.spent()}{'' if _timed_out(e) else f' (timeout={self.timeout:g})'}" if _retryable(e) else ""
        return RemoteReadError(f"could not read {what}{redact(url)}{after}: {cause}", redact(url),
                               (a, b) if a is not None else None)


class RemoteFile:
    """One object of a :class:`Remote`, read like a read-only buffer: ``f[a:b]`` is its bytes
    ``a`` to ``b`` (checked against its length first), from the held ranges, the block cache or
    one ranged GET."""

    __slots__ = ("remote", "url", "size", "etag")

    def __init__(self, remote: Remote, url: str, size: int, etag: str | None):
        self.remote, self.url, self.size, self.etag = remote, url, size, etag

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("a RemoteFile is read by slices with step 1")
        return self.read(s.start or 0, self.size if s.stop is None else s.stop)

    def request(self, a: int, b: int) -> Request:
        """The request for bytes ``a`` to ``b``, refused unless they lie inside the object."""
        if not 0 <= a <= b <= self.size:
            raise RemoteReadError(f"bytes {a}-{b - 1} lie outside {redact(self.url)} ({self.size} bytes)",
                                  redact(self.url), (a, b))
        return (self.url, a, b)

    def read(self, a: int, b: int) -> bytes:
        return self.remote.read_ranges([self.request(a, b)])[0] if b > a else b""

    def __repr__(self) -> str:
        return f"RemoteFile({redact(self.url)!r}, {self.size} bytes)"


def _scrub(text: str, url: str) -> str:
    """An error's text without the secrets a library may have put in it (URLs with their query)."""
    return ANY_URL.sub(lambda m: redact(m.group(0)), text.replace(url, redact(url)))[:300]
