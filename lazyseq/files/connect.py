"""Connecting to object storage: the fsspec file system of a URL with lazyseq's policies (socket
timeouts, no redirect to another host, no secret in a log line), and HTTP ranged reads that never
read more of a body than was asked for (a server that ignores ``Range``, or a hostile one, cannot
make a reader hold a whole object, or more, in memory).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from .urls import redact, redact_text

__all__ = ["filesystem", "http_ranges", "RedirectRefused", "WrongLength"]


class RedirectRefused(ConnectionError):
    """An HTTP server redirected a read to another host."""


class WrongLength(ConnectionError):
    """A server answered a range with more bytes than asked: it ignores ranges, or is hostile."""


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

    async def check(session: Any, ctx: Any, params: Any) -> None:
        to = params.response.headers.get("Location", "")
        target = params.response.url.join(aiohttp.client.URL(to)) if to else params.response.url
        if (target.scheme, target.host, target.port) != (params.url.scheme, params.url.host, params.url.port):
            raise RedirectRefused(f"the server redirected {redact(str(params.url))} to another host "
                                  f"({target.scheme}://{target.host}): lazyseq does not follow redirects to another host; "
                                  "use the final URL")

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(check)
    return trace


def http_ranges(fs: Any, reqs: list[list[Any]], timeout: float) -> list[Any]:
    """The bytes of each ``[url, start, stop]`` over fsspec's HTTP session, all at once, each an
    exception where it failed (``on_error="return"``); ``timeout`` bounds the whole batch."""
    from fsspec.asyn import sync

    async def each() -> list[Any]:
        session = await fs.set_session()
        return await asyncio.gather(*(_http_range(fs, session, *r) for r in reqs), return_exceptions=True)

    return sync(fs.loop, each, timeout=timeout)


async def _http_range(fs: Any, session: Any, url: str, a: int, b: int) -> bytes:
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={a}-{b - 1}"
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status in (404, 410):
            raise FileNotFoundError(redact(url))
        r.raise_for_status()
        if r.status != 206 or (r.content_length is not None and r.content_length > b - a):
            raise WrongLength(f"the server answered a range of {b - a} bytes with status {r.status} and "
                              f"{r.content_length} bytes: it ignores Range requests (a dataset's server must answer them)")
        parts, got = [], 0
        while got < b - a:
            chunk = await r.content.read(b - a - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        if got == b - a and await r.content.read(1):
            raise WrongLength(f"the server sent more than the {b - a} bytes asked for")
        return b"".join(parts)
