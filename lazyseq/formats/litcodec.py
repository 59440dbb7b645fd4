"""litdata, the bytes: an ``index.json`` checked chunk by chunk (:func:`index_of`), its pytree
spec rebuilt from JSON (:func:`spec_of`, never torch's loader), a chunk's offset table
(:func:`offsets_of`) and an item's leaves decoded (:class:`Leaves`), as ``litdata.optimize``
writes them with its default ``PyTreeLoader``. Everything here is data from elsewhere: every size
is checked before it is used, and a ``pickle`` leaf is refused unless the caller allows it.

>>> spec = spec_of('[1, {"type": "builtins.tuple", "context": "null", "children_spec": '
...                '[{"type": null, "context": null, "children_spec": []}]}]', "index.json")
>>> leaves = Leaves(["int"], spec, "chunk-0-0.bin", allow_pickle=False)
>>> leaves.decode(b"\\x08\\x00\\x00\\x00" + (7).to_bytes(8, "little"), 0)
(7,)
"""

from __future__ import annotations

import io
import json
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StoreError
from .mdscodec import printable
from .sources import need

__all__ = ["Chunk", "Index", "index_of", "spec_of", "offsets_of", "frames_of", "Leaves", "INDEX_BYTES", "FRAMED"]

INDEX_BYTES = 64 * 2**20  # the most an index.json may hold
MAX_ITEMS = 2**32 - 2  # a chunk's offsets are u32
NUMPY = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
         "complex64", "complex128", "bool"]  # litdata's _NUMPY_DTYPES_MAPPING (object, bytes, str, void refused)
TORCH = {0: "float32", 1: "float32", 2: "float64", 3: "float64", 4: "complex64", 5: "complex64", 6: "complex128",
         7: "complex128", 8: "float16", 9: "float16", 10: "bfloat16", 11: "uint8", 12: "int8", 13: "int16",
         14: "int16", 15: "int32", 16: "int32", 17: "int64", 18: "int64", 19: "bool", 20: "uint16"}
PLAIN = ("int", "float", "bool", "str", "text", "bytes", "numpy", "tensor", "pil", "jpeg", "json", "pickle")
FRAMED = b"LDFZ01\0\0"  # a framed zstd chunk's magic (compression_level='batch')
PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, items, items a frame, frames
FRAME = struct.Struct("<IIQII")  # first item, items, compressed offset, compressed bytes, bytes
CONTAINERS = ("builtins.dict", "builtins.tuple", "builtins.list", "collections.OrderedDict")


@dataclass(frozen=True)
class Chunk:
    """One chunk of an index.json: its file, its bytes (as stored) and its items."""

    name: str
    nbytes: int
    items: int


@dataclass(frozen=True)
class Index:
    """An index.json, checked: its chunks, leaves' formats, spec and compression."""

    chunks: tuple[Chunk, ...]
    formats: tuple[str, ...]
    spec: Any
    compression: str | None  # 'zstd' (the whole chunk file), 'framed' (zstd frames of items in the file), None


def _bad(where: str, what: str) -> StoreError:
    return StoreError(f"{where} is not a valid litdata index: {what}")


def _name(x: Any, where: str, what: str) -> str:
    if not isinstance(x, str) or not x or x in (".", "..", "index.json") or len(x) > 255 \
            or any(c in "/\\" or not c.isprintable() for c in x):
        raise _bad(where, f"{what} {x!r} is not a file name in the dataset's folder")
    return x


def _count(x: Any, where: str, what: str, top: int) -> int:
    if type(x) is not int or not 0 <= x <= top:
        raise _bad(where, f"{what} is {x!r}, not a count from 0 to {top}")
    return x


def _format(f: Any, where: str, k: int) -> str:
    if not isinstance(f, str):
        raise _bad(where, f"data_format {k} is {f!r}, not a name")
    kind, _, arg = f.partition(":")
    if kind in ("no_header_numpy", "no_header_tensor"):
        top = len(NUMPY) if kind == "no_header_numpy" else len(TORCH)
        if not arg.isdigit() or int(arg) >= top:
            raise _bad(where, f"data_format {k} {f!r} names no dtype litdata's reader knows")
        return f
    if kind == "image" or (kind in PLAIN and not arg):
        return f
    raise _bad(where, f"data_format {k} {printable(ValueError(f))!r} is not one lazyseq.litdata decodes "
                      f"({', '.join(PLAIN)}, no_header_numpy, no_header_tensor, image)")


