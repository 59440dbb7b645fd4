"""Completion order: the items of a range as they arrive, whichever backend computes them.

A :class:`Completion` drives the window's backend over ``range(start, stop)`` the way the window
does for an ordered reader (chunks sized from what items cost, at most ``max_buffered`` jobs in
flight, the bytes budget), but hands items over as they come back, parts of long jobs included,
so that a slow item holds up only itself. It knows no backend: whatever implements the protocol
of ``backend.py`` gets completion order.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..core.node import Exhausted
from ..errors import NotWrapped, PrefetchTimeout
from . import wire
from .backend import STREAM
from .window import _LATE, _POLL, BUDGET, Window

__all__ = ["Completion", "Unordered", "UnorderedOpen"]


class UnorderedOpen(NotWrapped, RuntimeError):
    """A read by index (or a second unordered pass) while an unordered iterator is open."""


class Completion:
    """One unordered pass over ``range(*span)`` (``stop`` None: until a source of unknown size
    ends) through ``window``'s backend. While it is open, the window's results go to it."""

    def __init__(self, window: Window, span: tuple[int, int | None]):
        self.w, (self.front, self.stop) = window, span
        window.drop_all()  # what an ordered reader had in flight is no longer wanted
        window.sink, self.gen = self._take, window.gen
        self.owed: set[int] = set()  # sent, not arrived
        self.out: deque[tuple[int, Any]] = deque()  # arrived, not handed over
        self.resend: deque[int] = deque()  # arrived as wire.RESEND: to be asked for alone
        self.moved: set[int] = set()  # jobs whose rest went to another job (held up by a slow item)
        self.closing = False  # set from another thread: the reader in next() stops at its next look
        self.look = 0.0  # when to look for held-up jobs next (a monotonic time)

    def close(self) -> None:
        """Give up the rest; the window starts afresh at the next ordered read."""
        w = self.w
        if w.sink == self._take:
            w.sink = None
            w.drop_all()
        self.owed.clear()
        self.out.clear()

    def next(self) -> tuple[int, Any] | None:
        """The next ``(index, item or wire.ItemError)`` to arrive; None when every item has."""
        w = self.w
        deadline = None if w.timeout is None else time.monotonic() + w.timeout
        while not self.out:
            if self.closing:
                return None
            self._schedule()
            if not self.owed and not self.resend:
                return None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                first = min(self.owed | set(self.resend))
                raise PrefetchTimeout(f"prefetch: no item arrived within timeout={w.timeout}s ({w.describe}); "
                                      f"{len(self.owed)} items owed, the first {first}", first)
            left = max(0.0, self.look - now)
            w.collect(w.backend.poll(left if deadline is None else min(left, deadline - now)))
            w.backend.check()
            self.look = time.monotonic() + self._move_held_up()
        return self.out.popleft()

    # -- results ---------------------------------------------------------------------------------
    def _take(self, part: range, items: list) -> None:
        """Results of any job (ours, or one an ordered reader gave up) for the indices still owed."""
        owed, stop = self.owed, self.stop
        for j, x in zip(part, items):
            if j not in owed:
                continue  # a duplicate (a moved job's rest), or not ours
            if x is wire.RESEND:
                self.resend.append(j)
            elif type(x) is wire.ItemError and isinstance(x.error, Exhausted):
                stop = j if stop is None else min(stop, j)  # a source of unknown size ends here
            else:
                self.out.append((j, x))
            owed.discard(j)
        if stop != self.stop:
            self.stop = stop
            self.owed = {j for j in owed if j < stop}
            self.resend = deque(j for j in self.resend if j < stop)

    # -- scheduling ------------------------------------------------------------------------------
    def _mine(self) -> list[int]:
        w = self.w
        return [j for j, (_r, gen) in w.jobs.items() if gen == self.gen and j not in w.cancelled]

    def _schedule(self) -> None:
        """Send jobs from the front while there is room: jobs in flight, items not yet handed over."""
        w = self.w
        while self.resend:
            if not w._submit(range(self.resend[0], self.resend[0] + 1), True):
                return
            self.owed.add(self.resend.popleft())
        # Until a first chunk is back, what an item costs is unknown: one job per worker.
        most = w.max_buffered if w.stats["items"] else min(w.max_buffered, w.nworkers)
        mine = len(self._mine())
        while mine < most:
            waiting = len(self.owed) + len(self.out)
            if waiting >= w.max_buffered * w.chunk:
                return
            if w.item_bytes and mine >= w.nworkers and waiting * w.item_bytes > BUDGET:
                return  # enough bytes waiting: more would be out of the cache when taken
            count = w.chunk if self.stop is None else min(w.chunk, self.stop - self.front)
            if count <= 0:
                return
            r = range(self.front, self.front + count)
            if not w._submit(r, mine == 0):  # none of ours in flight: the slower path rather than wait
                return
            self.owed.update(r)
            self.front += count
            mine += 1

    def _move_held_up(self) -> float:
        """A job whose worker has been inside one item for long: the rest of the job goes to
        another worker (the item itself stays where it is: a stuck item holds one worker); a job
        waiting behind it in that worker's queue goes whole. Returns when to look again."""
        w, now, look = self.w, time.monotonic(), _POLL
        inside = max(2 * STREAM, _LATE * w.item_seconds)  # items of uneven cost are normal: a margin
        # A job not started costs nothing to move (its worker skips it): a worker silent for a few
        # times what a job should take is held up.
        behind = max(2 * STREAM, 4 * w.item_seconds * w.chunk)
        for j in self._mine():
            if j in self.moved:
                continue
            at = w.backend.where(j)
            if at is None:
                continue
            limit = inside if at[0] is not None else min(inside, behind)
            if now - at[1] < limit:
                look = min(look, at[1] + limit - now + 0.001)
                continue
            r = w.jobs[j][0]
            self.moved.add(j)
            if at[0] is None:  # queued behind a slow item of an earlier job of its worker: all of it moves
                rest = r
                w._cancel({j})
            else:
                rest = r[r.index(at[0]) + 1 :]
            if any(x in self.owed for x in rest) and w._submit(rest, True):
                w.stats["moved"] += 1
        return look


