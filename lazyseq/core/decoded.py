"""A few decoded blocks kept in memory, least recently used out, decoded once however many threads
ask for them: the cache of every source stored in blocks (Parquet row groups, Arrow record
batches, Lance fragments).

A thread that needs a block another thread is decoding waits for that decode (in steps of
``WAIT`` seconds, so it never hangs on a lost wakeup) instead of decoding it again: 32 prefetch
threads reading neighbouring rows cost one decode, and over a URL one set of requests. Decoded
blocks plus blocks being decoded stay within ``capacity``. A forked child starts with an empty
cache and fresh locks (a parent's thread may have held one at the fork).

>>> c = DecodedCache(2)
>>> c.get(0, lambda k: [k] * 3), c.get(1, str), c.get(2, float), c.held()
([0, 0, 0], '1', 2.0, [1, 2])
>>> c.peek(1), c.peek(0), c.held()  # a held block counts as used; one not held is not decoded
('1', None, [2, 1])
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["DecodedCache", "fork_mark"]

WAIT = 1.0  # seconds between checks while another thread decodes the block wanted

_forks = [0]  # bumped in a forked child: cheaper to compare than os.getpid() on every read
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def fork_mark() -> int:
    """A number that changes in a forked child: state made before a fork compares its mark."""
    return _forks[0]


class DecodedCache:
    """At most ``capacity`` decoded blocks by key; :meth:`get` decodes a missing one once."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"the cache holds at least one decoded block, got {capacity}")
        self.capacity = capacity
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # a decode finished (or failed)
        self._held: OrderedDict[Hashable, Any] = OrderedDict()  # least recently used first
        self._pending: set[Hashable] = set()  # keys some thread is decoding
        self._fork = _forks[0]
        self.last: tuple[Hashable, Any] = (None, None)  # the most recently used block: read without the lock

    def fresh(self) -> bool:
        """True in the process that made the cache; in a forked child, empties it first (False)."""
        if self._fork == _forks[0]:
            return True
        self._reset()
        return False

    def peek(self, key: Hashable) -> Any:
        """The block ``key`` if it is held (counted as used), else None; takes no lock: a hit is a
        lookup and a move in the LRU order, each one step under the GIL (an eviction between the
        two leaves the block with this reader, as a hit under the lock would)."""
        if self._fork != _forks[0]:
            return None
        data = self._held.get(key)
        if data is not None:
            try:
                self._held.move_to_end(key)
            except KeyError:  # evicted meanwhile by another thread
                pass
            self.last = (key, data)
        return data

    def get(self, key: Hashable, decode: Callable[[Hashable], Any]) -> Any:
        """The block ``key``: held, being decoded by another thread (waited for), or ``decode(key)`` here."""
        data = self.peek(key)
        if data is not None:
            return data
        self.fresh()
        with self._lock:
            while True:
                data = self._held.get(key)
                if data is not None:
                    self._held.move_to_end(key)
                    self.last = (key, data)
                    return data
                if key not in self._pending:
                    break
                self._done.wait(WAIT)
            self._pending.add(key)
            while self._held and len(self._held) + len(self._pending) > self.capacity:
                self._evict()
        data = None
        try:
            data = decode(key)
            return data
        finally:
            with self._lock:
                self._pending.discard(key)
                if data is not None:
                    while self._held and len(self._held) + len(self._pending) >= self.capacity:
                        self._evict()
                    self._held[key] = data
                    self.last = (key, data)
                self._done.notify_all()

    def _evict(self) -> None:  # the least recently used block (with the lock held)
        key, _ = self._held.popitem(last=False)
        if self.last[0] == key:
            self.last = (None, None)

    def held(self) -> list:
        """The keys of the blocks in memory, least recently used first."""
        self.fresh()
        with self._lock:
            return list(self._held)

    def clear(self) -> None:
        self.fresh()
        with self._lock:
            self._held.clear()
            self.last = (None, None)
