"""The process backend: start, feed, supervise and stop worker processes.

Each worker has its own duplex pipe. The reader sends fixed job records (a range of indices and a
slot) and receives one message per chunk. The reader waits on the pipes and on the processes'
sentinels together, so a dead worker is seen as soon as it dies.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing import connection, reduction
from typing import Any

import cloudpickle

from ..errors import WorkerCrashed, WorkerStartError
from . import slots, wire
from .slots import JobSlot, SlotPool

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
# A slot goes back to the worker that has it mapped unless that one has this many more jobs waiting.
_AFFINITY = 2


def parent_fd(fd: int) -> None:
    """Count ``fd`` among the descriptors forked workers close."""
    with FDS_LOCK:
        _PARENT_FDS.add(fd)


def close_parent_fd(pool: SlotPool) -> None:
    """Close the pool's descriptor in the reader (workers have their own), never mid-fork."""
    with FDS_LOCK:
        _PARENT_FDS.discard(pool.fd)
        pool.close_fd()


class _FdForChild:
    """A file descriptor handed to a spawn/forkserver child (duplicated into it at start)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def worker_main(index: int, conn: connection.Connection, seq: Any, start_hook: Any, shm: Any, slot_size: int,
                nslots: int, close_fds: list[int], parent: int, pickled: bool) -> None:
    """A worker's life: rebuild the pipeline, run start_hook, then answer job records until the
    reader closes the pipe or its process disappears."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle; it stops us
    if hasattr(os, "SCHED_BATCH"):  # a job record should not hand the reader's core to a worker
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        if pickled:
            seq, start_hook = cloudpickle.loads(seq), cloudpickle.loads(start_hook)
        memory = slots.map_segment(shm, SlotPool.HEADER + slot_size * nslots)
        os.close(shm)
        cancelled = memory[: SlotPool.HEADER].view("int64")
        if start_hook is not None:
            start_hook(index)
    except BaseException as e:
        try:
            conn.send_bytes(wire.encode(-1, wire.START_FAILED, cloudpickle.dumps(wire.ItemError(-1, e))))
        except OSError:
            pass
        return
    try:
        conn.send_bytes(wire.encode(-1, wire.READY, struct.pack("<q", os.getpid())))
    except OSError:  # the reader closed us already
        return
    base = memory.ctypes.data
    ppid = os.getppid()  # the reader, or the forkserver that forked us (which exits with the reader)
    threading.Thread(target=_exit_when_orphaned, args=(ppid,), name="lazyseq-orphan-watch", daemon=True).start()
    while True:
        try:
            if not conn.poll(0.5):
                if os.getppid() != ppid:  # orphaned: the reader's process is gone
                    return
                continue
            rec = conn.recv_bytes()
        except (EOFError, OSError):
            return
        job_id, start, step, count, slot = wire.JOB.unpack(rec)
        if cancelled[job_id % SlotPool.RING] == job_id:  # the reader jumped away from it
            try:
                conn.send_bytes(wire.encode(job_id, wire.CANCELLED, b""))
            except OSError:
                return
            continue
        job = None
        if slot >= 0:
            at = SlotPool.HEADER + slot * slot_size
            job = JobSlot(memory[at : at + slot_size], base + at)
        slots.set_current(job)
        t = time.perf_counter()
        items = wire.evaluate(seq, range(start, start + count * step, step))
        payload, table, needed = wire.dump_chunk(items, job)
        slots.set_current(None)
        del items
        try:
            conn.send_bytes(wire.encode(job_id, wire.RESULT, payload, table, needed, time.perf_counter() - t))
        except OSError:
            return


def _exit_when_orphaned(ppid: int) -> None:
    """A worker inside a long (or stuck) item never gets back to its pipe: this thread ends the
    worker once the reader's process is gone (we get a new parent), within about a second."""
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(0)  # no clean-up: the item's code may hold locks; the reader is gone anyway


