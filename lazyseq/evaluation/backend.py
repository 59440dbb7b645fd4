"""The backend protocol: what the prefetch window asks of whatever evaluates its chunk jobs.

A job is a range of indices of the pipeline; a backend evaluates it somewhere (threads of this
process, worker processes, actors on other machines) and answers with one final
:class:`Result`, after parts of it if it runs long (so that a stuck item holds up only itself). The
window decides which jobs to run and when; how results travel (shared-memory slots, pipes, an
object store) is the backend's business alone. Backends: ``threads.ThreadBackend``,
``processes.ProcessBackend``, ``actors.RayBackend``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..helpers import align

__all__ = ["Backend", "Result", "Running", "Settings", "STREAM", "Words"]

# A job running this long is answered in parts: the items done so far, then again every STREAM
# seconds. Far above what a chunk is sized to take (a few ms), so a healthy job never pays for it.
STREAM = 0.05


class Words:
    """How a backend's warnings put things: in the prefetch's terms (``shm_size``, ``max_buffered``).
    What builds a prefetch for its own users (the ``DataLoader``) passes one in its own terms."""

    def slot_too_small(self, count: int, needed: int, slot_size: int, shm_size: int, nslots: int) -> str:
        """A job of ``count`` items needed ``needed`` bytes of its slot, which holds ``slot_size``."""
        return (f"prefetch: a chunk of {count} item(s) needed {needed} bytes but a slot holds {slot_size} "
                f"(shm_size={shm_size} / max_buffered={nslots}); what did not fit went through the pipe. "
                f"shm_size >= {align(needed) * nslots} would fit")

    def slots_held(self, slot_size: int, shm_size: int, nslots: int) -> str:
        """Every slot is held by items the reader keeps alive: the wanted item goes through the pipe."""
        return ("prefetch: the reader holds every shared-memory slot (items kept alive), so items go through the "
                "pipe; drop items sooner or raise max_buffered")


_PREFETCH_WORDS = Words()


@dataclass(frozen=True)
class Settings:
    """What a backend is started with (the prefetch's arguments that concern evaluation)."""

    nworkers: int
    start_hook: Callable[[int], Any] | None = None
    max_buffered: int = 10  # results the window may have in flight or ready: slots, for the process backend
    shm_size: int = 0  # bytes of shared memory (process backend)
    mp_context: Any = None  # a multiprocessing context (process backend)
    ray_options: Any = None  # Ray actor options, e.g. {"num_cpus": 2} (Ray backend)
    address: str | None = None  # the Ray cluster to connect to when not connected yet (Ray backend)
    words: Words = _PREFETCH_WORDS  # how warnings put things (the DataLoader's own terms under a DataLoader)
    report: Callable[[Any], int | dict] | None = None  # run in each process worker after each job (process backend)


class Result(NamedTuple):
    """A job's answer, or part of it. ``items`` is one entry per index of the job from ``first``
    on, an item, a ``wire.ItemError`` (the item's exception) or ``wire.RESEND`` (it arrived but
    must be asked for again, alone); ``None`` when the job was cancelled before it ran. A part
    (``final=False``) carries the items a job finished while a slow item holds it up; the final
    answer carries the rest. ``nbytes``: the bytes the items take in the backend's transport, which
    the window keeps within a cache-sized budget ahead of the reader (0 where not counted)."""

    job_id: int
    items: list | None
    seconds: float = 0.0  # the time the worker spent on the job
    nbytes: int = 0
    first: int = 0
    final: bool = True


class Backend(Protocol):
    """Evaluates chunk jobs of one sequence. Every method is called by the reader's thread, under
    the prefetch's lock, except :meth:`close`, which may come from any thread; once closed,
    :meth:`submit` and :meth:`poll` raise ``PrefetchClosed``."""

    COUNTERS: dict[str, int]  # the backend's own entries of ``Prefetch.stats()``, with their start values
    JOB_SECONDS: float  # about how much work one job should hold (what a job costs the backend sets it)

    def __init__(self, seq: Any, settings: Settings, stats: dict) -> None:
        """Start the workers (raise ``WorkerStartError`` or the cause if they cannot start)."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (empty where they are not local processes)."""

    def submit(self, job_id: int, r: range, wanted: bool) -> bool:
        """Send the job of items ``r``; False if there is no room for it now (the window waits
        for answers). A ``wanted`` job holds the item the reader waits for: it is refused only
        when the workers' queues are full, and takes a slower path rather than wait for room."""

    def cancel(self, job_ids: set[int]) -> set[int]:
        """Give jobs up. Returns those that will never answer; the others answer later (cancelled,
        or with their items if a worker was inside already)."""

    def poll(self, timeout: float) -> list[Result]:
        """The answers that arrive within ``timeout`` seconds (possibly none)."""

    def check(self) -> None:
        """Raise ``WorkerCrashed`` (or ``WorkerStartError``) for a worker seen dead or failed."""

    def room(self) -> bool:
        """Whether a job submitted now would get the backend's fast path (a free slot...)."""

    def started(self, job_id: int) -> bool:
        """Whether the worker that has the job is up (a start-up is no sign of a slow item)."""

    def where(self, job_id: int) -> tuple[int | None, float] | None:
        """Where the job's worker is: the index of the item of this job it computes now (None:
        it is still in an earlier job), and since when it has made no progress (a monotonic
        time); None when there is no telling (not sent to a worker yet, or one still starting).
        The window never gives the item a worker is in to a second one (a stuck item holds one
        worker), and moves a job held up for long to another."""

    def chunk_cap(self, item_bytes: float) -> int | None:
        """At most how many items of this size one job may hold (None: no limit)."""

    def gauges(self) -> dict:
        """The backend's current state for ``Prefetch.stats()`` (free slots...)."""

    def close(self) -> None:
        """Stop the workers and release what they hold; idempotent; bounded in time."""


class Running:
    """A job a worker is inside, for a backend that answers long jobs in parts: the items done so
    far (``items`` grows as they are done), how many were sent, and since when none were."""

    __slots__ = ("job_id", "indices", "items", "sent", "since")

    def __init__(self, job_id: int, indices: range):
        self.job_id, self.indices, self.items, self.sent = job_id, indices, [], 0
        self.since = time.monotonic()
