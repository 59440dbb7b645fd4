"""Instruments: watch the items a pipeline reads, and how fast."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .core.base import View
from .core.node import check_source, describe_source, is_finite, read_many, reader
from .errors import wrap_error
from .helpers import fname

__all__ = ["debug", "monitor_throughput", "profile", "profiling", "Profile", "Stage"]


class Debug(View):
    fingerprint_transparent = True

    def __init__(self, seq: Any, func: Callable, max_calls: int | None, max_rate: float | None):
        self.src, self._rd = check_source(seq, "debug"), reader(seq)
        self.func, self.max_calls, self.max_rate = func, max_calls, max_rate
        self.n_calls, self.last_call = 0, -float("inf")
        self.finite = is_finite(seq)

    def _silent(self) -> bool:
        if self.max_calls is not None and self.n_calls >= self.max_calls:
            return True
        return self.max_rate is not None and time.monotonic() - self.last_call < 1.0 / self.max_rate

    def _get(self, i: int) -> Any:
        value = self._rd(i)
        if not self._silent():
            self.n_calls, self.last_call = self.n_calls + 1, time.monotonic()
            try:
                self.func(i, value)
            except Exception as e:
                raise wrap_error(e, i, self)  # noqa: B904
        return value

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value

    def describe(self) -> str:
        return f"debug({fname(self.func)})"


def debug(seq: Any, func: Callable, max_calls: int | None = None, max_rate: float | None = None) -> View:
    """Call ``func(index, item)`` whenever an item is read, at most ``max_calls`` times and at most
    ``max_rate`` times a second.

    >>> import lazyseq
    >>> watched = lazyseq.instrument.debug([1, 2, 3, 4, 5], lambda i, v: print(i, v), max_calls=2)
    >>> x = watched[0]
    0 1
    >>> y = watched[2]
    2 3
    >>> z = watched[3]
    """
    return Debug(seq, func, max_calls, max_rate)


class ThroughputMonitor(View):
    fingerprint_transparent = True

    def __init__(self, seq: Any):
        self.src, self._rd = check_source(seq, "monitor_throughput"), reader(seq)
        self.finite = is_finite(seq)
        self._setup()

    def _setup(self) -> None:
        self._lock, self.n_calls, self.time_spent = threading.Lock(), 0, 0.0

    def __getstate__(self) -> dict:
        return {"src": self.src, "_rd": self._rd, "finite": self.finite}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def reset(self) -> None:
        """Forget the reads measured so far."""
        with self._lock:
            self.n_calls, self.time_spent = 0, 0.0

    def throughput(self) -> float:
        """Items per second over the reads measured so far."""
        if self.n_calls == 0:
            raise RuntimeError("monitor_throughput: no item was read yet, so there is no throughput")
        return self.n_calls / self.time_spent

    def read_delay(self) -> float:
        """Average seconds per item read."""
        if self.n_calls == 0:
            raise RuntimeError("monitor_throughput: no item was read yet, so there is no read delay")
        return self.time_spent / self.n_calls

    def _count(self, n: int, dt: float) -> None:
        with self._lock:
            self.n_calls += n
            self.time_spent += dt

    def _get(self, i: int) -> Any:
        t = time.perf_counter()
        value = self._rd(i)
        self._count(1, time.perf_counter() - t)
        return value

    def _get_many(self, idx: Sequence[int]) -> list:
        t = time.perf_counter()
        values = read_many(self.src, idx)
        self._count(len(values), time.perf_counter() - t)
        return values

    def __iter__(self) -> Iterator:
        it = iter(self.src)
        while True:  # time the source's own iteration, not the consumer's work between items
            t = time.perf_counter()
            try:
                value = next(it)
            except StopIteration:
                return
            self._count(1, time.perf_counter() - t)
            yield value

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value

    def describe(self) -> str:
        return "monitor_throughput()"


def monitor_throughput(seq: Any) -> ThroughputMonitor:
    """Measure how long reading items of ``seq`` takes.

    The view has ``read_delay()`` (seconds per item), ``throughput()`` (items per second) and
    ``reset()``.

    >>> import lazyseq, time
    >>> slow = lazyseq.smap(lambda x: time.sleep(0.01) or x, list(range(5)))
    >>> watched = lazyseq.instrument.monitor_throughput(slow)
    >>> list(watched)
    [0, 1, 2, 3, 4]
    >>> 0.009 < watched.read_delay() < 0.5
    True
    """
    return ThroughputMonitor(seq)


# -- time per stage --------------------------------------------------------------------------------
# the read protocol: where a view spends its time; with the reads a view above may bind instead of
# _get and _get_many (Node._get_fn, _get_many_fn), and a slice's own __getitem__
_READS = ("_get", "_get_many", "_get_each", "_get_listed", "_gather_trusted", "_map_plain", "__getitem__")


class Stage:
    """One view (or plain source) of a profiled pipeline: the reads it served and the time spent
    in it, its sources excluded (``seconds``)."""

    __slots__ = ("view", "name", "depth", "tree", "calls", "items", "seconds", "busy", "workers")

    def __init__(self, view: Any, name: str, depth: int):
        self.view, self.name, self.depth, self.tree = view, name, depth, ""
        self.calls, self.items, self.seconds = 0, 0, 0.0
        # a prefetch: its workers' time inside jobs while profiled (its stats()' busy_seconds), and how many
        self.busy: float | None = None
        self.workers = 0

    @property
    def seconds_per_item(self) -> float:
        """Seconds spent in this stage per item it delivered (0 if it delivered none)."""
        return self.seconds / self.items if self.items else 0.0

    @property
    def items_per_s(self) -> float:
        """Items per second this stage alone could deliver (inf if it took no measurable time)."""
        return self.items / self.seconds if self.seconds > 0 else float("inf")

    def __repr__(self) -> str:
        return f"Stage({self.name!r}, items={self.items}, seconds={self.seconds:.6f})"


class Profile:
    """Time per stage of a pipeline, filled in while reads run under :func:`profiling` (or by
    :func:`profile`). ``stages`` lists every view of the tree, parents first; ``prof[view]`` is the
    :class:`Stage` of a view of the pipeline; ``total`` is the wall-clock seconds profiled."""

    def __init__(self, seq: Any):
        self.seq, self.stages, self.total, self.reads = seq, [], 0.0, 0
        self._by_id: dict[int, Stage] = {}
        self._codes: set = set()
        self._walk(seq, 0)

    def _walk(self, node: Any, depth: int, lead: str = "", last: bool = True) -> None:
        if id(node) in self._by_id:  # a source read by two views: one stage
            return
        name = node.describe() if isinstance(node, View) else describe_source(node)
        stage = self._by_id[id(node)] = Stage(node, name, depth)
        stage.tree = lead + ("└─ " if last else "├─ ") if depth else ""  # the prefix drawn in table()
        self.stages.append(stage)
        kinds = _READS if isinstance(node, View) else ("__getitem__",)
        for attr in kinds:  # Python-level reads only: a list's or array's time is its reader's
            if attr == "__getitem__" and kinds is _READS and type(node).__getitem__ is View.__getitem__:
                continue  # the general one: its reads go through _get; a slice reads in its own
            code = getattr(getattr(type(node), attr, None), "__code__", None)
            if code is not None:
                self._codes.add(code)
        if isinstance(node, View):
            kids = node.children()
            inner = lead + ("   " if last else "│  ") if depth else ""
            for k, kid in enumerate(kids):
                self._walk(kid, depth + 1, inner, k == len(kids) - 1)

    def __getitem__(self, view: Any) -> Stage:
        try:
            return self._by_id[id(view)]
        except KeyError:
            raise KeyError(f"profile: {describe_source(view)} is not a stage of the profiled pipeline") from None

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def table(self) -> str:
        """The stages as a tree, with items, ms per item, items/s and share of the time."""
        rows = [f"{'stage':50s}{'items':>8s}{'ms/item':>10s}{'items/s':>11s}{'share':>7s}"]
        for s in self.stages:
            name = s.tree + s.name
            name = name if len(name) <= 48 else name[:47] + "…"
            rate = "-" if not s.items else "inf" if s.seconds <= 0 else f"{s.items_per_s:.0f}"
            share = f"{100 * s.seconds / self.total:.0f}%" if self.total > 0 and s.items else "-"
            rows.append(f"{name:50s}{s.items:8d}{1e3 * s.seconds_per_item:10.3f}{rate:>11s}{share:>7s}")
        rows.append(f"{self.reads} reads in {1e3 * self.total:.1f} ms under the profiler "
                    "(it adds about 1 us per Python call, counted in the stage making the call)")
        for s in self.stages:
            if s.busy is not None and s.workers and self.total > 0:
                rows.append(f"{s.name}: its {s.workers} workers were inside jobs {s.busy:.3f} s, "
                            f"{s.busy / (self.total * s.workers):.0%} of {s.workers} x the time profiled "
                            "(the rest: starting, or waiting for a job or a free slot)")
        return "\n".join(rows)

    def _busy_marks(self) -> list[tuple[Stage, float]]:
        """Each prefetch stage with its workers' busy seconds so far (a ``stats()`` with ``busy_seconds``)."""
        marks = []
        for s in self.stages:
            stats = getattr(s.view, "stats", None) if isinstance(s.view, View) else None
            counters = stats() if callable(stats) else None
            if isinstance(counters, dict) and "busy_seconds" in counters:
                marks.append((s, counters["busy_seconds"]))
        return marks

    def _add_busy(self, marks: list[tuple[Stage, float]]) -> None:
        for s, before in marks:
            counters = s.view.stats()
            s.busy = (s.busy or 0.0) + counters["busy_seconds"] - before
            s.workers = counters.get("nworkers", 0)

    def __repr__(self) -> str:
        return self.table()

    # -- the profiler hook: a stack of the stages being read, innermost last ---------------------
    def _hook(self) -> Callable:
        codes, by_id, clock = self._codes, self._by_id, time.perf_counter
        stack: list = []  # [frame, stage, start, seconds spent in inner stages]

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code in codes:
                local = frame.f_locals
                stage = by_id.get(id(local.get("self")))
                if stage is None or (stack and stack[-1][1] is stage):  # not ours, or a view's inner call
                    return
                key = local.get(frame.f_code.co_varnames[1]) if frame.f_code.co_name != "_get" else None
                stage.calls += 1
                stage.items += 1 if key is None else len(key) if hasattr(key, "__len__") else 1
                stack.append([frame, stage, clock(), 0.0])
            elif event == "return" and stack and stack[-1][0] is frame:
                _, stage, start, inner = stack.pop()
                spent = clock() - start
                stage.seconds += spent - inner
                if stack:
                    stack[-1][3] += spent

        return hook


