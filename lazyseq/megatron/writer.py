"""``lazyseq.megatron.write``: any sequence of 1-D integer arrays as Megatron's ``.bin``/``.idx``.

The tokens stream to a temporary ``.bin`` beside the final one (memory bounded by one document
and the per-document tables); with ``dtype=None`` the file starts as uint16 and is widened in
place (to int32, then int64) by a chunked rewrite the first time a value does not fit. Both files
are renamed into place at the end: an old ``.idx`` is removed, then the ``.bin`` and the ``.idx``
renamed in (readers start from the ``.idx``): an interrupted write leaves the previous files, or
no ``.idx`` (no corpus), never a new ``.bin`` beside an old ``.idx``.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable
from typing import Any, BinaryIO

import numpy as np

from ..files import is_url, redact
from . import access
from .idx import CODES, HEADER, MAGIC, paths

__all__ = ["write"]

_AUTO = (np.dtype("<u2"), np.dtype("<i4"), np.dtype("<i8"))
_INTS = tuple(dt for dt in CODES if dt.kind in "iu")
_CHUNK = 1 << 24  # bytes per step of a widening rewrite


def _given(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype).newbyteorder("<")
    if dt not in _INTS:
        raise TypeError(f"lazyseq.megatron.write: dtype {np.dtype(dtype)} is not an integer dtype of Megatron's "
                        f"format ({', '.join(d.name for d in _INTS)})")
    return dt


def _doc(doc: Any, k: int) -> np.ndarray:
    a = np.asarray(doc)
    if a.ndim != 1:
        raise ValueError(f"lazyseq.megatron.write: document {k} has shape {a.shape}; documents are 1-D arrays of tokens")
    if a.dtype.kind not in "iu" and a.size:
        raise TypeError(f"lazyseq.megatron.write: document {k} has dtype {a.dtype}; tokens are integers")
    if a.size > np.iinfo(np.int32).max:
        raise ValueError(f"lazyseq.megatron.write: document {k} has {a.size} tokens; Megatron's sizes are int32")
    return a


def _fits(a: np.ndarray, dt: np.dtype) -> bool:
    if not a.size or np.can_cast(a.dtype, dt, "safe"):
        return True
    info = np.iinfo(dt)
    return info.min <= int(a.min()) and int(a.max()) <= info.max


class _Bin:
    """The temporary ``.bin``: its file, path and dtype, widened on demand."""

    def __init__(self, final: str, dt: np.dtype):
        self.final, self.dt = final, dt
        self.f, self.tmp = access.create(final)

    def add(self, a: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(a, self.dt).data)

    def widen(self, dt: np.dtype) -> None:
        """Rewrite what was written so far as ``dt``, chunk by chunk."""
        f, tmp = access.create(self.final)
        try:
            self.f.flush()
            self.f.seek(0)
            step = _CHUNK // self.dt.itemsize * self.dt.itemsize
            while chunk := self.f.read(step):
                f.write(np.frombuffer(chunk, self.dt).astype(dt).data)
        except BaseException:
            f.close()
            access.remove(tmp)
            raise
        self.drop()
        self.f, self.tmp, self.dt = f, tmp, dt

    def drop(self) -> None:
        self.f.close()
        access.remove(self.tmp)


def _widest_needed(a: np.ndarray, dt: np.dtype, k: int) -> np.dtype:
    for cand in _AUTO[_AUTO.index(dt) + 1:]:
        if _fits(a, cand):
            return cand
    raise ValueError(f"lazyseq.megatron.write: document {k} holds values outside int64")


def _index(f: BinaryIO, sizes: np.ndarray, dt: np.dtype) -> None:
    n = len(sizes)
    pointers = np.zeros(n, "<i8")
    if n > 1:
        np.cumsum(sizes[:-1], out=pointers[1:])
    pointers *= dt.itemsize
    f.write(HEADER.pack(MAGIC, 1, CODES[dt], n, n + 1))
    f.write(sizes.astype("<i4").data)
    f.write(pointers.data)
    f.write(np.arange(n + 1, dtype="<i8").data)


def write(prefix: str | os.PathLike, docs: Iterable, dtype: Any = None) -> None:
    """Write the documents ``docs`` (1-D integer arrays or lists) as Megatron's ``prefix.bin`` and
    ``prefix.idx``, which Megatron-core's ``IndexedDataset``, tinygrad's ``BinIdxDataset`` and
    :func:`lazyseq.megatron.indexed` read back identically (each document one sequence).

    ``docs`` is any iterable: a list, a view, a pipeline tokenising text in prefetch workers. It is
    read once, in order, streaming: memory holds one document and 12 bytes per document. With
    ``dtype=None`` the tokens are stored as the smallest of uint16, int32 and int64 that holds all
    of them; a given ``dtype`` (an integer dtype of the format) is checked against every value.
    The files appear complete or not at all (written beside and renamed into place, the
    ``.idx`` last).

    >>> import tempfile, os
    >>> from lazyseq import megatron
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'corpus')
    >>> megatron.write(prefix, [np.arange(3), [70000]])
    >>> docs = megatron.indexed(prefix)
    >>> docs.dtype, docs[1]
    (dtype('int32'), array([70000], dtype=int32))
    """
    if is_url(prefix):
        raise ValueError(f"lazyseq.megatron.write writes local files, not {redact(prefix)}: write them locally, "
                         "then upload prefix.bin and prefix.idx")
    _, bin_file, idx_file = paths(prefix)
    fixed = dtype is not None
    dt = _given(dtype) if fixed else _AUTO[0]
    sizes = array("q")
    out, index = _Bin(bin_file, dt), None
    try:
        for k, doc in enumerate(docs):
            a = _doc(doc, k)
            if not _fits(a, out.dt):
                if fixed:
                    raise ValueError(f"lazyseq.megatron.write: document {k} holds values from {a.min()} to {a.max()}, "
                                     f"outside {dt.name}")
                out.widen(_widest_needed(a, out.dt, k))
            out.add(a)
            sizes.append(a.size)
        table = np.frombuffer(sizes, np.int64) if sizes else np.zeros(0, np.int64)
        index = access.create(idx_file)
        _index(index[0], table, out.dt)
        # An old .idx goes first, then the new .bin, then the new .idx: a crash between the renames
        # leaves no .idx (no corpus), never a new .bin read through an old .idx.
        access.remove(idx_file)
        access.commit(out.f, out.tmp, bin_file)
        access.commit(*index, idx_file)
    except BaseException:
        out.drop()
        if index is not None:
            index[0].close()
            access.remove(index[1])
        raise
