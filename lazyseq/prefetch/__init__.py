"""prefetch: the ordered window of work ahead of the reader, over thread or process workers."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from ..base import Exhausted, View, check_source, is_finite, length
from ..errors import EvaluationError, PrefetchClosed, PrefetchTimeout, passthrough, wrap_error
from . import wire
from .processes import ProcessBackend, close_parent_fd, parent_fd
from .slots import SlotPool, empty, empty_like
from .threads import ThreadBackend

__all__ = ["prefetch", "Prefetch", "empty", "empty_like"]

_CHUNK_MAX = 1024
_CHUNK_SECONDS = 0.004  # a chunk worth about this much work keeps the reader fed without stalls
# Seconds a wanted item waits for given-up jobs (which a worker may be inside) to free a slot or
# their worker, before it gets a job of its own (through the pipe, or on another worker).
_PATIENCE = 0.05
# A job outstanding this many times what it should cost, and at least _LATE_FLOOR seconds, is held
# up by a slow or stuck item: its wanted item gets a job of its own (items of uneven cost are
# normal, and a duplicate costs work, hence the margins).
_LATE, _LATE_FLOOR = 50, 1.0


def _cache_budget() -> int:
    """Bytes of results to keep ahead of the reader: half the last-level cache. Items computed
    further ahead have left the cache when the reader gets to them (measured: 4 MiB items, ten
    ahead, cost the reader 1.5x the CPU of three ahead)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip().upper()
        size = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    except (OSError, ValueError):
        size = 32 << 20
    return max(size // 2, 4 << 20)


_BUDGET = _cache_budget()


_forks = [0]  # bumped in a forked child: a prefetch made before the fork is not the child's to run
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class _Machinery:
    """What must be stopped when the prefetch goes away (held by its finalizer, not by it)."""

    def __init__(self) -> None:
        self.backend: Any = None
        self.pool: SlotPool | None = None
        self.owner, self.fork = os.getpid(), _forks[0]
        self.lock, self.stopped = threading.Lock(), False  # stopped: what starts later stops at once

    def stop(self) -> None:
        if os.getpid() != self.owner:  # a forked copy of the reader's objects: not ours to stop
            return
        with self.lock:
            self.stopped = True
            backend, self.backend = self.backend, None
            pool, self.pool = self.pool, None
        if backend is not None:
            backend.close()
        if pool is not None:
            close_parent_fd(pool)


class Prefetch(View):
    def __init__(self, seq: Any, nworkers: int, method: str, max_buffered: int, start_hook: Callable | None,
                 shm_size: int, mp_context: Any, timeout: float | None, lazy_start: bool):
        self.src = check_source(seq, "prefetch")
        if method not in ("thread", "process"):
            raise ValueError(f"prefetch: method must be 'thread' or 'process', got {method!r}")
        if max_buffered < 1:
            raise ValueError(f"prefetch: max_buffered must be >= 1, got {max_buffered}")
        if shm_size < 0:
            raise ValueError(f"prefetch: shm_size must be >= 0, got {shm_size}")
        if shm_size and method != "process":
            raise ValueError("prefetch: shm_size only applies to method='process' (threads share memory already)")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"prefetch: timeout must be > 0 seconds or None, got {timeout}")
        if isinstance(mp_context, str) or mp_context is None:
            mp_context = multiprocessing.get_context(mp_context)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.nworkers = max(1, cores + nworkers) if nworkers <= 0 else nworkers
        self.method, self.max_buffered, self.start_hook = method, max_buffered, start_hook
        self.shm_size, self.mp_context, self.timeout = shm_size, mp_context, timeout
        self.finite = is_finite(seq)
        self._setup()
        if not lazy_start:
            self._start()

    # -- life cycle ------------------------------------------------------------------------------
    def _setup(self) -> None:
        self._lock = threading.RLock()
        self._m = _Machinery()
        self._finalizer = weakref.finalize(self, self._m.stop)
        self._error: BaseException | None = None
        self._jobs: dict[int, tuple[range, int | None, int]] = {}  # id -> (indices, slot, generation)
        self._ready: dict[int, Any] = {}
        self._next_job, self._gen = 0, 0
        self._pos, self._stride, self._front, self._delta, self._origin = 0, 1, 0, 0, 0
        self._skips: list[tuple[int, int]] = []  # spans (in strides from _origin) kept over a jump
        self._end: int | None = None  # where a source of unknown size was found to end
        self._cancelled: set[int] = set()  # jobs given up, not yet answered by their worker
        self._sent: dict[int, float] = {}  # job -> when it was sent
        self._last: int | None = None  # the index read last (not the item: that would pin its slot)
        self._chunk, self._item_seconds, self._item_bytes, self._ramp = 1, 0.0, 0, self.max_buffered
        self._warned: set[str] = set()
        self._stats = dict(items=0, jobs=0, chunk=1, bytes_shm=0, bytes_pipe=0, fallbacks=0, waits=0,
                           wait_seconds=0.0, jumps=0)

    def _start(self) -> None:
        m = self._m
        if m.backend is not None:
            return
        try:
            if self.method == "thread":
                backend = ThreadBackend(self.src, self.nworkers, self.start_hook)
            else:
                pool = SlotPool(self.shm_size, self.max_buffered)
                with m.lock:
                    m.pool, stopped = pool, m.stopped
                if stopped:  # close() ran meanwhile (from another thread)
                    raise self._error or PrefetchClosed(f"{self.describe()} was closed")
                parent_fd(pool.fd)
                backend = ProcessBackend(self.src, self.nworkers, self.start_hook, self.mp_context, pool)
                close_parent_fd(pool)  # every worker holds its own descriptor or mapping now
            with m.lock:
                m.backend, stopped = backend, m.stopped
            if stopped:  # close() ran while the workers started: stop them now
                raise self._error or PrefetchClosed(f"{self.describe()} was closed")
        except BaseException:
            m.stop()
            raise

    def close(self) -> None:
        """Stop the workers and release the shared memory; items already read stay valid.

        Safe from any thread: a reader waiting for an item gets ``PrefetchClosed``."""
        if self._error is None:
            self._error = PrefetchClosed(f"{self.describe()} is closed; create a new one to read on")
        self._finalizer()  # idempotent; does not wait for the reader's lock
        if self._lock.acquire(blocking=False):
            try:
                self._ready.clear()
                self._jobs.clear()
                self._cancelled.clear()
                self._sent.clear()
            finally:
                self._lock.release()

    @property
    def closed(self) -> bool:
        """Whether it is closed (``close()``, a crashed worker, Ctrl-C while reading): reads raise."""
        return self._error is not None

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict:
        keep = ("src", "nworkers", "method", "max_buffered", "start_hook", "shm_size", "timeout", "finite")
        state = {k: self.__dict__[k] for k in keep}
        state["mp_context"] = self.mp_context.get_start_method()
        return state

    def __setstate__(self, state: dict) -> None:  # a copy (e.g. nested in a worker) starts on first read
        self.__dict__.update(state)
        self.mp_context = multiprocessing.get_context(state["mp_context"])
        self._setup()

    # -- reads -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.src) if self.finite else View.__len__(self)

    def _get(self, i: int) -> Any:
        with self._lock:
            if self._error is not None:
                raise self._error
            try:
                if self._m.fork != _forks[0]:  # a forked copy of a started prefetch: start afresh
                    self._setup()
                if self._m.backend is None:
                    self._start()
                # The same item again gets a job of its own (a fresh object, as seq[i] would be);
                # the window stays where it is.
                value = self._wait(i) if i == self._last else self._read(i)
            except (IndexError, PrefetchTimeout):
                if isinstance(self._error, PrefetchClosed):  # close() from another thread meanwhile
                    raise self._error from None
                raise  # about this item only: the prefetch goes on
            except BaseException as e:  # a crash, a failed start, Ctrl-C, close(): stop every worker
                if isinstance(self._error, PrefetchClosed) and not isinstance(e, KeyboardInterrupt):
                    raise self._error from None  # whatever close() from another thread broke on the way
                self.close()
                self._error = PrefetchClosed("prefetch: stopped by KeyboardInterrupt; create a new one") \
                    if isinstance(e, KeyboardInterrupt) else e
                raise
            if isinstance(self._error, PrefetchClosed):  # close() ran meanwhile: a waiting reader gets PrefetchClosed
                raise self._error
            return self._deliver(i, value)

    def _read(self, i: int) -> Any:
        if i != self._pos:
            self._jump(i)
        else:
            self._ramp = min(self.max_buffered, self._ramp * 2)
        if i not in self._ready:  # (a read in order usually finds its item there: nothing to start)
            self._schedule()
        value = self._wait(i)
        self._last, self._pos = i, i + self._stride
        self._schedule()
        return value

    def _deliver(self, i: int, value: Any) -> Any:
        if type(value) is not wire.ItemError:
            return value
        err = value.rebuild()
        if isinstance(err, Exhausted):  # a source of unknown size ended: iteration stops here
            raise err
        if passthrough():
            raise (err.__cause__ if isinstance(err, EvaluationError) and err.__cause__ is not None
                   and not isinstance(err.__cause__, wire.RemoteTraceback) else err)
        if isinstance(err, (EvaluationError, IndexError)):
            raise err  # as seq[i] raises it; the base class notes which item of this prefetch was read
        raise wrap_error(err, i, self)

    def _in_window(self, j: int) -> bool:
        d = j - self._pos
        return d % self._stride == 0 and 0 <= d // self._stride < self._horizon()

    def _horizon(self) -> int:
        return self.max_buffered * self._chunk

    def _jump(self, i: int) -> None:
        self._stats["jumps"] += 1
        delta = i - self._last if self._last is not None else 0
        if delta != 0 and delta == self._delta:
            self._stride = delta  # the same step twice: the reader walks with this stride (any size)
        self._delta = delta
        self._pos, self._gen, s = i, self._gen + 1, self._stride
        end = i + self._horizon() * s  # what the old window would have reached
        def inside(j: int) -> bool:
            return (j - i) % s == 0 and (i <= j < end if s > 0 else end < j <= i)
        for j in [j for j in self._ready if not inside(j)]:
            del self._ready[j]
        kept = [range(j, j + s, s) for j in self._ready]
        stale = set()
        for job_id, (r, _slot, _gen) in self._jobs.items():
            if job_id in self._cancelled:
                continue  # its worker will skip it
            aligned = len(r) and r.step == s and (r[0] - i) % s == 0
            if aligned and (r[-1] >= i and r[0] < end if s > 0 else r[-1] <= i and r[0] > end):
                kept.append(r)
            elif i in r:
                kept.append(range(i, i + s, s))
            else:
                stale.add(job_id)
        self._cancel(stale)
        # Random reads should not start a full window each: start small, ramp up as reads go on.
        self._ramp, self._chunk = 1, 1
        # Scheduling restarts at i and steps over the spans still ready or in flight.
        spans = sorted((max(0, (r[0] - i) // s), (r[-1] - i) // s + 1) for r in kept)
        self._skips = []
        for a, b in spans:
            if self._skips and a <= self._skips[-1][1]:
                self._skips[-1] = (self._skips[-1][0], max(b, self._skips[-1][1]))
            else:
                self._skips.append((a, b))
        self._skips.reverse()  # the nearest last, to pop
        self._origin, self._front = i, i

    def _cancel(self, job_ids: set[int]) -> None:
        if not job_ids:
            return
        backend = self._m.backend
        if isinstance(backend, ThreadBackend):
            for job_id in backend.cancel(job_ids):
                del self._jobs[job_id]
                self._sent.pop(job_id, None)
        else:  # the worker skips them when it gets to them; until then they hold their slot
            for job_id in job_ids:
                self._m.pool.cancel(job_id)
            self._cancelled |= job_ids
            backend.abandon(job_ids)

    def _slot(self) -> int | None:
        return self._m.pool.acquire() if self._m.pool is not None and self._m.pool.nslots else None

    def _bound(self) -> range | None:
        """The indices still to schedule from the front, in stride order (None: unbounded)."""
        n = length(self.src) if self._end is None else self._end
        s = self._stride
        if s > 0:
            return range(self._front, n, s) if n is not None else None
        return range(self._front, -1, s)

    def _schedule(self) -> None:
        # Until a first chunk is back, what an item costs (time, bytes) is unknown: one job per worker.
        ramp = self._ramp if self._stats["items"] else min(self._ramp, self.nworkers)
        if len(self._jobs) - len(self._cancelled) >= ramp:
            return  # the usual case of a read in order: the window is full
        pool, backend = self._m.pool, self._m.backend
        shm = pool is not None and pool.nslots > 0
        while len(self._jobs) - len(self._cancelled) < ramp:
            ahead = (self._front - self._pos) // self._stride
            if ahead >= self._horizon():
                return
            if self._item_bytes and len(self._jobs) - len(self._cancelled) >= self.nworkers \
                    and ahead * self._item_bytes > _BUDGET:
                return  # enough bytes ahead: more would be out of the cache when read
            if backend is None or backend.full():
                return
            rest = self._bound()
            count = self._chunk if rest is None else min(self._chunk, len(rest))
            if count <= 0:
                return
            slot = None
            if shm:
                slot = pool.acquire()
                if slot is None:
                    if self._jobs or self._front != self._pos:
                        return  # wait for the reader to drop items; the wanted item is in flight
                    gc.collect()  # cycles release slots only when collected
                    slot = pool.acquire()
                    if slot is None:
                        self._warn("held", "prefetch: the reader holds every shared-memory slot (items kept "
                                   "alive), so items go through the pipe; drop items sooner or raise max_buffered")
                        self._stats["fallbacks"] += 1
            s = self._stride
            if self._skips:  # stop short of the next span kept over a jump
                a = self._skips[-1][0]
                count = min(count, a - (self._front - self._origin) // s)
            if count > 0:
                self._submit(range(self._front, self._front + count * s, s), slot)
                self._front += count * s
            elif slot is not None:
                pool.release(slot)
            while self._skips and (self._front - self._origin) // s >= self._skips[-1][0]:
                end = self._skips.pop()[1]
                if (self._front - self._origin) // s < end:
                    self._front = self._origin + end * s

    def _submit(self, r: range, slot: int | None) -> None:
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = (r, slot, self._gen)
        self._sent[job_id] = time.monotonic()
        self._stats["jobs"] += 1
        self._m.backend.submit(job_id, r, slot)

    def _wait(self, i: int) -> Any:
        if i in self._ready:
            return self._ready.pop(i)
        t0 = time.monotonic()
        deadline = None if self.timeout is None else t0 + self.timeout
        self._stats["waits"] += 1
        patience = None  # until when the wanted item waits for a slot that given-up jobs hold
        try:
            while i not in self._ready:
                left = 0.5
                jobs = [j for j, (r, _, _) in self._jobs.items() if i in r]
                if jobs:
                    late = self._late_after(jobs, t0)
                    if late is not None:
                        left = late - time.monotonic()
                        if left <= 0:  # a slow or stuck item holds them up: the wanted one goes on alone
                            self._cancel(set(jobs) - self._cancelled)
                            self._schedule_item(i)
                            left = 0.5
                else:
                    pool = self._m.pool
                    held = bool(self._cancelled) and pool is not None and pool.nslots > 0 and not pool.free()
                    if held:
                        # Given-up jobs give their slots back as soon as their worker skips them,
                        # unless it is inside one (a slow or stuck item): then use the pipe.
                        now = time.monotonic()
                        patience = now + _PATIENCE if patience is None else patience
                        left = patience - now
                    if not held or left <= 0:
                        self._schedule_item(i)
                        left = 0.5
                if deadline is not None:
                    left = min(left, deadline - time.monotonic())
                if left <= 0:
                    raise PrefetchTimeout(f"prefetch: item {i} did not arrive within timeout={self.timeout}s "
                                          f"({self.describe()})", i)
                backend = self._m.backend
                if backend is None:
                    raise self._error or PrefetchClosed(f"{self.describe()} was closed")
                try:
                    done = backend.poll(left)
                except (OSError, ValueError):
                    if self._m.backend is None:  # closed from another thread while we waited
                        raise self._error or PrefetchClosed(f"{self.describe()} was closed") from None
                    raise
                self._collect(done)
                backend.check()
                self._schedule()  # jobs finished while waiting: keep the workers fed
            return self._ready.pop(i)
        finally:
            self._stats["wait_seconds"] += time.monotonic() - t0

    def _late_after(self, jobs: list[int], t0: float) -> float | None:
        """When the jobs that hold the wanted item count as held up (by a slow or stuck item of
        theirs, or one given up before them on their worker): None while there is no telling.
        Counted from when the reader began to wait (``t0``) at the earliest: answers may have
        waited on the pipe while the reader did other things."""
        backend, limit = self._m.backend, _PATIENCE
        for j in jobs:
            if j in self._cancelled or backend.behind(j):
                continue  # given up, or behind a given-up job: _PATIENCE is enough
            if not self._item_seconds or not backend.started(j):
                return None  # no chunk back yet, or a worker still starting: no telling what is slow
            limit = max(limit, _LATE_FLOOR, _LATE * self._item_seconds * len(self._jobs[j][0]))
        return max(t0, *(self._sent[j] for j in jobs)) + limit

    def _schedule_item(self, i: int) -> None:
        """Give the wanted item a job of its own: it has none (every slot taken by stale work), or
        its jobs are held up by a slow or stuck item."""
        backend = self._m.backend
        if backend is None or backend.full():
            return  # the workers are behind on records already: wait for answers (or the timeout)
        slot = self._slot()
        if slot is None and self._m.pool is not None and self._m.pool.nslots:
            self._stats["fallbacks"] += 1
        self._submit(range(i, i + 1), slot)

    def _collect(self, done: list) -> None:
        backend = self._m.backend
        for msg in done:
            if isinstance(backend, ThreadBackend):
                job_id, items, seconds = msg
                table, needed, payload, kind = (), 0, None, wire.RESULT
            else:
                job_id, kind, table, needed, seconds, payload = msg
                if job_id < 0:
                    continue  # a worker's start-up message
            job = self._jobs.pop(job_id, None)
            late = job_id in self._cancelled  # given up (maybe after it started): keep what is still wanted
            self._cancelled.discard(job_id)
            self._sent.pop(job_id, None)
            if job is None:
                continue
            r, slot, gen = job
            if kind == wire.CANCELLED:
                if slot is not None:
                    self._m.pool.release(slot)
                continue
            if payload is not None:
                try:
                    items = backend.load_items(slot, table, payload)
                except Exception as e:  # pickled in the worker, but does not unpickle here
                    err = TypeError(f"the results of items {r.start}..{r[-1]} could not be unpickled in the "
                                    f"reader: {type(e).__name__}: {e}")
                    err.__cause__ = e
                    items = [wire.ItemError(j, err, portable=False) for j in r]
                nbytes = sum(n for _, n in table)
                self._stats["bytes_shm"] += nbytes
                self._stats["bytes_pipe"] += len(payload)
                if slot is not None and needed > self._m.pool.slot_size:
                    self._stats["fallbacks"] += 1
                    self._warn("size", f"prefetch: a chunk of {len(r)} item(s) needed {needed} bytes but a slot "
                               f"holds {self._m.pool.slot_size} (shm_size={self.shm_size} / max_buffered="
                               f"{self.max_buffered}); what did not fit went through the pipe. "
                               f"shm_size >= {needed * self.max_buffered} would fit")
                self._adapt(len(r), seconds, needed)
            else:
                self._adapt(len(r), seconds, 0)
            self._stats["items"] += len(r)
            last = items[-1] if items else None
            if not self.finite and type(last) is wire.ItemError and isinstance(last.error, Exhausted):
                self._end = min(last.index, self._end if self._end is not None else last.index)
            if gen == self._gen and not late:
                self._ready.update(zip(r, items))
            else:
                self._ready.update((j, x) for j, x in zip(r, items) if self._in_window(j))

    def _adapt(self, count: int, seconds: float, nbytes: int) -> None:
        """Grow chunks as jobs complete, within the time budget and what fits a slot."""
        per_item = seconds / max(count, 1)
        self._item_seconds = per_item if self._item_seconds == 0 else 0.7 * self._item_seconds + 0.3 * per_item
        cap = _CHUNK_MAX
        if self._item_seconds > 0:
            cap = min(cap, max(1, int(_CHUNK_SECONDS / self._item_seconds)))
        pool = self._m.pool
        if pool is not None and pool.nslots:
            per_item_bytes = nbytes / max(count, 1)
            self._item_bytes = max(self._item_bytes * 0.7, per_item_bytes)
            if self._item_bytes > 0:
                cap = min(cap, max(1, int(pool.slot_size // (self._item_bytes + 64))))
        self._chunk = max(1, min(self._chunk * 2, cap))
        self._stats["chunk"] = self._chunk

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=5)

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters: items computed, jobs sent, current chunk size, bytes through shared memory and
        through the pipe, fallbacks to the pipe, reads that had to wait and the time spent waiting."""
        with self._lock:
            out = dict(self._stats)
            pool = self._m.pool
            out.update(method=self.method, nworkers=self.nworkers, max_buffered=self.max_buffered,
                       slot_size=pool.slot_size if pool is not None else 0,
                       slots_free=pool.free() if pool is not None else 0)
            return out

    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty for threads, or before they start)."""
        backend = self._m.backend
        return list(backend.pids) if isinstance(backend, ProcessBackend) else []

    def describe(self) -> str:
        what = "threads" if self.method == "thread" else "processes"
        shm = f", shm_size={self.shm_size}" if self.shm_size else ""
        return f"prefetch({self.nworkers} {what}, max_buffered={self.max_buffered}{shm})"


def prefetch(seq: Any, nworkers: int = 0, method: str = "thread", max_buffered: int = 10,
             start_hook: Callable | None = None, shm_size: int = 0, *, mp_context: Any = None,
             timeout: float | None = None, lazy_start: bool = False) -> Prefetch:
    """The items of ``seq``, computed ahead of the reader by worker threads or processes.

    ``p[i]`` is ``seq[i]`` for every key ``seq`` accepts. Reading in order keeps up to
    ``max_buffered`` chunks of items in flight; a jump restarts the window at the new index,
    cancelling work no longer wanted and keeping what is still wanted.

    - ``nworkers``: number of workers; ``<= 0`` means usable cores + ``nworkers`` (at least 1).
    - ``method``: ``'thread'`` or ``'process'``. Process workers get chunks of indices over a
      pipe and evaluate them with one bulk read; results come back as one small pickle per chunk.
    - ``shm_size``: bytes of shared memory for process workers, split into ``max_buffered`` slots.
      Every numpy array, bytearray and large bytes object of a result is written into the job's
      slot and read back as a zero-copy view; the slot is reused only when no array built on it is
      alive in the reader. What does not fit a slot goes through the pipe (warned once, counted
      in ``stats()['fallbacks']``). ``lazyseq.empty``/``empty_like`` build arrays in the slot
      directly, saving that copy.
    - ``start_hook(worker_index)`` runs once in every worker before its first item.
    - ``mp_context``: ``'fork'``, ``'forkserver'``, ``'spawn'`` or a multiprocessing context.
    - ``timeout``: seconds to wait for one item before :class:`lazyseq.PrefetchTimeout`.
    - ``lazy_start``: start workers at the first read rather than now.

    An exception in a worker is raised as :class:`EvaluationError` for that item only; a worker
    that dies raises :class:`WorkerCrashed`. ``close()``, a ``with`` block or dropping the object
    stops the workers.

    >>> import lazyseq
    >>> with lazyseq.prefetch(lazyseq.smap(lambda x: x * x, range(100)), nworkers=2) as p:
    ...     p[5], p[-1], list(p[:4])
    (25, 9801, [0, 1, 4, 9])
    """
    return Prefetch(seq, nworkers, method, max_buffered, start_hook, shm_size, mp_context, timeout, lazy_start)
