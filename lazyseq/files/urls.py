"""What a location is (a local path or a URL), how a URL is shown, and how a name joins it.

A URL may carry credentials (``https://user:secret@host/...``, a presigned query string): every
message, repr and log line shows it through :func:`redact`, and the names a file gives (a store's
shard names) join a URL only as plain names (:func:`join`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["is_url", "local_path", "redact", "join", "PLAIN_NAME", "ANY_URL"]

ANY_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")  # a URL inside a text (a library's message)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # no separator, no '..', '%', '?', '#', ':'


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL other than ``file://`` (a local path otherwise).

    >>> is_url('s3://bucket/train'), is_url('/data/train'), is_url('file:///data/train')
    (True, False, False)
    """
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return m is not None and m.group(1).lower() != "file"


def local_path(path: str | os.PathLike) -> str:
    """The absolute local path of ``path`` (a ``file://`` URL becomes its path)."""
    path = os.fspath(path)
    if isinstance(path, str) and path[:7].lower() == "file://":
        path = path[7:]
    return os.path.abspath(path)


def redact(url: str) -> str:
    """``url`` without what may be a secret: its user info and its query string and fragment
    (presigned URLs carry credentials there).

    >>> redact('https://me:pw@host:8000/data/train?X-Amz-Signature=abc#top')
    'https://host:8000/data/train'
    """
    if not is_url(url):
        return url
    try:
        u = urlsplit(url)
        host = u.hostname or ""
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        netloc = f"{host}:{u.port}" if u.port is not None else host
    except ValueError:  # a malformed port: show no more than the scheme
        return url.split("://", 1)[0] + "://..."
    return urlunsplit((u.scheme, netloc, u.path, "", ""))


def join(url: str, name: str, what: str = "a file") -> str:
    """``url`` with the plain file name ``name`` appended (a query string stays at the end).

    ``name`` comes from a file (a manifest, an index): one with a separator, ``..``, ``%``, ``?``,
    ``#`` or a scheme is refused with ValueError, so it can never point outside ``url``.

    >>> join('https://host/data/train?sig=1', 'shard-00000.bin')
    'https://host/data/train/shard-00000.bin?sig=1'
    >>> join('s3://bucket/train', '../other')
    Traceback (most recent call last):
    ...
    ValueError: s3://bucket/train names a file '../other': only a plain file name may join a store's URL
    """
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):
        raise ValueError(f"{redact(url)} names {what} {name!r:.80}: only a plain file name may join a store's URL")
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, u.path.rstrip("/") + "/" + name, u.query, u.fragment))
