"""Connecting to object storage: the fsspec file system of a URL with lazyseq's policies (socket
timeouts, no redirect to another host, no secret in a log line), and HTTP ranged reads that never
read more of a body than was asked for (a server that ignores ``Range``, or a hostile one, cannot
make a reader hold a whole object, or more, in memory).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .urls import ANY_URL, redact

__all__ = ["filesystem", "http_ranges", "RedirectRefused", "WrongLength"]


class RedirectRefused(ConnectionError):
    """An HTTP server redirected a read to another host."""


class WrongLength(ConnectionError):
    """A server answered a range with more bytes than asked: it ignores ranges, or is hostile."""


class _RedactURLs(logging.Filter):
    """fsspec and s3fs log URLs at DEBUG level: their user info and query strings go."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = ANY_URL.sub(lambda m: redact(m.group(0)), text)
        if clean != text:
            record.msg, record.args = clean, ()
        return True


_REDACTING = _RedactURLs()


def _redact_logs() -> None:
    for name in ("fsspec", "fsspec.http", "fsspec.asyn", "s3fs", "gcsfs", "adlfs", "aiobotocore", "botocore"):
        logger = logging.getLogger(name)
        if _REDACTING not in logger.filters:
            logger.addFilter(_REDACTING)


def filesystem(url: str, options: dict, timeout: float) -> Any:
    """The fsspec file system of ``url``, made anew (no instance shared with other code), with
    lazyseq's policies: socket timeouts of ``timeout`` (a stalled request fails and is retried),
    redirects to another host refused, URLs redacted in the libraries' log lines."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {redact(url)} needs fsspec (and the package of its protocol, e.g. s3fs): "
                          "pip install 'lazyseq[remote]'") from None
    _redact_logs()
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
