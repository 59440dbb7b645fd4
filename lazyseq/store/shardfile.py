"""One shard file of a store: its fields' segments written at 64-byte offsets, with their layouts
and the file's checksum (the format: :mod:`.format`, docs/store.md); whether an earlier run wrote a
shard whole. :mod:`.write` evaluates the items and calls these."""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..files.local import open_data
from ..helpers import align
from . import format as fmt

__all__ = ["write_shard", "file_crc", "finished"]


# -- one shard ---------------------------------------------------------------------------------------
Piece = bytes | np.ndarray  # a part of a segment: bytes, or a uint8 array


def _as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` in C order, as a uint8 array (a view when ``a`` is contiguous)."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8) if a.size and a.dtype.itemsize else np.empty(0, np.uint8)


def _array_field(vals: list, spec: dict) -> tuple[dict, list[list[Piece]]]:
    """Layout and segments of an array field: fixed-stride if every shape is the same, else flat
    data (each item at its dtype's alignment) with an offset (n + 1) and a shape (n, ndim) table.
    The items' own bytes are written (every dtype equals item 0's): no copy of the shard is made."""
    first = vals[0].shape
    if all(v.shape == first for v in vals):
        return {"shape": list(first)}, [[_as_bytes(v) for v in vals]]
    step = max(1, min(fmt.dtype_from_json(spec["dtype"]).alignment, 64))
    pos, offs, data = 0, [], []
    for v in vals:
        pad = -pos % step
        if pad:
            data.append(b"\0" * pad)
        pos += pad
        offs.append(pos)
        data.append(_as_bytes(v))
        pos += v.nbytes
    offs.append(pos)
    shapes = np.array([v.shape for v in vals], dtype="<i8").reshape(len(vals), spec["ndim"])
    return {}, [data, [_as_bytes(np.array(offs, dtype="<i8"))], [_as_bytes(shapes)]]


def _encode_bytes(v: Any, kind: str) -> bytes:
    if kind == "pickle":
        return fmt.pickle_dumps(v)
    return v.encode("utf-8", "surrogatepass") if kind in ("str", "np.str_") else v


def _field(vals: list, spec: dict, lo: int) -> tuple[dict, list[list[Piece]]]:
    """The layout (parts named in order: data, offsets, shapes) and segments of one field of a shard."""
    kind = spec["kind"]
    if kind == "array":
        return _array_field(vals, spec)
    if kind == "none":
        return {}, []
    if kind in fmt.BYTES_LIKE:
        parts = []
        for j, v in enumerate(vals):
            try:
                parts.append(_encode_bytes(v, kind))
            except Exception as e:
                raise fmt.SchemaError(f"item {lo + j}, field {spec['path']}: cannot pickle it: {e}") from e
        offs = np.zeros(len(parts) + 1, dtype="<i8")
        np.cumsum([len(p) for p in parts], out=offs[1:])
        return {}, [parts, [_as_bytes(offs)]]
    dt = fmt.PYTHON.get(kind) or fmt.dtype_from_json(spec["dtype"])
    try:
        col = np.array(vals, dtype=dt)
    except OverflowError:
        j = next(j for j, v in enumerate(vals) if not -(2**63) <= v < 2**63)
        raise fmt.SchemaError(f"item {lo + j}, field {spec['path']}: the int {vals[j]} does not fit in 64 bits; "
                              "store it as a str, or pass allow_pickle=True and an object of another type") from None
    return {}, [[_as_bytes(col.reshape(len(vals)))]]


@contextlib.contextmanager
def _removed_on_error(path: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise


def write_shard(path: str, fields: list[dict], cols: list[list], lo: int) -> tuple[int, int, list[dict]]:
    """Write the shard file, field by field (each column is let go once written), every segment
    at a 64-byte offset. Returns the file's size, its crc32 and the fields' layouts."""
    layouts, pos, crc = [], 0, 0
    tmp = f"{path}.{os.getpid()}.{id(cols)}.tmp"
    with open(tmp, "wb") as f, _removed_on_error(tmp):
        for k, spec in enumerate(fields):
            layout, segs = _field(cols[k], spec, lo)
            cols[k] = None
            for name, seg in zip(("data", "offsets", "shapes"), segs):
                pad = b"\0" * (align(pos) - pos)
                f.write(pad)
                crc, pos = zlib.crc32(pad, crc), pos + len(pad)
                start = pos
                for piece in seg:
                    f.write(piece)
                    crc, pos = zlib.crc32(piece, crc), pos + len(piece)
                layout[name] = [start, pos - start]
            layouts.append(layout)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return pos, crc, layouts


def file_crc(fd: int) -> int:
    """The CRC-32 of the file open at ``fd``, read from its start (``fd`` stays open)."""
    crc, pos = 0, 0
    while chunk := os.pread(fd, 1 << 22, pos):
        crc, pos = zlib.crc32(chunk, crc), pos + len(chunk)
    return crc


def finished(root: str, k: int, r: range) -> dict | None:
    """Shard ``k``'s record if the shard was written whole by an earlier run (size and checksum)."""
    try:
        rec = fmt.read_json(os.path.join(root, fmt.PROGRESS, fmt.record_name(k)), "record")
        if (rec["shard"], rec["start"], rec["stop"]) != (k, r.start, r.stop):
            return None
        fd, st = open_data(os.path.join(root, rec["file"]), f"shard {k}", root=root)
        try:
            if st.st_size != rec["bytes"] or file_crc(fd) != rec["crc32"]:
                return None
        finally:
            os.close(fd)
    except (OSError, KeyError, TypeError):
        return None
    return rec