def _next(window: Window, completion: Completion) -> tuple[int, Any] | None:
    return completion.next()


class Unordered:
    """The iterator :meth:`Prefetch.unordered` returns: ``(index, item)`` pairs as items complete.
    Closing it (``close()``, leaving a ``for`` loop, dropping it, a ``with`` block) gives up the
    work left; the prefetch goes on."""

    def __init__(self, p: Any, start: int, stop: int | None):  # under p's lock
        self._p = p
        self._pass: Completion | None = p._guarded(Completion, (start, stop))

    def __iter__(self) -> Unordered:
        return self

    def __next__(self) -> tuple[int, Any]:
        p = self._p
        with p._lock:
            if not self._open():
                raise StopIteration
            x = p._guarded(_next, self._pass)
            if x is None:
                self._finish()
                raise StopIteration
        i, value = x
        return i, p._deliver(i, value)

    def close(self) -> None:
        """Give up the items not yet taken (from any thread; idempotent)."""
        done = self._pass
        if done is None:
            return
        done.closing = True
        lock = self._p._lock
        if not lock.acquire(timeout=0.2):  # another thread is in next(): it finishes within _POLL seconds
            return
        try:
            self._finish()
        finally:
            lock.release()

    def _open(self) -> bool:
        """Whether it is open (under the prefetch's lock), finishing a close() from another thread."""
        if self._pass is not None and self._pass.closing:
            self._finish()
        return self._pass is not None

    def _finish(self) -> None:
        done, self._pass = self._pass, None
        if done is None:
            return
        if self._p._error is None:
            done.close()
        else:  # the prefetch is closed: nothing to cancel
            done.w.sink = None
        self._p._unordered = None

    def __enter__(self) -> Unordered:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit, or the prefetch half torn down: nothing left to give up
            pass
