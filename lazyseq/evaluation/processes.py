"""The process backend: start, feed, supervise and stop worker processes; own their slot pool.

Each worker has its own duplex pipe. The reader sends fixed job records (a range of indices and a
slot) and receives one message per chunk (``worker.py`` is the other end). The reader waits on the
pipes and on the processes' sentinels together, so a dead worker is seen as soon as it dies. Every
job gets a shared-memory slot when one is free; its arrays come back as views of the slot, which
returns to the pool when the reader drops the last of them (``slots.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import re
import select
import selectors
import signal
import sys
import threading
import time
from multiprocessing import connection
from typing import Any, ClassVar

import cloudpickle

from ..errors import PrefetchClosed, WorkerCrashed, WorkerStartError
from ..helpers import ALIGN, forced, span, warn
from . import wire
from .backend import Result, Settings
from .slots import SlotPool
from .worker import FdForChild, worker_main

__all__ = ["ProcessBackend", "MAX_QUEUED"]

# Parent-side descriptors of every live worker pipe and segment of this process. A forked worker
# closes all of them, so a worker never keeps another one's pipe open: when the reader's process
# dies, every worker reads end-of-file. The lock keeps a fork's list from naming a descriptor that
# another thread closes (and the number gets reused) before the child closes it.
_PARENT_FDS: set[int] = set()
FDS_LOCK = threading.RLock()


def _forget_parent_fds() -> None:  # a forked child owns none of them (and no thread holds its lock)
    global FDS_LOCK
    FDS_LOCK = threading.RLock()
    _PARENT_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_fds)


# Job records a worker may have waiting on its connection. A connection is a Unix socketpair,
# whose send buffer (SO_SNDBUF, 208 KiB by default) is charged ~0.8-1.3 KiB per small record: ~160
# to ~280 records fit before a send blocks. 64 stays far below, so sending never blocks the reader,
# even behind a worker stuck on one item while the reader jumps about and gives up job after job.
MAX_QUEUED = 64
# A slot goes back to the worker that has it mapped unless that one has more jobs waiting (first
# writes fault a slot's pages in: ~15 ms for 35 MB; at 2 more, one DataLoader bench worker idled
# 0.4-0.7 s of a 1.7 s epoch while jobs waited in the other's pipe).
_AFFINITY = 0


def parent_fd(fd: int) -> None:
    """Count ``fd`` among the descriptors forked workers close."""
    with FDS_LOCK:
        _PARENT_FDS.add(fd)


def close_parent_fd(pool: SlotPool) -> None:
    """Close the pool's descriptor in the reader (workers have their own), never mid-fork."""
    with FDS_LOCK:
        _PARENT_FDS.discard(pool.fd)
        pool.close_fd()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_GUARD = re.compile(r"""^\s*if\s+(__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__)""", re.M)


def _guard_hint(method: str) -> str | None:
    """Why a worker likely died while starting, where it can be told: with ``spawn`` (and
    ``forkserver``) a worker imports the main script again; one that starts workers at its top
    level, without an ``if __name__ == "__main__":`` guard, makes the worker fail as it starts."""
    if method not in ("spawn", "forkserver"):
        return None
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:  # python -c, a notebook, a REPL: nothing is imported again
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            if _GUARD.search(f.read()):
                return None  # guarded: the cause is something else
    except OSError:
        pass
    return (f"Likely cause: with the {method!r} start method the workers import the main script ({path}) "
            f"again, and it has no `if __name__ == \"__main__\":` guard, so importing it starts workers again "
            "(the worker's stderr says so). Put the code that runs the pipeline under that guard")


_RECOLLECT = 1.0  # seconds between garbage collections looking for a slot the reader may have let go


class _Poller:
    """Waits for any of a fixed set of descriptors to be readable: ``select.poll`` (no descriptor of
    its own), else a ``selectors`` selector (kqueue, epoll or select, where there is no poll or
    with LAZYSEQ_FORCE_FALLBACKS=poll)."""

    def __init__(self, fds: tuple[int, ...]):
        self.poll: Any = None
        self.selector: selectors.BaseSelector | None = None
        if hasattr(select, "poll") and not forced("poll"):
            self.poll = select.poll()
            for fd in fds:
                self.poll.register(fd, select.POLLIN)
        else:
            self.selector = selectors.DefaultSelector()
            for fd in fds:
                self.selector.register(fd, selectors.EVENT_READ)

    def wait(self, timeout: float) -> list[int]:
        """The descriptors ready within ``timeout`` seconds."""
        if self.poll is not None:
            return [fd for fd, _ in self.poll.poll(max(0, int(timeout * 1000 + 0.999)))]
        assert self.selector is not None
        return [key.fd for key, _ in self.selector.select(max(0.0, timeout))]

    def close(self) -> None:
        if self.selector is not None:
            self.selector.close()


