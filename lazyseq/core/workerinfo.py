"""``worker_info()``: which worker runs this code, as ``torch.utils.data.get_worker_info()`` says it.

Every backend calls its start hook once in each worker before its first item; :class:`WorkerStart`
wraps that hook (the user's ``start_hook`` or the DataLoader's ``worker_init_fn``) and records the
worker first, so the hook sees it too. Thread workers share the reader's process: the record is
per thread there; a worker process or Ray actor records it for the whole process. The hook is
pickled together with the sequence (the backends send them as one pickle), so ``dataset`` is the
worker's own copy, the object its items are read from.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["WorkerInfo", "WorkerStart", "set_thread", "worker_info"]


class WorkerInfo(NamedTuple):
    """This worker's index (``id``, from 0), how many workers its prefetch has, its random seed
    (a DataLoader's: the one its global generators were seeded from; None for a bare prefetch),
    and ``dataset``: the worker's copy of the DataLoader's dataset (of the prefetch's sequence)."""

    id: int
    num_workers: int
    seed: int | None
    dataset: Any


_thread = threading.local()
_process: list[WorkerInfo] = []  # a worker process's record, for every thread of it


def worker_info() -> WorkerInfo | None:
    """In a prefetch or DataLoader worker (thread, process or Ray actor, and inside
    ``worker_init_fn``), a :class:`WorkerInfo`; in the main process (the reader), ``None``.

    >>> import lazyseq
    >>> lazyseq.worker_info() is None
    True
    >>> with lazyseq.prefetch(lazyseq.smap(lambda i: lazyseq.worker_info().num_workers, range(4)), 2) as p:
    ...     list(p)
    [2, 2, 2, 2]
    """
    info = getattr(_thread, "info", None)
    return info if info is not None else _process[0] if _process else None


def set_thread(info: WorkerInfo | None) -> None:
    """This thread works for the worker ``info`` (the async backend's pool threads, for its loop)."""
    _thread.info = info


class WorkerStart:
    """The start hook the backends run in each worker: records :class:`WorkerInfo`, then calls
    ``hook(index)``. A hook with ``worker_seed(index)`` (the DataLoader's) gives the seed, and one
    with a ``dataset`` attribute gives the dataset (else the sequence is the dataset)."""

    def __init__(self, hook: Callable[[int], Any] | None, nworkers: int, seq: Any):
        self.hook, self.nworkers, self.seq, self.owner = hook, nworkers, seq, os.getpid()

    def __call__(self, index: int) -> None:
        hook = self.hook
        seed = hook.worker_seed(index) if hasattr(hook, "worker_seed") else None
        dataset = hook.dataset if hasattr(hook, "dataset") else self.seq
        info = WorkerInfo(index, self.nworkers, seed, dataset)
        _thread.info = info
        if os.getpid() != self.owner:  # a worker process (or actor) of its own: every thread of it
            _process[:] = [info]
        if hook is not None:
            hook(index)
