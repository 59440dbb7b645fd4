"""MosaicML Streaming (MDS) datasets read at random, where they lie: :func:`mds`.

``len`` comes from ``index.json`` alone (read once, bounded, checked: :mod:`.mdscodec`). A shard is
opened at its first read, its offset table read once and checked; item ``i`` is then one read of
its sample's bytes: a slice of the local shard's memory map, one ranged GET of a URL (a batch: its
ranges at once). A compressed shard is decompressed once, into ``cache_dir`` (a verified copy, as
:mod:`.untar` keeps one) or, without it, in memory.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..errors import StoreError
from ..files import is_url, local_path
from ..files.remote import check_settings
from .mdscodec import INDEX_BYTES, Columns, offsets_of, printable, shards_of
from .sources import Opened, PartsEndToEnd, Remotes, need, open_source, shown

__all__ = ["mds", "MDS"]

MEMORY_BYTES = 2**30  # the most a compressed shard decompresses to in memory (without cache_dir)
CHUNK = 4 * 2**20


def _join(root: str, *names: str) -> str:
    if is_url(root):
        return "/".join([root.rstrip("/"), *names])
    return os.path.join(root, *names)


class Reader:
    """A shard as this process opened it: its (uncompressed) bytes, offsets and columns."""

    __slots__ = ("opened", "offsets", "columns")

    def __init__(self, opened: Opened, offsets: np.ndarray, columns: Columns):
        self.opened, self.offsets, self.columns = opened, offsets, columns

    def samples(self, js: Sequence[int]) -> list[dict]:
        ranges = [(int(self.offsets[j]), int(self.offsets[j + 1])) for j in js]
        wanted = [r for r in ranges if r[0] < r[1]]  # (an empty sample, which offsets may say, is read as no bytes)
        got = iter([self.opened.read(*wanted[0])] if len(wanted) == 1 else self.opened.read_many(wanted) if wanted else [])
        blobs = [next(got) if a < b else b"" for a, b in ranges]
        return [self.columns.decode(b, j) for j, b in zip(js, blobs)]


class MDS(PartsEndToEnd, View):
    """The samples of a MosaicML MDS dataset: see :func:`mds`."""

    checks_keys = False

    def __init__(self, path: Any, split: str | None, allow_pickle: bool, settings: dict, strict: bool):
        check_settings(timeout=settings["timeout"])
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"lazyseq.mds: give a dataset's folder or URL, got a {type(path).__name__}")
        path = os.fspath(path)
        root = path if is_url(path) else local_path(path)
        if split is not None and (not isinstance(split, str) or not split or ".." in split.split("/")
                                  or split.startswith("/") or "\\" in split):
            raise ValueError(f"lazyseq.mds: split={split!r} is not a subfolder's name")
        self.root = _join(root, *split.split("/")) if split else root
        self.settings, self.strict, self.allow_pickle = dict(settings), bool(strict), bool(allow_pickle)
        self._remotes = Remotes(self.settings)
        where = shown(_join(self.root, "index.json"))
        try:
            opened = open_source(_join(self.root, "index.json"), "an MDS index", self._remotes)
        except FileNotFoundError:
            raise FileNotFoundError(f"lazyseq.mds: {where} is missing: give the folder holding an MDS dataset's "
                                    "index.json (and split= its subfolder)") from None
        if opened.size > INDEX_BYTES:
            raise StoreError(f"{where} is not a valid MDS index: it holds {opened.size} bytes, more than {INDEX_BYTES}")
        self.index_stamp = (opened.size, opened.stamp)
        self.shards = shards_of(opened.read(0, opened.size), where)
        for k, s in enumerate(self.shards):  # (pickled columns refused now, not at the first read)
            Columns(s.names, s.encodings, s.sizes, f"{shown(self._file(k))} (shard {k})", self.allow_pickle)
        self._known: list[tuple[int, Any] | None] = [None] * len(self.shards)
        self._setup()

    def _file(self, k: int) -> str:
        s = self.shards[k]
        return _join(self.root, s.zip if s.compression else s.raw)  # type: ignore[arg-type]

    def _setup(self) -> None:
        self._setup_parts(s.samples for s in self.shards)

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in ("root", "settings", "strict", "allow_pickle", "index_stamp", "shards",
                                              "_known")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._remotes = Remotes(self.settings)
        self._setup()

    # -- shards ----------------------------------------------------------------------------------
    def _stat(self, k: int) -> Opened:
        """Shard ``k``'s file (compressed, if it is) opened, checked against index.json and what this view saw."""
        s, path = self.shards[k], self._file(k)
        where = f"{shown(path)} (shard {k} of {shown(self.root)})"
        try:
            opened = open_source(path, "an MDS shard", self._remotes)
        except FileNotFoundError:
            raise StoreError(f"{where} is missing") from None
        want = s.zip_bytes if s.compression else s.raw_bytes
        if opened.size != want:
            raise StoreError(f"{where} holds {opened.size} bytes, its index.json says {want}")
        known = self._known[k]
        if known is not None and self.strict and opened.stamp != known[1]:
            raise StoreError(f"{where} changed since this view was made (another modification time or ETag): make the "
                             "view again over the dataset as it is now")
        self._known[k] = (opened.size, opened.stamp)
        return opened

    def _open(self, k: int) -> Reader:
        s = self.shards[k]
        opened = self._stat(k)
        where = f"{shown(self._file(k))} (shard {k} of {shown(self.root)})"
        if s.compression:
            opened = self._decompressed(k, opened, where)
            where = f"{shown(_join(self.root, s.raw))}, decompressed from {where}"
        offsets = offsets_of(opened.read(0, 4 * (s.samples + 2)), s, opened.size, where)
        return Reader(opened, offsets, Columns(s.names, s.encodings, s.sizes, where, self.allow_pickle))

    def _decompressed(self, k: int, opened: Opened, where: str) -> Opened:
        s = self.shards[k]
        if opened.remote is not None and opened.size > MEMORY_BYTES:  # (with cache_dir and an ETag, it is a local copy)
            raise StoreError(f"{where} is {opened.size} bytes, more than lazyseq.mds fetches into memory ({MEMORY_BYTES}): "
                             "give cache_dir= (over a server that gives ETags) to keep it on local disk")
        data = opened.buffer if opened.remote is None else opened.read(0, opened.size)
        cache_dir = self.settings.get("cache_dir")
        if cache_dir is None:
            if s.raw_bytes > MEMORY_BYTES:
                raise StoreError(f"{where} decompresses to {s.raw_bytes} bytes, more than lazyseq.mds keeps in memory "
                                 f"({MEMORY_BYTES}): give cache_dir= to decompress it once there")
            out = io.BytesIO()
            _decompress(s.compression, data, out, s.raw_bytes, where)  # type: ignore[arg-type]
            return Opened(opened.path, s.raw_bytes, opened.stamp, buffer=out.getvalue())
        source = self._file(k) if is_url(self._file(k)) else os.path.abspath(self._file(k))
        copy = _cached(os.fspath(cache_dir), source, s.compression, s.raw_bytes, data, opened.stamp, where)  # type: ignore[arg-type]
        return open_source(copy, "a decompressed MDS shard", self._remotes)

    # -- shape and reads -------------------------------------------------------------------------
    def _len(self) -> int:
        return self._starts[-1]

    @property
    def shard_samples(self) -> tuple[int, ...]:
        """The samples of each shard, in order (from index.json)."""
        return tuple(s.samples for s in self.shards)

    @property
    def cuts(self) -> list[int]:
        """The index where each shard after the first starts: ``block_shuffle(v, v.cuts, seed)``."""
        return self._starts[1:-1]

    def _part(self, k: int, js: Sequence[int]) -> list[dict]:
        return self._reader(k).samples(js)

    # -- description -----------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The shards' names, sizes and samples (from index.json); with ``strict`` the modification
        times (URLs: ETags) of index.json and of every shard's file too. Reads no sample."""
        stamps = None
        if self.strict:
            stamps = [str(self.index_stamp[1])] + [str(self._stat(k).stamp) for k in range(len(self.shards))]
        return {"files": [s.zip if s.compression else s.raw for s in self.shards], "bytes": [s.raw_bytes for s in self.shards],
                "samples": [s.samples for s in self.shards], "index_bytes": self.index_stamp[0], "stamps": stamps}

    def nbytes(self) -> int:
        """The size of the shards uncompressed, in bytes (from index.json)."""
        return sum(s.raw_bytes for s in self.shards)

    def describe(self) -> str:
        return f"mds({len(self.shards)} shard{'s' * (len(self.shards) != 1)})"


