"""The shared-memory slot a process worker is filling for its current job, per thread.

A leaf below both the views and the evaluation package: the process backend sets the current
slot around each job; ``lazyseq.empty`` allocates in it; views that keep items beyond a read
(``add_cache``) keep :func:`keepable` copies, since the slot is reused once the job is delivered.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..helpers import align
from . import tree

__all__ = ["JobSlot", "set_current", "current", "keepable", "empty"]


class JobSlot:
    """The slot a worker writes the current job into: a bump allocator over its bytes."""

    __slots__ = ("view", "offset", "start")

    def __init__(self, view: np.ndarray, start: int):
        self.view, self.offset, self.start = view, 0, start  # start: address of the slot

    def reserve(self, nbytes: int) -> int | None:
        off = align(self.offset)
        if off + nbytes > len(self.view):
            return None
        self.offset = off + nbytes
        return off

    def holds(self, a: np.ndarray) -> bool:
        """Whether ``a``'s data lies in this slot."""
        addr = a.__array_interface__["data"][0]
        return self.start <= addr < self.start + len(self.view)


# Per thread: only the worker's evaluating thread writes into the job's slot. Arrays that other
# threads (a nested thread prefetch computing ahead) make could outlive the job.
_local = threading.local()


def set_current(slot: JobSlot | None) -> None:
    _local.job = slot


def current() -> JobSlot | None:
    return getattr(_local, "job", None)


def keepable(value: Any) -> Any:
    """``value`` with every array that lives in the current job's slot copied out of it, for what
    must outlive the job (a cache). Outside a process worker's job: ``value`` itself."""
    job = current()
    if job is None:
        return value
    return tree.map(lambda a: a.copy() if type(a) is np.ndarray and job.holds(a) else a, value)


def empty(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    """``numpy.empty``, placed in the current job's shared-memory slot inside a process worker.

    An item function that fills its output in place (``out=``, slicing) and returns it saves the
    copy into the slot: the array is already where the reader will see it. Anywhere else (the
    main process, thread workers, a full slot) this is plain ``numpy.empty``. Do not keep such an
    array beyond the item that returns it: its memory is reused for later items.

    >>> import lazyseq
    >>> a = lazyseq.empty((2, 3), dtype='float32')
    >>> a.shape, a.dtype
    ((2, 3), dtype('float32'))
    """
    job = current()
    if job is not None:
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        off = job.reserve(nbytes)
        if off is not None:
            return np.ndarray(shp, dtype=dt, buffer=job.view, offset=off, order=order)
    return np.empty(shape, dtype=dtype, order=order)
