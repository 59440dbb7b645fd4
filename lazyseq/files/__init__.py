"""The one files layer (DESIGN section 2): a dataset's location is a local path or any fsspec URL
(``s3://``, ``https://``, ``gs://``). Formats ask it for their bytes: locally they memory-map
files as before; remotely they read byte ranges through :class:`Remote` (block cache, joined and
concurrent requests, retries within ``timeout``) and, with ``cache_dir=``, whole objects kept on
local disk (:class:`DiskCache`). See docs/remote.md. :func:`serve` (:mod:`.httpserver`) serves a
directory over HTTP with Range requests: a small local server for notebooks, benchmarks and tests."""

from typing import Any

from .diskcache import DiskCache
from .remote import Remote, RemoteFile
from .urls import PLAIN_NAME, is_url, join, local_path, redact
from .writes import RemoteWriteError

__all__ = ["Remote", "RemoteFile", "DiskCache", "is_url", "local_path", "redact", "join", "PLAIN_NAME", "serve",
           "RemoteWriteError"]


def __getattr__(name: str) -> Any:
    if name == "serve":  # imported on first use: http.server costs ~10 ms at every import of lazyseq
        from .httpserver import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
