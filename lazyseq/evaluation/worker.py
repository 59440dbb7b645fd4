"""A process worker's life: rebuild the pipeline, run ``start_hook``, answer job records.

Runs in the child. Every record names a range of indices and a shared-memory slot; the answer is
one message per job (``wire``), preceded by PARTIAL messages when the job runs long: a watch
thread sends the items already done, so a slow or stuck item holds up only itself. The same
thread ends the worker once the reader's process is gone (the pipe's end-of-file only reaches a
worker that is not inside an item).
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

from ..core import jobslot
from ..core.jobslot import JobSlot
from ..helpers import forced
from . import slots, wire
from .backend import STREAM, Running
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
    # A job record should not hand the reader's core to a worker. Linux only: macOS has no such
    # policy, and its workers keep the default one.
    if hasattr(os, "SCHED_BATCH") and not forced("sched"):
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
                nslots: int, close_fds: list[int], pickled: bool, report: Any = None) -> None:
    """Start (say READY, or START_FAILED with the reason), then answer job records until the
    reader closes the pipe. ``report(seq)``, if given, runs after each job: when its value (an
    int, or a dict of counts by key) changes, a REPORT message carries it ahead of the job's result."""
    _settle(close_fds)
    try:
        if pickled:
            seq, start_hook, report = cloudpickle.loads(seq)  # sent as one pickle (see processes.py)
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
    outbox = _Outbox(conn, seq)
    # The reader, or the forkserver that forked us (which exits with the reader).
    threading.Thread(target=outbox.watch, args=(os.getppid(),), name="lazyseq-worker-watch", daemon=True).start()
    _serve(conn, outbox, seq, memory, slot_size, report)


_ORPHAN_CHECK = 0.5  # seconds between looks at the reader's process


class _Outbox:
    """The worker's pipe, shared by the evaluating thread and the watch thread (one lock, so
    messages never interleave, and the parts of a job arrive in order before its result)."""

    def __init__(self, conn: connection.Connection, seq: Any):
        self.conn, self.seq, self.lock = conn, seq, threading.Lock()
        self.running: Running | None = None

    def send(self, msg: bytes) -> bool:
        with self.lock:
            try:
                self.conn.send_bytes(msg)
                return True
            except OSError:
                return False

    def finish(self, run: Running) -> tuple[list, int]:
        """The job is done: no part of it is sent any more. Returns its unsent items, and where they start."""
        with self.lock:
            self.running = None
            return run.items[run.sent :], run.sent

    def watch(self, ppid: int) -> None:
        """Send the done items of a long job; exit once the reader's process is gone."""
        last_check = time.monotonic()
        while True:
            time.sleep(STREAM / 2)
            now = time.monotonic()
            if now - last_check >= _ORPHAN_CHECK:
                last_check = now
                if os.getppid() != ppid:
                    os._exit(0)  # no clean-up: the item's code may hold locks; the reader is gone anyway
            run = self.running
            if run is not None and now - run.since >= STREAM and len(run.items) > run.sent:
                self._send_part(run)

    def _send_part(self, run: Running) -> None:
        with self.lock:
            if self.running is not run:
                return  # finished meanwhile: its result carries the items
            done, first = len(run.items), run.sent
            r = run.indices[first:done]
            items = wire.finish(self.seq, r, run.items[first:done], portable=True)
            payload, _, _ = wire.dump_chunk(items, None)  # in-band: the slot is the evaluating thread's
            try:
                self.conn.send_bytes(wire.encode(run.job_id, wire.PARTIAL, payload, first=first))
            except OSError:
                return
            run.sent, run.since = done, time.monotonic()


def _serve(conn: connection.Connection, outbox: _Outbox, seq: Any, memory: Any, slot_size: int, report: Any) -> None:
    cancelled, base = memory[: SlotPool.HEADER].view("int64"), memory.ctypes.data
    reported: int | dict = 0
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
            r = range(start, start + count * step, step)
            run = outbox.running = Running(job_id, r)
            wire.compute(seq, r, run.items)
            items, first = outbox.finish(run)
            items = wire.finish(seq, r[first:], items, portable=True)
            payload, table, needed = wire.dump_chunk(items, job)
            jobslot.set_current(None)
            del items, run
            msg = wire.encode(job_id, wire.RESULT, payload, table, needed, time.perf_counter() - t, first)
            if report is not None:
                value = _report(report, seq, reported)
                if value != reported and outbox.send(wire.encode_report(job_id, value, reported)):
                    reported = value
        if not outbox.send(msg):
            return


def _report(report: Any, seq: Any, last: int | dict) -> int | dict:
    """``report(seq)`` as an int, or a copy of its dict of counts by key; what it said last if it
    fails (a count is no reason to fail a job)."""
    try:
        value = report(seq)
        return dict(value) if isinstance(value, dict) else int(value)
    except Exception:
        return last
