"""What travels between the reader and process workers: fixed job records, and result chunks whose
out-of-band buffers (pickle protocol 5) are written into the job's shared-memory slot."""

from __future__ import annotations

import io
import pickle
import struct
import traceback
from typing import Any, NamedTuple

import numpy as np

from ..core import tree
from ..core.jobslot import JobSlot
from ..core.node import Exhausted, Failed, is_node, read_each, reader
from ..errors import EvaluationError, raised
from ..helpers import ALIGN, PAGE

JOB = struct.Struct("<qqqqq")  # job id, first index, step, count, slot (-1: no slot)
# job id, kind, number of slot buffers, bytes needed, seconds spent, where in the job the items start
HEAD = struct.Struct("<qiiqdq")
BUF = struct.Struct("<qq")  # offset in the slot, length

# RESULT: a job's (last) items; PARTIAL: the items a job has finished while a slow one holds it up;
# REPORT: the worker's ``report`` value changed (sent before the job's RESULT; ``needed`` carries it,
# and a value by key, a dict, its changed entries as the payload: see encode_report).
RESULT, READY, START_FAILED, CANCELLED, PARTIAL, REPORT = 0, 1, 2, 3, 4, 5


class Resend:
    """An item that arrived but could not be unpickled with its chunk-mates: the window asks for
    it again in a job of its own, so that only an item that fails alone fails."""

    __slots__ = ()


RESEND = Resend()


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, as text (the ``__cause__`` of it)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


class ItemError:
    """An item whose evaluation raised in a worker: the exception, its cause, the traceback text."""

    __slots__ = ("index", "error", "cause", "tb")

    def __init__(self, index: int, exc: BaseException, portable: bool = True):
        self.index, self.tb = index, "".join(traceback.format_exception(exc)) if portable else ""
        if portable:  # it will cross a process boundary
            self.error, self.cause = picklable(exc), picklable(exc.__cause__) if exc.__cause__ else None
        else:
            self.error, self.cause = exc, None

    def __reduce__(self):
        return (_item_error, (self.index, self.error, self.cause, self.tb))

    def rebuild(self) -> BaseException:
        """The worker's exception, with its cause and the worker's traceback chained under it."""
        if not self.tb:  # from a thread: the exception itself, with its real traceback
            return self.error
        err, remote = self.error, RemoteTraceback(self.tb)
        if self.cause is not None:
            self.cause.__cause__ = remote
            err.__cause__ = self.cause
        else:
            err.__cause__ = remote
        return err


def _item_error(index: int, error: BaseException, cause: BaseException | None, tb: str) -> ItemError:
    e = ItemError.__new__(ItemError)
    e.index, e.error, e.cause, e.tb = index, error, cause, tb
    return e


def picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else an ``EvaluationError`` that says what it was (what
    seqtools raises, so that ``seterr('passthrough')`` still raises an evaluation error)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception as why:
        item, view = (exc.item, exc.view) if isinstance(exc, EvaluationError) else (None, None)
        return EvaluationError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc} "
                               f"(the original exception could not be pickled: {why})", item, view)


def evaluate(seq: Any, idx: range, portable: bool = True) -> list:
    """The items ``idx`` of ``seq`` in one bulk read that goes past failing items (``_get_each``):
    a failing item becomes an ``ItemError`` naming it, the others arrive, each computed once (in
    views that can tell the failing items apart: see ``View._get_each``)."""
    return finish(seq, idx, compute(seq, idx, []), portable)


def compute(seq: Any, idx: range, out: list) -> list:
    """The raw items of :func:`evaluate` (``Failed(error)`` for a failing one), appended to ``out``
    as they are done, for a worker to send while a slow item holds up the rest. If the bulk read
    breaks (a ``BaseException`` such as ``SystemExit``), item by item from where it broke."""
    try:
        read_each(seq, idx, out)
    except BaseException:
        pass
    get = seq.__getitem__ if is_node(seq) else reader(seq)  # the view's checks and error wrapping
    for i in idx[len(out):]:
        try:
            out.append(get(i))
        except BaseException as e:
            out.append(Failed(e))
    return out


def finish(seq: Any, idx: range, items: list, portable: bool) -> list:
    """``items`` (raw items of indices ``idx``, a list the caller owns: a copy of what a worker
    thread may still be adding to) with each ``Failed`` made an ``ItemError`` that names its
    index and view, in place."""
    # Past the end of a source of unknown size (read with a step > 0), every later item of the
    # chunk is past it too: they all get the error of the first such index.
    unsized = not seq.finite if is_node(seq) else not hasattr(seq, "__len__")
    out, end = items, None
    for k, x in enumerate(out):
        if end is not None:
            out[k] = end
        elif type(x) is Failed:
            i, err = idx[k], x.error
            if isinstance(err, Exception) and is_node(seq):
                err = raised(err, i, seq)
            out[k] = ItemError(i, err, portable)
            if unsized and isinstance(err, Exhausted):
                end = out[k]
    return out


def _bytes_from(buf: Any) -> bytes:
    return bytes(buf)


