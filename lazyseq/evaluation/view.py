"""The prefetch view: its life cycle and read path, over a window that drives one backend."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..core.base import View
from ..core.node import Exhausted, check_source, fork_unsafe, is_finite, length
from ..core.workerinfo import WorkerStart
from ..errors import EvaluationError, PrefetchClosed, PrefetchTimeout, passthrough, wrap_error
from ..helpers import usable_cores
from . import wire
from .actors import RayBackend, cluster_cpus, options_error, ray_missing
from .backend import Backend, Settings, Words
from .completion import Unordered, UnorderedOpen
from .coroutines import AsyncBackend
from .processes import ProcessBackend
from .threads import ThreadBackend
from .window import Window

__all__ = ["prefetch", "Prefetch"]

BACKENDS: dict[str, type] = {"thread": ThreadBackend, "process": ProcessBackend, "ray": RayBackend,
                             "async": AsyncBackend}

_forks = [0]  # bumped in a forked child: a prefetch made before the fork is not the child's to run
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class _Machinery:
    """What must be stopped when the prefetch goes away (held by its finalizer, not by it)."""

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.owner, self.fork = os.getpid(), _forks[0]
        self.lock, self.stopped = threading.Lock(), False  # stopped: what starts later stops at once

    def stop(self) -> None:
        if os.getpid() != self.owner:  # a forked copy of the reader's objects: not ours to stop
            return
        with self.lock:
            self.stopped = True
            backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


class Prefetch(View):
    """See :func:`prefetch`. The view owns the life cycle (start, close, pickling, fork) and turns
    what the window delivers into items or the errors ``seq[i]`` would raise."""

    # lazyseq.at_epoch leaves a prefetch as it is: its pipeline lives in its workers (a copy would
    # start workers of its own that nothing closes)
    epoch_opaque = True
    fingerprint_transparent = True  # workers, method and depth may change across a resume

    def __init__(self, seq: Any, nworkers: int, method: str, max_buffered: int, start_hook: Callable | None,
                 shm_size: int, mp_context: Any, timeout: float | None, lazy_start: bool, ray_options: Any = None,
                 address: str | None = None, words: Words | None = None, report: Callable[[Any], int | dict] | None = None):
        # what describe() shows, first: a traceback prints this object even if a check below fails
        self.method, self.max_buffered, self.shm_size, self.nworkers = method, max_buffered, shm_size, nworkers
        self.src = check_source(seq, "prefetch")
        if method not in BACKENDS:
            raise ValueError(f"prefetch: method must be one of {sorted(BACKENDS)}, got {method!r}")
        if max_buffered < 1:
            raise ValueError(f"prefetch: max_buffered must be >= 1, got {max_buffered}")
        if shm_size < 0:
            raise ValueError(f"prefetch: shm_size must be >= 0, got {shm_size}")
        if shm_size and method != "process":
            raise ValueError("prefetch: shm_size only applies to method='process' (threads share memory already)")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"prefetch: timeout must be > 0 seconds or None, got {timeout}")
        why = options_error(ray_options, address, method)
        if why is not None:
            raise ValueError(f"prefetch: {why}")
        if method == "ray" and (missing := ray_missing()) is not None:
            raise ImportError(missing)
        self.ray_options, self.address = (dict(ray_options) if ray_options is not None else None), address
        if mp_context is None and method == "process":
            mp_context = _start_method(seq)
        if isinstance(mp_context, str) or mp_context is None:
            mp_context = multiprocessing.get_context(mp_context)
        if nworkers <= 0:  # Ray: the cluster's CPUs (connecting to it now)
            nworkers = max(1, (cluster_cpus(address) if method == "ray" else usable_cores()) + nworkers)
        self.nworkers = nworkers
        self.start_hook, self.mp_context, self.timeout = start_hook, mp_context, timeout
        self.words, self.report = words if words is not None else Words(), report
        self.finite = is_finite(seq)
        self._setup()
        if not lazy_start:
            self._start()

    # -- life cycle ------------------------------------------------------------------------------
    def _setup(self) -> None:
        """The state of a prefetch that has not started (again, in a copy or a forked child)."""
        self._lock = threading.RLock()  # one reader at a time; close() does not take it
        self._m = _Machinery()
        self._finalizer = weakref.finalize(self, self._m.stop)
        self._error: BaseException | None = None  # what every read raises from now on
        self._window: Window | None = None  # made with the backend, at the start
        self._unordered: weakref.ref | None = None  # the unordered() iterator open now, if any

    def _start(self) -> None:
        m = self._m
        if m.backend is not None:
            return
        cls = BACKENDS[self.method]
        stats = {**Window.COUNTERS, **cls.COUNTERS}
        start = WorkerStart(self.start_hook, self.nworkers, self.src)  # worker_info(), then the hook
        settings = Settings(self.nworkers, start, self.max_buffered, self.shm_size, self.mp_context,
                            self.ray_options, self.address, self.words, self.report)
        try:
            # what a view computes at its first len (filter's kept indices, pack's rows) is computed
            # here, once, before forked workers copy the pipeline (each would compute its own)
            length(self.src)
            backend = cls(self.src, settings, stats)
            with m.lock:
                m.backend, stopped = backend, m.stopped
            if stopped:  # close() ran while the workers started (from another thread): stop them now
                raise self._error or PrefetchClosed(f"{self.describe()} was closed")
        except BaseException:
            m.stop()
            raise
        self._window = Window(self.src, backend, self.nworkers, self.max_buffered, self.timeout, stats,
                              self.describe())

    def close(self) -> None:
        """Stop the workers and release the shared memory; items already read stay valid.

        Safe from any thread: a reader waiting for an item gets ``PrefetchClosed``."""
        if self._error is None:
            self._error = PrefetchClosed(f"{self.describe()} is closed; create a new one to read on")
        self._finalizer()  # idempotent; does not wait for the reader's lock
        if self._window is not None and self._lock.acquire(blocking=False):
            try:
                self._window.clear()
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
        keep = ("src", "nworkers", "method", "max_buffered", "start_hook", "shm_size", "timeout", "finite",
                "ray_options", "address", "report")
        state = {k: self.__dict__[k] for k in keep}
        state["mp_context"] = self.mp_context.get_start_method()
        return state

    def __setstate__(self, state: dict) -> None:  # a copy (e.g. nested in a worker) starts on first read
        self.__dict__.update(state)
        self.words = Words()  # in the prefetch's own terms: a copy is read as a prefetch
        self.mp_context = multiprocessing.get_context(state["mp_context"])
        self._setup()

    # -- reads -----------------------------------------------------------------------------------
    def _get(self, i: int) -> Any:
        with self._lock:
            if self._unordered is not None and self._unordered_open():
                raise UnorderedOpen(f"{self.describe()}: p[{i}] while an unordered() iterator over it is open; "
                                   "finish or close it first (leave its loop, it.close(), or a with block)")
            return self._deliver(i, self._guarded(Window.read, i))

    def _unordered_open(self) -> bool:  # under the lock
        it = self._unordered() if self._unordered is not None else None
        return it is not None and it._open()

    def _guarded(self, read: Callable[[Window, Any], Any], arg: Any) -> Any:
        """``read(window, arg)``, starting the workers first if needed (under the lock); what
        breaks the machinery closes the prefetch."""
        if self._error is not None:
            raise self._error
        try:
            if self._m.fork != _forks[0]:  # a forked copy of a started prefetch: start afresh
                self._setup()
            if self._m.backend is None:
                self._start()
            value = read(self._window, arg)
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
        return value

    def unordered(self, start: int = 0, stop: int | None = None) -> Unordered:
        """``(index, item)`` pairs for the indices of ``range(start, stop)`` in the order the items
        complete (each once), keeping the workers busy; one slow item holds up only itself.

        ``start``/``stop`` are read as in a slice (negative counts from the end); ``stop=None``
        goes to the end (of a source of unknown size too, found as it is read). At most
        ``max_buffered`` jobs are in flight, of as many items as about 4 ms of work (a chunk):
        with slow items, ``max_buffered`` items; computed items not yet taken count too.

        A failing item raises its ``EvaluationError`` from ``next()`` as ``p[i]`` does, and the
        iterator goes on; ``timeout`` bounds the wait for the next item (``PrefetchTimeout``).
        While the iterator is open, ``p[i]`` raises ``RuntimeError``: finish it, leave its loop
        (``break``), drop it or ``close()`` it; this cancels the work left, and ``p[i]`` works
        again. One unordered iterator at a time.

        >>> import lazyseq, time
        >>> def load(i):
        ...     time.sleep(0.3 if i == 0 else 0.001)  # item 0 is slow
        ...     return i * 10
        >>> with lazyseq.prefetch(lazyseq.smap(load, range(8)), nworkers=2) as p:
        ...     pairs = list(p.unordered())
        ...     p[3]
        30
        >>> sorted(pairs) == [(i, i * 10) for i in range(8)], pairs[-1]
        (True, (0, 0))
        """
        with self._lock:
            if self._unordered_open():
                raise UnorderedOpen(f"{self.describe()}: an unordered() iterator over it is open already; "
                                   "finish or close it first")
            n = length(self.src)
            if n is not None:
                start, stop, _ = slice(start, stop).indices(n)
            elif start < 0 or (stop is not None and stop < 0):
                raise IndexError(f"{self.describe()}: negative start or stop in unordered() on a source "
                                 "of unknown size")
            it = Unordered(self, start, stop)
            self._unordered = weakref.ref(it)
            return it

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

    # -- introspection ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters: items computed, jobs sent, current chunk size, reads that had to wait and the
        time spent waiting, jumps; the process backend adds bytes through shared memory and through
        the pipe, fallbacks to the pipe, its pool's ``slot_size`` and ``slots_free``, and
        ``reported``: the sum over workers of the last value of ``report`` (0 without one), and for
        a ``report`` that counts by key, ``reported_by``: the sums over the workers by key."""
        with self._lock:
            window = self._window
            out = dict(window.stats) if window is not None else {**Window.COUNTERS, **BACKENDS[self.method].COUNTERS}
            out.update(method=self.method, nworkers=self.nworkers, max_buffered=self.max_buffered)
            if window is not None:
                out.update(window.backend.gauges())
            return out

    def worker_pids(self) -> list[int]:
        """The process ids of the workers (empty for threads, or before they start)."""
        backend = self._m.backend
        return list(backend.pids) if backend is not None else []

    def describe(self) -> str:
        what = {"thread": "threads", "process": "processes", "ray": "Ray actors",
                "async": "coroutines"}.get(self.method, f"{self.method} workers")
        shm = f", shm_size={self.shm_size}" if self.shm_size else ""
        return f"prefetch({self.nworkers} {what}, max_buffered={self.max_buffered}{shm})"