@contextmanager
def profiling(seq: Any) -> Iterator[Profile]:
    """Time per stage of ``seq`` while the ``with`` block reads it (in this thread; the profiler
    that was set before, if any, is put back after the block):

    >>> import lazyseq
    >>> squares = lazyseq.smap(lambda x: x * x, range(10))
    >>> with lazyseq.instrument.profiling(squares) as prof:
    ...     total = sum(squares)
    >>> prof[squares].items, prof.stages[1].name
    (10, 'range(0, 10)')
    """
    prof, previous = Profile(check_source(seq, "profiling")), sys.getprofile()
    marks = prof._busy_marks()
    start = time.perf_counter()
    sys.setprofile(prof._hook())
    try:
        yield prof
    finally:
        sys.setprofile(previous)
        prof.total += time.perf_counter() - start
        prof._add_busy(marks)


def profile(seq: Any, n: int = 100, keys: Sequence[int] | None = None) -> Profile:
    """Read items of ``seq`` (the first ``n``, or those of ``keys``) one by one and return the time
    spent in each stage of its pipeline, its sources excluded, with items/s per stage.

    Stages below a ``prefetch`` run in its workers: their time shows as the prefetch's wait.

    >>> import time, lazyseq
    >>> decode = lazyseq.smap(lambda x: time.sleep(0.002) or x, range(100))
    >>> part = decode[10:60]
    >>> prof = lazyseq.instrument.profile(part, n=20)
    >>> 1.5 < prof[decode].seconds_per_item * 1e3 < 20, prof[part].seconds_per_item * 1e3 < 0.2
    (True, True)
    """
    if n < 0:
        raise ValueError(f"profile: n must be >= 0, got {n}")
    if keys is None:
        if not is_finite(seq):
            keys = range(n)
        else:
            keys = range(min(n, len(seq)))
    with profiling(seq) as prof:
        for k in keys:
            seq[k]
            prof.reads += 1
    return prof