class _Bytes:
    """A large ``bytes`` or ``bytearray`` in a result. The pickler never asks how to reduce those
    (a fast path writes them in-band), so they are swapped for this to travel out-of-band too."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray):
        self.data = data

    def __reduce_ex__(self, protocol: int):
        return (_bytes_from if type(self.data) is bytes else bytearray), (pickle.PickleBuffer(self.data),)


def _swap(x: Any) -> Any:
    t = type(x)
    return _Bytes(x) if (t is bytes or t is bytearray) and len(x) >= PAGE else x


def _bytes_list(data: Any, ends: bytes) -> list[bytes]:
    m, out, start = memoryview(data), [], 0
    for end in np.frombuffer(ends, np.int64).tolist():
        out.append(bytes(m[start:end]))
        start = end
    return out


class _BytesList:
    """A list of ``bytes`` (a batch's images, say) of ``PAGE`` bytes or more in all, each one
    smaller: one out-of-band buffer of them all, their ends in-band, rather than each in the pickle."""

    __slots__ = ("items",)

    def __init__(self, items: list[bytes]):
        self.items = items

    def __reduce_ex__(self, protocol: int):
        ends = np.cumsum([len(b) for b in self.items], dtype=np.int64)
        return _bytes_list, (pickle.PickleBuffer(b"".join(self.items)), ends.tobytes())


def _pack(x: Any) -> Any:
    """``x`` for the pickler: a plain list of bytes objects that add up to ``PAGE`` bytes or more
    as one :class:`_BytesList`, every large ``bytes`` as a :class:`_Bytes` (:func:`_swap`)."""
    t = type(x)
    if t is list and len(x) > 1 and all(type(b) is bytes for b in x) and sum(map(len, x)) >= PAGE:
        return _BytesList(x)
    if t is dict:
        return {k: _pack(v) for k, v in x.items()}
    if t is list or t is tuple:
        return t(_pack(v) for v in x)
    return x if t in _PLAIN else tree.map(_swap, x)


_PLAIN = frozenset((int, float, bool, type(None), str, np.ndarray))  # leaves that are never large bytes


def _address(m: memoryview) -> int:
    return np.frombuffer(m, dtype=np.uint8).ctypes.data


def dump_chunk(items: list, job: JobSlot | None) -> tuple[bytes, list[tuple[int, int]], int]:
    """Pickle ``items``; buffers go into ``job``'s slot while they fit, the rest in-band.

    Returns the payload, the (offset, length) of each slot buffer in order, and the bytes a slot
    would need to hold every buffer of the chunk.
    """
    table: list[tuple[int, int]] = []
    needed = [job.offset if job is not None else 0]
    base = job.offset if job is not None else 0

    def place(pb: pickle.PickleBuffer) -> bool:
        m = pb.raw()
        n = m.nbytes
        if job is not None and n:
            addr = _address(m)
            if job.start <= addr and addr + n <= job.start + len(job.view):  # made by lazyseq.empty()
                table.append((addr - job.start, n))
                return False
        needed[0] += n + ALIGN  # its alignment at most
        if job is None or n == 0:
            return True
        off = job.reserve(n)
        if off is None:
            return True  # does not fit: this buffer travels in-band, through the pipe
        job.view[off : off + n] = np.frombuffer(m, dtype=np.uint8)
        table.append((off, n))
        return False

    f = io.BytesIO()
    items = [x if type(x) in _PLAIN else _pack(x) for x in items]
    try:
        pickle.Pickler(f, protocol=5, buffer_callback=place).dump(items)
    except Exception:
        # Some item cannot be pickled: name it, send the others.
        table.clear()
        if job is not None:
            job.offset = base
        errors = [_pickle_error(x) for x in items]
        items = [x if e is None else ItemError(i, e) for i, (x, e) in enumerate(zip(items, errors))]
        f = io.BytesIO()
        pickle.Pickler(f, protocol=5, buffer_callback=place).dump(items)
    return f.getvalue(), table, needed[0]


def _pickle_error(x: Any) -> BaseException | None:
    """Why ``x`` cannot be pickled to leave the worker, or None if it can."""
    try:
        pickle.dumps(x, protocol=5, buffer_callback=lambda b: False)
    except Exception as e:
        return TypeError(f"the item ({type(x).__name__}) cannot be pickled to leave the worker process: {e}")
    return None


def encode(job_id: int, kind: int, payload: bytes, table: list[tuple[int, int]] = (), needed: int = 0,
           seconds: float = 0.0, first: int = 0) -> bytes:
    head = HEAD.pack(job_id, kind, len(table), needed, seconds, first)
    return b"".join([head, *(BUF.pack(o, n) for o, n in table), payload])


def encode_report(job_id: int, value: int | dict, last: int | dict) -> bytes:
    """A REPORT of ``report``'s new ``value`` (``last``: the one sent before): an int in ``needed``;
    counts by key (a dict of ints that only grow) as the entries that changed, pickled, and the
    sum of the counts in ``needed``."""
    if type(value) is not dict:
        return encode(job_id, REPORT, b"", needed=value)
    old = last if type(last) is dict else {}
    changed = {k: n for k, n in value.items() if old.get(k) != n}
    return encode(job_id, REPORT, pickle.dumps(changed), needed=sum(value.values()))


def merge_report(keyed: dict[int, dict], worker: int, payload: Any) -> dict:
    """A REPORT's entries by key (``payload``) from ``worker`` into ``keyed``, each worker's
    latest counts; the sums over the workers, by key."""
    keyed.setdefault(worker, {}).update(pickle.loads(payload))
    total: dict = {}
    for counts in keyed.values():
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return total


class Message(NamedTuple):
    job_id: int
    kind: int
    table: list[tuple[int, int]]
    needed: int
    seconds: float
    first: int
    payload: memoryview


def decode(msg: bytes) -> Message:
    job_id, kind, nbuf, needed, seconds, first = HEAD.unpack_from(msg)
    at = HEAD.size
    table = [BUF.unpack_from(msg, at + k * BUF.size) for k in range(nbuf)]
    return Message(job_id, kind, table, needed, seconds, first, memoryview(msg)[at + nbuf * BUF.size :])
