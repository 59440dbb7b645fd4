"""A store's shard in object storage, read by byte ranges (:class:`lazyseq.files.RemoteFile`).

Its small tables (a variable field's offsets and shapes) are read whole when the shard opens and
checked as a local shard's are; an item's value is one range of the shard, whose request
:func:`requests` names so that a bulk read can fetch a batch's ranges at once
(:meth:`lazyseq.files.Remote.holding`). Values are read-only arrays over the bytes received.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StoreError
from ..files import Remote, redact
from . import format as fmt

__all__ = ["RemoteTable", "var_array", "byte_requests", "remote_manifest", "remote_verify"]

_BUCKETS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss")  # URLs whose first part is a bucket (container)


class RemoteTable:
    """A fixed field's rows (one per item) in a remote shard: the part of an ndarray that single
    reads and :mod:`.gather` use (``t[j]``, ``t[j, ...]``, ``t[a:b]``, ``t.item(j)``, ``np.take``)."""

    __slots__ = ("file", "offset", "dtype", "shape", "ndim", "rowbytes")

    def __init__(self, file: Any, offset: int, dtype: np.dtype, shape: tuple):
        self.file, self.offset, self.dtype, self.shape, self.ndim = file, offset, np.dtype(dtype), shape, len(shape)
        self.rowbytes = self.dtype.itemsize * math.prod(shape[1:])

    def requests(self, js: np.ndarray) -> list:
        url, a, rb, v = self.file.url, self.offset, self.rowbytes, self.file.version  # the version the shard opened as
        return [(url, a + j * rb, a + (j + 1) * rb, v) for j in js.tolist()] if rb else []

    def _rows(self, a: int, b: int) -> np.ndarray:
        blob = self.file.read(self.offset + a * self.rowbytes, self.offset + b * self.rowbytes)
        return np.frombuffer(blob, self.dtype, count=(b - a) * math.prod(self.shape[1:])).reshape((b - a, *self.shape[1:]))

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple) and len(key) == 2 and key[1] is Ellipsis:
            return self._rows(key[0], key[0] + 1)[0, ...]
        if isinstance(key, slice):
            a, b, _ = key.indices(self.shape[0])
            return self._rows(a, max(a, b))
        return self._rows(key, key + 1)[0]

    def item(self, j: int) -> Any:
        return self._rows(j, j + 1)[0].item()

    def take(self, js: Any, axis: int = 0, out: np.ndarray | None = None, mode: str = "raise") -> np.ndarray:
        """Rows ``js`` (what ``np.take(table, js, axis=0)`` calls): their ranges fetched at once."""
        js = np.asarray(js, dtype=np.int64)
        if len(js) and (js.min() < 0 or js.max() >= self.shape[0]):
            raise IndexError(f"rows {js.min()}..{js.max()} of a table of {self.shape[0]}")
        blobs = self.file.remote.read_ranges(self.requests(js)) if self.rowbytes else []
        rows = np.frombuffer(b"".join(blobs), self.dtype).reshape((len(js), *self.shape[1:]))
        if out is None:
            return rows
        out[...] = rows
        return out


def var_array(dt: np.dtype, file: Any, base: int, offs: np.ndarray, shapes: np.ndarray) -> tuple[Callable, Callable, None]:
    """A variable-shape array field: item ``j`` is ``shapes[j]`` values at ``offs[j]`` of its data."""
    sizes = (np.prod(shapes, axis=1, dtype=np.int64) if shapes.shape[1] else np.ones(len(shapes), np.int64)) * dt.itemsize

    def one(j: int) -> np.ndarray:
        a = base + int(offs[j])
        return np.frombuffer(file.read(a, a + int(sizes[j])), dt).reshape(shapes[j].tolist())

    def pick(js: np.ndarray) -> list:
        blobs = file.remote.read_ranges(byte_requests(file, base, offs[js], offs[js] + sizes[js]))
        return [np.frombuffer(b, dt).reshape(s) for b, s in zip(blobs, shapes[js].tolist())]

    return one, pick, None


def byte_requests(file: Any, base: int, starts: np.ndarray, stops: np.ndarray) -> list:
    """The requests of items whose bytes lie at ``starts`` to ``stops`` of a field's data at ``base``."""
    return [file.request(base + a, base + b) for a, b in zip(starts.tolist(), stops.tolist())]


def remote_manifest(remote: Remote) -> dict:
    """The manifest of the store at ``remote`` (one read), checked to be one this lazyseq reads."""
    url = remote.join(fmt.MANIFEST)
    shown = f"{remote.shown}/{fmt.MANIFEST}"
    text = None
    try:
        text = remote.read_whole(url, fmt.MANIFEST_BYTES, "manifest")
    except FileNotFoundError:
        pass
    if text is None:  # (raised here, not in the except block: no __context__ to carry a URL's secrets)
        bucket = _missing_bucket(remote)
        if bucket is not None:
            raise FileNotFoundError(f"lazyseq.load: there is no store at {remote.shown}: the bucket {bucket} does not "
                                    "exist, or cannot be listed with these credentials; check the URL and storage_options")
        hint = ""
        try:  # one request, on this error path only: the job file a save leaves until it ends
            remote.info(f"{remote.url}/.lazyseq-partial/{fmt.JOB}")
            hint = f"; an interrupted save is in {remote.shown}/.lazyseq-partial: run the same lazyseq.save again to finish it"
        except OSError:
            pass
        raise FileNotFoundError(f"lazyseq.load: there is no store at {remote.shown}: it has no {fmt.MANIFEST}{hint}")
    try:
        m = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise StoreError(f"the manifest {shown} cannot be read: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(m, dict) or m.get("format") != fmt.FORMAT:
        raise StoreError(f"{shown} is not the manifest of a lazyseq store")
    if m.get("version") != fmt.VERSION:
        raise StoreError(f"{shown} has format version {m.get('version')!r:.40}; this lazyseq reads version {fmt.VERSION}")
    return m


def _missing_bucket(remote: Remote) -> str | None:
    """The bucket of ``remote`` (``s3://bucket``, redacted), if the URL names one and its file system
    says that it does not exist or cannot be listed; None otherwise, or when the file system cannot tell."""
    protocol = remote.url.split("://", 1)[0].lower()
    if protocol not in _BUCKETS:
        return None
    try:
        bucket = remote.fs._strip_protocol(remote.url).split("/", 1)[0]
        return None if not bucket or remote.fs.exists(bucket) else redact(f"{protocol}://{bucket}")
    except Exception:  # a file system that cannot tell: the message says what is known (no manifest)
        return None


def remote_verify(remote: Remote, url: str, rec: dict) -> None:
    """Read the whole shard at ``url`` and check its size and checksum against its record."""
    f = remote.open(url, rec["bytes"])
    crc, step = 0, 8 * 2**20
    for a in range(0, f.size, step * 8):
        for blob in remote.read_ranges([f.request(x, min(x + step, f.size)) for x in range(a, min(a + 8 * step, f.size), step)],
                                       cache=False):
            crc = zlib.crc32(blob, crc)
    if crc != rec["crc32"]:
        raise StoreError(f"{redact(url)} is corrupted: its checksum differs from the manifest's")
