"""Thrift's compact protocol, read and written: the encoding of Parquet's footer, page headers and
page indexes. Reading bounds every size by the bytes there (a length, a list size, the nesting
depth), so a stranger's bytes cost at most their own size; values stay as ``(type, value)`` pairs
(structs as ``{field id: (type, value)}``), so a struct is written back as it was read, less what
the caller dropped.

>>> w = Writer(); w.struct({1: (I32, 7), 3: (BINARY, b"x"), 4: (LIST, (I64, [1, 2]))})
>>> Reader(bytes(w.out)).struct(0)
{1: (5, 7), 3: (8, b'x'), 4: (9, (6, [1, 2]))}
"""

from __future__ import annotations

from typing import Any

__all__ = ["Reader", "Writer", "ThriftError", "get_int", "get_struct", "get_structs",
           "STOP", "TRUE", "FALSE", "BYTE", "I16", "I32", "I64", "DOUBLE", "BINARY", "LIST", "SET", "MAP", "STRUCT"]

MAX_DEPTH = 64  # nested structs and lists

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)


class ThriftError(Exception):
    """The bytes are not the struct they should be (the message says what)."""


class Reader:
    """The compact protocol over ``buf``: values as ``(type, value)``; structs as ``{id: (type, value)}``."""

    def __init__(self, buf: bytes):
        self.b, self.i = memoryview(buf), 0

    def byte(self) -> int:
        if self.i >= len(self.b):
            raise ThriftError("it ends inside a value")
        self.i += 1
        return self.b[self.i - 1]

    def varint(self) -> int:
        b, i, end = self.b, self.i, len(self.b)  # bytes read here, not by byte(): most of a footer is varints
        out = shift = 0
        while True:
            if i >= end:
                raise ThriftError("it ends inside a value")
            x = b[i]
            i += 1
            out |= (x & 0x7F) << shift
            if x < 0x80:
                self.i = i
                return out
            shift += 7
            if shift > 70:
                raise ThriftError("an integer runs past 10 bytes")

    def zigzag(self) -> int:
        z = self.varint()
        return (z >> 1) ^ -(z & 1)

    def value(self, t: int, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ThriftError(f"it nests deeper than {MAX_DEPTH} levels")
        if t in (TRUE, FALSE):
            return t == TRUE
        if t == BYTE:
            return self.byte()
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            self.i += 8
            if self.i > len(self.b):
                raise ThriftError("it ends inside a value")
            return bytes(self.b[self.i - 8 : self.i])
        if t == BINARY:
            n = self.varint()
            if n > len(self.b) - self.i:
                raise ThriftError(f"a string of {n} bytes runs past its end")
            self.i += n
            return bytes(self.b[self.i - n : self.i])
        if t in (LIST, SET):
            return self.list(depth)
        if t == STRUCT:
            return self.struct(depth + 1)
        raise ThriftError(f"it holds a value of unknown type {t}" if t != MAP else "it holds a map, which no footer field is")

    def list(self, depth: int) -> tuple[int, list]:
        h = self.byte()
        n, et = h >> 4, h & 0xF
        if n == 15:
            n = self.varint()
        if n > len(self.b) - self.i:  # every element takes a byte at least
            raise ThriftError(f"a list of {n} elements runs past its end")
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


class Writer:
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


def get_int(d: dict, fid: int, what: str) -> int:
    got = d.get(fid)
    if got is None or got[0] not in (I16, I32, I64):
        raise ThriftError(f"{what} is missing")
    return got[1]


def get_struct(d: dict, fid: int, what: str) -> dict:
    got = d.get(fid)
    if got is None or got[0] != STRUCT:
        raise ThriftError(f"{what} is missing")
    return got[1]


def get_structs(d: dict, fid: int, what: str) -> list[dict]:
    got = d.get(fid)
    if got is None:
        return []
    if got[0] != LIST or got[1][0] != STRUCT:
        raise ThriftError(f"{what} is not a list of structs")
    return got[1][1]
