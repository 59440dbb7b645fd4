"""Megatron's indexed format (``MMIDIDX``, version 1) read as a view: :func:`indexed`.

``prefix.idx`` holds, little-endian: the magic ``MMIDIDX\\0\\0`` (9 bytes), the version (uint64,
1), a dtype code (uint8, below), the number of sequences ``n`` (uint64), the number of document
boundaries ``m`` (uint64), then ``sizes`` (int32[n], tokens per sequence), ``pointers``
(int64[n], byte offsets of the sequences in ``prefix.bin``) and ``doc_idx`` (int64[m], the first
sequence of each document, then ``n``). ``prefix.bin`` holds the tokens.

The files are data from elsewhere: every count, size and pointer is checked against the files'
sizes before it is used (no read outside the two files, no allocation sized by the header), and
anything wrong is a :class:`~lazyseq.StoreError` naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

import numpy as np

from ..base import View
from ..errors import StoreError
from . import access

__all__ = ["Indexed", "indexed", "DTYPES", "CODES", "HEADER", "MAGIC", "paths"]

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document boundaries: 34 bytes
# Megatron-core's codes (megatron.core.datasets.indexed_dataset.DType); tinygrad reads 7 as float64
DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"), 5: np.dtype("<i8"),
          6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2")}
CODES = {dt: code for code, dt in DTYPES.items()}


def paths(prefix: str | os.PathLike) -> tuple[str, str, str]:
    """``(prefix, prefix.bin, prefix.idx)``, the prefix made absolute (a ``.bin``/``.idx`` suffix
    given by mistake is dropped)."""
    p = os.path.abspath(os.fspath(prefix))
    if p.endswith((".bin", ".idx")):
        p = p[:-4]
    return p, p + ".bin", p + ".idx"


class _Bad(Exception):
    pass


def _parse(idx: np.ndarray, idx_file: str, bin_size: int) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """Check the bytes of an ``.idx`` file against themselves and the ``.bin`` size; its dtype,
    sizes, pointers and doc_idx (read-only views of ``idx``)."""
    size = len(idx)
    if size < HEADER.size:
        raise _Bad(f"it has {size} bytes, fewer than the {HEADER.size} of a header")
    magic, version, code, n, m = HEADER.unpack(idx[: HEADER.size].tobytes())
    if magic != MAGIC:
        raise _Bad(f"it does not start with Megatron's magic {MAGIC!r} (found {magic!r})")
    if version != 1:
        raise _Bad(f"it has version {version}; this reader reads version 1")
    if code not in DTYPES:
        raise _Bad(f"its dtype code is {code}; Megatron's codes are 1 to 8")
    room = size - HEADER.size
    if n > room // 12 or m > room // 8 or HEADER.size + 12 * n + 8 * m != size:
        raise _Bad(f"it declares {n} sequences and {m} document boundaries, which need "
                   f"{HEADER.size + 12 * min(n, 2**60) + 8 * min(m, 2**60)} bytes; the file has {size}")
    dt = DTYPES[code]
    sizes = np.frombuffer(idx, "<i4", n, HEADER.size)
    pointers = np.frombuffer(idx, "<i8", n, HEADER.size + 4 * n)
    doc_idx = np.frombuffer(idx, "<i8", m, HEADER.size + 12 * n)
    _check_tables(sizes, pointers, doc_idx, dt, bin_size)
    return dt, sizes, pointers, doc_idx


def _check_tables(sizes: np.ndarray, pointers: np.ndarray, doc_idx: np.ndarray, dt: np.dtype, bin_size: int) -> None:
    n = len(sizes)
    if n:
        if sizes.min() < 0:
            k = int(np.argmax(sizes < 0))
            raise _Bad(f"sequence {k} has a negative size ({int(sizes[k])})")
        ok = (pointers >= 0) & (pointers <= bin_size)  # first, so that the sum below cannot overflow
        ok &= pointers + sizes.astype(np.int64) * dt.itemsize <= bin_size
        if not ok.all():
            k = int(np.argmin(ok))
            raise _Bad(f"sequence {k} ({int(sizes[k])} tokens at byte {int(pointers[k])}) lies outside "
                       f"the .bin file ({bin_size} bytes)")
    if len(doc_idx) and (doc_idx.min() < 0 or doc_idx.max() > n or (np.diff(doc_idx) < 0).any()):
        raise _Bad(f"its document index is not a nondecreasing list of sequence numbers from 0 to {n}")


class Indexed(View):
    """The sequences of a Megatron ``prefix.bin``/``prefix.idx`` pair, as a view: see :func:`indexed`."""

    checks_keys = False

    def __init__(self, prefix: str | os.PathLike):
        self.prefix, self.bin_file, self.idx_file = paths(prefix)
        try:
            bin_map = access.map_file(self.bin_file)
            idx_map = access.map_file(self.idx_file)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"lazyseq.megatron.indexed: {e.filename} is missing "
                                    f"(a Megatron dataset is a .bin and an .idx file)") from None
        try:
            self.dtype, self.sizes, self.pointers, self.doc_idx = _parse(idx_map, self.idx_file, len(bin_map))
        except _Bad as e:
            raise StoreError(f"{self.idx_file} is not a valid Megatron index: {e}") from None
        self._bin, self._n = bin_map, len(self.sizes)

    def __reduce__(self):  # a worker maps and checks the files itself
        return (Indexed, (self.prefix,))

    def _len(self) -> int:
        return self._n

    def _get(self, i: int) -> np.ndarray:
        return np.frombuffer(self._bin, self.dtype, int(self.sizes[i]), int(self.pointers[i]))

    def _get_many(self, idx: Any) -> list:
        s, p, b, dt = self.sizes[idx].tolist(), self.pointers[idx].tolist(), self._bin, self.dtype
        return [np.frombuffer(b, dt, n, o) for n, o in zip(s, p)]

    def tokens(self, i: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of sequence ``i`` (``0 <= start <= stop <= sizes[i]``, unchecked)."""
        return np.frombuffer(self._bin, self.dtype, stop - start, int(self.pointers[i]) + start * self.dtype.itemsize)

    def fingerprint_identity(self) -> dict:
        """The data's name, dtype, counts and file sizes, and a digest of the ``.idx``'s first and last
        MiB, for ``lazyseq.fingerprint``: the same for a copy anywhere, no token read."""
        idx = access.map_file(self.idx_file)
        head, tail = idx[: 1 << 20], idx[max(len(idx) - (1 << 20), 1 << 20):]
        digest = hashlib.blake2b(head.tobytes() + tail.tobytes(), digest_size=16).hexdigest()
        return {"prefix": os.path.basename(self.prefix), "dtype": self.dtype.str, "sequences": self._n,
                "documents": len(self.doc_idx), "bytes": [len(self._bin), len(idx)], "index": digest}

    def nbytes(self) -> int:
        """The size of the ``.bin`` file, in bytes."""
        return len(self._bin)

    def describe(self) -> str:
        return f"megatron.indexed({self.prefix!r}, {self.dtype.name})"