class ProcessBackend:
    def __init__(self, seq: Any, nworkers: int, start_hook: Callable | None, ctx: Any, pool: SlotPool):
        self.pool, self.ctx, self.method = pool, ctx, ctx.get_start_method()
        self.procs: list = []
        self.conns: list[connection.Connection] = []
        self.load: list[int] = []  # jobs outstanding per worker
        self.ready: list[bool] = []  # per worker: said it started
        self.slot_worker: dict[int, int] = {}  # the worker that wrote each slot last (has it mapped)
        self.job_worker: dict[int, int] = {}  # unanswered job -> its worker
        self.abandoned: set[int] = set()  # unanswered jobs the reader gave up (a worker may be inside one)
        self._pending_crash: int | None = None  # a worker seen dead, reported by check()
        self.stopping = False
        fork = self.method == "fork"
        if fork:
            args_seq, args_hook = seq, start_hook
        else:
            try:
                args_seq, args_hook = cloudpickle.dumps(seq), cloudpickle.dumps(start_hook)
            except Exception as e:
                raise TypeError(f"prefetch: the sequence cannot be pickled to start {self.method!r} workers "
                                f"({e}); use mp_context='fork' or make it picklable") from e
        with FDS_LOCK if fork else contextlib.nullcontext():  # spawn children inherit no descriptors
            try:
                for k in range(nworkers):
                    mine, theirs = ctx.Pipe(duplex=True)
                    self.conns.append(mine)
                    _PARENT_FDS.add(mine.fileno())
                    shm = pool.fd if fork else _FdForChild(pool.fd)
                    close = sorted(_PARENT_FDS - {pool.fd}) if fork else []
                    p = ctx.Process(target=worker_main, name=f"lazyseq-prefetch-{k}",
                                    args=(k, theirs, args_seq, args_hook, shm, pool.slot_size, pool.nslots, close,
                                          os.getpid(), not fork))
                    p.start()
                    theirs.close()
                    self.procs.append(p)
                    self.load.append(0)
                    self.ready.append(False)
            except BaseException:
                self.close()
                raise
        self.sentinels = {p.sentinel: k for k, p in enumerate(self.procs)}
        self.fds = {c.fileno(): k for k, c in enumerate(self.conns)}
        self.poller: Any = None

    @property
    def nworkers(self) -> int:
        return len(self.procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def full(self) -> bool:
        """Every worker has MAX_QUEUED records waiting: send no more until some are answered."""
        return min(self.load) >= MAX_QUEUED

    def abandon(self, job_ids: set[int]) -> None:
        """The reader gave these jobs up: their workers skip them, unless already inside one."""
        self.abandoned |= job_ids & self.job_worker.keys()

    def started(self, job_id: int) -> bool:
        """Whether the job's worker has started (said it is ready)."""
        k = self.job_worker.get(job_id)
        return k is not None and self.ready[k]

    def behind(self, job_id: int) -> bool:
        """Whether the job waits on a worker that has an abandoned job before it (which may be slow
        or stuck: nothing else would make the reader wait for it)."""
        k = self.job_worker.get(job_id)
        return k is not None and any(a < job_id and self.job_worker.get(a) == k for a in self.abandoned)

    def submit(self, job_id: int, r: range, slot: int | None) -> None:
        if self.stopping:
            raise OSError("prefetch: the workers were stopped")
        load = self.load
        # Workers with an abandoned job outstanding may be inside it for long: others first.
        busy = {self.job_worker[a] for a in self.abandoned} if self.abandoned else ()
        ks = ([k for k in range(len(load)) if k not in busy] if busy else None) or range(len(load))
        k = min(ks, key=load.__getitem__)
        if slot is not None:
            # A slot's pages cost a fault per page in each worker that first writes them (1-2 us
            # each: a 4 MiB slot ~2 ms), so a slot stays with the worker that has it mapped.
            w = self.slot_worker.get(slot, k)
            if w not in busy and load[w] <= load[k] + _AFFINITY and load[w] < MAX_QUEUED:
                k = w
            self.slot_worker[slot] = k
        load[k] += 1
        self.job_worker[job_id] = k
        try:
            self.conns[k].send_bytes(wire.JOB.pack(job_id, r.start, r.step, len(r), -1 if slot is None else slot))
        except OSError:
            self._crashed(k)

    def _crashed(self, k: int) -> None:
        if self.stopping:  # closed from another thread: not a crash
            raise OSError("prefetch: the workers were stopped")
        p = self.procs[k]
        try:  # a worker that failed to start said why before exiting
            while self.conns[k].poll(0):
                self._message(k, self.conns[k].recv_bytes())
        except (EOFError, OSError):
            pass
        p.join(0.5)
        code = p.exitcode
        raise WorkerCrashed(f"prefetch worker {k} (pid {p.pid}) {_describe_exit(code)}; the items it was "
                            "computing are lost and this prefetch is closed: create a new one to go on",
                            p.pid, code)

    def poll(self, timeout: float) -> list[tuple[int, int, list[tuple[int, int]], int, float, memoryview]]:
        """Messages that arrived within ``timeout`` seconds; raises WorkerCrashed for a dead worker."""
        if self.poller is None:  # registered once: a fresh selector per wait costs more than the wait
            self.poller = select.poll()
            for fd in (*self.fds, *self.sentinels):
                self.poller.register(fd, select.POLLIN)
        events = self.poller.poll(max(0, int(timeout * 1000 + 0.999)))
        if self.stopping:  # closed from another thread while we waited
            raise OSError("prefetch: the workers were stopped")
        out, dead = [], []
        for fd, _event in events:
            k = self.fds.get(fd)
            if k is None:
                dead.append(self.sentinels[fd])
                continue
            try:
                out.append(self._message(k, self.conns[k].recv_bytes()))
            except (EOFError, OSError):
                dead.append(k)
        for k in dead:  # what a dead worker sent before dying still counts
            conn = self.conns[k]
            try:
                while conn.poll(0):
                    out.append(self._message(k, conn.recv_bytes()))
            except (EOFError, OSError):
                pass
        if dead and not self.stopping:
            self._pending_crash = dead[0]
        return out

    def check(self) -> None:
        k = self._pending_crash
        if k is not None:
            self._crashed(k)

    def _message(self, k: int, msg: bytes) -> tuple:
        job_id, kind, table, needed, seconds, payload = wire.decode_head(msg)
        if kind == wire.START_FAILED:
            err = cloudpickle.loads(payload).rebuild()
            raise WorkerStartError(f"prefetch worker {k} failed to start: {type(err).__name__}: {err}") from err
        if kind == wire.READY:
            self.ready[k] = True
        else:  # a job's answer
            self.load[k] -= 1
            self.job_worker.pop(job_id, None)
            self.abandoned.discard(job_id)
        return job_id, kind, table, needed, seconds, payload

    def load_items(self, slot: int | None, table: list[tuple[int, int]], payload: memoryview) -> list:
        """Rebuild a chunk's items; arrays are views of ``slot`` that keep it reserved."""
        if table:
            anchor = self.pool.anchor(slot)
            return pickle.loads(payload, buffers=[anchor[o : o + n] for o, n in table])
        if slot is not None:
            self.pool.release(slot)
        return pickle.loads(payload)

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

