"""MosaicML MDS, the bytes: an ``index.json`` checked shard by shard (:func:`shards_of`), a shard's
offset table (:func:`offsets_of`) and a sample's columns decoded (:class:`Columns`), as
``streaming.base.format.mds`` writes and reads them. Everything here is data from elsewhere: every
size is checked before it is used, and a ``pkl`` column is refused unless the caller allows it.

>>> cols = Columns(["x", "s"], ["int32", "str"], [4, None], "a.mds", allow_pickle=False)
>>> cols.decode(b"\\x07\\x00\\x00\\x00" + b"\\x02\\x00\\x00\\x00" + b"hello !", 0)  # s's size, x, s
{'x': np.int32(2), 's': 'hello !'}
"""

from __future__ import annotations

import io
import json
import math
import pickle
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

from ..errors import StoreError
from .sources import need

__all__ = ["Shard", "shards_of", "offsets_of", "Columns", "printable", "COMPRESSIONS", "INDEX_BYTES"]

INDEX_BYTES = 64 * 2**20  # the most an index.json may hold
MAX_SAMPLES = 2**32 - 2  # a shard's offsets are u32: no more samples fit in one
SCALARS = {n: np.dtype(n) for n in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                                    "float16", "float32", "float64")}
VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
TEXT = ("str", "bytes", "json", "str_int", "str_float", "str_decimal")
IMAGES = ("jpeg", "png", "pil")
LISTS = {"list[pil]": "pil", "list[jpeg]": "jpeg", "list[png]": "png", "jpeg_array": "jpeg", "jpegarray": "jpeg"}
COMPRESSIONS = ("gz", "bz2", "zstd")  # what lazyseq.mds decompresses (mosaic's br and snappy are refused)


@dataclass(frozen=True)
class Shard:
    """One shard of an index.json, checked: its raw file, and the compressed file kept instead."""

    raw: str  # basename of the uncompressed shard
    raw_bytes: int
    samples: int
    names: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]
    compression: str | None  # 'zstd', 'gz', 'bz2' (a level dropped), None
    zip: str | None
    zip_bytes: int | None


def printable(e: BaseException) -> str:
    """An error's text for a message: at most 200 characters, none a control character."""
    return "".join(c if c.isprintable() else "?" for c in str(e)[:200])


def _bad(where: str, what: str) -> StoreError:
    return StoreError(f"{where} is not a valid MDS index: {what}")


def _name(x: Any, where: str, what: str) -> str:
    """A shard's basename, a plain name in its folder (never ``..``, a path, or empty)."""
    if not isinstance(x, str) or not x or x in (".", "..") or len(x) > 255 \
            or any(c in "/\\" or not c.isprintable() for c in x):  # (no path, no control character for messages)
        raise _bad(where, f"{what} {x!r} is not a file name in the dataset's folder")
    return x


def _count(x: Any, where: str, what: str, top: int) -> int:
    if type(x) is not int or not 0 <= x <= top:
        raise _bad(where, f"{what} is {x!r}, not a count from 0 to {top}")
    return x


def static_size(encoding: str) -> int | None:
    """The bytes every value of ``encoding`` takes (None: each sample says)."""
    if encoding in SCALARS:
        return SCALARS[encoding].itemsize
    if encoding == "int":
        return 8
    if encoding.startswith("ndarray:"):
        dtype, shape = _ndarray_header(encoding)
        return None if dtype is None or shape is None else math.prod(shape) * np.dtype(dtype).itemsize
    return None


def _ndarray_header(encoding: str) -> tuple[str | None, tuple[int, ...] | None]:
    args = encoding.split(":")[1:]
    if len(args) > 2 or not args or args[0] not in VALUE_DTYPES.values():
        raise ValueError(f"encoding {encoding!r}: an ndarray's is 'ndarray', 'ndarray:DTYPE' or 'ndarray:DTYPE:D1,D2,...'")
    shape = None
    if len(args) == 2:
        dims = args[1].split(",")
        if not 1 <= len(dims) <= 63 or not all(d.isdigit() and 1 <= int(d) < 2**32 for d in dims):
            raise ValueError(f"encoding {encoding!r}: the shape is 1 to 63 dimensions of 1 or more")
        shape = tuple(int(d) for d in dims)
    return args[0], shape


def _known(encoding: Any) -> bool:
    if not isinstance(encoding, str):
        return False
    if encoding in SCALARS or encoding in TEXT or encoding in IMAGES or encoding in LISTS or encoding in ("int", "pkl",
                                                                                                         "ndarray"):
        return True
    if encoding.startswith("ndarray:"):
        try:
            _ndarray_header(encoding)
        except ValueError:
            return False
        return True
    return False


