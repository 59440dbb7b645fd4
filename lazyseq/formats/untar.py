"""Compressed tar shards (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``) under ``cache_dir``:
decompressed once into a local copy that is then read at random like any ``.tar``.

A copy is ``<root>/<hash>.tar`` and its record ``<root>/<hash>.tar.json``, ``<hash>`` a hash of the
uid, the shard's absolute path or whole URL, its size and its stamp (modification time; a URL's
ETag): a shard that changed has another copy. The copy is decompressed in a stream (bounded memory)
to a file of a fresh random name, then renamed into place, and the record written last holds the
hash of the source, its size and stamp, the copy's size and its BLAKE2b digest. A copy is used only
if it proves itself: a regular file of this user (opened once, never through a link), of the
recorded size, whose digest (computed once per process and copy) is the recorded one; anything
else is decompressed again. A copy larger than ``cache_dir_bytes`` (when given) is refused: a small
compressed shard cannot fill the disk.

>>> import gzip, io, os, tarfile, tempfile
>>> root = tempfile.mkdtemp()
>>> buf = io.BytesIO()
>>> with tarfile.open(fileobj=buf, mode="w") as t:
...     info = tarfile.TarInfo("a.txt"); info.size = 2; t.addfile(info, io.BytesIO(b"hi"))
>>> packed = gzip.compress(buf.getvalue())
>>> path = decompressed(root, "/data/a.tar.gz", packed, 17, None)
>>> open(path, "rb").read() == buf.getvalue(), decompressed(root, "/data/a.tar.gz", packed, 17, None) == path
(True, True)
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import json
import lzma
import os
import tempfile
import threading
import zlib
from typing import Any

from ..errors import StoreError
from ..files.local import open_data

__all__ = ["decompressed", "KINDS"]

KINDS = {".tar.gz": "gzip", ".tgz": "gzip", ".tar.bz2": "bz2", ".tar.xz": "xz"}  # what can be decompressed
CHUNK = 4 * 2**20
RECORD_BYTES = 4096
_verified: dict[tuple[int, ...], str] = {}  # (dev, inode, size, mtime, ctime) of a copy hashed here -> digest
_lock = threading.Lock()


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _decoder(source: str) -> Any:
    kind = next(k for s, k in KINDS.items() if source.endswith(s))
    return {"gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), "bz2": bz2.BZ2Decompressor,
            "xz": lzma.LZMADecompressor}[kind]()


def decompressed(root: str, source: str, data: Any, stamp: Any, max_bytes: int | None, shown: str = "") -> str:
    """The path of the verified decompressed copy of ``source`` (its compressed bytes ``data``, a
    memory map or bytes; ``stamp`` its modification time or ETag) under ``root``, made if need be."""
    shown = shown or source
    root = os.path.abspath(root)
    base = os.path.join(root, _hash(f"{_uid()}\0{source}\0{len(data)}\0{stamp}")[:40] + ".tar")
    if _proves(base, source, len(data), stamp):
        return base
    os.makedirs(root, exist_ok=True)
    size, digest = write_fresh(root, base, lambda f: _write(f, _decoder(source), memoryview(data), max_bytes, shown))
    record = {"source": _hash(source), "source_size": len(data), "stamp": str(stamp), "size": size, "digest": digest}
    write_fresh(root, base + ".json", lambda f: f.write(json.dumps(record, sort_keys=True).encode()))
    return base


def write_fresh(root: str, path: str, fill: Any) -> Any:
    """``fill(f)`` writing a file of a fresh random name in ``root``, renamed to ``path`` when whole
    (removed if ``fill`` fails); what ``fill`` returns."""
    fd, tmp = tempfile.mkstemp(prefix=".lazyseq-", suffix=".part", dir=root)
    try:
        with os.fdopen(fd, "wb") as f:
            got = fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return got


def _write(f: Any, decoder: Any, data: memoryview, max_bytes: int | None, shown: str) -> tuple[int, str]:
    """Decompress ``data`` into ``f`` in a stream, at most CHUNK bytes out at a time (a bomb never
    fills memory): ``(bytes written, their BLAKE2b digest)``."""
    h, size = hashlib.blake2b(), 0
    gz = isinstance(decoder, type(zlib.decompressobj()))
    try:
        for a in range(0, len(data), CHUNK):
            piece: Any = data[a:a + CHUNK]
            while True:
                out = decoder.decompress(piece, CHUNK)
                piece = decoder.unconsumed_tail if gz else b""
                size += len(out)
                if max_bytes is not None and size > max_bytes:
                    raise StoreError(f"{shown} (a compressed tar shard) decompresses to more than cache_dir_bytes="
                                     f"{max_bytes}: give a larger cache_dir_bytes, or decompress it yourself")
                f.write(out)
                h.update(out)
                more = (piece or len(out) == CHUNK) if gz else not (decoder.needs_input or decoder.eof)
                if not more or decoder.eof:
                    break
        if not decoder.eof or decoder.unused_data:
            raise StoreError(f"{shown} (a compressed tar shard) is truncated, or has bytes after its compressed stream")
    except (zlib.error, EOFError, lzma.LZMAError, ValueError) as e:
        raise StoreError(f"{shown} (a compressed tar shard) cannot be decompressed: {type(e).__name__}: {e}") from None
    except OSError as e:  # bz2's errors; a StoreError passes
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"{shown} (a compressed tar shard) cannot be decompressed: {type(e).__name__}: {e}") from None
    return size, h.hexdigest()


def _proves(base: str, source: str, source_size: int, stamp: Any) -> bool:
    """Whether the copy at ``base`` is the verified decompression of this version of ``source``."""
    try:
        fd, st = open_data(base + ".json", "a decompressed shard's record", max_bytes=RECORD_BYTES)
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(RECORD_BYTES + 1))
        if st.st_uid != _uid() or not isinstance(record, dict) or record.get("source") != _hash(source) \
                or record.get("source_size") != source_size or record.get("stamp") != str(stamp):
            return False
        fd, st = open_data(base, "a decompressed shard")
        try:
            if st.st_uid != _uid() or st.st_size != record.get("size"):
                return False
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            digest = _verified.get(key)
            if digest is None:
                h, pos = hashlib.blake2b(), 0
                while chunk := os.pread(fd, CHUNK, pos):
                    h.update(chunk)
                    pos += len(chunk)
                digest = h.hexdigest()
                with _lock:
                    _verified[key] = digest
            return digest == record.get("digest")
        finally:
            os.close(fd)
    except (OSError, ValueError):  # missing, a link, garbled: not a copy of ours (StoreError is an OSError)
        return False
