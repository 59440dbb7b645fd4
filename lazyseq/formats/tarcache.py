"""The index cache of tar shards: a shard's :class:`~lazyseq.formats.tar.TarIndex` kept on local
disk, so a shard's headers are read once, not once per process or run.

An entry is one file, ``<root>/<hash>.wds-index``, under ``cache_dir`` else
``$XDG_CACHE_HOME/lazyseq`` (``~/.cache/lazyseq``), never beside the data. ``<hash>`` is a hash of
the user's uid, this format's version and the shard's absolute path or whole URL (its query
string included, which never shows in a name or a record). The file is a magic line, the length of
a JSON record, the record, then the arrays' bytes. The record holds the hash of the shard's
path or URL, its size and stamp (modification time in ns; a URL's ETag) as indexed, the arrays'
lengths and the BLAKE2b digest of the bytes after it. Nothing is unpickled.

An entry is used only if it proves it is the index of the shard as it is now: a regular file of
this user (opened once, never through a link, never waiting on a FIFO), no larger than the shard's
index can be, whose record names the same path, size and stamp, whose digest its bytes have and
whose arrays describe members inside the shard. Anything else is ignored and the index built again
(and written again). A shard whose stamp is unknown (a URL without an ETag) is never cached. An
entry is written to a file of a fresh random name, then renamed into place; a directory where
nothing can be written only means no cache.

>>> import os, tempfile
>>> from lazyseq.formats.tarindex import TarIndex
>>> i64 = np.int64
>>> ix = TarIndex(np.array([512], i64), np.array([3], i64), np.zeros(1, np.int32), np.array([0, 1], i64),
...               np.array([0, 1], i64), b"a", ["txt"])
>>> root = tempfile.mkdtemp()
>>> store(root, "/data/x.tar", 1024, 17, ix)
>>> again = load(root, "/data/x.tar", 1024, 17)
>>> again.key(0), again.members(0), load(root, "/data/x.tar", 1024, 18)   # another mtime: not used
('a', [('txt', 512, 3)], None)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Any

import numpy as np

from ..errors import StoreError
from ..files.local import open_data
from .tarindex import TarIndex

__all__ = ["load", "store", "default_root"]

VERSION = 1
MAGIC = b"lazyseq webdataset index 1\n"
SUFFIX = ".wds-index"
RECORD_BYTES = 1 << 16
I64, I32 = np.dtype("<i8"), np.dtype("<i4")


def default_root() -> str:
    """``$XDG_CACHE_HOME/lazyseq``, else ``~/.cache/lazyseq`` (where lazyseq's other caches go)."""
    return os.path.expanduser(os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "lazyseq"))


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def entry(root: str, source: str) -> str:
    """The path of ``source``'s entry under ``root``."""
    key = hashlib.sha256(f"{_uid()}\0{VERSION}\0{source}".encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return os.path.join(os.path.abspath(root), key + SUFFIX)


def _arrays(ix: TarIndex) -> list[tuple[str, np.ndarray]]:
    return [("offsets", ix.offsets.astype(I64)), ("sizes", ix.sizes.astype(I64)), ("ext_ids", ix.ext_ids.astype(I32)),
            ("starts", ix.starts.astype(I64)), ("key_ends", ix.key_ends.astype(I64))]


def store(root: str, source: str, size: int, stamp: Any, ix: TarIndex) -> None:
    """Write ``ix``, the index of ``source`` (``size`` bytes, ``stamp``), as its entry under ``root``
    (atomically; nothing where it cannot be written)."""
    if stamp is None:
        return
    body = b"".join(np.ascontiguousarray(a).tobytes() for _, a in _arrays(ix)) + ix.keys
    record = {"format": VERSION, "source": _source_hash(source), "size": size, "stamp": str(stamp), "exts": ix.exts,
              "lengths": {name: len(a) for name, a in _arrays(ix)}, "keys": len(ix.keys),
              "digest": hashlib.blake2b(body).hexdigest()}
    head = json.dumps(record, sort_keys=True).encode()
    with contextlib.suppress(OSError):
        os.makedirs(os.path.abspath(root), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".wds-", suffix=".part", dir=os.path.abspath(root))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + len(head).to_bytes(8, "little") + head + body)
            os.replace(tmp, entry(root, source))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def load(root: str, source: str, size: int, stamp: Any) -> TarIndex | None:
    """The index of ``source`` (``size`` bytes, ``stamp``) from its entry under ``root`` if the
    entry proves to be it (see the module's docstring), else None."""
    if stamp is None:
        return None
    path = entry(root, source)
    try:
        fd, st = open_data(path, "an index cache entry", max_bytes=2 * size + 2 * RECORD_BYTES)
    except (OSError, ValueError):  # missing, a link, a FIFO, too large: not an entry of ours (StoreError is an OSError)
        return None
    try:
        if st.st_uid != _uid():
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(st.st_size + 1)
    finally:
        os.close(fd)
    try:
        return _parse(data, source, size, stamp, path)
    except (ValueError, KeyError, TypeError, StoreError):  # json's and unicode errors are ValueErrors
        return None


def _parse(data: bytes, source: str, size: int, stamp: Any, path: str) -> TarIndex | None:
    n = len(MAGIC) + 8
    if data[:len(MAGIC)] != MAGIC or len(data) < n:
        return None
    head = int.from_bytes(data[len(MAGIC):n], "little")
    if head > RECORD_BYTES or n + head > len(data):
        return None
    record = json.loads(data[n:n + head])
    if (not isinstance(record, dict) or record.get("format") != VERSION or record.get("source") != _source_hash(source)
            or record.get("size") != size or record.get("stamp") != str(stamp)):
        return None
    body = memoryview(data)[n + head:]
    if hashlib.blake2b(body).hexdigest() != record.get("digest"):
        return None
    lengths, exts, nkeys = record["lengths"], record["exts"], record["keys"]
    if not (isinstance(exts, list) and all(isinstance(e, str) for e in exts) and isinstance(nkeys, int)):
        return None
    arrays, at = {}, 0
    for name, dt in (("offsets", I64), ("sizes", I64), ("ext_ids", I32), ("starts", I64), ("key_ends", I64)):
        k = lengths[name]
        if not isinstance(k, int) or k < 0 or at + k * dt.itemsize > len(body):
            return None
        arrays[name] = np.frombuffer(body, dt, k, at)
        at += k * dt.itemsize
    if at + nkeys != len(body):
        return None
    ix = TarIndex(arrays["offsets"], arrays["sizes"], arrays["ext_ids"], arrays["starts"], arrays["key_ends"],
                  bytes(body[at:]), exts)
    ix.check(size, path)
    return ix
