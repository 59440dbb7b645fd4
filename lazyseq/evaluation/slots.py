"""The shared-memory slot pool, slot anchors, and ``empty``/``empty_like`` for workers.

One anonymous segment (``memfd_create``; ``shm_open`` + immediate unlink elsewhere) is split into
fixed slots. Its file descriptor is handed to the workers, so the segment has no name in
``/dev/shm`` once created: nothing can leak there, whatever kills whom.

A delivered chunk's arrays are zero-copy views of its slot. Their numpy ``base`` chain ends at one
:class:`SlotAnchor` per chunk (numpy keeps an object exposing ``__array_interface__`` as the base of
every array built on it); when the last array goes, the anchor's ``__del__`` puts the
slot back in the pool. So a slot is reused only when nothing in the parent looks at it any more.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections import deque
from typing import Any

import numpy as np

from ..core.jobslot import empty
from ..helpers import ALIGN, PAGE, forced

__all__ = ["SlotPool", "SlotAnchor", "empty", "empty_like"]


def create_segment(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory with no name left behind."""
    if hasattr(os, "memfd_create") and not forced("memfd"):
        fd = os.memfd_create("lazyseq", getattr(os, "MFD_CLOEXEC", 0))
    else:  # macOS, the BSDs (and Linux with LAZYSEQ_FORCE_FALLBACKS=memfd, as CI runs it)
        import _posixshmem

        # at most 31 characters (macOS's limit): "/lazyseq-" + pid + "-" + 12 hex digits
        name = f"/lazyseq-{os.getpid()}-{secrets.token_hex(6)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        _posixshmem.shm_unlink(name)  # the name lived for two system calls; the descriptor keeps the memory
        os.set_inheritable(fd, False)  # as MFD_CLOEXEC: workers get it handed over, nothing else does
    try:
        os.ftruncate(fd, size)  # no zero-fill: pages appear when first written
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_segment(fd: int, size: int) -> np.ndarray:
    """The whole segment as a writable uint8 array (it keeps the mapping alive)."""
    return np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)


class SlotAnchor:
    """The numpy base of every array delivered from one slot; dropping the last releases the slot."""

    __slots__ = ("__array_interface__", "__weakref__", "_memory", "_release", "_slot")

    def __init__(self, memory: np.ndarray, offset: int, size: int, release: Any, slot: int):
        self._memory = memory  # keeps the mapping alive as long as any array of the slot lives
        self._release, self._slot = release, slot
        self.__array_interface__ = {"data": (memory.ctypes.data + offset, False), "shape": (size,),
                                    "typestr": "|u1", "version": 3}

    def __del__(self) -> None:  # cheaper than a weakref.finalize per chunk; runs in any thread or in gc
        self._release(self._slot)


class SlotPool:
    """``nslots`` slots of ``slot_size`` bytes in one shared segment (parent side), after a header
    page that holds the ring of cancelled job ids workers check before starting a job."""

    HEADER = PAGE
    RING = HEADER // 8

    def __init__(self, shm_size: int, nslots: int):
        self.nslots = nslots if shm_size > 0 else 0
        self.slot_size = (shm_size // nslots) // ALIGN * ALIGN if self.nslots else 0
        if self.nslots and self.slot_size < ALIGN:
            raise ValueError(f"prefetch: shm_size={shm_size} is too small for {nslots} slots")
        self.size = self.HEADER + self.slot_size * self.nslots
        self.fd = create_segment(self.size)
        self.memory = map_segment(self.fd, self.size)
        self.cancelled = self.memory[: self.HEADER].view(np.int64)
        self.cancelled[:] = -1
        # deque append/popleft are atomic, so a finalizer running in any thread (or inside the
        # garbage collector while the reader is in acquire) can release without a lock.
        self._free: deque[int] = deque(range(self.nslots))

    def cancel(self, job_id: int) -> None:
        self.cancelled[job_id % self.RING] = job_id

    def offset(self, slot: int) -> int:
        return self.HEADER + slot * self.slot_size

    def acquire(self) -> int | None:
        try:
            return self._free.pop()
        except IndexError:
            return None

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def free(self) -> int:
        return len(self._free)

    def anchor(self, slot: int) -> np.ndarray:
        """A uint8 array over ``slot`` whose views keep the slot reserved; the slot returns to the
        pool when the last of them is gone."""
        return np.asarray(SlotAnchor(self.memory, self.offset(slot), self.slot_size, self._free.append, slot))

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def empty_like(a: Any, dtype: Any = None) -> np.ndarray:
    """:func:`empty` with the shape and dtype of ``a`` (or ``dtype``).

    >>> import lazyseq, numpy as np
    >>> lazyseq.empty_like(np.zeros((4, 2), 'uint8')).shape
    (4, 2)
    """
    a = np.asarray(a)
    return empty(a.shape, a.dtype if dtype is None else dtype)
