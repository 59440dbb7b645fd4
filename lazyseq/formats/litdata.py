"""litdata datasets (the output of ``litdata.optimize``) read at random, where they lie: :func:`litdata`.

``len`` comes from ``index.json`` alone (read once, bounded, checked: :mod:`.litcodec`). A chunk is
opened at its first read, its offset table read once and checked; item ``i`` is then one read of
its bytes: a slice of the local chunk's memory map, one ranged GET of a URL (a batch: its ranges
at once). A zstd chunk is decompressed once, into ``cache_dir`` (a verified copy, as :mod:`.mds`
keeps one) or, without it, in memory. The litdata package is not needed.
"""

from __future__ import annotations

import bisect
import io
import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..errors import StoreError
from ..files import is_url, local_path
from ..files.remote import check_settings
from .litcodec import FRAME, INDEX_BYTES, PREFIX, Leaves, framed_table, frames_of, index_of, offsets_of
from .mds import MEMORY_BYTES, _cached, _decompress, _join
from .mdscodec import printable
from .sources import Opened, PartsEndToEnd, Remotes, need, open_source, shown

__all__ = ["litdata", "LitData"]

ARROW = b"LDARW01\0"  # the magic ending a chunk with an Arrow IPC footer of its rows


class Reader:
    """A chunk as this process opened it: its (uncompressed) bytes and offsets."""

    __slots__ = ("opened", "offsets", "leaves")

    def __init__(self, opened: Opened, offsets: np.ndarray, leaves: Leaves):
        self.opened, self.offsets, self.leaves = opened, offsets, leaves

    def items(self, js: Sequence[int]) -> list:
        ranges = [(int(self.offsets[j]), int(self.offsets[j + 1])) for j in js]
        wanted = [r for r in ranges if r[0] < r[1]]
        got = iter([self.opened.read(*wanted[0])] if len(wanted) == 1 else self.opened.read_many(wanted) if wanted else [])
        blobs = [next(got) if a < b else b"" for a, b in ranges]
        return [self.leaves.decode(b, j) for j, b in zip(js, blobs)]


class FramedReader:
    """A framed zstd chunk as this process opened it: an item is its frame's bytes (one read),
    decompressed; a batch reads its frames' at once; the last frame decompressed is kept (a
    sequential read decompresses each once)."""

    __slots__ = ("opened", "offsets", "frames", "leaves", "where", "last")

    def __init__(self, opened: Opened, offsets: np.ndarray, frames: np.ndarray, leaves: Leaves, where: str):
        self.opened, self.offsets, self.frames, self.leaves, self.where = opened, offsets, frames, leaves, where
        self.last: tuple[int, bytes] | None = None

    def _frames(self, fs: list[int]) -> dict[int, bytes]:
        """Frames ``fs`` decompressed: their compressed bytes read at once (over a URL: one request)."""
        last, got = self.last, {}
        if last is not None and last[0] in fs:
            got[last[0]] = last[1]
        wanted = [f for f in fs if f not in got]
        if wanted:
            need("zstandard", "litdata", f"decompressing {self.where}")
            rows = [tuple(int(x) for x in self.frames[f]) for f in wanted]
            for f, (_, _, _, _, raw) in zip(wanted, rows):
                if raw > MEMORY_BYTES:
                    raise StoreError(f"{self.where}, frame {f}: {raw} bytes decompressed, more than lazyseq.litdata keeps "
                                     f"in memory ({MEMORY_BYTES})")
            ranges = [(at, at + zlen) for _, _, at, zlen, _ in rows]
            blobs = [self.opened.read(*ranges[0])] if len(ranges) == 1 else self.opened.read_many(ranges)
            for f, row, blob in zip(wanted, rows, blobs):
                out = io.BytesIO()
                _decompress("zstd", blob, out, row[4], f"{self.where}, frame {f}")
                got[f] = out.getvalue()
        self.last = (fs[-1], got[fs[-1]])
        return got

    def items(self, js: Sequence[int]) -> list:
        if not js:
            return []
        fs = [int(np.searchsorted(self.frames[:, 0], j, side="right")) - 1 for j in js]
        frames = self._frames(list(dict.fromkeys(fs)))
        out = []
        for j, f in zip(js, fs):
            base = int(self.offsets[int(self.frames[f, 0])])
            data = memoryview(frames[f])[int(self.offsets[j]) - base:int(self.offsets[j + 1]) - base]
            out.append(self.leaves.decode(data, j))
        return out


