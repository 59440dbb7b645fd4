"""Connecting to object storage: the fsspec file system of a URL with lazyseq's policies (socket
timeouts, no redirect to another host, no secret in a log line), and the ranged reads of
:func:`fetch_ranges`: each GET carries the object's version as it was opened (``If-Match`` over
HTTP and S3, S3's ``VersionId`` on a versioned bucket), its answer's ``Content-Range`` and ETag
are checked against what was asked, its body is read no further than the range (a server that
ignores ``Range``, or a hostile one, cannot make a reader hold a whole object, or more, in
memory), and the whole batch ends by the read's deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any, NamedTuple

from .urls import redact, redact_text

__all__ = ["filesystem", "fetch_ranges", "pool_size", "Backoff", "Version", "RedirectRefused", "WrongLength", "WrongRange",
           "Changed", "OutOfTime"]


class RedirectRefused(ConnectionError):
    """An HTTP server redirected a read to another host."""


class WrongLength(ConnectionError):
    """A server answered a range with more bytes than asked: it ignores ranges, or is hostile."""


class WrongRange(ConnectionError):
    """A server answered a range with another range (its ``Content-Range`` is not what was asked)."""


class Changed(ConnectionError):
    """The object is not the version that was opened: a ranged GET's ``If-Match`` failed (412), its
    answer carries another ETag or size, or the ``VersionId`` opened is gone."""


class OutOfTime(TimeoutError):
    """A request was not answered in full before the deadline of its read."""


class Version(NamedTuple):
    """What an object was when it was opened: its size, its ETag (a strong one, or None: the server
    gives none, or only a weak one, which ``If-Match`` cannot use) and its S3 ``VersionId`` (None on
    a bucket without versioning). Every ranged GET of the object carries it."""

    size: int
    etag: str | None = None
    version_id: str | None = None


# -- no secret in a log record ------------------------------------------------------------------------
# A filter on a logger sees only the records logged at that very logger, not its children's
# (botocore.auth, botocore.endpoint, urllib3.connectionpool ...), and a handler's filter only the
# handlers it was put on. So every record is scrubbed where it is made: a log record factory that
# wraps the one in place (logging.setLogRecordFactory), whatever logger, handler or propagation
# follows. It rewrites the message (msg and args), a traceback (exc_info: formatted, redacted, kept
# as exc_text and dropped, so no handler formats the secret again) and stack_info. Each call of
# `filesystem` checks that it is still in place (code that sets its own factory later replaces it).
_LOCK = threading.Lock()
_VALUES: set[str] = set()  # secrets given in storage_options, hidden wherever they appear
_VALUES_RE: list[Any] = [None]
_SECRET_OPTION = re.compile(r"(?i)key|secret|token|password|passwd|credential|authori[sz]ation|signature|sas|cookie")
_LIBRARIES = ("fsspec", "s3fs", "gcsfs", "adlfs", "aiobotocore", "botocore", "boto3", "aiohttp", "urllib3", "asyncio")


def scrub(text: str) -> str:
    """``text`` without a secret: :func:`.urls.redact_text`, and the secret values of the
    storage_options lazyseq was given."""
    text = redact_text(text)
    values = _VALUES_RE[0]
    return values.sub("***", text) if values is not None else text


def scrub_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message, traceback and stack scrubbed (:func:`scrub`), in place."""
    try:
        text, broken = record.getMessage(), False
    except Exception:  # msg and args that do not format: logging would print both on stderr
        text, broken = f"{record.msg} {record.args!r}", True
    clean = scrub(text)
    if clean != text or broken:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None:
        shown = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        clean = scrub(shown)
        if clean != shown:
            record.exc_info, record.exc_text = None, clean
    elif record.exc_text:
        record.exc_text = scrub(record.exc_text)
    if record.stack_info:
        record.stack_info = scrub(record.stack_info)
    return record


class _RedactURLs(logging.Filter):
    """The same scrubbing as a filter, on the libraries' own loggers: a second guard, should other
    code replace the record factory."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrub_record(record)
        return True


_REDACTING = _RedactURLs()


def _secret_values(options: Any, name: str = "") -> Iterator[str]:
    """The string values of ``options`` (nested dicts) under a name that says they are secret."""
    if isinstance(options, dict):
        for k, v in options.items():
            yield from _secret_values(v, f"{name}.{k}")
    elif isinstance(options, str) and len(options) >= 6 and _SECRET_OPTION.search(name):
        yield options


def _redact_logs(options: dict | None = None) -> None:
    """Install the scrubbing (the record factory, the filters) if not in place; remember the secret
    values of ``options``."""
    with _LOCK:
        new = set(_secret_values(options or {})) - _VALUES
        if new:
            _VALUES.update(new)
            _VALUES_RE[0] = re.compile("|".join(map(re.escape, sorted(_VALUES, key=len, reverse=True))))
        made = logging.getLogRecordFactory()
        if not getattr(made, "lazyseq_scrubs", False):
            def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
                return scrub_record(made(*args, **kwargs))

            factory.lazyseq_scrubs = True  # type: ignore[attr-defined]
            logging.setLogRecordFactory(factory)
        for lib in _LIBRARIES:
            logger = logging.getLogger(lib)
            if _REDACTING not in logger.filters:
                logger.addFilter(_REDACTING)


def filesystem(url: str, options: dict, timeout: float) -> Any:
    """The fsspec file system of ``url``, made anew (no instance shared with other code), with
    lazyseq's policies: socket timeouts of ``timeout`` (a stalled request fails and is retried),
    redirects to another host refused, no secret in a log record (:func:`scrub_record`)."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {redact(url)} needs fsspec (and the package of its protocol, e.g. s3fs): "
                          "pip install 'lazyseq[remote]'") from None
    _redact_logs(options)
    protocol = url.split("://", 1)[0].lower()
    options = dict(options)
    if protocol in ("http", "https"):  # a stalled request fails after `timeout` without data; then it is retried
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client["trace_configs"] = [*client.get("trace_configs", ()), _same_host_redirects()]
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
        options["client_kwargs"] = client
    elif protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    return fsspec.filesystem(protocol, skip_instance_cache=True, **options)