def _jax_running() -> bool:
    """Whether JAX started its runtime (XLA's threads) in this process: a fork of it may deadlock,
    as JAX warns at every fork (``DataLoader(to_tensor='jax')`` starts it before its workers)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xb, "_backends", None))


def _start_method(seq: Any) -> str | None:
    """The default start method, unless it is ``fork`` and the pipeline holds a view a forked child
    cannot read (:func:`~lazyseq.core.node.fork_unsafe`), or JAX runs here: then ``forkserver``
    (or ``spawn``), whose workers open their own files, as such a view's do."""
    if multiprocessing.get_context().get_start_method() != "fork" or (fork_unsafe(seq) is None and not _jax_running()):
        return None
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def prefetch(seq: Any, nworkers: int = 0, method: str = "thread", max_buffered: int | None = None,
             start_hook: Callable | None = None, shm_size: int = 0, *, mp_context: Any = None,
             timeout: float | None = None, lazy_start: bool = False, ray_options: Mapping | None = None,
             address: str | None = None, words: Words | None = None,
             report: Callable[[Any], int | dict] | None = None) -> Prefetch:
    """The items of ``seq``, computed ahead of the reader by worker threads, processes or Ray actors.

    ``p[i]`` is ``seq[i]`` for every key ``seq`` accepts. Reading in order keeps up to
    ``max_buffered`` chunks of items in flight; a jump restarts the window at the new index,
    cancelling work no longer wanted and keeping what is still wanted.

    - ``nworkers``: number of workers; ``<= 0`` means usable cores + ``nworkers`` (at least 1).
    - ``method``: ``'thread'``, ``'process'`` or ``'ray'``. Process workers get chunks of indices
      over a pipe and evaluate them with one bulk read; results come back as one small pickle per
      chunk. Ray actors (on this machine or across a cluster: see docs/cluster.md) get the pipeline
      once each and chunks of about 50 ms of work; results come back through Ray's object store
      (arrays as read-only zero-copy views); ``nworkers <= 0`` counts the cluster's CPUs.
      ``'async'``: up to ``nworkers`` items at once as coroutines on one event loop in a
      background thread, for ``async def`` item functions (I/O-bound sources; see docs/prefetch.md).
    - ``max_buffered``: jobs (chunks of items) in flight or ready at once; by default 10, or twice
      ``nworkers`` where that is more, so that every worker has work (32 threads reading from
      object storage keep 32 requests in flight).
    - ``shm_size``: bytes of shared memory for process workers, split into ``max_buffered`` slots.
      Every numpy array, bytearray and large bytes object of a result (and a list of small bytes,
      as one buffer) is written into the job's slot and read back as a zero-copy view (bytes as
      copies); the slot is reused only when no array built on it is
      alive in the reader. What does not fit a slot goes through the pipe (warned once, counted
      in ``stats()['fallbacks']``). ``lazyseq.empty``/``empty_like`` build arrays in the slot
      directly, saving that copy.
    - ``start_hook(worker_index)`` runs once in every worker before its first item.
    - ``mp_context``: ``'fork'``, ``'forkserver'``, ``'spawn'`` or a multiprocessing context; by
      default the platform's, except that a pipeline holding a view a forked child cannot read
      (a ``lazyseq.lance`` dataset) starts its workers with ``'forkserver'`` where the default is
      ``'fork'`` (the main script is then imported again in the workers: guard it).
    - ``timeout``: seconds to wait for one item before :class:`lazyseq.PrefetchTimeout`.
    - ``lazy_start``: start workers at the first read rather than now.
    - ``ray_options`` (``method='ray'``): Ray actor options, e.g. ``{"num_cpus": 2}`` or
      ``{"num_gpus": 1}``; by default one CPU each, spread over the nodes (``"SPREAD"``).
    - ``address`` (``method='ray'``): the Ray cluster to join when this process is not connected to
      one yet (``ray.init(address=address)``); without it, a local Ray instance is started, and shut
      down at interpreter exit (or by ``lazyseq.shutdown_ray()``).
    - ``words`` (for what builds a prefetch for its own users, as the ``DataLoader`` does): a
      ``lazyseq.evaluation.backend.Words`` that words the shared-memory warnings in its terms.
    - ``report`` (``method='process'``): ``report(seq)`` runs in each worker after each job, on
      the worker's copy of ``seq``, and returns an int (a count the worker keeps, e.g. the items
      its ``on_error`` views replaced); ``stats()['reported']`` is the sum over the workers of
      their latest values. The ``DataLoader`` counts its ``on_error`` replacements this way. A
      dict of counts by key (counts that only grow) is sent as the entries that changed;
      ``stats()['reported_by']`` then sums them over the workers by key (``reported``: all of them).

    ``p.unordered(start, stop)`` yields ``(index, item)`` pairs in the order items complete.

    An exception in a worker is raised as :class:`EvaluationError` for that item only; a worker
    that dies raises :class:`WorkerCrashed`. ``close()``, a ``with`` block or dropping the object
    stops the workers.

    >>> import lazyseq
    >>> with lazyseq.prefetch(lazyseq.smap(lambda x: x * x, range(100)), nworkers=2) as p:
    ...     p[5], p[-1], list(p[:4])
    (25, 9801, [0, 1, 4, 9])
    """
    if max_buffered is None:  # never fewer jobs in flight than workers (32 threads waiting on a network...)
        max_buffered = max(10, 2 * nworkers)
    return Prefetch(seq, nworkers, method, max_buffered, start_hook, shm_size, mp_context, timeout, lazy_start,
                    ray_options, address, words, report)