class ArrowReader:
    """A chunk whose items litdata kept only as a trailing Arrow IPC file (rows of strings or nested
    lists): the file read once, checked (its place, its rows the chunk's items); an item its row."""

    __slots__ = ("batches", "starts")

    def __init__(self, opened: Opened, items: int, after: int, where: str):
        pa = need("pyarrow", "litdata", f"reading {where} (its items are an Arrow IPC table)")
        size = int(np.frombuffer(opened.read(opened.size - 12, opened.size - 8), "<u4")[0])
        start = opened.size - 12 - size
        if not size or start < after:
            raise StoreError(f"{where}: its Arrow footer of {size} bytes does not fit after its offset table")
        try:
            f = pa.ipc.open_file(pa.py_buffer(opened.read(start, start + size)))
            self.batches = [f.get_batch(b) for b in range(f.num_record_batches)]
        except pa.ArrowException as e:
            raise StoreError(f"{where}: its Arrow footer is not an Arrow IPC file: {printable(e)}") from None
        self.starts = list(itertools.accumulate((b.num_rows for b in self.batches), initial=0))
        if self.starts[-1] != items:
            raise StoreError(f"{where}: its Arrow footer holds {self.starts[-1]} rows, its index.json says {items} items")

    def items(self, js: Sequence[int]) -> list:
        out = []
        for j in js:
            b = bisect.bisect_right(self.starts, j) - 1
            out.append(self.batches[b].slice(j - self.starts[b], 1).to_pylist()[0])
        return out


