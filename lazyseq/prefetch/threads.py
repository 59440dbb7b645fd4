"""The thread backend: worker threads evaluate chunks of indices from a shared job queue."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import WorkerStartError
from . import wire


class ThreadBackend:
    def __init__(self, seq: Any, nworkers: int, start_hook: Callable | None):
        self.seq, self.start_hook = seq, start_hook
        self.cond = threading.Condition()
        self.jobs: deque[tuple[int, range]] = deque()
        self.done: list[tuple[int, list, float]] = []
        self.cancelled: set[int] = set()
        self.stopping, self.start_error = False, None
        self.threads = [threading.Thread(target=self._work, args=(k,), name=f"lazyseq-prefetch-{k}", daemon=True)
                        for k in range(nworkers)]
        for t in self.threads:
            t.start()

    @property
    def nworkers(self) -> int:
        return len(self.threads)

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
            t = time.perf_counter()
            items = wire.evaluate(self.seq, r, portable=False)  # BaseExceptions (SystemExit...) become item errors
            with self.cond:
                self.done.append((job_id, items, time.perf_counter() - t))
                self.cond.notify_all()

    def full(self) -> bool:  # an in-process queue: never blocks the reader
        return False

    def behind(self, job_id: int) -> bool:  # one queue for all threads: no job waits behind a stuck one
        return False

    def started(self, job_id: int) -> bool:
        return True

    def submit(self, job_id: int, r: range, slot: int | None) -> None:
        with self.cond:
            self.jobs.append((job_id, r))
            self.cond.notify()

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Drop jobs not yet started; returns those dropped."""
        with self.cond:
            dropped = {j for j, _ in self.jobs if j in job_ids}
            if dropped:
                self.jobs = deque(job for job in self.jobs if job[0] not in dropped)
        return dropped

    def poll(self, timeout: float) -> list[tuple[int, list, float]]:
        with self.cond:
            if not self.done and self.start_error is None:
                self.cond.wait(timeout)
            out, self.done = self.done, []
        return out

    def check(self) -> None:
        if self.start_error is not None:
            k, e = self.start_error
            raise WorkerStartError(f"prefetch worker thread {k} failed to start: {type(e).__name__}: {e}") from e
        if not any(t.is_alive() for t in self.threads) and not self.stopping:
            raise RuntimeError("prefetch: every worker thread has stopped")

    def close(self, grace: float = 1.0) -> None:
        with self.cond:
            self.stopping = True
            self.jobs.clear()
            self.cond.notify_all()
        deadline = time.monotonic() + grace
        for t in self.threads:  # a thread busy in user code cannot be interrupted; it is a daemon
            t.join(max(0.0, deadline - time.monotonic()))
