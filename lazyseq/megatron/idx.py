"""Megatron's indexed format (``MMIDIDX``, version 1) read as a view: :func:`indexed`.

``prefix.idx`` holds, little-endian: the magic ``MMIDIDX\\0\\0`` (9 bytes), the version (uint64,
1), a dtype code (uint8, below), the number of sequences ``n`` (uint64), the number of document
boundaries ``m`` (uint64), then ``sizes`` (int32[n], tokens per sequence), ``pointers``
(int64[n], byte offsets of the sequences in ``prefix.bin``) and ``doc_idx`` (int64[m], the first
sequence of each document, then ``n``). ``prefix.bin`` holds the tokens.

The files are data from elsewhere: every count, size and pointer is checked against the files'
sizes before it is used (no read outside the two files, no allocation sized by the header), and
anything wrong is a :class:`~lazyseq.StoreError` naming the file and what is wrong. The counts
are checked against the file's size from the header alone, the document index's first and last
entries (``0`` and ``n``) next, then the tables block by block (``_BLOCK`` entries: the checks'
memory does not grow with the file). A URL's header is judged before the rest of its ``.idx`` is
read. A view pickles with a digest of its sequence sizes: a worker that finds other files refuses
them (:func:`_reopen`).
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from ..core.base import View
from ..errors import RemoteReadError, StoreError
from ..files import Remote, RemoteFile, is_url, local_path, redact
from . import access

__all__ = ["Indexed", "indexed", "DTYPES", "CODES", "HEADER", "MAGIC", "paths"]

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document boundaries: 34 bytes
# Megatron-core's codes (megatron.core.datasets.indexed_dataset.DType); tinygrad reads 7 as float64
DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"), 5: np.dtype("<i8"),
          6: np.dtype("<f8"), 7: np.dtype("<f4"), 8: np.dtype("<u2")}
CODES = {dt: code for code, dt in DTYPES.items()}


def paths(prefix: str | os.PathLike) -> tuple[str, str, str]:
    """``(prefix, prefix.bin, prefix.idx)``, a local prefix made absolute, a URL's suffixes put on its
    path (before a query string); a ``.bin``/``.idx`` suffix given by mistake is dropped."""
    if is_url(prefix):
        u = urlsplit(prefix)  # type: ignore[arg-type]
        p = u.path[:-4] if u.path.endswith((".bin", ".idx")) else u.path
        return tuple(urlunsplit((u.scheme, u.netloc, p + ext, u.query, u.fragment)) for ext in ("", ".bin", ".idx"))
    p = local_path(prefix)
    if p.endswith((".bin", ".idx")):
        p = p[:-4]
    return p, p + ".bin", p + ".idx"


class _Bad(Exception):
    pass


_BLOCK = 1 << 20  # table entries checked at a time: the checks' memory is bounded, whatever the file declares


def check_header(head: bytes, size: int) -> tuple[int, int, int]:
    """``(dtype code, n, m)`` of an ``.idx`` of ``size`` bytes from its first bytes, checked: the
    magic, the version, the code, and the tables the counts declare against the file's size (so
    nothing is read or allocated for a count the file cannot hold). Raises ``_Bad``."""
    if size < HEADER.size or len(head) < HEADER.size:
        raise _Bad(f"it has {size} bytes, fewer than the {HEADER.size} of a header")
    magic, version, code, n, m = HEADER.unpack(head[: HEADER.size])
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
    if m < 1:
        raise _Bad("it has no document boundaries (Megatron's document index holds at least its last entry, the "
                   "number of sequences)")
    return code, n, m


def _parse(idx: np.ndarray, idx_file: str, bin_size: int) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """Check the bytes of an ``.idx`` file against themselves and the ``.bin`` size; its dtype,
    sizes, pointers and doc_idx (read-only views of ``idx``)."""
    code, n, m = check_header(idx[: HEADER.size].tobytes(), len(idx))
    dt = DTYPES[code]
    sizes = np.frombuffer(idx, "<i4", n, HEADER.size)
    pointers = np.frombuffer(idx, "<i8", n, HEADER.size + 4 * n)
    doc_idx = np.frombuffer(idx, "<i8", m, HEADER.size + 12 * n)
    if doc_idx[0] != 0 or doc_idx[-1] != n:  # first, in O(1): a file of zeros (or holes) stops here
        raise _Bad(f"its document index runs from {int(doc_idx[0])} to {int(doc_idx[-1])}, not from 0 to its {n} "
                   "sequences")
    for a in range(0, max(n, m), _BLOCK):  # block by block: no temporary sized by the file
        _check_block(sizes[a : a + _BLOCK], pointers[a : a + _BLOCK], a, dt, bin_size)
        _check_doc_block(doc_idx[max(a - 1, 0) : a + _BLOCK], n)
    return dt, sizes, pointers, doc_idx


def _check_block(sizes: np.ndarray, pointers: np.ndarray, first: int, dt: np.dtype, bin_size: int) -> None:
    """Sequences ``first...`` (``sizes``, ``pointers``): sizes not negative, each inside the ``.bin``."""
    if not len(sizes):
        return
    if sizes.min() < 0:
        k = int(np.argmax(sizes < 0))
        raise _Bad(f"sequence {first + k} has a negative size ({int(sizes[k])})")
    ok = (pointers >= 0) & (pointers <= bin_size)  # first, so that the sum below cannot overflow
    ok &= pointers + sizes.astype(np.int64) * dt.itemsize <= bin_size
    if not ok.all():
        k = int(np.argmin(ok))
        raise _Bad(f"sequence {first + k} ({int(sizes[k])} tokens at byte {int(pointers[k])}) lies outside "
                   f"the .bin file ({bin_size} bytes)")


def _check_doc_block(doc_idx: np.ndarray, n: int) -> None:
    """Entries of the document index (with the one before the block): nondecreasing, from 0 to ``n``."""
    if len(doc_idx) and (doc_idx.min() < 0 or doc_idx.max() > n or (np.diff(doc_idx) < 0).any()):
        raise _Bad(f"its document index is not a nondecreasing list of sequence numbers from 0 to {n}")


class Indexed(View):
    """The sequences of a Megatron ``prefix.bin``/``prefix.idx`` pair, as a view: see :func:`indexed`."""

    checks_keys = False

    def __init__(self, prefix: str | os.PathLike, remote: Remote | None = None):
        self.prefix, self.bin_file, self.idx_file = paths(prefix)
        self.remote = remote if is_url(self.prefix) else None
        if is_url(self.prefix) and remote is None:
            self.remote = Remote(self.prefix)
        self.shown = redact(self.prefix)  # a URL without its secrets, for every message
        shown_idx = redact(self.idx_file)
        try:
            opened = access.open_pair(self.bin_file, self.idx_file, self.remote, _head_check(shown_idx))
        except FileNotFoundError as e:
            missing = e.filename or (self.bin_file if redact(self.bin_file) in str(e) else self.idx_file)
            raise FileNotFoundError(f"lazyseq.megatron.indexed: {redact(missing)} is missing "
                                    f"(a Megatron dataset is a .bin and an .idx file)") from None
        bin_map, idx_map, self._version, self._identity = opened
        try:
            self.dtype, self.sizes, self.pointers, self.doc_idx = _parse(idx_map, shown_idx, len(bin_map))
        except _Bad as e:
            raise StoreError(f"{shown_idx} is not a valid Megatron index: {e}") from None
        self._bin, self._idx, self._n = bin_map, idx_map, len(self.sizes)
        self._ranged = isinstance(bin_map, RemoteFile)  # else a memory map
        self._digest: str | None = None

    def __reduce__(self):
        # a worker maps (or fetches) and checks the files itself, and refuses files other than these
        return (_reopen, (self.prefix, self.remote, self._identity, self.digest()))

    def digest(self) -> str:
        """A digest of what the samples of this corpus are cut from: the counts, the dtype, the
        ``.bin``'s size and every sequence's size (blake2b of the ``sizes`` table, 4 bytes a
        sequence, computed once: about 40 ms for 10 million sequences)."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(struct.pack("<QQBQ", self._n, len(self.doc_idx), CODES[self.dtype], len(self._bin)))
            h.update(np.ascontiguousarray(self.sizes).data)
            self._digest = h.hexdigest()
        return self._digest

    @property
    def name(self) -> str:
        """The corpus's file name, without ``.bin``/``.idx`` (a URL's, without its secrets)."""
        return os.path.basename(urlsplit(self.shown).path if self.remote is not None else self.prefix)

    def version(self) -> list:
        """What identifies this version of the files (a cached index's key): their ``(size,
        mtime_ns)`` when they were opened, or for a URL the ``[size, etag]`` of the objects then."""
        return self._version

    def _len(self) -> int:
        return self._n

    def _get(self, i: int) -> np.ndarray:
        if not self._ranged:
            return np.frombuffer(self._bin, self.dtype, int(self.sizes[i]), int(self.pointers[i]))
        return self._fetch([(int(self.pointers[i]), int(self.sizes[i]))], f"document {i}")[0]

    def _get_many(self, idx: Any) -> list:
        s, p, b, dt = self.sizes[idx].tolist(), self.pointers[idx].tolist(), self._bin, self.dtype
        if self._ranged:
            return self._fetch(list(zip(p, s)), f"{len(s)} documents")
        return [np.frombuffer(b, dt, n, o) for n, o in zip(s, p)]

    def tokens(self, i: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of sequence ``i`` (``0 <= start <= stop <= sizes[i]``, unchecked)."""
        if self._ranged:
            return self.spans([(i, start, stop)])[0]
        return np.frombuffer(self._bin, self.dtype, stop - start, int(self.pointers[i]) + start * self.dtype.itemsize)

    def spans(self, spans: Any) -> list[np.ndarray]:
        """Tokens ``start:stop`` of sequence ``i`` for each ``(i, start, stop)`` (unchecked, as in
        :meth:`tokens`), read-only; over a URL, their ranges fetched at once."""
        at, dt = self.pointers, self.dtype
        parts = [(int(at[i]) + a * dt.itemsize, b - a) for i, a, b in spans]
        if self._ranged:
            return self._fetch(parts, f"tokens of documents {sorted({int(i) for i, _, _ in spans})[:8]}")
        return [np.frombuffer(self._bin, dt, n, o) for o, n in parts]

    def _fetch(self, parts: list, what: str) -> list[np.ndarray]:
        """``n`` tokens at byte ``o`` of the ``.bin`` for each ``(o, n)``, their ranges fetched at once."""
        f, size = self._bin, self.dtype.itemsize
        try:
            blobs = iter(f.remote.read_ranges([f.request(o, o + n * size) for o, n in parts if n]))
        except RemoteReadError as e:
            raise e.about(f"{what} of {self.describe()}") from None
        return [np.frombuffer(next(blobs) if n else b"", self.dtype) for _, n in parts]

    def fingerprint_identity(self) -> dict:
        """The data's name, dtype, counts and file sizes, and a digest of the ``.idx``'s first and last
        MiB, for ``lazyseq.fingerprint``: the same for a copy anywhere, no token read."""
        idx = self._idx
        head, tail = idx[: 1 << 20], idx[max(len(idx) - (1 << 20), 1 << 20):]
        digest = hashlib.blake2b(head.tobytes() + tail.tobytes(), digest_size=16).hexdigest()
        return {"prefix": self.name, "dtype": self.dtype.str, "sequences": self._n,
                "documents": len(self.doc_idx), "bytes": [len(self._bin), len(idx)], "index": digest}

    def nbytes(self) -> int:
        """The size of the ``.bin`` file, in bytes."""
        return len(self._bin)

    def describe(self) -> str:
        return f"megatron.indexed({self.shown!r}, {self.dtype.name})"


def _head_check(shown_idx: str):
    """The check of an ``.idx``'s first bytes and size that :func:`access.open_pair` runs on a URL's
    ``.idx`` before it reads the rest into memory."""
    def check(head: bytes, size: int) -> None:
        try:
            check_header(head, size)
        except _Bad as e:
            raise StoreError(f"{shown_idx} is not a valid Megatron index: {e}") from None
    return check


def _reopen(prefix: str, remote: Remote | None, identity: Any, digest: str) -> Indexed:
    """An :class:`Indexed` view unpickled (in a worker): the files opened and checked again, and
    refused unless they are those the view was made from (the same files, or the same sizes)."""
    docs = Indexed(prefix, remote)
    if docs._identity != identity and docs.digest() != digest:
        raise StoreError(f"{redact(docs.idx_file)} changed since the view was built (other sequence sizes, counts "
                         "or .bin size): the index of samples made from it does not fit the files now; build the "
                         "view again over the corpus as it is")
    return docs


def indexed(prefix: str | os.PathLike, *, storage_options: dict | None = None, block_cache: int = 64 * 2**20,
            cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int | None = None,
            timeout: float = 30.0) -> Indexed:
    """The sequences (documents) of Megatron's ``prefix.bin``/``prefix.idx`` files, as a view.

    ``docs[i]`` is sequence ``i`` as a **read-only, zero-copy** 1-D numpy array of the stored dtype
    (a view of a memory map of ``prefix.bin``); ``docs.sizes`` (int32), ``docs.pointers`` (byte
    offsets, int64) and ``docs.doc_idx`` (int64, the document boundaries) are the tables of
    ``prefix.idx``; ``docs.dtype`` is the token dtype, by Megatron-core's codes.

    The files are data from elsewhere: every count, size and pointer of ``prefix.idx`` is checked
    against both files' sizes when the view is made (vectorised, no allocation sized by the
    header), so that no read leaves the files; a bad file raises :class:`~lazyseq.StoreError`
    naming it and what is wrong. The view pickles as its prefix and a digest of its sequence sizes:
    a prefetch worker maps and checks the files itself, and raises a ``StoreError`` if they changed
    since (other sizes, counts or ``.bin`` size), rather than read other documents.

    ``prefix`` may be any fsspec URL (``s3://bucket/corpus``, ``https://host/corpus``): the
    ``.idx`` is read whole once (at most 4 GiB), both objects' sizes come from HEAD requests and
    are checked as above, and a document is one ranged GET (a bulk read: its ranges at once,
    neighbours joined), a read-only array equal to the local one. ``storage_options``,
    ``block_cache``, ``cache_dir`` (both files kept whole on local disk and memory-mapped, at most
    ``cache_dir_bytes``), ``timeout`` are :func:`lazyseq.load`'s; a URL's view pickles as its URL
    and these settings. See docs/remote.md.

    >>> import tempfile, os
    >>> from lazyseq import megatron
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'corpus')
    >>> megatron.write(prefix, [[5, 6, 7], [8], [9, 10]])
    >>> docs = megatron.indexed(prefix)
    >>> len(docs), docs[0], docs.dtype, docs.sizes.tolist(), docs[2].flags.writeable
    (3, array([5, 6, 7], dtype=uint16), dtype('uint16'), [3, 1, 2], False)
    """
    remote = None
    if is_url(prefix):
        remote = Remote(paths(prefix)[0], storage_options, block_cache, cache_dir, cache_dir_bytes, timeout)
    return Indexed(prefix, remote)