class LitData(PartsEndToEnd, View):
    """The items of a litdata dataset: see :func:`litdata`."""

    checks_keys = False

    def __init__(self, path: Any, allow_pickle: bool, settings: dict):
        check_settings(timeout=settings["timeout"])
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"lazyseq.litdata: give a dataset's folder or URL, got a {type(path).__name__}")
        path = os.fspath(path)
        self.root = path if is_url(path) else local_path(path)
        self.settings, self.allow_pickle = dict(settings), bool(allow_pickle)
        self._remotes = Remotes(self.settings)
        where = shown(_join(self.root, "index.json"))
        try:
            opened = open_source(_join(self.root, "index.json"), "a litdata index", self._remotes)
        except FileNotFoundError:
            raise FileNotFoundError(f"lazyseq.litdata: {where} is missing: give the folder litdata.optimize wrote "
                                    "(its index.json and chunk-*.bin)") from None
        if opened.size > INDEX_BYTES:
            raise StoreError(f"{where} is not a valid litdata index: it holds {opened.size} bytes, more than {INDEX_BYTES}")
        self.index_stamp = (opened.size, opened.stamp)
        self.index = index_of(opened.read(0, opened.size), where)
        Leaves(self.index.formats, self.index.spec, where, self.allow_pickle)  # (pickled leaves refused now)
        self._known: list[Any] = [None] * len(self.index.chunks)
        self._setup()

    def _file(self, k: int) -> str:
        return _join(self.root, self.index.chunks[k].name)

    def _setup(self) -> None:
        self._setup_parts(c.items for c in self.index.chunks)

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in ("root", "settings", "allow_pickle", "index_stamp", "index", "_known")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._remotes = Remotes(self.settings)
        self._setup()

    # -- chunks ----------------------------------------------------------------------------------
    def _stat(self, k: int) -> Opened:
        """Chunk ``k``'s file opened, checked against index.json and what this view saw."""
        c, path = self.index.chunks[k], self._file(k)
        where = f"{shown(path)} (chunk {k} of {shown(self.root)})"
        try:
            opened = open_source(path, "a litdata chunk", self._remotes)
        except FileNotFoundError:
            raise StoreError(f"{where} is missing") from None
        if self.index.compression != "zstd" and opened.size != c.nbytes:  # (zstd: chunk_bytes is the size decompressed)
            raise StoreError(f"{where} holds {opened.size} bytes, its index.json says {c.nbytes}")
        known = self._known[k]
        if known is not None and opened.stamp != known[1]:
            raise StoreError(f"{where} changed since this view was made (another modification time or ETag): make the "
                             "view again over the dataset as it is now")
        self._known[k] = (opened.size, opened.stamp)
        return opened

    def _open(self, k: int) -> Reader | FramedReader | ArrowReader:
        c = self.index.chunks[k]
        opened = self._stat(k)
        where = f"{shown(self._file(k))} (chunk {k} of {shown(self.root)})"
        leaves = Leaves(self.index.formats, self.index.spec, where, self.allow_pickle)
        if self.index.compression == "framed":
            frames = frames_of(opened.read(0, PREFIX.size), c, opened.size, where)
            table = opened.read(PREFIX.size, PREFIX.size + 4 * (c.items + 1) + FRAME.size * frames)
            return FramedReader(opened, *framed_table(table, c, frames, opened.size, where), leaves, where)
        if self.index.compression:
            opened = self._decompressed(k, opened, where)
            where = f"{where}, decompressed"
        offsets = offsets_of(opened.read(0, min(opened.size, 4 * (c.items + 2))), c, opened.size, where)
        if c.items and offsets[-1] == offsets[0] and opened.size >= 12 and opened.read(opened.size - 8, opened.size) == ARROW:
            return ArrowReader(opened, c.items, int(offsets[-1]), where)
        return Reader(opened, offsets, Leaves(self.index.formats, self.index.spec, where, self.allow_pickle))

    def _decompressed(self, k: int, opened: Opened, where: str) -> Opened:
        need("zstandard", "litdata", f"decompressing {where}")
        if opened.remote is not None and opened.size > MEMORY_BYTES:
            raise StoreError(f"{where} is {opened.size} bytes, more than lazyseq.litdata fetches into memory "
                             f"({MEMORY_BYTES}): give cache_dir= (over a server that gives ETags) to keep it on local disk")
        data = opened.buffer if opened.remote is None else opened.read(0, opened.size)
        cache_dir, size = self.settings.get("cache_dir"), self.index.chunks[k].nbytes
        if cache_dir is None:
            if size > MEMORY_BYTES:
                raise StoreError(f"{where} decompresses to {size} bytes, more than lazyseq.litdata keeps in memory "
                                 f"({MEMORY_BYTES}): give cache_dir= to decompress it once there")
            out = io.BytesIO()
            _decompress("zstd", data, out, size, where)
            return Opened(opened.path, size, opened.stamp, buffer=out.getvalue())
        source = self._file(k) if is_url(self._file(k)) else os.path.abspath(self._file(k))
        copy = _cached(os.fspath(cache_dir), source, "zstd", size, data, opened.stamp, where, tag="litdata")
        return open_source(copy, "a decompressed litdata chunk", self._remotes)

    # -- shape and reads -------------------------------------------------------------------------
    def _len(self) -> int:
        return self._starts[-1]

    @property
    def chunk_items(self) -> tuple[int, ...]:
        """The items of each chunk, in order (from index.json)."""
        return tuple(c.items for c in self.index.chunks)

    @property
    def cuts(self) -> list[int]:
        """The index where each chunk after the first starts: ``block_shuffle(v, v.cuts, seed)``."""
        return self._starts[1:-1]

    def _part(self, k: int, js: Sequence[int]) -> list:
        return self._reader(k).items(js)

    # -- description -----------------------------------------------------------------------------
    def fingerprint_identity(self) -> dict:
        """The chunks' names, sizes and items (from index.json) and the modification times (URLs:
        ETags) of index.json and of every chunk. Reads no item."""
        stamps = [str(self.index_stamp[1])] + [str(self._stat(k).stamp) for k in range(len(self.index.chunks))]
        return {"files": [c.name for c in self.index.chunks], "bytes": [c.nbytes for c in self.index.chunks],
                "items": list(self.chunk_items), "formats": list(self.index.formats),
                "index_bytes": self.index_stamp[0], "stamps": stamps}

    def nbytes(self) -> int:
        """The size of the chunks as stored, in bytes (from index.json)."""
        return sum(c.nbytes for c in self.index.chunks)

    def describe(self) -> str:
        n = len(self.index.chunks)
        return f"litdata({n} chunk{'s' * (n != 1)})"


