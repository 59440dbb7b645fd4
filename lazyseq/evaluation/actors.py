"""The Ray backend: chunk jobs evaluated by Ray actors, on this machine or across a cluster.

Each actor rebuilds the pipeline once (shipped through the object store) and answers one job per
call; results travel back through Ray's object store, numpy arrays without copies (they arrive as
read-only views of the store's shared memory). A job that runs long is answered in parts: the
reader asks the actor, on a second thread of the actor, for the items it has done so far, so a slow
or stuck item holds up only itself. Ray is imported only when a prefetch with ``method='ray'``
starts (see :func:`connect`).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import cloudpickle

from ..errors import PrefetchClosed, WorkerCrashed, WorkerStartError
from . import wire
from .backend import Result, Running, Settings

__all__ = ["RayBackend", "connect", "shutdown", "cluster_cpus", "options_error", "ray_missing"]

_QUEUED = 3  # jobs an actor holds at most (one running, the rest hide the call's latency)
_PROGRESS = 0.25  # a job out this long: ask its actor for the items done so far (every _PROGRESS s)
# An actor that leaves a progress call unanswered this long is silent (frozen, its node cut off): no
# telling where it is, so the window moves the item the reader waits for to another actor.
_SILENT = 2.0
_CLOSE_WAIT = 5.0  # seconds close() waits to see its actors dead
_START_TIMEOUT = 120.0  # seconds for every actor to start (a node may have to pull the runtime env)
_started_here = [False]  # whether lazyseq started the Ray instance this process is connected to
_connect_lock = threading.Lock()

_MISSING = ("prefetch(method='ray') needs Ray, which is not installed: pip install 'lazyseq[ray]' "
            "(or pip install ray)")


def ray_missing() -> str | None:
    """What to install when Ray is missing (None: it is installed), without importing it."""
    return None if importlib.util.find_spec("ray") is not None else _MISSING


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError(_MISSING) from e
    return ray


def connect(address: str | None = None) -> Any:
    """The ``ray`` module, connected: the current connection when ``ray.is_initialized()``, else
    ``ray.init(address=address)`` when an address is given, else a local Ray instance that lazyseq
    starts (and shuts down at interpreter exit, or with :func:`shutdown`)."""
    ray = _ray()
    with _connect_lock:
        if ray.is_initialized():
            return ray
        if address is not None:
            ray.init(address=address)
        else:
            ray.init(include_dashboard=False)
            _started_here[0] = True
            atexit.register(shutdown)
    return ray


def shutdown() -> bool:
    """Shut down the Ray instance lazyseq started (a no-op for one started or joined by your code).
    Returns whether it did. Runs by itself at interpreter exit."""
    if not _started_here[0]:
        return False
    import ray

    _started_here[0] = False
    if ray.is_initialized():
        ray.shutdown()
    return True


def cluster_cpus(address: str | None = None) -> int:
    """The CPUs of the Ray cluster (connecting as :func:`connect` does)."""
    return int(connect(address).cluster_resources().get("CPU", 1))


class Evaluator:
    """An actor's state: the pipeline, the job it is inside, the jobs it is told to skip. Methods
    ``job`` run on the actor's main thread, one at a time and in order; ``progress`` and ``skip``
    on its ``watch`` thread, while a job runs."""

    def __init__(self, index: int, seq: bytes):
        self.lock, self.skipped, self.running = threading.Lock(), set(), None
        self.seq, self.failed = None, None
        try:
            self.seq, hook = cloudpickle.loads(seq)
            if hook is not None:
                hook(index)
        except BaseException as e:  # said by ready(): a clear WorkerStartError in the reader
            self.failed = wire.ItemError(-1, e)

    def ready(self) -> tuple:
        """Where it runs (node id, host, pid), or why it failed to start."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return self.failed, node, socket.gethostname(), os.getpid()

    def job(self, job_id: int, start: int, step: int, count: int) -> tuple | None:
        """The items of a job from the first one not yet answered in a part (None: skipped)."""
        with self.lock:
            if self.skipped:
                skip = job_id in self.skipped
                self.skipped = {j for j in self.skipped if j > job_id}  # jobs come in order: the rest are past
                if skip:
                    return None
            r = range(start, start + count * step, step)
            run = self.running = Running(job_id, r)
        t = time.perf_counter()
        wire.compute(self.seq, r, run.items)
        with self.lock:
            self.running = None
            first = run.sent
            items = run.items[first:]
        return wire.finish(self.seq, r[first:], items, portable=True), time.perf_counter() - t, first

    def progress(self) -> tuple | None:
        """The job it is inside: (job id, where its new items start, those items, seconds since
        its last progress); None when idle."""
        with self.lock:
            run = self.running
            if run is None:
                return None
            done, first = len(run.items), run.sent
            now = time.monotonic()
            if done > first:
                run.sent, run.since = done, now
            r = run.indices[first:done]
            return run.job_id, first, wire.finish(self.seq, r, run.items[first:done], portable=True), now - run.since

    def skip(self, job_ids: list[int]) -> None:
        with self.lock:
            self.skipped.update(job_ids)


