"""The thread backend: worker threads of the reader's process take chunk jobs from one queue.

A job that runs long is answered in parts: the reader takes the items a thread has done so far
(every ``worker.STREAM`` seconds), so a slow or stuck item holds up only itself."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, ClassVar

from ..errors import PrefetchClosed, WorkerStartError
from . import wire
from .backend import STREAM, Result, Running, Settings

__all__ = ["ThreadBackend"]


class ThreadBackend:
    """Items come back as the very objects the threads computed: nothing is copied or pickled."""

    COUNTERS: ClassVar[dict[str, int]] = {}
    JOB_SECONDS = 0.004  # a chunk worth about this much work keeps the reader fed without stalls

    def __init__(self, seq: Any, settings: Settings, stats: dict):
        self.seq, self.start_hook = seq, settings.start_hook
        self.cond = threading.Condition()
        self.jobs: deque[tuple[int, range]] = deque()  # waiting for a thread
        self.done: list[Result] = []  # answered, not yet polled
        self.running: dict[int, Running] = {}  # jobs a thread is inside
        self.stopping = False
        self.start_error: tuple[int, BaseException] | None = None  # (thread, what its start_hook raised)
        self.threads = [threading.Thread(target=self._work, args=(k,), name=f"lazyseq-prefetch-{k}", daemon=True)
                        for k in range(settings.nworkers)]
        for t in self.threads:
            t.start()

    @property
    def pids(self) -> list[int]:
        return []

    def _work(self, k: int) -> None:
        if self.start_hook is not None:
            try:
                self.start_hook(k)
            except BaseException as e:
                with self.cond:
                    self.start_error = (k, e)
                    self.cond.notify_all()
                return
        while True:
            with self.cond:
                while not self.jobs and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                job_id, r = self.jobs.popleft()
                run = self.running[job_id] = Running(job_id, r)
            t = time.perf_counter()
            wire.compute(self.seq, r, run.items)  # BaseExceptions (SystemExit...) become item errors
            with self.cond:
                del self.running[job_id]
                items = wire.finish(self.seq, r[run.sent :], run.items[run.sent :], portable=False)
                self.done.append(Result(job_id, items, time.perf_counter() - t, first=run.sent))
                self.cond.notify_all()

    def submit(self, job_id: int, r: range, wanted: bool) -> bool:
        with self.cond:
            if self.stopping:
                raise PrefetchClosed("prefetch: the worker threads were stopped")
            self.jobs.append((job_id, r))
            self.cond.notify()
        return True  # an in-process queue has room for every job

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Drop the jobs no thread has taken yet: those never answer."""
        with self.cond:
            dropped = {j for j, _ in self.jobs if j in job_ids}
            if dropped:
                self.jobs = deque(job for job in self.jobs if job[0] not in dropped)
        return dropped

    def poll(self, timeout: float) -> list[Result]:
        with self.cond:
            if not self.done and self.start_error is None and not self.stopping:
                if self.running:  # wake up in time to take what a long job has done
                    # (a job with nothing new since its last part is looked at again a STREAM later:
                    # waking at once would spin, and starve the workers of the GIL)
                    now = time.monotonic()
                    since = min(run.since if len(run.items) > run.sent else now for run in self.running.values())
                    timeout = min(timeout, max(0.0, since + STREAM - now))
                self.cond.wait(timeout)
            if self.stopping:  # closed from another thread while we waited
                raise PrefetchClosed("prefetch: the worker threads were stopped")
            out, self.done = self.done, []
            now = time.monotonic()
            for run in self.running.values():
                if now - run.since >= STREAM and len(run.items) > run.sent:
                    done, first = len(run.items), run.sent
                    items = wire.finish(self.seq, run.indices[first:done], run.items[first:done], portable=False)
                    out.append(Result(run.job_id, items, first=first, final=False))
                    run.sent, run.since = done, now
        return out

    def check(self) -> None:
        if self.start_error is not None:
            k, e = self.start_error
            raise WorkerStartError(f"prefetch worker thread {k} failed to start: {type(e).__name__}: {e}") from e
        if not self.stopping and not any(t.is_alive() for t in self.threads):
            raise RuntimeError("prefetch: every worker thread has stopped")

    def room(self) -> bool:
        return True

    def started(self, job_id: int) -> bool:
        return True

    def where(self, job_id: int) -> tuple[int | None, float] | None:
        run = self.running.get(job_id)  # a job in the queue waits for any thread: no telling
        if run is None:
            return None
        done = len(run.items)
        return (run.indices[done] if done < len(run.indices) else None), run.since

    def chunk_cap(self, item_bytes: float) -> int | None:
        return None

    def gauges(self) -> dict:
        return {}

    def close(self, grace: float = 1.0) -> None:
        with self.cond:
            self.stopping = True
            self.jobs.clear()
            self.cond.notify_all()
        deadline = time.monotonic() + grace
        for t in self.threads:  # a thread busy in user code cannot be interrupted; it is a daemon
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
