"""The headers of a local tar file found at once, with numpy, in the common case: :func:`scan`.

Every ustar, PAX or GNU header holds ``ustar`` at byte 257, so the blocks that do are the candidate
headers; their sizes and types, read at once, say where each one's next header is. Where following
them from block 0 visits exactly the candidates, in order, and ends at a zero block or the end of
the file, they are the headers that reading one after another (:class:`~lazyseq.formats.tar._Walk`)
finds, and the walk's loop is not needed. Anything else falls back to it (None): a candidate that
is not on the chain (``ustar`` inside a member's data), a header of another kind than a regular
file, a directory or a PAX header that sets nothing read (a long name, a link, a PAX ``path`` or
``size``, a global header...), a size not written as 11 octal digits, two PAX headers in a row. The
walk then finds what is wrong, or reads what is unusual; either way the checksums, number fields
and names are checked by the same code afterwards.

>>> import io, tarfile
>>> buf = io.BytesIO()
>>> with tarfile.open(fileobj=buf, mode="w") as t:
...     for name in ("a.txt", "b.txt"):
...         info = tarfile.TarInfo(name); info.size = 600; t.addfile(info, io.BytesIO(bytes(600)))
>>> at, regular, sizes = scan(buf.getvalue(), len(buf.getvalue()))
>>> at.tolist(), regular.tolist(), sizes.tolist()
([0, 1536], [True, True], [600, 600])
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["scan"]

BLOCK = 512
MAGIC = np.frombuffer(b"ustar", np.uint8)
POWERS = 8 ** np.arange(10, -1, -1, dtype=np.int64)
REG, DIR, PAX = 48, 53, 120  # the kinds this handles: "0", "5", "x"
TELLS = (b"path=", b"size=", b"GNU.sparse")  # what makes a PAX header set something read
BATCH = 8192
WORDS = np.array([31, 32, 33, 39, 64, 65])  # the header's 4-byte words that hold its size, type and magic


def scan(buf: Any, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(header offsets, which headers are regular members', those members' sizes)`` of the tar
    file whose bytes are ``buf`` (a memory map or bytes of ``size`` bytes), or None where the walk
    must read it (a member's data follows its header)."""
    nb = size // BLOCK
    if nb == 0:
        return None
    blocks = np.frombuffer(buf, np.uint8, nb * BLOCK).reshape(nb, BLOCK)  # no copy
    cand = np.flatnonzero(blocks[:, 257] == MAGIC[0])  # one byte per block first: twice as fast as five
    words = np.frombuffer(buf, np.uint32, nb * BLOCK // 4)  # 4-byte words: a gather of few wide items is fast
    head = np.take(words, cand[:, None] * (BLOCK // 4) + WORDS).view(np.uint8)  # bytes 124-136, 156-160, 256-264
    real = (head[:, 18:22] == MAGIC[1:]).all(1)
    cand, head = cand[real], head[real]
    if not len(cand) or cand[0] != 0:
        return None
    field, kind = head[:, :12], head[:, 12]
    digits = field[:, :11]
    if not (((digits >= 48) & (digits <= 55)).all() and ((field[:, 11] | 32) == 32).all()):
        return None  # a size in another form (base-256, spaces, fewer digits): the walk reads it
    if not ((kind == REG) | (kind == DIR) | (kind == PAX)).all():
        return None
    n = (digits.astype(np.int64) - 48) @ POWERS
    step = np.where(kind == DIR, 0, (n + BLOCK - 1) // BLOCK)
    nxt = cand + 1 + step
    if not (nxt[:-1] == cand[1:]).all():
        return None  # a candidate off the chain, or a header the chain skips
    end = int(nxt[-1])
    if end * BLOCK > size or (end < nb and blocks[end].any()) or (end == nb and size - end * BLOCK):
        return None  # past the end, a header without the magic, or a truncated one: the walk says which
    pax = kind == PAX
    if pax[-1] or (pax[1:] & pax[:-1]).any() or not _quiet(blocks, cand[pax], n[pax]):
        return None
    reg = kind == REG
    return cand * BLOCK, reg, n[reg]


def _quiet(blocks: np.ndarray, at: np.ndarray, n: np.ndarray) -> bool:
    """Whether the PAX headers at blocks ``at`` (of ``n`` bytes each) set nothing read: each fits in
    its one data block, none of which names a path, a size or a sparse map."""
    if (n > BLOCK).any():
        return False
    width = int(n.max(initial=0))
    for a in range(0, len(at), BATCH):
        rows = blocks[at[a:a + BATCH] + 1]
        if rows[:, width:].any():  # bytes past every record: read them all, as tarfile would
            width = BLOCK
        data = rows[:, :width].tobytes()
        if any(tell in data for tell in TELLS):
            return False
    return True
