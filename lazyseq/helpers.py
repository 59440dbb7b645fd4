"""Constants and small functions every layer uses; imports nothing of lazyseq."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

ALIGN = 64  # bytes: a cache line; buffers in shared memory start on one, and tinygrad's CPU kernels load aligned
PAGE = 4096  # bytes: a memory page; a slot pool's header, and the size below which bytes travel in the pickle


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


# Linux-only calls each have a portable path (macOS, the BSDs); LAZYSEQ_FORCE_FALLBACKS makes
# lazyseq take those paths on Linux too, so that CI runs them. Read at each use (cheap, and rare):
# spawned workers inherit the environment, where a monkeypatch in the parent would not reach.
FALLBACKS = {
    "memfd": "shared-memory segments through shm_open + immediate unlink, not memfd_create",
    "poll": "workers' pipes watched through selectors.DefaultSelector, not select.poll",
    "affinity": "usable cores from os.cpu_count, not sched_getaffinity",
    "sched": "workers keep the default scheduling policy (no SCHED_BATCH)",
}


def forced(fallback: str) -> bool:
    """Whether ``LAZYSEQ_FORCE_FALLBACKS`` (a testing aid: ``all`` or comma-separated names of
    :data:`FALLBACKS`) asks for the portable path ``fallback`` even where the Linux one exists."""
    value = os.environ.get("LAZYSEQ_FORCE_FALLBACKS", "")
    if not value:
        return False
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = names - FALLBACKS.keys() - {"all"}
    if unknown:
        raise ValueError(f"LAZYSEQ_FORCE_FALLBACKS: unknown fallback(s) {sorted(unknown)}; "
                         f"known: all, {', '.join(FALLBACKS)}")
    return fallback in names or "all" in names


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one, as on Linux;
    all the machine's cores elsewhere, e.g. macOS).

    >>> from lazyseq.helpers import usable_cores
    >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
    True
    """
    if hasattr(os, "sched_getaffinity") and not forced("affinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fname(f: Callable) -> str:
    """A short name for a function in descriptions."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
    return name.replace(".<locals>", "")


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def span(r: range, what: str = "item") -> str:
    """``r`` in words: ``item 5``, ``items 5-8``, ``items 1-9 (step 2)``.

    >>> span(range(5, 6)), span(range(5, 9)), span(range(1, 10, 2), "batch")
    ('item 5', 'items 5-8', 'batches 1-9 (step 2)')
    """
    plural = f"{what}es" if what.endswith(("s", "sh", "ch", "x")) else f"{what}s"
    if len(r) == 1:
        return f"{what} {r[0]}"
    if not r:
        return f"no {plural}"
    return f"{plural} {r[0]}-{r[-1]}" + ("" if r.step == 1 else f" (step {r.step})")


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` pointing at the first caller outside lazyseq (the user's line), however
    deep inside the package the cause was seen."""
    # stacklevel 1 is this function's own line: the frame that called it is level 2
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def need(module: str, what: str, name: str, install: str) -> Any:
    """``import module`` for an optional framework, or ImportError saying that ``what`` needs
    ``name`` and how to install it (``install``)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs {name}, which is not installed: {install}") from e