def index_of(data: bytes, where: str) -> Index:
    """The chunks and config of the index.json ``data`` (read from ``where``), checked."""
    if len(data) > INDEX_BYTES:
        raise _bad(where, f"it holds more than {INDEX_BYTES} bytes")
    try:
        obj = json.loads(bytes(data))
    except (ValueError, RecursionError) as e:
        raise _bad(where, f"not JSON ({type(e).__name__}: {printable(e)})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("chunks"), list) or not isinstance(obj.get("config"), dict):
        raise _bad(where, "not an object with a list of chunks and a config")
    config = obj["config"]
    loader = config.get("item_loader", "PyTreeLoader")
    if loader != "PyTreeLoader":
        raise _bad(where, f"item_loader {printable(ValueError(loader))!r} is not one lazyseq.litdata reads "
                          "(PyTreeLoader, litdata's default)")
    if config.get("encryption") is not None:
        raise _bad(where, "its chunks are encrypted (config.encryption): lazyseq.litdata reads no encrypted data")
    comp = config.get("compression")
    if comp is not None and (not isinstance(comp, str) or comp.split(":")[0] != "zstd"):
        raise _bad(where, f"compression {comp!r} is not one lazyseq.litdata decompresses (zstd)")
    level = config.get("compression_level")
    if level not in (None, "chunk", "batch") or config.get("ipc_compression") is not None or (level == "batch" and not comp):
        raise _bad(where, f"compression_level {level!r} / ipc_compression {config.get('ipc_compression')!r} (per-item or "
                          "Arrow compression) is not read by lazyseq.litdata: write with compression_level='chunk' or 'batch'")
    formats = config.get("data_format")
    if not isinstance(formats, list) or not formats:
        raise _bad(where, "config.data_format is not a list of leaves' formats")
    formats = [_format(f, where, k) for k, f in enumerate(formats)]
    spec = spec_of(config.get("data_spec"), where)
    if _leaves(spec) != len(formats):
        raise _bad(where, f"data_spec has {_leaves(spec)} leaves, data_format {len(formats)}")
    chunks = []
    for k, c in enumerate(obj["chunks"]):
        if not isinstance(c, dict):
            raise _bad(where, f"chunk {k} is not an object")
        items = _count(c.get("chunk_size"), where, f"chunk {k}: chunk_size", MAX_ITEMS)
        nbytes = _count(c.get("chunk_bytes"), where, f"chunk {k}: chunk_bytes", 2**62)
        if nbytes < (PREFIX.size + 4 * (items + 1) if level == "batch" else 4 * (items + 2)):
            raise _bad(where, f"chunk {k}: {nbytes} bytes cannot hold the offsets of {items} items")
        chunks.append(Chunk(_name(c.get("filename"), where, f"chunk {k}: filename"), nbytes, items))
    if len({c.name for c in chunks}) != len(chunks):
        raise _bad(where, "two chunks name one file")
    return Index(tuple(chunks), tuple(formats), spec, None if not comp else "framed" if level == "batch" else "zstd")


def spec_of(text: Any, where: str) -> Any:
    """litdata's ``data_spec`` (torch's ``treespec_dumps``: a JSON string ``[1, node]``) as nested
    tuples ``(type, keys, children)``; ``None`` a leaf. Only dicts, tuples and lists are rebuilt."""
    if text is None:
        return None  # (one leaf, the item itself)
    try:
        obj = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, list) or len(obj) != 2 or obj[0] != 1:
        raise _bad(where, "config.data_spec is not a version 1 pytree spec in JSON")
    return _node(obj[1], where, 0)


def _node(n: Any, where: str, depth: int) -> Any:
    if not isinstance(n, dict) or not isinstance(n.get("children_spec"), list) or depth > 64:
        raise _bad(where, "config.data_spec holds a node that is not {type, context, children_spec}")
    kind, children = n.get("type"), n["children_spec"]
    if kind is None:
        if children:
            raise _bad(where, "config.data_spec holds a leaf with children")
        return None
    if kind not in CONTAINERS:
        raise _bad(where, f"config.data_spec holds a {printable(ValueError(kind))!r}: lazyseq.litdata rebuilds "
                          f"{', '.join(CONTAINERS)}")
    keys = None
    if kind in ("builtins.dict", "collections.OrderedDict"):
        try:
            keys = json.loads(n.get("context"))
        except (TypeError, ValueError, RecursionError):
            keys = None
        if not isinstance(keys, list) or len(keys) != len(children) \
                or not all(isinstance(x, (str, int, float, bool)) or x is None for x in keys):
            raise _bad(where, "config.data_spec holds a dict whose context is not its list of keys")
    return (kind, keys, tuple(_node(c, where, depth + 1) for c in children))


def _leaves(spec: Any) -> int:
    return 1 if spec is None else sum(_leaves(c) for c in spec[2])


def _paths(spec: Any, at: str = "") -> list[str]:
    """Each leaf's place in the item, for messages: ``'image'``, ``'label.0'``..."""
    if spec is None:
        return [at or "item"]
    keys = spec[1] if spec[1] is not None else range(len(spec[2]))
    return [p for k, c in zip(keys, spec[2]) for p in _paths(c, f"{at}.{k}" if at else str(k))]


