"""What a location is (a local path or a URL), how a URL is shown, and how a name joins it.

A URL may carry credentials (``https://user:secret@host/...``, a presigned query string): every
message, repr and log line shows it through :func:`redact`, and the names a file gives (a store's
shard names) join a URL only as plain names (:func:`join`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["is_url", "local_path", "redact", "redact_text", "join", "PLAIN_NAME", "ANY_URL"]

ANY_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")  # a URL inside a text (a library's message)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # no separator, no '..', '%', '?', '#', ':'
# the names a secret goes by in headers, query strings, canonical requests, reprs and JSON (longest first)
_FIELDS = sorted(("authorization", "proxy-authorization", "x-amz-security-token", "x-amz-credential", "x-amz-signature",
                  "x-goog-credential", "x-goog-signature", "x-api-key", "api-key", "api_key", "apikey", "cookie",
                  "set-cookie", "credential", "signature", "sig", "token", "access_token", "refresh_token",
                  "session_token", "security_token", "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                  "access_key", "secret_key", "secret", "client_secret", "account_key", "sas_token", "password",
                  "passwd"), key=len, reverse=True)
_FIELD = re.compile(r"(?i)(?<![\w-])(" + "|".join(map(re.escape, _FIELDS)) + r")(['\"]?[ \t]*[:=][ \t]*)")
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}\b")  # an AWS access key id
_TOKEN_END = re.compile(r"[&\s,;'\"<>()\[\]{}]|$")


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


def redact_text(text: str) -> str:
    """``text`` (a log line, a traceback) without what may be a secret: URLs through :func:`redact`,
    the value after a secret's name (``Authorization: ...``, ``'X-Amz-Security-Token': b'...'``,
    ``X-Amz-Signature=...``, botocore's ``Signature:`` line, ``"token": "..."``) and AWS access key ids,
    each shown as ``***``.

    >>> redact_text("GET https://h/x?X-Amz-Signature=ab headers={'Authorization': b'AWS4 Credential=AKIAIOSFODNN7EXAMPLE/x'}")
    "GET https://h/x headers={'Authorization': ***}"
    >>> redact_text('/b/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F1&X-Amz-Date=2024 x-amz-security-token:IQo\\nnext')
    '/b/k?X-Amz-Credential=***&X-Amz-Date=2024 x-amz-security-token:***\\nnext'
    """
    text = ANY_URL.sub(lambda m: redact(m.group(0)), text)
    out, pos = [], 0
    for m in _FIELD.finditer(text):
        if m.start() < pos:
            continue
        out += [text[pos:m.end()], "***"]
        pos = _value_end(text, m.end(), ":" in m.group(2))
    out.append(text[pos:])
    return _KEY_ID.sub("***", "".join(out))


def _value_end(text: str, i: int, colon: bool) -> int:
    """Where the value that starts at ``text[i]`` ends: a quoted one (``'...'``, ``b"..."``) at its
    closing quote; after a colon (a header line) at the line's end, or the next line's when the
    value is on a line of its own (botocore's ``Signature:``); after ``=`` at a separator."""
    j = i + 1 if text[i:i + 1] == "b" and text[i + 1:i + 2] in ("'", '"') else i
    quote = text[j:j + 1]
    if quote in ("'", '"'):
        k = j + 1
        while k < len(text) and text[k] != quote and text[k] != "\n":
            k += 2 if text[k] == "\\" else 1
        return min(k + 1, len(text))
    if colon:
        end = text.find("\n", i)
        if end == -1:
            return len(text)
        if not text[i:end].strip():  # the value on the next line
            nxt = text.find("\n", end + 1)
            return len(text) if nxt == -1 else nxt
        return end
    return i + _TOKEN_END.search(text, i).start() - i


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