def _same_host_redirects() -> Any:
    """An aiohttp trace that refuses a redirect to another host (a dataset's server must not send
    its reader's requests, and their credentials, elsewhere)."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(_refuse_other_hosts)
    return trace


async def _refuse_other_hosts(session: Any, ctx: Any, params: Any) -> None:
    # a module function, not a closure: aiohttp's sessions hold their traces in reference cycles, and
    # a closure of lazyseq's inside one would be left for the cyclic collector with them
    import aiohttp

    to = params.response.headers.get("Location", "")
    target = params.response.url.join(aiohttp.client.URL(to)) if to else params.response.url
    if (target.scheme, target.host, target.port) != (params.url.scheme, params.url.host, params.url.port):
        raise RedirectRefused(f"the server redirected {redact(str(params.url))} to another host "
                              f"({target.scheme}://{target.host}): lazyseq does not follow redirects to another host; "
                              "use the final URL")


# -- what a failure means, and the tries of a read ------------------------------------------------
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
    final = (FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError | RedirectRefused | WrongLength
             | WrongRange | Changed)
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


def _real(e: BaseException) -> BaseException:
    """The failure behind ``e``: fsspec's HTTP ``info()`` turns any failure of its HEAD and GET (a
    503, a timeout, a refused redirect) into FileNotFoundError, the real one as its cause; s3fs
    turns a missing bucket into one too (a 404: still missing)."""
    cause = e.__cause__
    if isinstance(e, FileNotFoundError) and cause is not None and _status(cause) not in (404, 410):
        return cause
    return e


class Backoff:
    """The tries of one read or write and its deadline, ``window`` seconds after the first: waits of
    50 ms doubling up to 2 s between them, as long as the next try would start before the deadline;
    each try gets what is :meth:`left` of it (a read's concurrent requests share it)."""

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


def pool_size(fs: Any, protocol: str) -> int:
    """How many requests of ``fs`` are in flight at once: aiohttp's pool (100 connections unless
    ``client_kwargs`` gives a connector), aiobotocore's (``max_pool_connections``, 10 by default)."""
    if protocol in ("s3", "s3a"):
        return int((getattr(fs, "config_kwargs", None) or {}).get("max_pool_connections", 10))
    connector = (getattr(fs, "client_kwargs", None) or {}).get("connector")
    return int(getattr(connector, "limit", 0) or 100)


def fetch_ranges(fs: Any, protocol: str, reqs: list[tuple], left: float) -> list[Any]:
    """The bytes of each ``(url, start, stop, version)`` (``version``: a :class:`Version` or None),
    all sent at once; an exception in the place of each that failed. Each request ends within
    ``left`` seconds (:class:`OutOfTime` past them): the deadline of the read it belongs to."""
    if not getattr(fs, "async_impl", False):  # a synchronous file system (memory://): no deadline to enforce
        return fs.cat_ranges([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs], on_error="return")
    one = _http_range if protocol in ("http", "https") else _s3_range if protocol in ("s3", "s3a") else _any_range

    async def each() -> list[Any]:
        session = await fs.set_session() if hasattr(fs, "set_session") else None
        return await asyncio.gather(*(_bounded(one(fs, session, *r), left) for r in reqs), return_exceptions=True)

    future = asyncio.run_coroutine_threadsafe(each(), fs.loop)
    try:
        return future.result(left + 1.0)  # each request ends by its deadline: the extra second is the loop's
    except concurrent.futures.TimeoutError:
        future.cancel()
        return [OutOfTime("the event loop did not answer in time")] * len(reqs)


async def _bounded(coro: Any, left: float) -> Any:
    """``coro``'s result, or :class:`OutOfTime` once ``left`` seconds have passed (a library's own timeout,
    a subclass of TimeoutError such as aiohttp's on a silent socket, goes through as it is)."""
    try:
        return await asyncio.wait_for(coro, max(left, 0.001))
    except TimeoutError as e:
        if type(e) is not TimeoutError:
            raise
    raise OutOfTime("the answer was not complete in time")


def _shown(text: Any) -> str:
    """A value a server sent (an ETag, a header), fit for a message: 80 characters, no control character."""
    return "".join(c if c.isprintable() else "?" for c in str(text)[:80])


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*")


def _check_answer(url: str, a: int, b: int, version: Version | None, content_range: str | None, etag: str | None) -> None:
    """The ``Content-Range`` and ETag of a 206 answer to bytes ``a`` to ``b``, checked against the
    range asked and the object's version: :class:`WrongRange` or :class:`Changed` if they differ."""
    m = _CONTENT_RANGE.fullmatch(content_range or "")
    if m is None:
        raise WrongRange(f"the server answered bytes {a}-{b - 1} with Content-Range {_shown(content_range)!r}, "
                         "not a range of bytes")
    start, end, total = int(m[1]), int(m[2]), m[3]
    if (start, end) != (a, b - 1):
        raise WrongRange(f"the server answered bytes {start}-{end} (Content-Range {m[0].strip()!r}) for bytes {a}-{b - 1}: "
                         "a server or proxy that answers other ranges than asked cannot be read")
    if version is not None and total != "*" and int(total) != version.size:
        raise Changed(f"it is {total} bytes now, {version.size} when it was opened")
    if version is not None and version.etag and etag and _opaque(etag) != _opaque(version.etag):
        raise Changed(f"its ETag is {_shown(etag)} now, {_shown(version.etag)} when it was opened")


def _opaque(etag: str) -> str:
    """An ETag without its weakness mark: ``W/"x"`` and ``"x"`` name the same version (weak comparison)."""
    return etag[2:] if etag.startswith("W/") else etag


async def _read_exactly(read: Any, n: int) -> bytes:
    """At most ``n`` bytes of a body (fewer where it ends early); :class:`WrongLength` if more follow."""
    parts, got = [], 0
    while got < n:
        chunk = await read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got == n and await read(1):
        raise WrongLength(f"the server sent more than the {n} bytes asked for")
    return b"".join(parts)


async def _http_range(fs: Any, session: Any, url: str, a: int, b: int, version: Version | None = None) -> bytes:
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={a}-{b - 1}"
    if version is not None and version.etag:
        headers["If-Match"] = version.etag
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status in (404, 410):
            raise FileNotFoundError(redact(url))
        if r.status == 412:
            raise Changed(f"the server refused If-Match: {_shown(version and version.etag)} (412 Precondition Failed)")
        r.raise_for_status()
        if r.status != 206 or (r.content_length is not None and r.content_length > b - a):
            raise WrongLength(f"the server answered a range of {b - a} bytes with status {r.status} and "
                              f"{r.content_length} bytes: it ignores Range requests (a dataset's server must answer them)")
        _check_answer(url, a, b, version, r.headers.get("Content-Range"), r.headers.get("ETag"))
        return await _read_exactly(r.content.read, b - a)


async def _s3_range(fs: Any, session: Any, url: str, a: int, b: int, version: Version | None = None) -> bytes:
    """A ranged GetObject through s3fs's client, without s3fs's own retries (the read's deadline and
    backoff are lazyseq's): ``VersionId`` where the bucket is versioned, else ``IfMatch``."""
    from botocore.exceptions import ClientError

    bucket, key, path_version = fs.split_path(url)
    kw: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={a}-{b - 1}"}
    vid = (version.version_id if version is not None else None) or path_version
    if vid:
        kw["VersionId"] = vid
    elif version is not None and version.etag:
        kw["IfMatch"] = version.etag
    s3 = await fs.get_s3(bucket)
    answer, failure = None, None
    try:
        answer = await s3.get_object(**fs._get_s3_method_kwargs(s3.get_object, **kw))
    except ClientError as e:  # (raised below, not here: the library's exception stays out of the chain)
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        failure = e
        if status == 412 or code == "PreconditionFailed":
            failure = Changed(f"S3 refused IfMatch: {_shown(version and version.etag)} (412 PreconditionFailed)")
        elif code == "NoSuchVersion" or (status == 404 and vid):
            failure = Changed(f"its version {_shown(vid)} is gone")
        elif status in (404, 410) or code in ("NoSuchKey", "NoSuchBucket"):
            failure = FileNotFoundError(redact(url))
    if failure is not None:
        raise failure
    async with answer["Body"] as body:
        if answer.get("ContentLength") is not None and answer["ContentLength"] > b - a:
            raise WrongLength(f"S3 answered a range of {b - a} bytes with {answer['ContentLength']} bytes")
        _check_answer(url, a, b, version, answer.get("ContentRange"), answer.get("ETag"))
        return await _read_exactly(body.read, b - a)


async def _any_range(fs: Any, session: Any, url: str, a: int, b: int, version: Version | None = None) -> bytes:
    """Another protocol's ranged read (gcsfs, adlfs...): fsspec's own; no version carried."""
    return await fs._cat_file(url, start=a, end=b)