_remote: list = []


def _remote_class(ray: Any) -> Any:
    """The Evaluator as a Ray actor class, made once (Ray exports a class to the cluster once)."""
    if not _remote:
        _remote.append(ray.remote(concurrency_groups={"watch": 1})(Evaluator))
    return _remote[0]


class _Job:
    __slots__ = ("actor", "indices", "ref", "done")

    def __init__(self, actor: int, indices: range, ref: Any):
        self.actor, self.indices, self.ref, self.done = actor, indices, ref, 0


class RayBackend:
    """Ray actors, one CPU each unless ``ray_options`` says otherwise, spread over the nodes."""

    COUNTERS: ClassVar[dict[str, int]] = dict(progress_calls=0)
    JOB_SECONDS = 0.05  # a call costs ~1 ms: jobs are sized to about this much work each

    def __init__(self, seq: Any, settings: Settings, stats: dict):
        self.ray = ray = connect(settings.address)
        self.stats, self.stopping = stats, False
        options: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD", **(settings.ray_options or {})}
        try:
            seq_ref = ray.put(cloudpickle.dumps((seq, settings.start_hook)))  # one pickle: see processes.py
        except Exception as e:
            raise TypeError(f"prefetch: the sequence cannot be pickled to start Ray actors ({e}); make it picklable") from e
        actor_class = _remote_class(ray).options(**options)
        self.actors = [actor_class.remote(k, seq_ref) for k in range(settings.nworkers)]
        self.where_is: list[tuple | None] = [None] * len(self.actors)  # (node, host, pid) once ready
        self.waiting: dict[Any, tuple[str, int]] = {a.ready.remote(): ("ready", k) for k, a in enumerate(self.actors)}
        self.load = [0] * len(self.actors)
        self.heard = [time.monotonic()] * len(self.actors)  # when each actor last made progress
        self.asked: list[float | None] = [None] * len(self.actors)  # a progress call out since then
        self.inside: list[tuple[int, int] | None] = [None] * len(self.actors)  # (job id, item) per progress
        self.outstanding: dict[int, _Job] = {}
        self.abandoned: set[int] = set()
        self.pending_crash: tuple[int, BaseException] | None = None
        try:
            self._wait_started(options)
        except BaseException:
            self.close()
            raise

    def _wait_started(self, options: dict) -> None:
        """Wait until every actor runs (so a read's timeout never counts a start-up), within
        ``_START_TIMEOUT``: actors that ask for more than the cluster has would wait forever."""
        deadline = time.monotonic() + _START_TIMEOUT
        while any(kind == "ready" for kind, _ in self.waiting.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                n = sum(kind == "ready" for kind, _ in self.waiting.values())
                asked = {k: v for k, v in options.items() if k != "scheduling_strategy"}
                raise WorkerStartError(
                    f"prefetch: {n} of {len(self.actors)} Ray actors did not start within {_START_TIMEOUT:.0f} s. Each "
                    f"asks for {asked}; the cluster has {self.ray.available_resources()} free of "
                    f"{self.ray.cluster_resources()}: lower nworkers or ray_options, or add nodes")
            self.poll(min(left, 1.0))
            self.check()

    @property
    def pids(self) -> list[int]:
        return []  # processes of Ray's, maybe on other machines: see actor_locations()

    def actor_locations(self) -> list[tuple | None]:
        """(node id, host name, pid) of each actor, None for one not started yet."""
        return list(self.where_is)

    def _name(self, k: int) -> str:
        loc = self.where_is[k]
        actor_id = self.actors[k]._actor_id.hex()
        at = f"node {loc[0]} ({loc[1]}), pid {loc[2]}" if loc else "not started yet"
        return f"Ray actor {k} (actor id {actor_id}, {at})"

    # -- sending ---------------------------------------------------------------------------------
    def submit(self, job_id: int, r: range, wanted: bool) -> bool:
        if self.stopping:
            raise PrefetchClosed("prefetch: the Ray actors were stopped")
        load = self.load
        busy = {self.outstanding[j].actor for j in self.abandoned} if self.abandoned else ()
        free = [k for k in range(len(load)) if load[k] < _QUEUED and k not in busy]
        if not free:
            if not wanted:
                return False
            free = [k for k in range(len(load)) if k not in busy] or list(range(len(load)))
        k = min(free, key=load.__getitem__)
        if load[k] == 0:
            self.heard[k] = time.monotonic()  # idle until now: not held up
        load[k] += 1
        ref = self.actors[k].job.remote(job_id, r.start, r.step, len(r))
        self.outstanding[job_id] = _Job(k, r, ref)
        self.waiting[ref] = ("job", job_id)
        return True

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Actors skip these jobs when they get to them (answering None), unless inside one."""
        by_actor: dict[int, list[int]] = {}
        for j in job_ids & self.outstanding.keys():
            by_actor.setdefault(self.outstanding[j].actor, []).append(j)
        for k, js in by_actor.items():
            self.actors[k].skip.options(concurrency_group="watch").remote(js)
        self.abandoned |= job_ids & self.outstanding.keys()
        return set()

    # -- receiving -------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[Result]:
        if self.stopping:
            raise PrefetchClosed("prefetch: the Ray actors were stopped")
        now = time.monotonic()
        self._ask_progress(now)
        late = [self.heard[k] + _PROGRESS for k in range(len(self.actors)) if self.load[k] and self.asked[k] is None]
        if late:
            timeout = min(timeout, max(0.0, min(late) - now))
        refs = list(self.waiting)
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # and whatever else is in already
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        if self.stopping:
            raise PrefetchClosed("prefetch: the Ray actors were stopped")
        out: list[Result] = []
        for ref in ready:
            kind, key = self.waiting.pop(ref)
            try:
                value = self.ray.get(ref)
            except Exception as e:
                self._failed(kind, key, e, out)
                continue
            getattr(self, "_" + kind)(key, value, out)
        return out

    def _ask_progress(self, now: float) -> None:
        for k, actor in enumerate(self.actors):
            if self.load[k] and self.asked[k] is None and now - self.heard[k] >= _PROGRESS:
                self.asked[k] = now
                self.stats["progress_calls"] += 1
                self.waiting[actor.progress.options(concurrency_group="watch").remote()] = ("progress", k)

    def _ready(self, k: int, value: tuple, out: list[Result]) -> None:
        failed, *where = value
        self.where_is[k] = tuple(where)
        if failed is not None:
            err = failed.rebuild()
            hint = ""
            if isinstance(err, ImportError):
                hint = ("; code the pipeline refers to by module must be importable on every node: install it there, "
                        "or ship it with ray.init(runtime_env={'working_dir': ...}) or ray_options="
                        "{'runtime_env': {'py_modules': [...]}}")
            raise WorkerStartError(f"prefetch: {self._name(k)} failed to start: {type(err).__name__}: {err}{hint}") from err

    def _job(self, job_id: int, value: tuple | None, out: list[Result]) -> None:
        job = self.outstanding.pop(job_id)
        self.load[job.actor] -= 1
        self.abandoned.discard(job_id)
        self.heard[job.actor], self.inside[job.actor] = time.monotonic(), None
        if value is None:
            out.append(Result(job_id, None))
            return
        items, seconds, first = value
        out.append(Result(job_id, items, seconds, 0, first))

    def _progress(self, k: int, value: tuple | None, out: list[Result]) -> None:
        self.asked[k] = None
        if value is None:
            return
        job_id, first, items, age = value
        job = self.outstanding.get(job_id)
        if job is None:
            return  # answered meanwhile
        self.heard[k] = time.monotonic() - age
        self.inside[k] = (job_id, job.indices[first + len(items)] if first + len(items) < len(job.indices) else -1)
        if items:
            job.done = first + len(items)
            out.append(Result(job_id, items, first=first, final=False))

    def _failed(self, kind: str, key: int, e: Exception, out: list[Result]) -> None:
        ray = self.ray
        if isinstance(e, ray.exceptions.RayActorError):
            k = key if kind != "job" else self.outstanding[key].actor
            if self.pending_crash is None and not self.stopping:
                self.pending_crash = (k, e)
            return
        if kind == "job":  # the answer arrived but cannot be rebuilt here: ask item by item
            job = self.outstanding[key]
            r = job.indices[job.done :]
            if len(r) > 1:
                items = [wire.RESEND] * len(r)
            else:
                err = TypeError(f"the result of item {r[0]} could not be unpickled in the reader: {type(e).__name__}: {e}")
                err.__cause__ = e
                items = [wire.ItemError(r[0], err, portable=False)]
            self._job(key, (items, 0.0, job.done), out)
        elif kind == "progress":
            self.asked[key] = None
        else:
            raise WorkerStartError(f"prefetch: {self._name(key)} failed to start: {type(e).__name__}: {e}") from e

    # -- the actors' state -----------------------------------------------------------------------
    def check(self) -> None:
        if self.pending_crash is None:
            return
        if self.stopping:
            raise PrefetchClosed("prefetch: the Ray actors were stopped")
        k, e = self.pending_crash
        if self.where_is[k] is None and "creation task" in str(e):
            raise WorkerStartError(f"prefetch: {self._name(k)} failed to start: {e}") from e
        raise WorkerCrashed(f"prefetch: {self._name(k)} died; the items it was computing are lost and this prefetch "
                            f"is closed: create a new one to go on. Ray says: {e}",
                            self.where_is[k][2] if self.where_is[k] else None,
                            worker=f"{self._name(k)} died (Ray says: {e})") from e

    def room(self) -> bool:
        return min(self.load) < _QUEUED

    def started(self, job_id: int) -> bool:
        job = self.outstanding.get(job_id)
        return job is not None and self.where_is[job.actor] is not None

    def where(self, job_id: int) -> tuple[int | None, float] | None:
        """An actor runs its jobs in order and a job's items in order; its answers to ``progress``
        say which job and item it is in; until one comes, the first unanswered item of its first
        job is where it is. None for an actor that does not answer (see ``_SILENT``)."""
        job = self.outstanding.get(job_id)
        if job is None or self.where_is[job.actor] is None:
            return None
        k = job.actor
        if self.asked[k] is not None and time.monotonic() - self.asked[k] > _SILENT:
            return None
        inside = self.inside[k]
        if inside is not None and inside[0] == job_id:
            return (inside[1] if inside[1] >= 0 else None), self.heard[k]
        if job.done >= len(job.indices) or any(j < job_id and o.actor == k for j, o in self.outstanding.items()):
            return None, self.heard[k]
        return job.indices[job.done], self.heard[k]

    def chunk_cap(self, item_bytes: float) -> int | None:
        return None

    def gauges(self) -> dict:
        nodes = {loc[0] for loc in self.where_is if loc is not None}
        return dict(actors=len(self.actors), nodes=len(nodes))

    def close(self) -> None:
        """Kill the actors and wait (a few seconds at most) until Ray reports them dead."""
        if self.stopping:
            return
        self.stopping = True
        ray, actors = self.ray, self.actors
        if not ray.is_initialized():
            return
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        pings = []
        for a in actors:
            try:
                pings.append(a.__ray_ready__.remote())
            except Exception:
                pass
        if pings:
            ray.wait(pings, num_returns=len(pings), timeout=_CLOSE_WAIT)
        self.waiting.clear()
        self.outstanding.clear()


def options_error(ray_options: Mapping | None, address: str | None, method: str) -> str | None:
    """Why these arguments do not fit the method (None: they do)."""
    if method != "ray" and (ray_options is not None or address is not None):
        return "ray_options and address only apply to method='ray'"
    if ray_options is not None and not isinstance(ray_options, Mapping):
        return f"ray_options must be a dict of Ray actor options (e.g. {{'num_cpus': 2}}), got {type(ray_options).__name__}"
    return None
