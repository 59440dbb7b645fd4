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
>>> f = parse(data[-8 - int.from_bytes(data[-8:-4], "little") : -8], "x.parquet")
>>> f.rows, f.chunks[1][0].path, pq.read_metadata(pa.BufferReader(f.small)).num_rows
([2, 1], 'x', 3)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import StoreError
from .thrift import BINARY, LIST, Reader, ThriftError, Writer, get_int, get_struct, get_structs

__all__ = ["parse", "Footer", "Chunk", "MAX_FOOTER"]

MAX_FOOTER = 256 * 2**20  # bytes: a footer larger than this is refused before it is read

# field ids dropped from the footer pyarrow reads (see the module's docstring)
DROP_FILE = {7, 8, 9}  # column_orders; encryption_algorithm, footer_signing_key_metadata (refused first)
DROP_CHUNK = {4, 5, 6, 7, 8, 9}  # page-index offsets and lengths, crypto metadata, encrypted metadata
DROP_META = {12, 13, 14, 15, 16, 17}  # statistics, encoding stats, bloom filter, size statistics, geo statistics


@dataclass
class Chunk:
    """One column chunk as the footer describes it: its leaf's dotted ``path``, the offsets of its
    first data page and of its dictionary page (or None), its compressed bytes, its value count,
    where its offset index lies (``(offset, length)`` or None), and its metadata as read (cleaned:
    what a one-page file of this column copies)."""

    path: str
    data: int
    dictionary: int | None
    nbytes: int
    values: int
    index: tuple[int, int] | None
    meta: dict


@dataclass
class Footer:
    """A footer parsed and cleaned: ``rows`` of each row group, ``chunks[group][leaf]``, ``small``
    (the cleaned footer as a small Parquet file), the ``schema`` elements as read and ``created_by``."""

    rows: list[int]
    chunks: list[list[Chunk]]
    small: bytes
    schema: list[dict]
    created_by: Any


def _chunk(c: dict, r: int, k: int) -> Chunk:
    where = f"row group {r}, column chunk {k}"
    if 1 in c:
        raise ThriftError(f"{where} lies in another file ({c[1][1][:100]!r}): a file's column chunks must be its own")
    if 8 in c or 9 in c:
        raise ThriftError(f"{where} is encrypted: encrypted Parquet files are not read")
    index = (get_int(c, 4, ""), get_int(c, 5, "")) if 4 in c and 5 in c else None
    for fid in DROP_CHUNK:
        c.pop(fid, None)
    m = get_struct(c, 3, f"{where}'s metadata")
    for fid in DROP_META:
        m.pop(fid, None)
    got = m.get(3)
    if got is None or got[0] != LIST or got[1][0] != BINARY:
        raise ThriftError(f"{where}'s column path is missing")
    path = ".".join(p.decode("utf-8", "replace") for p in got[1][1])
    dictionary = get_int(m, 11, "") if 11 in m else None
    return Chunk(path, get_int(m, 9, f"{where}'s data page offset"), dictionary, get_int(m, 7, f"{where}'s compressed size"),
                 get_int(m, 5, f"{where}'s value count"), index, m)


def parse(footer: bytes, shown: str) -> Footer:
    """The footer bytes ``footer`` of the file named ``shown``, parsed, checked and cleaned; a
    :class:`StoreError` names what is wrong."""
    try:
        fm = Reader(footer).struct(0)
        if 8 in fm or 9 in fm:
            raise ThriftError("the file is encrypted: encrypted Parquet files are not read")
        for fid in DROP_FILE:
            fm.pop(fid, None)
        num_rows = get_int(fm, 3, "its row count")
        rows, chunks = [], []
        for k, g in enumerate(get_structs(fm, 4, "its row groups")):
            rows.append(get_int(g, 3, f"row group {k}'s row count"))
            chunks.append([_chunk(c, k, j) for j, c in enumerate(get_structs(g, 1, f"row group {k}'s columns"))])
        if any(n < 0 for n in rows) or num_rows != sum(rows):
            raise ThriftError(f"its footer says {num_rows} rows, its {len(rows)} row groups hold "
                              f"{sum(rows) if min(rows, default=0) >= 0 else 'a negative number of'}")
        schema = get_structs(fm, 2, "its schema")
        w = Writer()
        w.struct(fm)
    except ThriftError as e:
        raise StoreError(f"{shown} (a Parquet file) is corrupted: {e}") from None
    except (TypeError, ValueError, IndexError, AttributeError, KeyError):  # a value of another type than its field's
        raise StoreError(f"{shown} (a Parquet file) is corrupted: its footer holds values of the wrong types") from None
    except RecursionError:
        raise StoreError(f"{shown} (a Parquet file) is corrupted: its footer nests too deep") from None
    body = bytes(w.out)
    small = b"PAR1" + body + struct.pack("<I", len(body)) + b"PAR1"
    return Footer(rows, chunks, small, schema, fm.get(6))