def litdata(path_or_url: Any, *, allow_pickle: bool = False, storage_options: dict | None = None,
            cache_dir: str | os.PathLike | None = None, timeout: float = 30.0) -> LitData:
    """The items of a litdata dataset (what ``litdata.optimize`` writes: ``index.json`` and
    ``chunk-*.bin``, plain or ``compression="zstd"``) as a random-access view: item ``i`` is what
    ``litdata.StreamingDataset(dir)[i]`` gives (ints, floats, str, bytes (litdata: a memoryview),
    numpy arrays, torch tensors (numpy arrays without torch), PIL images, jpeg as ``(3, H, W)``
    uint8, in the dicts, tuples and lists they were written in; rows litdata kept only as an Arrow
    footer as their ``to_pylist`` rows). The litdata package is not needed.

    ``len`` and ``.cuts`` (each chunk's start: ``block_shuffle(v, v.cuts, seed)`` shuffles reading
    a few chunks at a time) come from ``index.json`` alone, checked. A chunk's offset table is read
    once, at its first read; item ``i`` then costs one read of its bytes (a batch: one request per
    chunk). zstd (``pip install 'lazyseq[litdata]'``): a framed chunk (litdata's default) is read a
    frame at a time; a whole-chunk stream is decompressed once, into ``cache_dir`` (a verified copy)
    or in memory (at most 1 GiB a chunk). A ``pickle`` leaf is refused unless ``allow_pickle=True``;
    encrypted data, other item loaders (tokens, parquet) and per-item compression are refused.
    ``storage_options``, ``timeout``: as :func:`~lazyseq.parquet`'s.

    >>> import os, struct, json, tempfile
    >>> root = tempfile.mkdtemp()
    >>> items = [struct.pack("<II", 8, 2) + struct.pack("<q", 7) + b"hi", struct.pack("<II", 8, 0) + struct.pack("<q", 8)]
    >>> ends = [4 * (len(items) + 2) + sum(map(len, items[:k])) for k in range(len(items) + 1)]
    >>> chunk = struct.pack(f"<{len(ends) + 1}I", len(items), *ends) + b"".join(items)
    >>> _ = open(os.path.join(root, "chunk-0-0.bin"), "wb").write(chunk)
    >>> leaf = {"type": None, "context": None, "children_spec": []}
    >>> spec = [1, {"type": "builtins.dict", "context": json.dumps(["y", "text"]), "children_spec": [leaf, leaf]}]
    >>> config = {"data_format": ["int", "str"], "data_spec": json.dumps(spec), "compression": None,
    ...           "item_loader": "PyTreeLoader", "encryption": None}
    >>> index = {"chunks": [{"chunk_bytes": len(chunk), "chunk_size": 2, "filename": "chunk-0-0.bin"}], "config": config}
    >>> _ = open(os.path.join(root, "index.json"), "w").write(json.dumps(index))
    >>> v = litdata(root)
    >>> v, v[0], v[-1], v.cuts
    (litdata(1 chunk)  len=2, {'y': 7, 'text': 'hi'}, {'y': 8, 'text': ''}, [])
    """
    settings = {"storage_options": storage_options, "cache_dir": cache_dir, "timeout": timeout}
    return LitData(path_or_url, allow_pickle, settings)
