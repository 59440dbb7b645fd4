"""add_cache: keep recently read items."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Any

from ..core.base import View
from ..core.jobslot import keepable
from ..core.node import check_source, is_finite, reader

__all__ = ["add_cache"]


class Cache(View):
    fingerprint_transparent = True  # a cache changes no item (lazyseq.fingerprint)

    def __init__(self, seq: Any, cache_size: int, cache: MutableMapping | None):
        self.src, self._rd = check_source(seq, "add_cache"), reader(seq)
        if cache_size < 0:
            raise ValueError(f"add_cache: cache_size must be >= 0, got {cache_size}")
        self.cache_size, self.own_cache = cache_size, cache is None
        self.cache = OrderedDict() if cache is None else cache
        self.finite = is_finite(seq)
        self._setup()

    def _setup(self) -> None:
        # The lock guards the mapping only; items are computed outside it, so different items are
        # evaluated concurrently and a second reader of an item being computed waits for it.
        self._lock, self._pending = threading.Lock(), {}

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_pending")}
        if self.own_cache:  # a copy (e.g. sent to a worker) starts empty rather than shipping items
            state["cache"] = OrderedDict()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _touch(self, i: int) -> tuple[bool, Any]:
        cache = self.cache
        if i in cache:
            value = cache.pop(i)
            cache[i] = value  # most recently used goes last
            return True, value
        return False, None

    def _get(self, i: int) -> Any:
        while True:
            with self._lock:
                hit, value = self._touch(i)
                if hit:
                    return value
                waiter = self._pending.get(i)
                if waiter is None:
                    done = self._pending[i] = threading.Event()
                    break
            waiter.wait()  # another thread computes it; if that failed, compute it here
        try:
            value = self._rd(i)
            with self._lock:
                if self.cache_size > 0:
                    cache = self.cache
                    while len(cache) >= self.cache_size:
                        del cache[next(iter(cache))]  # least recently used
                    cache[i] = keepable(value)  # not a view of a prefetch slot that will be reused
            return value
        finally:
            with self._lock:
                del self._pending[i]
            done.set()

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value
        with self._lock:
            if i in self.cache:
                self.cache[i] = value

    def describe(self) -> str:
        return f"add_cache({self.cache_size})"


def add_cache(seq: Any, cache_size: int = 1, cache: MutableMapping | None = None) -> View:
    """Keep the ``cache_size`` most recently used items of ``seq``, so reading them again is free.

    Least-recently-used items are evicted first (seqtools evicted the oldest insert). The cache is
    thread-safe without serialising work: different items are computed concurrently, and a reader
    asking for an item that another thread is computing waits for that result instead of computing
    it twice. ``cache`` may be any insertion-ordered mutable mapping to store items in. The view
    pickles (its default cache travels empty).

    >>> import lazyseq
    >>> def work(x):
    ...     print('working')
    ...     return x * 2
    >>> cached = lazyseq.add_cache(lazyseq.smap(work, [0, 1, 2, 3]))
    >>> cached[3]
    working
    6
    >>> cached[3]
    6
    """
    return Cache(seq, cache_size, cache)
