"""Writing to object storage through fsspec, for :func:`lazyseq.save` to a URL: whole objects put
(a file uploaded, a small object written, optionally only if absent), listed and deleted, each
retried with backoff like :class:`~lazyseq.files.Remote`'s reads.

How long a request may take: ``remote.timeout`` seconds, retries included, for a small object,
a listing or a deletion; an upload of ``size`` bytes gets :func:`upload_window` seconds, retries
included (``timeout`` more for every :data:`UPLOAD_STEP` bytes: a 256 MiB shard may take 9 *
``timeout``, i.e. it fails only below about 1 MiB/s with the default 30 s). With an async file
system (s3fs, gcsfs) each try is also cut off when the window runs out.

Messages name the redacted URL and what was being written; the values of ``storage_options``
whose keys name a secret (key, secret, token, password...) are masked in any text a library put in
its error, and the library's exception is not chained (its text may hold them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import RemoteReadError, RemoteWriteError
from .remote import Backoff, Remote, _retryable, _scrub
from .urls import redact

__all__ = ["RemoteWriteError", "listing", "read_small", "read_many", "put_bytes", "put_file", "delete",
           "upload_window", "UPLOAD_STEP"]

UPLOAD_STEP = 32 * 2**20  # bytes an upload may take `timeout` seconds for, on top of the first `timeout`
_SECRET_KEY = re.compile(r"secret|key|token|pass|credential|auth|sig|session", re.I)


def upload_window(timeout: float, size: int) -> float:
    """Seconds an upload of ``size`` bytes may take, retries included."""
    return timeout * (1 + size / UPLOAD_STEP)


def _secrets(options: Any) -> Iterable[str]:
    """The string values of ``options`` (nested dicts too) stored under a key that names a secret."""
    if isinstance(options, dict):
        for k, v in options.items():
            if isinstance(v, str) and len(v) >= 4 and _SECRET_KEY.search(str(k)):
                yield v
            else:
                yield from _secrets(v)


def _hide(text: str, remote: Remote, url: str) -> str:
    text = _scrub(text, url)
    for s in _secrets(remote.options):
        text = text.replace(s, "***")
    return text


def _tries(remote: Remote, call: Callable[[dict], Any], url: str, what: str, verb: str, window: float,
           error: type[OSError] = RemoteWriteError) -> Any:
    """``call(kwargs)`` (kwargs: the per-try timeout of an async file system), retried with backoff
    until ``window`` seconds have passed. A missing object (FileNotFoundError) and an object that
    exists where it must not (FileExistsError) are raised at once, with the redacted URL."""
    tries, timed = Backoff(window), getattr(remote.fs, "async_impl", False)
    while True:
        tries.tries += 1
        failure = None
        try:
            return call({"timeout": max(tries.left(), 0.01)} if timed else {})
        except Exception as e:  # raised below, outside this block: no __context__ keeps the library's
            failure = e  # exception, whose text may hold the URL's secrets
        if isinstance(failure, FileExistsError):
            raise FileExistsError(f"{redact(url)} exists")
        if isinstance(failure, FileNotFoundError):  # (fsspec's HTTP hides other failures as this one: refused for saves)
            if verb in ("read", "list", "delete"):
                raise FileNotFoundError(f"{redact(url)} does not exist")
            raise error(f"could not {verb} {what} at {redact(url)}: its bucket (or parent) does not exist", redact(url))
        if not _retryable(failure) or not tries.again():
            after = f" {tries.spent()}" if _retryable(failure) else ""
            why = _hide(str(failure), remote, url) or ("no answer in time" if isinstance(failure, TimeoutError)
                                                      else "(no message)")
            raise error(f"could not {verb} {what} at {redact(url)}{after}: {type(failure).__name__}: {why}", redact(url))


def _path(remote: Remote, url: str) -> str:
    return remote.fs._strip_protocol(url).rstrip("/")


def listing(remote: Remote, url: str | None = None) -> dict[str, int]:
    """Every object under ``url`` (default: the location), as its name relative to ``url``
    (``shard-00000-....bin``, ``.lazyseq-partial/job.json``) and its size; ``{}`` if there is none."""
    url = url or remote.url
    fs, base = remote.fs, _path(remote, url)
    fs.invalidate_cache(base)  # a listing cached by the file system would hide what another save did

    def find(kw: dict) -> dict:
        return fs.find(url, detail=True, **kw)
    try:
        found = _tries(remote, find, url, "the objects", "list", remote.timeout, RemoteReadError)
    except FileNotFoundError:
        return {}
    out = {}
    for path, info in found.items():
        path = path.rstrip("/")
        if info.get("type", "file") == "file" and path.startswith(base + "/"):
            out[path[len(base) + 1:]] = int(info.get("size") or 0)
    return out


def read_small(remote: Remote, url: str, what: str) -> bytes | None:
    """The bytes of the small object at ``url`` (a lock, a job file), read now (no cache); None if
    it does not exist."""
    try:
        return _tries(remote, lambda kw: remote.fs.cat_file(url, **kw), url, what, "read", remote.timeout, RemoteReadError)
    except FileNotFoundError:
        return None


def read_many(remote: Remote, urls: list[str], what: str) -> dict[str, bytes]:
    """The bytes of each object of ``urls`` that can be read (requests sent at once where the file
    system can), by URL; the others are left out."""
    if not urls:
        return {}
    paths = {_path(remote, u): u for u in urls}

    def cat(kw: dict) -> dict:
        return remote.fs.cat(list(paths), on_error="omit", **kw)
    got = _tries(remote, cat, urls[0], what, "read", remote.timeout, RemoteReadError)
    return {paths[_path(remote, p)]: b for p, b in got.items() if isinstance(b, bytes) and _path(remote, p) in paths}


def put_bytes(remote: Remote, url: str, data: bytes, what: str, create: bool = False) -> None:
    """Write ``data`` as the object at ``url`` (one PUT). ``create=True``: only if no object is
    there (FileExistsError otherwise); atomic where the store says so (S3's ``If-None-Match``, GCS,
    ``memory://``), a check then a write elsewhere."""
    mode = "create" if create else "overwrite"
    _tries(remote, lambda kw: remote.fs.pipe_file(url, data, mode=mode, **kw), url, what, "write",
           upload_window(remote.timeout, len(data)))  # (a manifest of many shards may be megabytes)


def put_file(remote: Remote, local: str, url: str, what: str, size: int) -> None:
    """Upload the local file ``local`` (``size`` bytes) as the object at ``url``: the file system
    picks one PUT or a multipart upload (s3fs: multipart from 100 MiB, in 50 MiB parts)."""
    _tries(remote, lambda kw: remote.fs.put_file(local, url, **kw), url, what, "upload", upload_window(remote.timeout, size))


def delete(remote: Remote, urls: list[str], what: str) -> None:
    """Delete the objects at ``urls`` (those already gone are no error), in batches (S3: 1000 per
    request)."""
    fs = remote.fs
    for a in range(0, len(urls), 1000):
        batch = urls[a : a + 1000]
        try:
            _tries(remote, lambda kw, b=batch: fs.rm(b, **kw), batch[0], what, "delete", remote.timeout)
        except FileNotFoundError:  # some file systems refuse a batch naming a missing object: one by one
            for u in batch:
                try:
                    _tries(remote, lambda kw, u=u: fs.rm_file(u, **kw), u, what, "delete", remote.timeout)
                except FileNotFoundError:
                    pass
