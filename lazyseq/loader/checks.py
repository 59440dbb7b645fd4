"""The DataLoader's argument checks: PyTorch's (with its messages, in its order), then lazyseq's
own (``method`` and what applies to it only)."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from typing import Any

from ..evaluation import prefetch
from .seeding import IN_PROCESS, refused

__all__ = ["torch_checks", "method_checks", "order_checks", "seed_from"]


def torch_checks(batch_size: int | None, shuffle: bool | None, sampler: Any, batch_sampler: Any, num_workers: int,
                 drop_last: bool, timeout: float, multiprocessing_context: Any,
                 prefetch_factor: int | None, persistent_workers: bool) -> tuple[int | None, bool, bool, int | None, Any]:
    """PyTorch's argument checks and messages, in its order; returns the arguments as the loader
    uses them: (batch_size, shuffle, drop_last, prefetch_factor, multiprocessing context)."""
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                         "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
        batch_size, drop_last = None, False
    # batch_size=None with drop_last=True: torch refuses it; here the dataset's items may be batches
    # (a bucket), and drop_last gives every rank the same number of them (shard's drop_remainder)
    if multiprocessing_context is not None:
        if num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading "
                             f"(num_workers > 0), but got num_workers={num_workers}")
        if isinstance(multiprocessing_context, str):
            methods = multiprocessing.get_all_start_methods()
            if multiprocessing_context not in methods:
                raise ValueError(f"multiprocessing_context option should specify a valid start method in {methods!r}, "
                                 f"but got multiprocessing_context={multiprocessing_context!r}")
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        elif not isinstance(multiprocessing_context, multiprocessing.context.BaseContext):
            raise TypeError("multiprocessing_context option should be a valid context object or a string "
                            f"specifying the start method, but got multiprocessing_context={multiprocessing_context}")
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size <= 0):
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
    return batch_size, shuffle, drop_last, prefetch_factor, multiprocessing_context


def method_checks(method: Any, num_workers: int, shm_size: int | None, multiprocessing_context: Any,
                  seed_each_item: bool) -> None:
    """``method`` is whatever ``lazyseq.prefetch`` accepts (asked of prefetch itself: a new backend
    needs no change here); ``shm_size`` and ``multiprocessing_context`` concern process workers
    only; ``seed_each_item`` is refused with workers in the reader's process (threads, an event
    loop), which share the global generators (any other such backend is refused when its workers
    start, by ``seeding.WorkerInit``)."""
    try:  # a prefetch that starts nothing: its checks of the method are the ones that count
        prefetch([], 1, method, lazy_start=True)
    except (ValueError, TypeError, ImportError) as e:  # an unknown method; a known one not installed
        raise type(e)(f"DataLoader(method={method!r}): {e}") from None
    if method != "process":
        if shm_size:
            raise ValueError(f"DataLoader: shm_size sizes the shared memory of worker processes, which "
                             f"method={method!r} does not use; leave shm_size=None (or use method='process')")
        if multiprocessing_context is not None:
            raise ValueError(f"DataLoader: multiprocessing_context starts worker processes, which "
                             f"method={method!r} does not use; leave it None (or use method='process')")
    if seed_each_item and method in IN_PROCESS and num_workers > 0:
        raise ValueError(refused(method))


def order_checks(dataset: Any, shuffle: bool) -> None:
    """Warn when ``shuffle=True`` would read a view meant to be read in order (``ordered_only``: a
    mix that follows a weight schedule, whose weights are a function of the position)."""
    from ..views.epochs import _walk  # (the walk over a pipeline's views that at_epoch uses)

    if shuffle and any(getattr(v, "ordered_only", False) for v in _walk(dataset, set())):
        warnings.warn("DataLoader(shuffle=True) reads a mix that follows a weight schedule out of order, so "
                      "the schedule's weights no longer follow the training step; read it in order "
                      "(shuffle=False) and shuffle inside each source instead (lazyseq.shuffle(source, seed=...))",
                      UserWarning, stacklevel=3)


def seed_from(seed: int | None, generator: Any) -> int:
    if seed is not None:
        return int(seed)
    if generator is not None:
        if hasattr(generator, "initial_seed"):  # torch.Generator
            return int(generator.initial_seed())
        if hasattr(generator, "integers"):  # numpy Generator
            return int(generator.integers(2**63))
        raise TypeError(f"DataLoader: generator must be a torch.Generator or numpy Generator, got {type(generator).__name__}")
    return int.from_bytes(os.urandom(8), "little") >> 1
