"""The async backend: up to ``nworkers`` items at once on one event loop in a background thread.

For I/O-bound sources (HTTP, object stores, slow disks) whose item functions are ``async def``:
thousands of requests in flight cost one thread. How an item is read (``aread``): its path is
walked from the top through ``smap``/``starmap`` and index remaps (slices, ``shuffle``,
``shard``, ``cycle``...); an async function's coroutine is awaited on the loop, a plain function
above an async one runs in a small thread pool with the awaited values, and any other view, or
a part of the pipeline with no async function in it, is read whole in the pool (where a read of
an async ``smap`` deeper down joins this loop too). Items of a job run concurrently and are sent
as they finish, so a slow one holds up only itself.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..core import aio
from ..core.base import Remap
from ..core.node import Failed, is_node, reader
from ..core.workerinfo import WorkerInfo, set_thread, worker_info
from ..errors import PrefetchClosed, WorkerStartError, wrap_error
from ..views.mapping import Map, SeededMap, item_rng
from . import wire
from .backend import STREAM, Result, Settings

__all__ = ["AsyncBackend"]

POOL_MAX = 8  # threads for the plain (sync) parts of a pipeline


class _Pool:
    """Daemon threads running plain reads for the loop (an executor whose threads never block
    the interpreter's exit on a stuck read). They read async views on ``loop``."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop):
        self.loop, self.q = loop, queue.SimpleQueue()
        self.info: WorkerInfo | None = None  # the loop's worker_info(), for the reads run here
        self.threads = [threading.Thread(target=self._work, name=f"lazyseq-async-pool-{k}", daemon=True)
                        for k in range(n)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        aio.use_loop(self.loop)
        while True:
            job = self.q.get()
            if job is None:
                return
            fut, fn, args = job
            set_thread(self.info)
            try:
                ok, value = True, fn(*args)
            except BaseException as e:  # an item's error, whatever it is
                ok, value = False, e
            try:
                self.loop.call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    async def call(self, fn: Callable, *args: Any) -> Any:
        fut = self.loop.create_future()
        self.q.put((fut, fn, args))
        return await fut

    def stop(self, deadline: float) -> None:
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


def _settle(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if not fut.done():
        fut.set_result(value) if ok else fut.set_exception(value)


def has_async(seq: Any, memo: dict[int, bool]) -> bool:
    """Whether the item path of ``seq`` (through maps and remaps) reaches an async function."""
    key = id(seq)
    if key not in memo:
        if isinstance(seq, Map):
            memo[key] = type(seq.f) is aio.Blocking or any(has_async(s, memo) for s in seq.seqs)
        elif isinstance(seq, Remap):
            memo[key] = has_async(seq.src, memo)
        else:
            memo[key] = False
    return memo[key]


async def aread(seq: Any, i: int, pool: _Pool, memo: dict[int, bool]) -> Any:
    """Item ``i`` of ``seq`` (a valid non-negative index), awaiting the async functions on its path."""
    if not has_async(seq, memo):
        if is_node(seq):
            return await pool.call(seq.__getitem__, i)  # the view's checks and error notes
        return reader(seq)(i)  # a list, an array: at once
    if isinstance(seq, Remap):
        return await aread(seq.src, seq._map(i), pool, memo)
    # A map whose function, or one below it, is async.
    if seq.src is not None:
        x = await aread(seq.src, i, pool, memo)
        args = list(x) if seq.star else [x]
    else:
        args = [await aread(s, i, pool, memo) for s in seq.seqs]
    kwargs = {"rng": item_rng(seq._seedkey, i)} if isinstance(seq, SeededMap) else {}
    f = seq.f
    try:
        if type(f) is aio.Blocking:
            return await f.f(*args, **kwargs)
        return await pool.call(lambda: f(*args, **kwargs))
    except Exception as e:
        raise wrap_error(e, i, seq)  # noqa: B904


class _Job:
    __slots__ = ("job_id", "indices", "values", "state", "left", "busy", "since", "started", "dropped")

    def __init__(self, job_id: int, indices: range):
        self.job_id, self.indices, self.values = job_id, indices, [None] * len(indices)
        self.state = bytearray(len(indices))  # 0: running or waiting, 1: done, 2: sent
        self.left, self.busy, self.since = len(indices), 0.0, time.monotonic()
        self.started = self.dropped = False


class AsyncBackend:
    """Jobs become tasks on one event loop; a semaphore lets ``nworkers`` items run at once."""

    COUNTERS: ClassVar[dict[str, int]] = {}
    JOB_SECONDS = 0.004  # of one worker's time: the window sizes chunks from ``seconds``/nworkers

    def __init__(self, seq: Any, settings: Settings, stats: dict):
        self.seq, self.nworkers, self.memo = seq, settings.nworkers, {}
        self.cond = threading.Condition()
        self.jobs: dict[int, _Job] = {}  # sent, not answered in full
        self.done: list[Result] = []  # answered, not yet polled
        self.stopping = False
        self.start_error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.sem = asyncio.Semaphore(self.nworkers)
        self.pool = _Pool(min(self.nworkers, POOL_MAX), self.loop)
        hook = settings.start_hook

        def ready() -> None:
            if hook is not None:
                try:
                    hook(0)
                except BaseException as e:
                    self.start_error = e
            self.pool.info = worker_info()

        self.thread = threading.Thread(target=aio.serve, args=(self.loop, ready), name="lazyseq-async", daemon=True)
        self.thread.start()

    @property
    def pids(self) -> list[int]:
        return []

    # -- the loop's side -------------------------------------------------------------------------
    def _start(self, job: _Job) -> None:
        if job.dropped or self.start_error is not None:
            return
        for k, i in enumerate(job.indices):
            self.loop.create_task(self._item(job, k, i))

    async def _item(self, job: _Job, k: int, i: int) -> None:
        async with self.sem:
            with self.cond:
                if job.dropped:
                    return
                job.started = True
            t = time.perf_counter()
            try:
                value = await aread(self.seq, i, self.pool, self.memo)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # SystemExit... from an item function: that item's error
                value = Failed(e)
            seconds = time.perf_counter() - t
        with self.cond:
            job.values[k], job.state[k] = value, 1
            job.left -= 1
            job.busy += seconds
            if job.left == 0 and self.jobs.pop(job.job_id, None) is not None:  # (None: closed, or dropped)
                self.done.extend(self._runs(job))
                self.done.append(Result(job.job_id, [], job.busy / self.nworkers, first=len(job.indices)))
                self.cond.notify_all()

    def _runs(self, job: _Job) -> list[Result]:
        """The items of ``job`` done and not yet sent, as parts (one per run of neighbours)."""
        out, state, n, k = [], job.state, len(job.indices), 0
        while k < n:
            if state[k] != 1:
                k += 1
                continue
            a = k
            while k < n and state[k] == 1:
                state[k] = 2
                k += 1
            items = wire.finish(self.seq, job.indices[a:k], job.values[a:k], portable=False)
            job.values[a:k] = [None] * (k - a)  # the window holds them now
            out.append(Result(job.job_id, items, first=a, final=False))
        return out

    # -- the reader's side -----------------------------------------------------------------------
    def submit(self, job_id: int, r: range, wanted: bool) -> bool:
        with self.cond:
            if self.stopping:
                raise PrefetchClosed("prefetch: the event loop was stopped")
            job = self.jobs[job_id] = _Job(job_id, r)
        self.loop.call_soon_threadsafe(self._start, job)
        return True

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Drop the jobs none of whose items has started: those never answer."""
        with self.cond:
            dropped = {j for j in job_ids if j in self.jobs and not self.jobs[j].started}
            for j in dropped:
                self.jobs.pop(j).dropped = True
        return dropped

    def poll(self, timeout: float) -> list[Result]:
        with self.cond:
            if not self.done and self.start_error is None and not self.stopping:
                now = time.monotonic()  # wake up in time to send what a long job has done
                since = min((job.since for job in self.jobs.values() if 1 in job.state), default=now)
                self.cond.wait(min(timeout, max(0.0, since + STREAM - now)))
            if self.stopping:
                raise PrefetchClosed("prefetch: the event loop was stopped")
            out, self.done = self.done, []
            now = time.monotonic()
            for job in self.jobs.values():
                if now - job.since >= STREAM and 1 in job.state:
                    out.extend(self._runs(job))
                    job.since = now
        return out

    def check(self) -> None:
        if self.start_error is not None:
            e = self.start_error
            raise WorkerStartError(f"prefetch: start_hook failed in the event loop's thread: {type(e).__name__}: {e}") \
                from e
        if not self.stopping and not self.thread.is_alive():
            raise RuntimeError("prefetch: the event loop's thread has stopped")

    def room(self) -> bool:
        return True

    def started(self, job_id: int) -> bool:
        return True

    def where(self, job_id: int) -> tuple[int | None, float] | None:
        return None  # items of a job run at once: no one item holds up the others

    def chunk_cap(self, item_bytes: float) -> int | None:
        return None

    def gauges(self) -> dict:
        with self.cond:
            return {"items_pending": sum(job.left for job in self.jobs.values())}

    def close(self, grace: float = 1.0) -> None:
        with self.cond:
            if self.stopping:
                return
            self.stopping = True
            self.jobs.clear()
            self.cond.notify_all()
        deadline = time.monotonic() + grace
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)  # the loop's thread cancels what is left
        except RuntimeError:  # closed already
            pass
        self.pool.stop(deadline)
        if self.thread is not threading.current_thread():
            self.thread.join(max(0.0, deadline - time.monotonic()))
