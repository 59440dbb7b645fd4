"""A Parquet footer read by lazyseq before pyarrow sees it: parsed (Thrift compact protocol, every
size bounded by the bytes there), checked, and handed on without the parts that only speed up
other readers' queries.

Why: pyarrow trusts parts of a footer that a stranger writes. A mutated ``size_statistics`` (a
level histogram of the wrong length) makes pyarrow 26 *abort the process* when the column's
metadata is touched (an uncaught C++ exception: no Python error to catch). Statistics, size
statistics, encoding stats, bloom filters, page-index references and geospatial statistics are
dropped from the footer pyarrow gets (lazyseq reads rows by position: it needs none of them);
an encrypted file or a column chunk kept in another file (``file_path``) is refused.

:func:`parse` returns the cleaned footer as a small Parquet file (magic, footer, length, magic)
for ``pyarrow.parquet.read_metadata``, and the facts lazyseq checks itself: the rows of each row
group, and per column chunk its byte offsets, sizes and value count.

>>> import io, pyarrow as pa, pyarrow.parquet as pq
>>> b = io.BytesIO(); pq.write_table(pa.table({"x": [1, 2, 3]}), b, row_group_size=2)
>>> data = b.getvalue()
>>> rows, chunks, small = parse(data[-8 - int.from_bytes(data[-8:-4], "little") : -8], "x.parquet")
>>> rows, chunks[1][0][0], pq.read_metadata(pa.BufferReader(small)).num_rows
([2, 1], 'x', 3)
"""

from __future__ import annotations

import struct
from typing import Any

from ..errors import StoreError

__all__ = ["parse", "Chunk", "MAX_FOOTER"]

MAX_FOOTER = 256 * 2**20  # bytes: a footer larger than this is refused before it is read
MAX_DEPTH = 64  # nested structs and lists

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

# field ids dropped from the footer pyarrow reads (see the module's docstring)
DROP_FILE = {7, 8, 9}  # column_orders; encryption_algorithm, footer_signing_key_metadata (refused first)
DROP_CHUNK = {4, 5, 6, 7, 8, 9}  # page-index offsets and lengths, crypto metadata, encrypted metadata
DROP_META = {12, 13, 14, 15, 16, 17}  # statistics, encoding stats, bloom filter, size statistics, geo statistics


class _Bad(Exception):
    pass


