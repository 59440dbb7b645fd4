"""Arrow IPC files as :func:`~lazyseq.formats.arrow.arrow` reads them: each opened through
:mod:`.sources` and indexed once per process (:func:`index_file`: its schema, its record batches'
rows, and the batches or where they lie).

Local files (and a URL's ``cache_dir`` copy) are memory mapped: a batch is a zero-copy view of the
map (a stream-format file is read through once, keeping those views). A file-format file over a
URL reads its footer and each record batch's metadata message (its row count) as ranges, parsed
here (pyarrow gives neither a batch's offset nor its rows without reading its body); a
stream-format file over a URL is read whole, once, at most ``STREAM_URL_BYTES``. Everything these
files say is checked before it is used: offsets inside the file, sizes that agree, a stream's
end-of-stream marker (a stream cut at a batch's end is otherwise whole-looking).
"""

from __future__ import annotations

import struct
from typing import Any

from ..errors import StoreError
from .sources import Opened, need, reader_errors

__all__ = ["WHAT", "Index", "index_file", "table_index", "pyarrow"]

WHAT = "an Arrow IPC file"
SUFFIXES = (".arrow", ".feather", ".ipc")
FILE_MAGIC = b"ARROW1"
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # a stream's end-of-stream marker
STREAM_URL_BYTES = 2**30  # a stream-format file over a URL is read whole: at most this


def pyarrow() -> Any:
    return need("pyarrow", "parquet", "lazyseq.arrow")


# -- the IPC footer, for a file over a URL (pyarrow gives no batch's offset or rows without its body) --
def _unpack(fmt: str, buf: bytes, at: int) -> int:
    if not 0 <= at <= len(buf) - struct.calcsize(fmt):
        raise ValueError(f"a flatbuffer offset ({at}) outside its {len(buf)} bytes")
    return struct.unpack_from(fmt, buf, at)[0]


def _field(buf: bytes, table: int, i: int) -> int:
    """Where field ``i`` of the flatbuffer table at ``table`` lies (0: absent)."""
    vtable = table - _unpack("<i", buf, table)
    size = _unpack("<H", buf, vtable)
    if 4 + 2 * i + 2 > size:
        return 0
    off = _unpack("<H", buf, vtable + 4 + 2 * i)
    return table + off if off else 0


def _ref(buf: bytes, at: int) -> int:
    return at + _unpack("<I", buf, at)


def _footer_blocks(f: Any, size: int) -> list[tuple[int, int, int]]:
    """``(offset, metadata bytes, body bytes)`` of each record batch of a file-format file."""
    tail = f.read(size - 10, size)
    flen = _unpack("<i", tail, 0)
    start = size - 10 - flen
    if tail[4:] != FILE_MAGIC or not 8 <= start:
        raise ValueError(f"its footer says it is {flen} bytes, which a {size}-byte file cannot hold")
    footer = f.read(start, size - 10)
    at = _field(footer, _ref(footer, 0), 3)  # Footer.recordBatches
    if not at:
        return []
    vec = _ref(footer, at)
    n = _unpack("<I", footer, vec)
    if vec + 4 + 24 * n > len(footer):
        raise ValueError(f"its footer lists {n} record batches, more than its {len(footer)} bytes hold")
    out = []
    for b in range(n):
        off, meta, body = (_unpack("<q", footer, vec + 4 + 24 * b), _unpack("<i", footer, vec + 12 + 24 * b),
                           _unpack("<q", footer, vec + 20 + 24 * b))
        if not (8 <= off and 8 <= meta and 0 <= body and off + meta + body <= start):
            raise ValueError(f"record batch {b} lies at bytes {off} to {off + meta + body}, outside the data")
        out.append((off, meta, body))
    return out


def _message_rows(m: bytes, body: int) -> int:
    """The rows a record batch's metadata message says it holds (checked against its body's size)."""
    start, n = (8, _unpack("<i", m, 4)) if _unpack("<i", m, 0) == -1 else (4, _unpack("<i", m, 0))
    fb = m[start : start + n]
    root = _ref(fb, 0)
    kind = _field(fb, root, 1)
    if not kind or fb[kind] != 3:  # MessageHeader.RecordBatch
        raise ValueError("a record batch's message is not a record batch")
    at = _field(fb, root, 3)
    if (_unpack("<q", fb, at) if at else 0) != body:
        raise ValueError("a record batch's message and the footer disagree on its size")
    header = _field(fb, root, 2)
    at = _field(fb, _ref(fb, header), 0) if header else 0
    rows = _unpack("<q", fb, at) if at else 0
    if rows < 0:
        raise ValueError(f"a record batch says it holds {rows} rows")
    return rows


class Index:
    """A part as this process reads it: its schema, its batches' rows, and either the batches
    themselves (zero-copy views of a map, or of a table in memory) or, for a file-format file over a
    URL, where each batch lies."""

    def __init__(self, schema: Any, rows: list[int], batches: list | None = None, blocks: list | None = None):
        self.schema, self.rows, self.batches, self.blocks = schema, rows, batches, blocks


def index_file(opened: Opened, where: str) -> Index:
    """Read ``opened``'s schema and batches (see the module's docstring); errors name ``where``."""
    with reader_errors(where):
        index = _read(opened, where)
        names = index.schema.names  # decoded now: bad UTF-8 in a name is this file's error (nested ones: at a decode)
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise StoreError(f"{where} has two columns named {twice[0]!r}: a row is a dict of its columns")
    return index


def _read(opened: Opened, where: str) -> Index:
    pa = pyarrow()
    if opened.size < 8:
        raise StoreError(f"{where} is not an Arrow IPC file: it is {opened.size} bytes")
    head = bytes(opened.buffer[:8]) if opened.remote is None else opened.remote.read(0, 8)
    if head.startswith(b"FEA1"):
        raise StoreError(f"{where} is a Feather v1 file: write it again as Feather v2 (pyarrow.feather.write_feather)")
    if head.startswith(FILE_MAGIC) and opened.remote is not None:
        reader = pa.ipc.open_file(opened.source())
        blocks = _footer_blocks(opened.remote, opened.size)
        with opened.remote.remote.holding([opened.remote.request(o, o + m) for o, m, _ in blocks]):
            rows = [_message_rows(opened.remote.read(o, o + m), body) for o, m, body in blocks]
        return Index(reader.schema, rows, blocks=blocks)
    if head.startswith(FILE_MAGIC):
        reader = pa.ipc.open_file(opened.source())
        batches = [reader.get_batch(b) for b in range(reader.num_record_batches)]
        return Index(reader.schema, [b.num_rows for b in batches], batches=batches)
    data = opened.buffer
    if opened.remote is not None:
        if opened.size > STREAM_URL_BYTES:
            raise StoreError(f"{where} is in the stream format, read whole over a URL, and is {opened.size} bytes, "
                             f"more than {STREAM_URL_BYTES}: give cache_dir (a local copy), or write it in the file "
                             "format (pyarrow.ipc.new_file), whose batches are read by ranges")
        data = opened.remote.read(0, opened.size)
    if bytes(data[-8:]) != EOS:
        raise StoreError(f"{where} is truncated or not an Arrow IPC file: neither the file format's magic at its "
                         "start nor a stream's end-of-stream marker at its end")
    reader = pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(data)))
    batches = list(reader)
    return Index(reader.schema, [b.num_rows for b in batches], batches=batches)


def table_index(table: Any) -> Index:
    batches = table.to_batches()
    return Index(table.schema, [b.num_rows for b in batches], batches=batches)
