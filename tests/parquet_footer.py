"""A Parquet file's footer rewritten by the tests that play a stranger: one integer field of the
footer's Thrift (compact protocol) set to another value, the rest kept byte for byte.

``patch(data, path, value)``: ``path`` names the field from ``FileMetaData`` down, as field ids
and list positions: ``[3]`` is the file's ``num_rows``, ``[4, 0, 3]`` row group 0's ``num_rows``,
``[4, 0, 1, 2, 3, 9]`` the ``data_page_offset`` of row group 0's column 2 (RowGroup.columns = 1,
ColumnChunk.meta_data = 3, ColumnMetaData.data_page_offset = 9, total_compressed_size = 7).
"""

import struct

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12


def _varint(b, i):
    out = shift = 0
    while True:
        x = b[i]
        i += 1
        out |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return out, i


def _zigzag(n):
    return (n << 1) ^ (n >> 63)


def _encode_varint(n):
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _skip(b, i, t):
    """The index past a value of compact type ``t`` starting at ``i``."""
    if t in (TRUE, FALSE):
        return i
    if t == BYTE:
        return i + 1
    if t in (I16, I32, I64):
        return _varint(b, i)[1]
    if t == DOUBLE:
        return i + 8
    if t == BINARY:
        n, i = _varint(b, i)
        return i + n
    if t in (LIST, SET):
        n, et, i = _list_header(b, i)
        for _ in range(n):
            i = i + 1 if et in (TRUE, FALSE) else _skip(b, i, et)
        return i
    if t == MAP:
        n, i = _varint(b, i)
        if n:
            kv, i = b[i], i + 1
            for _ in range(n):
                i = _skip(b, _skip(b, i, kv >> 4), kv & 0xF)
        return i
    if t == STRUCT:
        for _fid, _ft, _start, end in _fields(b, i):
            i = end
        return i + 1  # the stop byte
    raise ValueError(f"unknown compact type {t}")


def _list_header(b, i):
    h = b[i]
    i += 1
    n = h >> 4
    if n == 15:
        n, i = _varint(b, i)
    return n, h & 0xF, i


def _fields(b, i):
    """``(field id, type, value start, value end)`` of each field of the struct starting at ``i``."""
    fid = 0
    out = []
    while b[i] != STOP:
        h = b[i]
        i += 1
        delta, t = h >> 4, h & 0xF
        if delta:
            fid += delta
        else:
            z, i = _varint(b, i)
            fid = (z >> 1) ^ -(z & 1)
        end = _skip(b, i, t)
        out.append((fid, t, i, end))
        i = end
    return out


def _locate(b, i, path):
    """``(start, end, type)`` of the value at ``path`` inside the struct starting at ``i``."""
    fid = path[0]
    for f, t, start, end in _fields(b, i):
        if f == fid:
            if len(path) == 1:
                return start, end, t
            if t == LIST:
                _n, et, j = _list_header(b, start)
                for _ in range(path[1]):
                    j = _skip(b, j, et)
                return _locate(b, j, path[2:]) if len(path) > 2 else (j, _skip(b, j, et), et)
            return _locate(b, start, path[1:])
    raise KeyError(f"no field {fid}")


def footer(data):
    n = struct.unpack("<I", data[-8:-4])[0]
    return len(data) - 8 - n, data[len(data) - 8 - n : -8]


def read(data, path):
    """The integer at ``path`` of the footer of ``data``."""
    _, meta = footer(data)
    start, _, _ = _locate(meta, 0, path)
    z, _ = _varint(meta, start)
    return (z >> 1) ^ -(z & 1)


def patch(data, path, value):
    """``data`` (a Parquet file's bytes) with the integer at ``path`` of its footer set to ``value``."""
    at, meta = footer(data)
    start, end, t = _locate(meta, 0, path)
    assert t in (I16, I32, I64), f"the field at {path} is not an integer (type {t})"
    meta = meta[:start] + _encode_varint(_zigzag(value)) + meta[end:]
    return data[:at] + meta + struct.pack("<I", len(meta)) + b"PAR1"
