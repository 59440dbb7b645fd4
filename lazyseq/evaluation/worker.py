"""A process worker's life: rebuild the pipeline, run ``start_hook``, answer job records.

Runs in the child. Every record names a range of indices and a shared-memory slot; the answer is
one message per job (``wire``). The worker ends when the reader closes its pipe, or, if it is
inside a long item then, when a watch thread sees the reader's process gone.
"""

from __future__ import annotations

import os
import signal
import struct
import threading
import time
from multiprocessing import connection, reduction
from typing import Any

import cloudpickle

from .. import jobslot
from ..jobslot import JobSlot
from . import slots, wire
from .slots import SlotPool

__all__ = ["FdForChild", "worker_main"]


class FdForChild:
    """A file descriptor handed to a spawn/forkserver child (duplicated into it at start)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _settle(close_fds: list[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle; it stops us
    if hasattr(os, "SCHED_BATCH"):  # a job record should not hand the reader's core to a worker
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass
    for fd in close_fds:  # the reader's ends of other workers' pipes (fork): theirs to close
        try:
            os.close(fd)
        except OSError:
            pass


def worker_main(index: int, conn: connection.Connection, seq: Any, start_hook: Any, shm: Any, slot_size: int,
                nslots: int, close_fds: list[int], pickled: bool) -> None:
    """Start (say READY, or START_FAILED with the reason), then answer job records until the
    reader closes the pipe."""
    _settle(close_fds)
    try:
        if pickled:
            seq, start_hook = cloudpickle.loads(seq), cloudpickle.loads(start_hook)
        memory = slots.map_segment(shm, SlotPool.HEADER + slot_size * nslots)
        os.close(shm)
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
    # The reader, or the forkserver that forked us (which exits with the reader).
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), name="lazyseq-orphan-watch",
                     daemon=True).start()
    _serve(conn, seq, memory, slot_size)


def _serve(conn: connection.Connection, seq: Any, memory: Any, slot_size: int) -> None:
    cancelled, base = memory[: SlotPool.HEADER].view("int64"), memory.ctypes.data
    while True:
        try:
            rec = conn.recv_bytes()
        except (EOFError, OSError):
            return
        job_id, start, step, count, slot = wire.JOB.unpack(rec)
        if cancelled[job_id % SlotPool.RING] == job_id:  # the reader jumped away from it
            msg = wire.encode(job_id, wire.CANCELLED, b"")
        else:
            job = None
            if slot >= 0:
                at = SlotPool.HEADER + slot * slot_size
                job = JobSlot(memory[at : at + slot_size], base + at)
            jobslot.set_current(job)
            t = time.perf_counter()
            items = wire.evaluate(seq, range(start, start + count * step, step))
            payload, table, needed = wire.dump_chunk(items, job)
            jobslot.set_current(None)
            del items
            msg = wire.encode(job_id, wire.RESULT, payload, table, needed, time.perf_counter() - t)
        try:
            conn.send_bytes(msg)
        except OSError:
            return


def _exit_when_orphaned(ppid: int) -> None:
    """A worker inside a long (or stuck) item never gets back to its pipe: this thread ends the
    worker once the reader's process is gone (we get a new parent), within about a second."""
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(0)  # no clean-up: the item's code may hold locks; the reader is gone anyway
