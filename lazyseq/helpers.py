"""Constants and small functions every layer uses; imports nothing of lazyseq."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

ALIGN = 64  # bytes: a cache line; buffers in shared memory start on one, and tinygrad's CPU kernels load aligned
PAGE = 4096  # bytes: a memory page; a slot pool's header, and the size below which bytes travel in the pickle


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fname(f: Callable) -> str:
    """A short name for a function in descriptions."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
    return name.replace(".<locals>", "")


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` pointing at the first caller outside lazyseq (the user's line), however
    deep inside the package the cause was seen."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