def _pieces(kind: str, data: memoryview, where: str) -> Iterator[bytes]:
    """The decompression of ``data``, at most CHUNK bytes at a time (a bomb never fills memory)."""
    if kind == "zstd":
        zstd = need("zstandard", "mds", f"decompressing {where}")
        with zstd.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
            while out := r.read(CHUNK):
                yield out
        return
    gz = kind == "gz"
    dec: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else bz2.BZ2Decompressor()
    for a in range(0, len(data), CHUNK):
        piece: Any = data[a:a + CHUNK]
        while True:
            out = dec.decompress(piece, CHUNK)
            yield out
            piece = dec.unconsumed_tail if gz else b""
            if dec.eof or (not piece and len(out) < CHUNK if gz else dec.needs_input):
                break
        if dec.eof:
            return
    if not dec.eof:
        raise EOFError("the compressed stream is truncated")


def _decompress(kind: str, data: Any, out: Any, size: int, where: str) -> str:
    """Decompress ``data`` into ``out``, refusing more (or fewer) bytes than ``size``: the BLAKE2b
    digest of what was written."""
    h, got = hashlib.blake2b(), 0
    try:
        for piece in _pieces(kind, memoryview(data), where):
            got += len(piece)
            if got > size:
                break
            out.write(piece)
            h.update(piece)
    except ImportError:
        raise
    except Exception as e:
        raise StoreError(f"{where} cannot be decompressed ({kind}): {type(e).__name__}: {printable(e)}") from None
    if got != size:
        raise StoreError(f"{where} decompresses to {'more than ' * (got > size)}{min(got, size)} bytes, its index.json "
                         f"says {size}")
    return h.hexdigest()