def indexed(prefix: str | os.PathLike) -> Indexed:
    """The sequences (documents) of Megatron's ``prefix.bin``/``prefix.idx`` files, as a view.

    ``docs[i]`` is sequence ``i`` as a **read-only, zero-copy** 1-D numpy array of the stored dtype
    (a view of a memory map of ``prefix.bin``); ``docs.sizes`` (int32), ``docs.pointers`` (byte
    offsets, int64) and ``docs.doc_idx`` (int64, the document boundaries) are the tables of
    ``prefix.idx``; ``docs.dtype`` is the token dtype, by Megatron-core's codes.

    The files are data from elsewhere: every count, size and pointer of ``prefix.idx`` is checked
    against both files' sizes when the view is made (vectorised, no allocation sized by the
    header), so that no read leaves the files; a bad file raises :class:`~lazyseq.StoreError`
    naming it and what is wrong. The view pickles as its prefix: a prefetch worker maps and checks
    the files itself.

    >>> import tempfile, os
    >>> from lazyseq import megatron
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'corpus')
    >>> megatron.write(prefix, [[5, 6, 7], [8], [9, 10]])
    >>> docs = megatron.indexed(prefix)
    >>> len(docs), docs[0], docs.dtype, docs.sizes.tolist(), docs[2].flags.writeable
    (3, array([5, 6, 7], dtype=uint16), dtype('uint16'), [3, 1, 2], False)
    """
    return Indexed(prefix)