def _unflatten(spec: Any, values: Any) -> Any:
    if spec is None:
        return next(values)
    kind, keys, children = spec
    got = [_unflatten(c, values) for c in children]
    if keys is not None:
        return dict(zip(keys, got))
    return tuple(got) if kind == "builtins.tuple" else got


def offsets_of(head: bytes, chunk: Chunk, size: int, where: str) -> np.ndarray:
    """The ``items + 1`` offsets of a chunk from its first bytes, checked: the count index.json
    says, the first past the table, never decreasing, the last within the chunk's bytes."""
    n = chunk.items
    if len(head) < 4 * (n + 2):
        raise StoreError(f"{where}: {size} bytes cannot hold the offsets of its {n} items")
    table = np.frombuffer(head, "<u4", count=n + 2)
    if int(table[0]) != n:
        raise StoreError(f"{where} holds {int(table[0])} items, its index.json says {n}")
    offsets = table[1:].astype(np.int64)
    if offsets[0] != 4 * (n + 2) or offsets[-1] > size or (n and bool((np.diff(offsets) < 0).any())):
        raise StoreError(f"{where}: its item offsets do not run from its table's end ({4 * (n + 2)} bytes) within its "
                         f"{size} bytes without going back")
    return offsets


def frames_of(prefix: bytes, chunk: Chunk, size: int, where: str) -> int:
    """The frames a framed zstd chunk says it holds, from its first bytes ``prefix``, checked."""
    magic, version, _, n, k, frames = PREFIX.unpack_from(prefix)
    if magic != FRAMED or version != 1:
        raise StoreError(f"{where} is not a version 1 framed zstd chunk (its index.json says compression_level='batch')")
    if n != chunk.items or k < 1 or frames != -(-n // k) \
            or PREFIX.size + 4 * (n + 1) + FRAME.size * frames > size:
        raise StoreError(f"{where} holds {n} items in {frames} frames of {k}: its index.json says {chunk.items} items, "
                         f"its {size} bytes")
    return frames


def framed_table(table: bytes, chunk: Chunk, frames: int, size: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, frames)`` of a framed chunk from the bytes after its prefix, checked: the items'
    offsets (in the bytes decompressed) from 0, never going back; each frame's items following the
    last's, its compressed bytes within the file after the tables, its size its items'."""
    n = chunk.items
    offsets = np.frombuffer(table, "<u4", count=n + 1).astype(np.int64)
    rows = np.frombuffer(table, np.dtype([("first", "<u4"), ("n", "<u4"), ("at", "<u8"), ("zlen", "<u4"),
                                          ("len", "<u4")]), count=frames, offset=4 * (n + 1))
    cols = [rows[c].astype(np.int64) for c in ("first", "n", "at", "zlen", "len")]
    first, count, at, zlen, raw = cols
    start = PREFIX.size + 4 * (n + 1) + FRAME.size * frames
    ends = first + count
    if offsets[0] != 0 or bool((np.diff(offsets) < 0).any()) or first[0] != 0 or int(ends[-1]) != n \
            or bool((first[1:] != ends[:-1]).any()) or bool((count < 1).any()) or bool((zlen < 1).any()) \
            or bool((at < start).any()) or bool((at + zlen > size).any()) or bool((raw != offsets[ends] - offsets[first]).any()):
        raise StoreError(f"{where}: its item offsets or frame table do not hold (frames of its {n} items in order, "
                         f"within its {size} bytes, each the size of its items)")
    return offsets, np.stack(cols, axis=1)


class Leaves:
    """How a chunk's items decode: their leaves' formats and the spec that nests them."""

    def __init__(self, formats: Any, spec: Any, where: str, allow_pickle: bool):
        self.formats, self.spec, self.where = tuple(formats), spec, where
        self.paths = _paths(spec)
        for p, f in zip(self.paths, self.formats):
            if f == "pickle" and not allow_pickle:
                raise StoreError(f"{where}: field {p!r} is pickled (format 'pickle'): unpickling a stranger's bytes runs "
                                 "their code; give allow_pickle=True only for data you trust")
        self.head = 4 * len(self.formats)

    def decode(self, data: Any, j: int) -> Any:
        """Item ``j`` rebuilt from its bytes ``data``: a size per leaf, then the leaves."""
        view = memoryview(data)
        if len(view) < self.head:
            raise StoreError(f"{self.where}, item {j}: {len(view)} bytes cannot hold its {len(self.formats)} leaves' sizes")
        sizes = np.frombuffer(view[:self.head], "<u4").tolist()
        if self.head + sum(sizes) != len(view):
            raise StoreError(f"{self.where}, item {j}: its leaves' sizes ({sizes}) do not fill its {len(view) - self.head}"
                             " bytes")
        out, at = [], self.head
        for path, f, z in zip(self.paths, self.formats, sizes):
            try:
                out.append(_value(f, view[at:at + z]))
            except StoreError:
                raise
            except Exception as e:
                raise StoreError(f"{self.where}, item {j}, field {path!r} ({f}) cannot be decoded: "
                                 f"{type(e).__name__}: {printable(e)}") from None
            at += z
        return _unflatten(self.spec, iter(out))


def _value(f: str, b: memoryview) -> Any:
    kind, _, arg = f.partition(":")
    if kind == "int":
        return struct.unpack("<q", b)[0]
    if kind == "float":
        return struct.unpack("<d", b)[0]
    if kind == "bool":
        return bool(b[0])
    if kind in ("str", "text"):
        return str(b, "utf-8")
    if kind == "bytes":
        return bytes(b)
    if kind == "pickle":
        return pickle.loads(b)
    if kind == "json":
        return _json(b)
    if kind == "no_header_numpy":
        return np.frombuffer(b, NUMPY[int(arg)]).copy()
    if kind == "numpy":
        dtype, ndim = struct.unpack_from("<II", b)
        if dtype >= len(NUMPY) or len(b) < 8 + 4 * ndim:
            raise ValueError(f"dtype {dtype} or {ndim} dimensions do not fit")
        shape = struct.unpack_from(f"<{ndim}I", b, 8)
        return _shaped(np.dtype(NUMPY[dtype]), shape, b[8 + 4 * ndim:])
    if kind == "no_header_tensor":
        return _tensor(TORCH[int(arg)], None, b)
    if kind == "tensor":
        dtype, ndim = struct.unpack_from(">II", b)
        if dtype not in TORCH or len(b) < 8 + 4 * ndim:
            raise ValueError(f"dtype {dtype} or {ndim} dimensions do not fit")
        return _tensor(TORCH[dtype], struct.unpack_from(f">{ndim}I", b, 8), b[8 + 4 * ndim:])
    if kind == "pil":
        return _pil(b)
    return _image(b)  # jpeg, image:EXT


def _shaped(dtype: np.dtype, shape: tuple[int, ...], b: memoryview) -> np.ndarray:
    want = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if want != len(b):
        raise ValueError(f"shape {tuple(shape)} of {dtype} is {want} bytes, the value holds {len(b)}")
    return np.frombuffer(b, dtype).copy().reshape(shape)


def _tensor(dtype: str, shape: tuple[int, ...] | None, b: memoryview) -> Any:
    """A torch tensor when torch is importable (as litdata gives), else a numpy array."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None:
        if dtype == "bfloat16":
            raise ValueError("a bfloat16 tensor needs torch to be read")
        arr = np.dtype(dtype)
        return _shaped(arr, shape if shape is not None else (len(b) // arr.itemsize,), b)
    tdtype = getattr(torch, dtype)
    size = torch.empty((), dtype=tdtype).element_size()
    shape = shape if shape is not None else (len(b) // size,)
    want = int(np.prod(shape, dtype=object)) * size
    if want != len(b):
        raise ValueError(f"shape {tuple(shape)} of {dtype} is {want} bytes, the value holds {len(b)}")
    if not want:
        return torch.empty(shape, dtype=tdtype)
    return torch.frombuffer(bytearray(b), dtype=tdtype).reshape(shape)


def _json(b: memoryview) -> Any:
    raw = bytes(b)
    if raw and raw[0] <= 0x20:  # (litdata's compact binary tags; its JSON text starts with '[' or '{')
        raise ValueError("litdata's compact nested encoding is not read by lazyseq.litdata (only JSON text)")
    return json.loads(raw)


def _pil(b: memoryview) -> Any:
    image = need("PIL.Image", "litdata", "decoding a litdata 'pil' leaf")
    width, height, n = struct.unpack_from("<3I", b)
    raw = b[12 + n:]
    if n > 16 or width * height > 8 * len(raw):  # (no allocation the bytes do not back)
        raise ValueError(f"a {width}x{height} image (mode of {n} bytes) in {len(raw)} bytes")
    return image.frombytes(str(b[12:12 + n], "utf-8"), (width, height), bytes(raw))


def _image(b: memoryview) -> Any:
    """An encoded image decoded as litdata does: an RGB ``(3, H, W)`` uint8 tensor (numpy without
    torch), EXIF orientation applied."""
    image = need("PIL.Image", "litdata", "decoding a litdata 'jpeg' or 'image' leaf")
    from PIL import ImageOps

    img = image.open(io.BytesIO(bytes(b)))
    img.load()
    arr = np.ascontiguousarray(np.asarray(ImageOps.exif_transpose(img).convert("RGB")).transpose(2, 0, 1))
    try:
        import torch
    except ImportError:
        return arr
    return torch.from_numpy(arr)