def _cached(root: str, source: str, kind: str, size: int, data: Any, stamp: Any, where: str, tag: str = "mds") -> str:
    """The verified decompressed copy (``size`` bytes) of the file
    ``source`` under ``root``, made if need be: a record beside it (written last) holds its digest,
    checked once per process as :mod:`.untar` does. ``tag``: the format, in the copy's name."""
    from .untar import _hash, _proves, _uid, write_fresh

    root = os.path.abspath(root)
    base = os.path.join(root, _hash(f"{_uid()}\0{tag}\0{source}\0{len(data)}\0{stamp}")[:40] + f".{tag}")
    if _proves(base, source, len(data), stamp):
        return base
    os.makedirs(root, exist_ok=True)
    digest = write_fresh(root, base, lambda f: _decompress(kind, data, f, size, where))
    record = {"source": _hash(source), "source_size": len(data), "stamp": str(stamp), "size": size, "digest": digest}
    write_fresh(root, base + ".json", lambda f: f.write(json.dumps(record, sort_keys=True).encode()))
    return base


def mds(path_or_url: Any, *, split: str | None = None, allow_pickle: bool = False, storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None, timeout: float = 30.0, strict: bool = True) -> MDS:
    """The samples of a MosaicML Streaming (MDS) dataset as a random-access view of dicts
    ``{column: value}``, the values ``streaming.LocalDataset(local=path)[i]`` gives (numpy scalars
    and arrays, ``str``, ``bytes``, JSON values, PIL images opened from their bytes).

    ``path_or_url``: the folder (or URL: ``s3://``, ``https://``...) holding ``index.json``;
    ``split``: its subfolder to read. ``len`` and ``.cuts`` (each shard's start:
    ``block_shuffle(v, v.cuts, seed)`` shuffles reading a few shards at a time) come from
    ``index.json`` alone, checked. A shard's offset table is read once, at its first read; item
    ``i`` then costs one read of its sample's bytes (a batch: one request per shard). A compressed
    shard (``zstd``: ``pip install 'lazyseq[mds]'``, ``gz``, ``bz2``) is decompressed once, into
    ``cache_dir`` (a verified copy) or in memory (at most 1 GiB a shard). A ``pkl`` column is
    refused unless ``allow_pickle=True``: unpickling runs the file's code. ``storage_options``,
    ``timeout``, ``strict``: as :func:`~lazyseq.parquet`'s. The view pickles without data.

    >>> import os, struct, json, tempfile
    >>> root = tempfile.mkdtemp()
    >>> rows = [b"\\x03\\x00\\x00\\x00abc", b"\\x02\\x00\\x00\\x00de"]  # one str column: a size, then the bytes
    >>> head = 4 * (len(rows) + 2)
    >>> ends = [head + sum(map(len, rows[:k])) for k in range(len(rows) + 1)]
    >>> shard = struct.pack(f"<{len(ends) + 1}I", len(rows), *ends) + b"".join(rows)
    >>> _ = open(os.path.join(root, "shard.00000.mds"), "wb").write(shard)
    >>> info = {"column_encodings": ["str"], "column_names": ["text"], "column_sizes": [None], "compression": None,
    ...         "format": "mds", "hashes": [], "raw_data": {"basename": "shard.00000.mds", "bytes": len(shard),
    ...         "hashes": {}}, "samples": 2, "size_limit": 1 << 26, "version": 2, "zip_data": None}
    >>> _ = open(os.path.join(root, "index.json"), "w").write(json.dumps({"version": 2, "shards": [info]}))
    >>> v = mds(root)
    >>> v, v[1], v.cuts
    (mds(1 shard)  len=2, {'text': 'de'}, [])
    """
    settings = {"storage_options": storage_options, "cache_dir": cache_dir, "timeout": timeout}
    return MDS(path_or_url, split, allow_pickle, settings, strict)