class _Job:
    """A job sent to a worker and not answered yet."""

    __slots__ = ("worker", "slot", "indices", "done")

    def __init__(self, worker: int, slot: int | None, indices: range):
        self.worker, self.slot, self.indices = worker, slot, indices  # slot None: results take the pipe
        self.done = 0  # items already sent in PARTIAL messages


class ProcessBackend:
    """Worker processes with a pipe each, and the pool of shared-memory slots their results use."""

    COUNTERS: ClassVar[dict[str, int]] = dict(bytes_shm=0, bytes_pipe=0, fallbacks=0, reported=0)
    JOB_SECONDS = 0.004  # a chunk worth about this much work keeps the reader fed without stalls

    def __init__(self, seq: Any, settings: Settings, stats: dict):
        self.settings, self.stats = settings, stats
        self.ctx, self.method = settings.mp_context, settings.mp_context.get_start_method()
        self.procs: list = []
        self.conns: list[connection.Connection] = []
        self.load: list[int] = []  # jobs outstanding per worker
        self.ready: list[bool] = []  # per worker: said it started
        self.heard: list[float] = []  # per worker: when its last message came (its last progress)
        self.reported: list[int] = []  # per worker: the last value of settings.report it sent
        self.keyed: dict[int, dict] = {}  # per worker: the counts by key of a settings.report that gives a dict
        self.slot_worker: dict[int, int] = {}  # the worker that wrote each slot last (has it mapped)
        self.outstanding: dict[int, _Job] = {}  # unanswered jobs
        self.abandoned: set[int] = set()  # unanswered jobs the reader gave up (a worker may be inside one)
        self.warned: set[str] = set()
        self.collected = -_RECOLLECT  # when a garbage collection last freed no slot for a wanted item
        self.pending_crash: int | None = None  # a worker seen dead, reported by check()
        self.stopping = False
        self.poller: Any = None
        self.pool = SlotPool(settings.shm_size, settings.max_buffered)
        try:
            self._start(seq)
        except BaseException:
            self.close()
            raise
        self.sentinels = {p.sentinel: k for k, p in enumerate(self.procs)}
        self.fds = {c.fileno(): k for k, c in enumerate(self.conns)}

    def _start(self, seq: Any) -> None:
        pool, fork, hook, report = self.pool, self.method == "fork", self.settings.start_hook, self.settings.report
        parent_fd(pool.fd)
        if not fork:
            try:
                # one pickle: objects the hook shares with the sequence stay one object (worker_info's dataset)
                seq, hook, report = cloudpickle.dumps((seq, hook, report)), None, None
            except Exception as e:
                raise TypeError(f"prefetch: the sequence cannot be pickled to start {self.method!r} workers "
                                f"({e}); use mp_context='fork' or make it picklable") from e
        with FDS_LOCK if fork else contextlib.nullcontext():  # spawn children inherit no descriptors
            for k in range(self.settings.nworkers):
                mine, theirs = self.ctx.Pipe(duplex=True)
                self.conns.append(mine)
                _PARENT_FDS.add(mine.fileno())
                shm = pool.fd if fork else FdForChild(pool.fd)
                close = sorted(_PARENT_FDS - {pool.fd}) if fork else []
                p = self.ctx.Process(target=worker_main, name=f"lazyseq-prefetch-{k}",
                                     args=(k, theirs, seq, hook, shm, pool.slot_size, pool.nslots, close, not fork,
                                           report))
                p.start()
                theirs.close()
                self.procs.append(p)
                self.load.append(0)
                self.ready.append(False)
                self.heard.append(time.monotonic())
                self.reported.append(0)
        close_parent_fd(pool)  # every worker holds its own descriptor or mapping now

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # -- sending ---------------------------------------------------------------------------------
    def submit(self, job_id: int, r: range, wanted: bool) -> bool:
        if self.stopping:
            raise PrefetchClosed("prefetch: the worker processes were stopped")
        load = self.load
        if min(load) >= MAX_QUEUED:
            return False  # every worker has that many records waiting: wait for answers
        pool = self.pool
        slot = pool.acquire() if pool.nslots else None
        if slot is None and pool.nslots:
            if not wanted:
                return False  # wait for the reader to drop items; the wanted item is in flight
            slot = self._slot_for_wanted()
        # Workers with an abandoned job outstanding may be inside it for long: others first.
        busy = {self.outstanding[a].worker for a in self.abandoned} if self.abandoned else ()
        ks = ([k for k in range(len(load)) if k not in busy and load[k] < MAX_QUEUED] if busy else None) \
            or range(len(load))
        k = min(ks, key=load.__getitem__)
        if slot is not None:
            # A slot's pages cost a fault per page in each worker that first writes them (1-2 us
            # each: a 4 MiB slot ~2 ms), so a slot stays with the worker that has it mapped.
            w = self.slot_worker.get(slot, k)
            if w not in busy and load[w] <= load[k] + _AFFINITY and load[w] < MAX_QUEUED:
                k = w
            self.slot_worker[slot] = k
        load[k] += 1
        self.outstanding[job_id] = _Job(k, slot, r)
        try:
            self.conns[k].send_bytes(wire.JOB.pack(job_id, r.start, r.step, len(r), -1 if slot is None else slot))
        except OSError:
            self._crashed(k)
        return True

    def _slot_for_wanted(self) -> int | None:
        """A slot for the item the reader waits for when none is free; None: it takes the pipe."""
        now = time.monotonic()
        if now - self.collected >= _RECOLLECT and not any(job.slot is not None for job in self.outstanding.values()):
            # No job holds one: the reader does (items kept alive), or cycles not yet collected.
            # A collection costs up to ~100 ms in a large process: once a second at most, not per item.
            gc.collect()
            slot = self.pool.acquire()
            if slot is not None:
                return slot
            self.collected = now
            pool = self.pool
            self._warn("held", self.settings.words.slots_held(pool.slot_size, self.settings.shm_size, pool.nslots))
        self.stats["fallbacks"] += 1
        return None

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Workers skip these jobs when they get to them (answering CANCELLED), unless inside one."""
        for job_id in job_ids:
            self.pool.cancel(job_id)
        self.abandoned |= job_ids & self.outstanding.keys()
        return set()

    # -- receiving -------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[Result]:
        if self.poller is None:  # registered once: a fresh selector per wait costs more than the wait
            self.poller = _Poller((*self.fds, *self.sentinels))
        try:
            events = self.poller.wait(timeout)
        except (OSError, ValueError):
            if not self.stopping:
                raise
            events = []
        if self.stopping:  # closed from another thread while we waited
            raise PrefetchClosed("prefetch: the worker processes were stopped")
        out: list[Result] = []
        dead = []
        for fd in events:
            k = self.fds.get(fd)
            if k is None:
                dead.append(self.sentinels[fd])
                continue
            try:
                self._message(k, self.conns[k].recv_bytes(), out)
            except (EOFError, OSError):
                dead.append(k)
        for k in dead:  # what a dead worker sent before dying still counts
            self._drain(k, out)
        if dead and not self.stopping:
            self.pending_crash = dead[0]
        return out

    def _drain(self, k: int, out: list[Result]) -> None:
        conn = self.conns[k]
        try:
            while conn.poll(0):
                self._message(k, conn.recv_bytes(), out)
        except (EOFError, OSError):
            pass

    def _message(self, k: int, msg: bytes, out: list[Result]) -> None:
        job_id, kind, table, needed, seconds, first, payload = wire.decode(msg)
        self.heard[k] = time.monotonic()
        if kind == wire.START_FAILED:
            err = cloudpickle.loads(payload).rebuild()
            raise WorkerStartError(f"prefetch worker {k} failed to start: {type(err).__name__}: {err}") from err
        if kind == wire.READY:
            self.ready[k] = True
            return
        if kind == wire.REPORT:  # the worker's settings.report changed: its latest value counts
            self.reported[k] = needed
            self.stats["reported"] = sum(self.reported)
            if payload:  # a report by key: the entries that changed; the stats get the sums by key
                self.stats["reported_by"] = wire.merge_report(self.keyed, k, payload)
            return
        if kind == wire.PARTIAL:  # a slow item holds the job up: the items done so far
            job = self.outstanding[job_id]
            items = self._load(None, job.indices[first:], (), payload)
            job.done = first + len(items)
            self.stats["bytes_pipe"] += len(payload)
            out.append(Result(job_id, items, first=first, final=False))
            return
        self.load[k] -= 1
        self.abandoned.discard(job_id)
        job = self.outstanding.pop(job_id)
        if kind == wire.CANCELLED:
            if job.slot is not None:
                self.pool.release(job.slot)
            out.append(Result(job_id, None))
            return
        items = self._load(job.slot, job.indices[first:], table, payload)
        nbytes = sum(n for _, n in table)
        self.stats["bytes_shm"] += nbytes
        self.stats["bytes_pipe"] += len(payload)
        if job.slot is not None and needed > self.pool.slot_size:
            self.stats["fallbacks"] += 1
            s = self.settings
            self._warn("size", s.words.slot_too_small(len(job.indices), needed, self.pool.slot_size, s.shm_size,
                                                      s.max_buffered))
        out.append(Result(job_id, items, seconds, needed if self.pool.nslots else 0, first))

    def _load(self, slot: int | None, r: range, table: Any, payload: memoryview) -> list:
        """The items ``r`` of a message; arrays are views of the job's slot that keep it reserved.
        Items that do not unpickle here (they pickled in the worker) come back as ``RESEND``, to
        be asked for one by one, so that only the culprit fails; alone, it fails."""
        try:
            if table:
                anchor = self.pool.anchor(slot)
                return pickle.loads(payload, buffers=[anchor[o : o + n] for o, n in table])
            if slot is not None:
                self.pool.release(slot)
            return pickle.loads(payload)
        except Exception as e:
            if len(r) > 1:
                return [wire.RESEND] * len(r)
            err = TypeError(f"the result of item {r[0]} could not be unpickled in the reader: {type(e).__name__}: {e}")
            err.__cause__ = e
            return [wire.ItemError(r[0], err, portable=False)]

    # -- the workers' state ----------------------------------------------------------------------
    def check(self) -> None:
        if self.pending_crash is not None:
            self._crashed(self.pending_crash)

    def _crashed(self, k: int) -> None:
        if self.stopping:  # closed from another thread: not a crash
            raise PrefetchClosed("prefetch: the worker processes were stopped")
        p = self.procs[k]
        self._drain(k, [])  # a worker that failed to start said why before exiting
        p.join(0.5)
        code = p.exitcode
        worker = f"worker {k} (pid {p.pid}) {_describe_exit(code)}"
        items = None  # a worker runs its jobs in order: it was inside the first it had not answered whole
        if self.ready[k]:
            left = [job.indices[job.done :] for _, job in sorted(self.outstanding.items()) if job.worker == k]
            items = next((r for r in left if len(r)), None)
        hint = None if self.ready[k] else _guard_hint(self.method)
        where = f"while computing {span(items)}; that work is lost and" if items is not None else \
            "while starting, before its first job;" if not self.ready[k] else "while idle (it had no job);"
        raise WorkerCrashed(f"prefetch {worker} {where} this prefetch is closed: create a new one to go on"
                            f"{f'. {hint}' if hint else ''}", p.pid, code, worker=worker, items=items,
                            starting=not self.ready[k], hint=hint)

    def room(self) -> bool:
        return not self.pool.nslots or self.pool.free() > 0

    def started(self, job_id: int) -> bool:
        job = self.outstanding.get(job_id)
        return job is not None and self.ready[job.worker]

    def where(self, job_id: int) -> tuple[int | None, float] | None:
        """A worker runs its jobs in order and a job's items in order, and sends the items of a
        long job as they are done: the first unanswered item of its first job is where it is."""
        job = self.outstanding.get(job_id)
        if job is None or not self.ready[job.worker]:
            return None
        k = job.worker
        if job.done >= len(job.indices) or any(j < job_id and o.worker == k for j, o in self.outstanding.items()):
            return None, self.heard[k]  # it waits behind another job of its worker
        return job.indices[job.done], self.heard[k]

    def chunk_cap(self, item_bytes: float) -> int | None:
        if not self.pool.nslots or item_bytes <= 0:
            return None
        return max(1, int(self.pool.slot_size // (item_bytes + ALIGN)))

    def gauges(self) -> dict:
        return dict(slot_size=self.pool.slot_size, slots_free=self.pool.free())

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warn(message)

    def close(self, grace: float = 0.3) -> None:
        self.stopping = True
        with FDS_LOCK:
            for c in self.conns:
                _PARENT_FDS.discard(c.fileno())
                c.close()  # idle workers read end-of-file and return at once
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
            if not p.is_alive():
                p.close()
        self.procs, self.conns = [], []
        if self.poller is not None:
            self.poller.close()
        close_parent_fd(self.pool)
