"""Instruments: watch the items a pipeline reads, and how fast."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .base import View
from .errors import wrap_error
from .helpers import fname
from .node import check_source, is_finite, read_many, reader

__all__ = ["debug", "monitor_throughput"]


class Debug(View):
    def __init__(self, seq: Any, func: Callable, max_calls: int | None, max_rate: float | None):
        self.src, self._rd = check_source(seq, "debug"), reader(seq)
        self.func, self.max_calls, self.max_rate = func, max_calls, max_rate
        self.n_calls, self.last_call = 0, -float("inf")
        self.finite = is_finite(seq)

    def _silent(self) -> bool:
        if self.max_calls is not None and self.n_calls >= self.max_calls:
            return True
        return self.max_rate is not None and time.monotonic() - self.last_call < 1.0 / self.max_rate

    def _get(self, i: int) -> Any:
        value = self._rd(i)
        if not self._silent():
            self.n_calls, self.last_call = self.n_calls + 1, time.monotonic()
            try:
                self.func(i, value)
            except Exception as e:
                raise wrap_error(e, i, self)  # noqa: B904
        return value

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value

    def describe(self) -> str:
        return f"debug({fname(self.func)})"


def debug(seq: Any, func: Callable, max_calls: int | None = None, max_rate: float | None = None) -> View:
    """Call ``func(index, item)`` whenever an item is read, at most ``max_calls`` times and at most
    ``max_rate`` times a second.

    >>> import lazyseq
    >>> watched = lazyseq.instrument.debug([1, 2, 3, 4, 5], lambda i, v: print(i, v), max_calls=2)
    >>> x = watched[0]
    0 1
    >>> y = watched[2]
    2 3
    >>> z = watched[3]
    """
    return Debug(seq, func, max_calls, max_rate)


class ThroughputMonitor(View):
    def __init__(self, seq: Any):
        self.src, self._rd = check_source(seq, "monitor_throughput"), reader(seq)
        self.finite = is_finite(seq)
        self._setup()

    def _setup(self) -> None:
        self._lock, self.n_calls, self.time_spent = threading.Lock(), 0, 0.0

    def __getstate__(self) -> dict:
        return {"src": self.src, "_rd": self._rd, "finite": self.finite}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def reset(self) -> None:
        """Forget the reads measured so far."""
        with self._lock:
            self.n_calls, self.time_spent = 0, 0.0

    def throughput(self) -> float:
        """Items per second over the reads measured so far."""
        if self.n_calls == 0:
            raise RuntimeError("monitor_throughput: no item was read yet, so there is no throughput")
        return self.n_calls / self.time_spent

    def read_delay(self) -> float:
        """Average seconds per item read."""
        if self.n_calls == 0:
            raise RuntimeError("monitor_throughput: no item was read yet, so there is no read delay")
        return self.time_spent / self.n_calls

    def _count(self, n: int, dt: float) -> None:
        with self._lock:
            self.n_calls += n
            self.time_spent += dt

    def _get(self, i: int) -> Any:
        t = time.perf_counter()
        value = self._rd(i)
        self._count(1, time.perf_counter() - t)
        return value

    def _get_many(self, idx: Sequence[int]) -> list:
        t = time.perf_counter()
        values = read_many(self.src, idx)
        self._count(len(values), time.perf_counter() - t)
        return values

    def __iter__(self) -> Iterator:
        it = iter(self.src)
        while True:  # time the source's own iteration, not the consumer's work between items
            t = time.perf_counter()
            try:
                value = next(it)
            except StopIteration:
                return
            self._count(1, time.perf_counter() - t)
            yield value

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value

    def describe(self) -> str:
        return "monitor_throughput()"


def monitor_throughput(seq: Any) -> ThroughputMonitor:
    """Measure how long reading items of ``seq`` takes.

    The view has ``read_delay()`` (seconds per item), ``throughput()`` (items per second) and
    ``reset()``.

    >>> import lazyseq, time
    >>> slow = lazyseq.smap(lambda x: time.sleep(0.01) or x, list(range(5)))
    >>> watched = lazyseq.instrument.monitor_throughput(slow)
    >>> list(watched)
    [0, 1, 2, 3, 4]
    >>> 0.009 < watched.read_delay() < 0.5
    True
    """
    return ThroughputMonitor(seq)