def _shard(s: Any, k: int, where: str) -> Shard:
    at = f"shard {k}"
    if not isinstance(s, dict) or s.get("format") != "mds" or s.get("version") != 2:
        raise _bad(where, f"{at} is not a version 2 'mds' shard")
    names, encodings, sizes = s.get("column_names"), s.get("column_encodings"), s.get("column_sizes")
    if not (isinstance(names, list) and isinstance(encodings, list) and isinstance(sizes, list)) \
            or not len(names) == len(encodings) == len(sizes) or not names:
        raise _bad(where, f"{at}: column_names, column_encodings and column_sizes are not lists of one length")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise _bad(where, f"{at}: column_names are not distinct strings")
    for n, e, z in zip(names, encodings, sizes):
        if not _known(e):
            raise _bad(where, f"{at}, column {n!r}: encoding {e!r} is not one lazyseq.mds decodes")
        if z != static_size(e) or (z is not None and type(z) is not int):
            raise _bad(where, f"{at}, column {n!r}: column size {z!r} is not {static_size(e)!r}, its encoding's ({e!r})")
    raw = s.get("raw_data")
    if not isinstance(raw, dict):
        raise _bad(where, f"{at}: raw_data is not an object")
    samples = _count(s.get("samples"), where, f"{at}: samples", MAX_SAMPLES)
    raw_bytes = _count(raw.get("bytes"), where, f"{at}: raw_data bytes", 2**32 - 1)
    if raw_bytes < 4 * (samples + 2):
        raise _bad(where, f"{at}: {raw_bytes} bytes cannot hold the offsets of {samples} samples")
    comp, zipped, zip_name, zip_bytes = s.get("compression"), s.get("zip_data"), None, None
    if comp is not None:
        algo = comp.split(":", 1)[0] if isinstance(comp, str) else comp
        if algo not in COMPRESSIONS or not isinstance(zipped, dict):
            raise _bad(where, f"{at}: compression {comp!r} is not one lazyseq.mds decompresses ({', '.join(COMPRESSIONS)}) "
                              "with its zip_data")
        comp = algo
        zip_name = _name(zipped.get("basename"), where, f"{at}: zip_data basename")
        zip_bytes = _count(zipped.get("bytes"), where, f"{at}: zip_data bytes", 2**62)
    return Shard(_name(raw.get("basename"), where, f"{at}: raw_data basename"), raw_bytes, samples, tuple(names),
                 tuple(encodings), tuple(sizes), comp, zip_name, zip_bytes)


def shards_of(data: bytes, where: str) -> list[Shard]:
    """The shards of the index.json ``data`` (read from ``where``), checked."""
    if len(data) > INDEX_BYTES:
        raise _bad(where, f"it holds more than {INDEX_BYTES} bytes")
    try:
        obj = json.loads(bytes(data))
    except (ValueError, RecursionError) as e:
        raise _bad(where, f"not JSON ({type(e).__name__}: {printable(e)})") from None
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(obj.get("shards"), list):
        raise _bad(where, "not a version 2 index with a list of shards")
    shards = [_shard(s, k, where) for k, s in enumerate(obj["shards"])]
    files = [s.raw for s in shards] + [s.zip for s in shards if s.zip is not None]
    if len(set(files)) != len(files) or "index.json" in files:
        raise _bad(where, "two shards name one file")
    return shards


def offsets_of(head: bytes, shard: Shard, size: int, where: str) -> np.ndarray:
    """The ``samples + 1`` offsets of a shard from its first bytes ``head``, checked: the count the
    index says, the first past the table (mosaic writes its columns' JSON between), never decreasing, the last the file's end."""
    n = shard.samples
    table = np.frombuffer(head, "<u4", count=n + 2)
    if int(table[0]) != n:
        raise StoreError(f"{where} holds {int(table[0])} samples, its index.json says {n}")
    offsets = table[1:].astype(np.int64)
    if offsets[0] < 4 * (n + 2) or offsets[-1] != size or (n and bool((np.diff(offsets) < 0).any())):
        raise StoreError(f"{where}: its sample offsets do not run from past its table ({4 * (n + 2)} bytes) to the end "
                         f"of its {size} bytes without going back")
    return offsets