class _Reader:
    """The compact protocol over ``buf``: values as ``(type, value)``; structs as ``{id: (type, value)}``."""

    def __init__(self, buf: bytes):
        self.b, self.i = memoryview(buf), 0

    def byte(self) -> int:
        if self.i >= len(self.b):
            raise _Bad("it ends inside a value")
        self.i += 1
        return self.b[self.i - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            x = self.byte()
            out |= (x & 0x7F) << shift
            if x < 0x80:
                return out
            shift += 7
            if shift > 70:
                raise _Bad("an integer runs past 10 bytes")

    def zigzag(self) -> int:
        z = self.varint()
        return (z >> 1) ^ -(z & 1)

    def value(self, t: int, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _Bad(f"it nests deeper than {MAX_DEPTH} levels")
        if t in (TRUE, FALSE):
            return t == TRUE
        if t == BYTE:
            return self.byte()
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            self.i += 8
            if self.i > len(self.b):
                raise _Bad("it ends inside a value")
            return bytes(self.b[self.i - 8 : self.i])
        if t == BINARY:
            n = self.varint()
            if n > len(self.b) - self.i:
                raise _Bad(f"a string of {n} bytes runs past its end")
            self.i += n
            return bytes(self.b[self.i - n : self.i])
        if t in (LIST, SET):
            return self.list(depth)
        if t == STRUCT:
            return self.struct(depth + 1)
        raise _Bad(f"it holds a value of unknown type {t}" if t != MAP else "it holds a map, which no footer field is")

    def list(self, depth: int) -> tuple[int, list]:
        h = self.byte()
        n, et = h >> 4, h & 0xF
        if n == 15:
            n = self.varint()
        if n > len(self.b) - self.i:  # every element takes a byte at least
            raise _Bad(f"a list of {n} elements runs past its end")
        if et in (TRUE, FALSE):
            return et, [self.byte() == 1 for _ in range(n)]
        return et, [self.value(et, depth + 1) for _ in range(n)]

    def struct(self, depth: int) -> dict:
        out: dict[int, tuple[int, Any]] = {}
        fid = 0
        while True:
            h = self.byte()
            if h == STOP:
                return out
            delta, t = h >> 4, h & 0xF
            fid = fid + delta if delta else self.zigzag()
            out[fid] = (t, self.value(t, depth))


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while n >= 0x80:
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7
        self.out.append(n)

    def value(self, t: int, v: Any) -> None:
        if t == BYTE:
            self.out.append(v)
        elif t in (I16, I32, I64):
            self.varint((v << 1) ^ (v >> 63))
        elif t == DOUBLE:
            self.out += v
        elif t == BINARY:
            self.varint(len(v))
            self.out += v
        elif t in (LIST, SET):
            et, items = v
            if len(items) < 15:
                self.out.append(len(items) << 4 | et)
            else:
                self.out.append(0xF0 | et)
                self.varint(len(items))
            for x in items:
                if et in (TRUE, FALSE):
                    self.out.append(1 if x else 2)
                else:
                    self.value(et, x)
        elif t == STRUCT:
            self.struct(v)

    def struct(self, d: dict) -> None:
        last = 0
        for fid in sorted(d):
            t, v = d[fid]
            wire = (TRUE if v else FALSE) if t in (TRUE, FALSE) else t
            if 0 < fid - last <= 15:
                self.out.append((fid - last) << 4 | wire)
            else:
                self.out.append(wire)
                self.varint((fid << 1) ^ (fid >> 63))
            if t not in (TRUE, FALSE):
                self.value(t, v)
            last = fid
        self.out.append(STOP)


class Chunk(tuple):
    """What lazyseq checks of one column chunk: ``(path, data_page_offset, dictionary_page_offset or
    None, total_compressed_size, num_values)``."""


def _int(d: dict, fid: int, what: str) -> int:
    got = d.get(fid)
    if got is None or got[0] not in (I16, I32, I64):
        raise _Bad(f"{what} is missing")
    return got[1]


def _struct(d: dict, fid: int, what: str) -> dict:
    got = d.get(fid)
    if got is None or got[0] != STRUCT:
        raise _Bad(f"{what} is missing")
    return got[1]


def _structs(d: dict, fid: int, what: str) -> list[dict]:
    got = d.get(fid)
    if got is None:
        return []
    if got[0] != LIST or got[1][0] != STRUCT:
        raise _Bad(f"{what} is not a list of structs")
    return got[1][1]


def _chunk(c: dict, r: int, k: int) -> list:
    where = f"row group {r}, column chunk {k}"
    if 1 in c:
        raise _Bad(f"{where} lies in another file ({c[1][1][:100]!r}): a file's column chunks must be its own")
    if 8 in c or 9 in c:
        raise _Bad(f"{where} is encrypted: encrypted Parquet files are not read")
    for fid in DROP_CHUNK:
        c.pop(fid, None)
    m = _struct(c, 3, f"{where}'s metadata")
    for fid in DROP_META:
        m.pop(fid, None)
    got = m.get(3)
    if got is None or got[0] != LIST or got[1][0] != BINARY:
        raise _Bad(f"{where}'s column path is missing")
    path = got[1][1]
    dictionary = _int(m, 11, "") if 11 in m else None
    return [".".join(p.decode("utf-8", "replace") for p in path), _int(m, 9, f"{where}'s data page offset"), dictionary,
            _int(m, 7, f"{where}'s compressed size"), _int(m, 5, f"{where}'s value count")]


def parse(footer: bytes, shown: str) -> tuple[list[int], list[list[Chunk]], bytes]:
    """``(rows of each row group, each row group's column chunks, the cleaned footer as a small
    Parquet file for pyarrow.parquet.read_metadata)`` of the footer bytes ``footer`` of the file
    named ``shown``; a :class:`StoreError` names what is wrong."""
    try:
        r = _Reader(footer)
        fm = r.struct(0)
        if 8 in fm or 9 in fm:
            raise _Bad("the file is encrypted: encrypted Parquet files are not read")
        for fid in DROP_FILE:
            fm.pop(fid, None)
        num_rows = _int(fm, 3, "its row count")
        rows, chunks = [], []
        for k, g in enumerate(_structs(fm, 4, "its row groups")):
            rows.append(_int(g, 3, f"row group {k}'s row count"))
            chunks.append([Chunk(_chunk(c, k, j)) for j, c in enumerate(_structs(g, 1, f"row group {k}'s columns"))])
        if any(n < 0 for n in rows) or num_rows != sum(rows):
            raise _Bad(f"its footer says {num_rows} rows, its {len(rows)} row groups hold "
                       f"{sum(rows) if min(rows, default=0) >= 0 else 'a negative number of'}")
        w = _Writer()
        w.struct(fm)
    except _Bad as e:
        raise StoreError(f"{shown} (a Parquet file) is corrupted: {e}") from None
    except (TypeError, ValueError, IndexError, AttributeError, KeyError):  # a value of another type than its field's
        raise StoreError(f"{shown} (a Parquet file) is corrupted: its footer holds values of the wrong types") from None
    except RecursionError:
        raise StoreError(f"{shown} (a Parquet file) is corrupted: its footer nests too deep") from None
    body = bytes(w.out)
    return rows, chunks, b"PAR1" + body + struct.pack("<I", len(body)) + b"PAR1"
