"""One shard of a store, read: its fields' readers over its bytes, a read-only memory map of its
file (:func:`open_local`) or a :class:`lazyseq.files.RemoteFile` (read by ranges,
:mod:`.remote`). Offsets and shapes are checked here, when the shard opens (the manifest's
values were checked before, :mod:`.checks`)."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StoreError
from ..files import RemoteFile
from ..files.local import map_data
from . import format as fmt
from .remote import RemoteTable, byte_requests, var_array

__all__ = ["Shard", "open_local"]

_Reader = tuple[Callable[[int], Any], Callable[[np.ndarray], list] | None, np.ndarray | None]


def _text(b: bytes) -> str:
    return str(b, "utf-8", "surrogatepass")


_DECODE: dict[str, Callable[[bytes], Any]] = {
    "str": _text, "np.str_": lambda b: np.str_(_text(b)), "bytes": bytes, "np.bytes_": np.bytes_,
    "bytearray": bytearray, "pickle": pickle.loads}  # pickle: only for a store loaded with allow_pickle=True


def _bytes_like(kind: str, mm: Any, offs: np.ndarray, base: int, where: str) -> _Reader:
    decode = _DECODE[kind]

    def one(j: int) -> Any:
        try:
            return decode(mm[base + int(offs[j]) : base + int(offs[j + 1])])
        except UnicodeDecodeError as e:
            raise StoreError(f"{where}, item {j} of the shard, is not valid UTF-8: {e.reason}") from None

    def pick(js: np.ndarray) -> list:
        a, b = (offs[js] + base).tolist(), (offs[js + 1] + base).tolist()
        try:
            return [decode(mm[x:y]) for x, y in zip(a, b)]
        except UnicodeDecodeError:
            return [one(j) for j in js.tolist()]  # names the item

    return one, pick, None


def _var_array(dt: np.dtype, mm: Any, base: int, offs: np.ndarray, shapes: np.ndarray, where: str) -> _Reader:
    def one(j: int) -> np.ndarray:
        try:
            return np.ndarray(shapes[j].tolist(), dt, buffer=mm, offset=base + int(offs[j]))
        except (ValueError, TypeError) as e:  # numpy's bounds checks: the tables changed in the file after the checks
            raise _changed(where, e) from None

    def pick(js: np.ndarray) -> list:
        o, s = (offs[js] + base).tolist(), shapes[js].tolist()
        try:
            return [np.ndarray(sh, dt, buffer=mm, offset=x) for x, sh in zip(o, s)]
        except (ValueError, TypeError) as e:
            raise _changed(where, e) from None

    return one, pick, None


def _changed(where: str, e: Exception) -> StoreError:
    return StoreError(f"{where}: an item's offset or shape points outside the file ({fmt.shown(e, 100)}): the shard "
                      "file was changed after it was opened and checked; a store's files must not change while it is read")


def _fixed(kind: str, arr: np.ndarray) -> _Reader:
    if kind in fmt.PYTHON:
        return arr.item, None, arr
    if kind == "array" and arr.ndim == 1:  # 0-d arrays: arr[j] would be a numpy scalar
        return (lambda j: arr[j, ...]), None, arr
    return arr.__getitem__, None, arr


class Shard:
    """The readers of one shard's fields over its bytes (a read-only memory map of its file, or a
    :class:`lazyseq.files.RemoteFile`): ``ones`` (item ``j``), ``picks`` (items at an array of
    indices, variable fields), ``tables`` (fixed fields' rows; None for variable fields), and for a
    remote shard ``reqs`` (the byte ranges items ``js`` of a field need): :mod:`.gather` reads
    through the last three."""

    __slots__ = ("ones", "picks", "tables", "reqs", "mm", "remote")

    def __init__(self, mm: Any, where: str, rec: dict, fields: list[dict], dtypes: list[np.dtype | None]):
        self.mm, self.remote = mm, isinstance(mm, RemoteFile)
        m = rec["stop"] - rec["start"]
        self.reqs: list = []
        readers = [self._reader(where, f, lay, dt, m) for f, lay, dt in zip(fields, rec["fields"], dtypes)]
        self.ones, self.picks, self.tables = [r[0] for r in readers], [r[1] for r in readers], [r[2] for r in readers]

    def table(self, part: list, dtype: Any, shape: tuple, whole: bool = True) -> Any:
        """The table at ``part``, whose size and bounds the manifest's checks (:mod:`.checks`) vouch
        for; in a remote shard read now if ``whole`` (offsets, shapes), else read row by row."""
        if not self.remote:
            return np.ndarray(shape, dtype, buffer=self.mm, offset=part[0])
        if not whole:
            return RemoteTable(self.mm, part[0], dtype, shape)
        nbytes = np.dtype(dtype).itemsize * math.prod(shape)
        return np.frombuffer(self.mm.read(part[0], part[0] + nbytes), dtype).reshape(shape)

    def _reader(self, path: str, field: dict, lay: dict, dt: np.dtype | None, m: int) -> _Reader:
        kind, mm, what = field["kind"], self.mm, f"{path}, field {fmt.shown(field['path'])}"
        if kind == "none":
            self.reqs.append(lambda js: [])
            return (lambda j: None), lambda js: [None] * len(js), None
        if kind in fmt.BYTES_LIKE or ("shape" not in lay and kind == "array"):
            offs = self.table(lay["offsets"], "<i8", (m + 1,))
            base, nbytes = lay["data"]
            shapes = self.table(lay["shapes"], "<i8", (m, field["ndim"])) if kind == "array" else None
            sizes = _check_var(offs, shapes, nbytes, dt, m, path, field)
            if kind == "array":
                if self.remote:
                    r = var_array(dt, mm, base, offs, shapes)
                    nb = sizes.astype(np.int64)
                    self.reqs.append(lambda js: byte_requests(mm, base, offs[js], offs[js] + nb[js]))
                    return r
                return _var_array(dt, mm, base, offs, shapes, what)
            if self.remote:
                self.reqs.append(lambda js: byte_requests(mm, base, offs[js], offs[js + 1]))
            return _bytes_like(kind, mm, offs, base, what)
        shape = (m, *lay.get("shape", ()))
        table = self.table(lay["data"], dt, shape, whole=False)
        if self.remote:
            self.reqs.append(table.requests)
        return _fixed(kind, table)


def _check_var(offs: np.ndarray, shapes: np.ndarray | None, nbytes: int, dt: np.dtype | None, m: int, path: str,
               field: dict) -> np.ndarray | None:
    """Check a variable field's tables, read from the shard: each item's bytes lie in the field's
    data part, after the previous item's (never another's bytes), and (arrays) each shape is one
    numpy makes, counting a 0 as 1 as numpy does (:data:`.format.ITEM_BYTES`). The items' sizes
    in bytes (arrays; as float64: no int64 overflow), or None."""
    if not m:
        return np.zeros(0) if shapes is not None else None
    bad = offs[0] < 0 or offs[m] > nbytes or (np.diff(offs) < 0).any()
    sizes = None
    if shapes is not None and not bad:
        sizes = np.prod(shapes.astype(np.float64), axis=1) * dt.itemsize
        bad = (shapes < 0).any() or (offs[:m] + sizes > offs[1:]).any()
        if not bad and (np.prod(np.maximum(shapes, 1).astype(np.float64), axis=1) * dt.itemsize > fmt.ITEM_BYTES).any():
            raise StoreError(f"{path} is corrupted: a shape in the shape table of field {fmt.shown(field['path'])} is too "
                             f"large for an array (counting a 0 dimension as 1, more than {fmt.ITEM_BYTES} bytes)")
    if bad:
        raise StoreError(f"{path} is corrupted: the offsets{' or shapes' * (shapes is not None)} of field "
                         f"{fmt.shown(field['path'])} point outside its data or make items overlap")
    return sizes


def open_local(path: str, rec: dict, what: str, root: str | None = None) -> Any:
    """A read-only memory map of the shard file at ``path``, opened once and checked by its descriptor
    (:mod:`lazyseq.files.local`: a regular file in ``root``, of the manifest's size)."""
    try:
        return map_data(path, what, root=root, size=rec["bytes"])
    except FileNotFoundError:
        raise StoreError(f"{path} ({what}) is missing: the store is incomplete") from None
