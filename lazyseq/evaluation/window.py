"""The window: which chunk jobs to run ahead of the reader, and waiting for the item it wants.

Reading in order keeps up to ``max_buffered`` jobs in flight from the reader's position on; chunks
grow as jobs come back, up to about the backend's ``JOB_SECONDS`` of work each and what the backend says fits
(its ``chunk_cap``); a jump restarts the window at the new index, cancelling jobs no longer wanted
and stepping over those still wanted; a reader that walks with a stride is followed. The window
talks to one :class:`~lazyseq.evaluation.backend.Backend` and knows nothing of how it works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..core.node import Exhausted, length
from ..errors import PrefetchTimeout
from . import wire
from .backend import STREAM, Backend, Result

__all__ = ["Window"]

_CHUNK_MAX = 1024
# Seconds a wanted item waits for given-up jobs (which a worker may be inside) to free room or
# their worker, before it gets a job of its own (through a slower path, or on another worker).
_PATIENCE = 0.05
# A job outstanding this many times what it should cost, and at least _LATE_FLOOR seconds, is held
# up by a slow or stuck item: its wanted item gets a job of its own (items of uneven cost are
# normal, and a duplicate costs work, hence the margins).
_LATE, _LATE_FLOOR = 50, 1.0
_POLL = 0.5  # seconds between looks at the workers' health while waiting


def _cache_budget() -> int:
    """Bytes of results to keep ahead of the reader: half the last-level cache. Items computed
    further ahead have left the cache when the reader gets to them (measured: 4 MiB items, ten
    ahead, cost the reader 1.5x the CPU of three ahead). 32 MiB where the OS does not tell."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip().upper()
        size = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    except (OSError, ValueError):
        size = 32 << 20
    return max(size // 2, 4 << 20)


BUDGET = _cache_budget()


class Window:
    """The jobs in flight and the results ready for one reader of ``seq`` through ``backend``."""

    COUNTERS: ClassVar[dict[str, float]] = dict(items=0, jobs=0, chunk=1, waits=0, wait_seconds=0.0, jumps=0,
                                                moved=0, busy_seconds=0.0)

    def __init__(self, seq: Any, backend: Backend, nworkers: int, max_buffered: int, timeout: float | None,
                 stats: dict, describe: str):
        self.seq, self.backend, self.nworkers, self.max_buffered = seq, backend, nworkers, max_buffered
        self.timeout, self.stats, self.describe = timeout, stats, describe
        self.finite = not isinstance(length(seq), type(None))
        self.jobs: dict[int, tuple[range, int]] = {}  # job id -> (indices, generation)
        self.done: dict[int, int] = {}  # job id -> items it has answered in parts (a slow item holds the rest)
        self.sent: dict[int, float] = {}  # job id -> when it was sent
        self.cancelled: set[int] = set()  # jobs given up, not yet answered by their worker
        self.ready: dict[int, Any] = {}  # index -> item (or wire.ItemError)
        self.next_job, self.gen = 0, 0  # the generation changes at each jump
        # Reading position and scheduling front (indices), the stride the reader walks with, the
        # last step seen (a step seen twice becomes the stride), and where the last jump went.
        self.pos, self.front, self.stride, self.delta, self.origin = 0, 0, 1, 0, 0
        self.skips: list[tuple[int, int]] = []  # spans (in strides from origin) kept over a jump, nearest last
        self.end: int | None = None  # where a source of unknown size was found to end
        self.last: int | None = None  # the index read last (not the item: that would pin its memory)
        self.chunk, self.ramp = 1, max_buffered  # items per job; jobs in flight allowed now
        self.item_seconds, self.item_bytes = 0.0, 0.0  # smoothed cost of one item
        # Chunks hold at least this many items once costs are known, so that max_buffered jobs can
        # keep every worker busy (an async backend runs far more items at once than max_buffered).
        self.floor = -(-nworkers // max_buffered)
        # Where results go during an unordered pass (completion.Completion): (indices, items)
        self.sink: Callable[[range, list], None] | None = None

    # -- reads -----------------------------------------------------------------------------------
    def read(self, i: int) -> Any:
        """Item ``i`` (or its ``wire.ItemError``), moving the window to follow the reader. The
        same item twice in a row gets a job of its own (a fresh object, as ``seq[i]`` would be)."""
        if i == self.last:
            return self.wait(i)
        if i != self.pos:
            self.jump(i)
        else:
            self.ramp = min(self.max_buffered, self.ramp * 2)
        if i not in self.ready:  # (a read in order usually finds its item there: nothing to start)
            self.schedule()
        value = self.wait(i)
        self.last, self.pos = i, i + self.stride
        self.schedule()
        return value

    def clear(self) -> None:
        """Forget every job and result (the backend is closed)."""
        self.ready.clear()
        self.jobs.clear()
        self.done.clear()
        self.cancelled.clear()
        self.sent.clear()

    def drop_all(self) -> None:
        """Give up every job and ready item (an unordered pass begins or ends): the next read
        starts the window afresh; what cancelled jobs still answer is kept only where wanted."""
        self._cancel(set(self.jobs) - self.cancelled)
        self.ready.clear()
        self.gen += 1
        self.skips, self.last, self.ramp, self.stride, self.delta = [], None, 1, 1, 0
        self.pos = self.front = self.origin = 0

    def in_flight(self) -> int:
        return len(self.jobs) - len(self.cancelled)

    def _wanted(self, j: int) -> bool:
        """Whether item ``j`` of a job sent before the last jump (or given up) is still wanted: it
        lies on the reader's path ahead, within the window, or where scheduling went past it
        counting on that job (behind the front, or in a span kept over a jump)."""
        s = self.stride
        d = j - self.pos
        if d % s or d // s < 0:
            return False
        if d // s < self._horizon() or (j - self.front) // s < 0:
            return True
        k = (j - self.origin) // s
        return any(a <= k < b for a, b in self.skips)

    def _horizon(self) -> int:
        return self.max_buffered * self.chunk

    # -- jumps -----------------------------------------------------------------------------------
    def jump(self, i: int) -> None:
        """Restart the window at ``i``: keep what is still wanted, give up the rest."""
        self.stats["jumps"] += 1
        delta = i - self.last if self.last is not None else 0
        if delta != 0 and delta == self.delta:
            self.stride = delta  # the same step twice: the reader walks with this stride (any size)
        self.delta = delta
        self.pos, self.gen, s = i, self.gen + 1, self.stride
        end = i + self._horizon() * s  # what the old window would have reached

        def inside(j: int) -> bool:
            return (j - i) % s == 0 and (i <= j < end if s > 0 else end < j <= i)

        for j in [j for j in self.ready if not inside(j)]:
            del self.ready[j]
        kept = [range(j, j + s, s) for j in self.ready]
        stale = set()
        for job_id, (r, _gen) in self.jobs.items():
            if job_id in self.cancelled:  # its worker skips it, unless inside an item of it
                at = self.backend.where(job_id)
                if at is not None and at[0] is not None and inside(at[0]):
                    kept.append(range(at[0], at[0] + s, s))  # (maybe stuck: no second worker for it)
                continue
            aligned = len(r) and r.step == s and (r[0] - i) % s == 0
            if aligned and (r[-1] >= i and r[0] < end if s > 0 else r[-1] <= i and r[0] > end):
                kept.append(r)
            elif i in r:
                kept.append(range(i, i + s, s))
            else:
                stale.add(job_id)
        self._cancel(stale)
        # Random reads should not start a full window each: start small, ramp up as reads go on.
        self.ramp, self.chunk = 1, 1
        self._skip_over(kept, i, s)
        self.origin, self.front = i, i

    def _skip_over(self, kept: list[range], i: int, s: int) -> None:
        """Scheduling restarts at ``i`` and steps over the spans still ready or in flight."""
        spans = sorted((max(0, (r[0] - i) // s), (r[-1] - i) // s + 1) for r in kept)
        self.skips = []
        for a, b in spans:
            if self.skips and a <= self.skips[-1][1]:
                self.skips[-1] = (self.skips[-1][0], max(b, self.skips[-1][1]))
            else:
                self.skips.append((a, b))
        self.skips.reverse()  # the nearest last, to pop

    def _cancel(self, job_ids: set[int]) -> None:
        if job_ids:
            for job_id in self.backend.cancel(job_ids):  # those that will never answer
                del self.jobs[job_id]
                self.sent.pop(job_id, None)
                self.done.pop(job_id, None)
            self.cancelled |= job_ids & self.jobs.keys()

    # -- scheduling ------------------------------------------------------------------------------
    def _rest(self) -> range | None:
        """The indices still to schedule from the front, in stride order (None: unbounded)."""
        n = length(self.seq) if self.end is None else self.end
        s = self.stride
        if s > 0:
            return range(self.front, n, s) if n is not None else None
        return range(self.front, -1, s)

    def schedule(self) -> None:
        """Send jobs from the front while the window has room."""
        # Until a first chunk is back, what an item costs (time, bytes) is unknown: one job per worker.
        ramp = self.ramp if self.stats["items"] else min(self.ramp, self.nworkers)
        while self.in_flight() < ramp:
            ahead = (self.front - self.pos) // self.stride
            if ahead >= self._horizon():
                return
            if self.item_bytes and self.in_flight() >= self.nworkers and ahead * self.item_bytes > BUDGET:
                return  # enough bytes ahead: more would be out of the cache when read
            rest = self._rest()
            count = self.chunk if rest is None else min(self.chunk, len(rest))
            if count <= 0:
                return
            s = self.stride
            if self.skips:  # stop short of the next span kept over a jump
                count = min(count, self.skips[-1][0] - (self.front - self.origin) // s)
            if count > 0:
                wanted = not self.jobs and self.front == self.pos  # the item the reader needs next
                if not self._submit(range(self.front, self.front + count * s, s), wanted):
                    return  # no room: answers (or the reader dropping items) make some
                self.front += count * s
            while self.skips and (self.front - self.origin) // s >= self.skips[-1][0]:
                end = self.skips.pop()[1]
                if (self.front - self.origin) // s < end:
                    self.front = self.origin + end * s

    def _submit(self, r: range, wanted: bool) -> bool:
        job_id = self.next_job
        if not self.backend.submit(job_id, r, wanted):
            return False
        self.next_job += 1
        self.jobs[job_id] = (r, self.gen)
        self.sent[job_id] = time.monotonic()
        self.stats["jobs"] += 1
        return True

    def _schedule_item(self, i: int) -> None:
        """Give the wanted item a job of its own: it has none (given-up work holds the room), or
        its jobs are held up by a slow or stuck item."""
        self._submit(range(i, i + 1), True)

    # -- waiting ---------------------------------------------------------------------------------
    def wait(self, i: int) -> Any:
        """Item ``i``, once it arrives (``PrefetchTimeout`` past the timeout)."""
        if i in self.ready:
            return self.ready.pop(i)
        t0 = time.monotonic()
        deadline = None if self.timeout is None else t0 + self.timeout
        self.stats["waits"] += 1
        patience = None  # until when the wanted item waits for room that given-up jobs hold
        try:
            while i not in self.ready:
                left, patience = self._unblock(i, t0, patience)
                if deadline is not None:
                    left = min(left, deadline - time.monotonic())
                    if left <= 0:
                        raise PrefetchTimeout(f"prefetch: item {i} did not arrive within timeout={self.timeout}s "
                                              f"({self.describe})", i)
                self.collect(self.backend.poll(max(left, 0.0)))
                self.backend.check()
                self.schedule()  # jobs finished while waiting: keep the workers fed
            return self.ready.pop(i)
        finally:
            self.stats["wait_seconds"] += time.monotonic() - t0

    def _unblock(self, i: int, t0: float, patience: float | None) -> tuple[float, float | None]:
        """Make sure item ``i`` is on its way; returns how long to wait for answers, and until when
        the item waits for given-up jobs to make room."""
        jobs = [j for j, (r, _) in self.jobs.items() if i in r[self.done.get(j, 0) :]]
        if jobs:
            wait = self._held_up(i, jobs, t0)
            if wait is not None:
                return wait, patience
            jobs = [j for j in jobs if j in self.jobs and self.backend.where(j) is None]
        if jobs:
            late = self._late_after(jobs, t0)
            if late is None or late > time.monotonic():
                return (_POLL if late is None else late - time.monotonic()), patience
            self._cancel(set(jobs) - self.cancelled)  # a slow or stuck item holds them up: go on alone
        elif self.cancelled and not self.backend.room():
            # Given-up jobs make room as soon as their worker skips them, unless it is inside one
            # (a slow or stuck item): then the item takes the slower path.
            now = time.monotonic()
            patience = now + _PATIENCE if patience is None else patience
            if patience > now:
                return patience - now, patience
        self._schedule_item(i)
        return _POLL, patience

    def _held_up(self, i: int, jobs: list[int], t0: float) -> float | None:
        """For the jobs holding item ``i`` whose worker says where it is: wait while it is inside
        ``i`` (a second worker could only get stuck with it if it never ends: it arrives, or the
        reader's timeout names it) or progresses; a job whose worker has been inside another
        item (or job) for long goes to another worker from ``i`` on. Returns how long to wait
        (None: no job can tell)."""
        now, wait = time.monotonic(), None
        limit = max(2 * STREAM, _LATE * self.item_seconds)
        for j in jobs:
            at = self.backend.where(j)
            if at is None:
                continue
            x, since = at
            if x == i:
                return _POLL
            if j in self.cancelled:
                continue  # given up (or moved) already: what it answers is kept where wanted
            stalled = max(since, t0) + limit
            if stalled > now:
                wait = min(wait if wait is not None else _POLL, stalled - now)
                continue
            r = self.jobs[j][0]
            self._cancel({j})  # what it still answers is kept where wanted; its worker gets no more jobs
            if j in self.jobs and self._submit(r[r.index(i) :], True):
                self.stats["moved"] += 1
            wait = _POLL
        return wait

    def _late_after(self, jobs: list[int], t0: float) -> float | None:
        """When the jobs that hold the wanted item, and whose worker cannot say where it is (see
        ``_held_up``), count as held up: None while there is no telling. Counted from when the
        reader began to wait (``t0``) at the earliest: answers may have waited on the pipe while
        the reader did other things."""
        backend, limit = self.backend, _PATIENCE
        for j in jobs:
            if j in self.cancelled:
                continue  # given up: _PATIENCE is enough
            if not self.item_seconds or not backend.started(j):
                return None  # no chunk back yet, or a worker still starting: no telling what is slow
            limit = max(limit, _LATE_FLOOR, _LATE * self.item_seconds * len(self.jobs[j][0]))
        return max(t0, *(self.sent[j] for j in jobs)) + limit

    # -- results ---------------------------------------------------------------------------------
    def collect(self, done: list[Result]) -> None:
        for res in done:
            late = res.job_id in self.cancelled  # given up (maybe after it started): keep what is still wanted
            if res.final:
                job = self.jobs.pop(res.job_id, None)
                self.cancelled.discard(res.job_id)
                self.sent.pop(res.job_id, None)
                self.done.pop(res.job_id, None)
            else:
                job = self.jobs.get(res.job_id)
            if job is None or res.items is None:
                continue
            r, gen = job
            items = res.items
            part = r[res.first : res.first + len(items)]
            if res.final:
                self._adapt(len(r), res.seconds, res.nbytes)
                self.stats["busy_seconds"] += res.seconds  # the workers' time in jobs: idle = wall x nworkers - this
            elif res.first <= self.done.get(res.job_id, 0):  # (parts may come out of order: keep the prefix)
                self.done[res.job_id] = max(self.done.get(res.job_id, 0), res.first + len(items))
            self.stats["items"] += len(part)
            if not self.finite:
                self._find_end(items)
            if self.sink is not None:  # an unordered pass takes every item (it knows which it still owes)
                self.sink(part, items)
                continue
            if items and items[0] is wire.RESEND:  # to be asked for again, one by one
                continue
            if gen == self.gen and not late:
                self.ready.update(zip(part, items))
            else:
                self.ready.update((j, x) for j, x in zip(part, items) if self._wanted(j))

    def _find_end(self, items: list) -> None:
        """Note where a source of unknown size ends, from the first item past it."""
        for x in items:
            if type(x) is wire.ItemError and isinstance(x.error, Exhausted):
                self.end = x.index if self.end is None else min(x.index, self.end)
                return

    def _adapt(self, count: int, seconds: float, nbytes: int) -> None:
        """Grow chunks as jobs complete, within the time budget and what the backend can carry."""
        per_item = seconds / max(count, 1)
        self.item_seconds = per_item if self.item_seconds == 0 else 0.7 * self.item_seconds + 0.3 * per_item
        cap = _CHUNK_MAX
        if self.item_seconds > 0:
            cap = min(cap, max(1, self.floor, int(self.backend.JOB_SECONDS / self.item_seconds)))
        self.item_bytes = max(self.item_bytes * 0.7, nbytes / max(count, 1))
        most = self.backend.chunk_cap(self.item_bytes)
        if most is not None:
            cap = min(cap, most)
        self.chunk = max(1, min(max(self.chunk * 2, self.floor), cap))
        self.stats["chunk"] = self.chunk