class Columns:
    """How a shard's samples decode: its columns' names, encodings and sizes."""

    def __init__(self, names: Any, encodings: Any, sizes: Any, where: str, allow_pickle: bool):
        self.names, self.encodings, self.sizes, self.where = tuple(names), tuple(encodings), tuple(sizes), where
        for n, e in zip(names, encodings):
            if e == "pkl" and not allow_pickle:
                raise ValueError(f"{where}: column {n!r} is pickled (encoding 'pkl'): unpickling a stranger's bytes runs "
                                 "their code; give allow_pickle=True only for data you trust")
        self.arrays = {e: _ndarray_header(e) if e.startswith("ndarray:") else (None, None) for e in encodings
                       if e.startswith("ndarray")}
        self.dynamic = [z is None for z in sizes]

    def decode(self, data: Any, j: int) -> dict:
        """Sample ``j``'s dict from its bytes ``data``."""
        view = memoryview(data)
        ndyn = sum(self.dynamic)
        if len(view) < 4 * ndyn:
            raise StoreError(f"{self.where}, sample {j}: {len(view)} bytes cannot hold its {ndyn} column sizes")
        said = iter(np.frombuffer(view[:4 * ndyn], "<u4").tolist()) if ndyn else iter(())
        sizes = [next(said) if z is None else z for z in self.sizes]
        if 4 * ndyn + sum(sizes) != len(view):
            raise StoreError(f"{self.where}, sample {j}: its columns' sizes ({sizes}) do not fill its {len(view) - 4 * ndyn}"
                             " bytes")
        out, at = {}, 4 * ndyn
        for name, enc, z in zip(self.names, self.encodings, sizes):
            try:
                out[name] = self._value(enc, view[at:at + z])
            except StoreError:
                raise
            except Exception as e:
                raise StoreError(f"{self.where}, sample {j}, column {name!r} ({enc}) cannot be decoded: "
                                 f"{type(e).__name__}: {printable(e)}") from None
            at += z
        return out

    def _value(self, enc: str, b: memoryview) -> Any:
        if enc in SCALARS:
            return np.frombuffer(b, SCALARS[enc], count=1)[0]
        if enc == "int":
            return int(np.frombuffer(b, "<i8", count=1)[0])
        if enc == "bytes":
            return bytes(b)
        if enc == "pkl":
            return pickle.loads(b)
        if enc.startswith("ndarray"):
            return self._array(enc, b)
        if enc in IMAGES:
            return _image(enc, b)
        if enc in LISTS:
            return [_image(LISTS[enc], x) for x in _parts(b, 4 * enc.startswith("list"), enc)]
        text = str(b, "utf-8")
        return {"str": str, "json": json.loads, "str_int": int, "str_float": float, "str_decimal": _decimal}[enc](text)

    def _array(self, enc: str, b: memoryview) -> np.ndarray:
        dtype, shape = self.arrays[enc]
        at = 0
        if dtype is None:
            dtype = VALUE_DTYPES.get(b[0]) if len(b) else None
            if dtype is None:
                raise ValueError(f"dtype code {b[0] if len(b) else None} is not one of MDS's")
            at = 1
        if shape is None:
            if len(b) <= at:
                raise ValueError("no shape")
            ndim, code = b[at] >> 2, b[at] & 3
            width = 2 ** code
            if ndim == 0 or len(b) < at + 1 + ndim * width:
                raise ValueError(f"{ndim} dimensions do not fit in {len(b)} bytes")
            shape = tuple(np.frombuffer(b[at + 1:at + 1 + ndim * width], SHAPE_DTYPES[code]).tolist())
            at += 1 + ndim * width
        want = math.prod(shape) * np.dtype(dtype).itemsize
        if len(b) - at != want:
            raise ValueError(f"shape {shape} of {dtype} is {want} bytes, the value holds {len(b) - at}")
        return np.frombuffer(bytes(b[at:]), dtype).reshape(shape)


def _parts(b: memoryview, skip: int, enc: str) -> list[memoryview]:
    """The elements of a list of images (``skip``: the bytes before its count): a ``u32`` count,
    the ``u32`` size of each, then their bytes, which they must fill."""
    if len(b) < skip + 4:
        raise ValueError(f"{len(b)} bytes hold no count")
    n = int(np.frombuffer(b[skip:skip + 4], "<u4")[0])
    at = skip + 4 + 4 * n
    if len(b) < at or (n == 0 and not enc.startswith("list")):
        raise ValueError(f"{n} elements' sizes do not fit in {len(b)} bytes")
    sizes = np.frombuffer(b[skip + 4:at], "<u4").tolist()
    if at + sum(sizes) != len(b):
        raise ValueError(f"{n} elements of {sum(sizes)} bytes do not fill the {len(b) - at} after their sizes")
    out = []
    for z in sizes:
        out.append(b[at:at + z])
        at += z
    return out


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{text[:40]!r} is not a decimal") from None


def _image(enc: str, b: memoryview) -> Any:
    image = need("PIL.Image", "mds", f"decoding an MDS {enc!r} column")
    if enc != "pil":
        return image.open(io.BytesIO(bytes(b)))  # as mosaic: opened, decoded when its pixels are asked for
    width, height, n = np.frombuffer(b[:12], "<u4", count=3).tolist()
    raw = b[12 + n:]
    if n > 16 or width * height > 8 * len(raw):  # (every mode takes a bit a pixel at least: no allocation the bytes do not back)
        raise ValueError(f"a {width}x{height} image (mode of {n} bytes) in {len(raw)} bytes")
    return image.frombytes(str(b[12:12 + n], "utf-8"), (width, height), bytes(raw))
