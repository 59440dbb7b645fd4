"""What the DataLoader says in its own terms: the prefetch's shared-memory warnings and a dead
worker's ``WorkerCrashed`` reworded for a loader (``shm_size``, ``prefetch_factor``, batches and
epochs, "iterate the loader again"), and the counters it keeps per epoch (the prefetch's, and
the items its ``on_error`` views replaced, summed over the workers)."""

from __future__ import annotations

from typing import Any

from ..core.node import Node
from ..errors import WorkerCrashed
from ..evaluation.backend import Words
from ..helpers import align

__all__ = ["LoaderWords", "Replaced", "crashed", "epoch_counters", "starved_hint"]


class LoaderWords(Words):
    """The prefetch's shared-memory warnings, said of a DataLoader's batches and knobs."""

    def __init__(self, consumer: str, num_workers: int, prefetch_factor: int, sized: bool):
        self.consumer, self.num_workers, self.prefetch_factor, self.sized = consumer, num_workers, prefetch_factor, sized

    def _slots(self, slot_size: int, shm_size: int, nslots: int) -> str:
        how = ", sized by the loader (how: stats()['shm'])," if self.sized else ""
        return (f"shm_size={shm_size}{how} is {nslots} slots of {slot_size} bytes: one per batch in flight, "
                f"num_workers={self.num_workers} x prefetch_factor={self.prefetch_factor} + 1")

    def slot_too_small(self, count: int, needed: int, slot_size: int, shm_size: int, nslots: int) -> str:
        what = "a batch" if count == 1 else f"{count} batches"
        fix = f"shm_size >= {align(needed) * nslots} to fit it"
        return (f"DataLoader: {what} needed {needed} bytes of shared memory, but {self._slots(slot_size, shm_size, nslots)}. "
                "What did not fit came through the pipe (pickled: one more copy of each such batch). "
                + (f"Batches vary in size: pass {fix}" if self.sized else f"Pass {fix}"))

    def slots_held(self, slot_size: int, shm_size: int, nslots: int) -> str:
        if self.consumer == "tinygrad":
            advice = ("keep fewer batches alive, or raise prefetch_factor (one more slot per batch kept; "
                      "and shm_size, if you give it)")
        elif self.consumer == "torch":
            advice = ("with to_tensor='torch' a batch's CPU tensors share its slot's memory (no copy), so keeping "
                      "them (or views of them) keeps their slots: .clone() what you keep, or move it to the GPU")
        elif self.consumer == "jax":
            advice = ("with to_tensor='jax' on the CPU a batch's arrays may share its slot's memory, so keeping them "
                      "keeps their slots: copy what you keep (jnp.array(x, copy=True))")
        else:
            advice = ("with to_tensor=False a batch's arrays are views of its slot, so keeping numpy batches "
                      "(list(loader), a list of batches) keeps their slots: copy what you keep (np.array(x) for "
                      "each array), or use to_tensor=True (Tensors are copies)")
        return (f"DataLoader: the batches you hold keep every shared-memory slot ({self._slots(slot_size, shm_size, nslots)}), "
                "so the next batches come through the pipe: pickled and copied once more each, and the reader "
                f"runs a garbage collection at most once a second looking for a slot let go. To avoid it, {advice}")


# -- a dead worker -----------------------------------------------------------------------------------
def _batches(lo: tuple[int, int], hi: tuple[int, int]) -> str:
    """(epoch, batch) to (epoch, batch), in words."""
    if lo == hi:
        return f"batch {lo[1]} of epoch {lo[0]}"
    if lo[0] == hi[0]:
        return f"batches {lo[1]}-{hi[1]} of epoch {lo[0]}"
    return f"batch {lo[1]} of epoch {lo[0]} to batch {hi[1]} of epoch {hi[0]}"


def crashed(e: WorkerCrashed, where: Any, epoch: int, batch: int) -> WorkerCrashed:
    """``e`` in the DataLoader's words: which batches the worker was computing (``where(i)``: the
    (epoch, batch) of item ``i`` of the prefetch), and that iterating again resumes at ``batch``
    of ``epoch``, the one being read."""
    if e.items is not None and len(e.items):
        doing = f" while computing {_batches(where(min(e.items)), where(max(e.items)))}"
    elif e.starting:
        doing = " while starting, before its first batch"
    else:
        doing = ""
    resume = (f"Iterate the loader again (for batch in loader): it resumes at batch {batch} of epoch {epoch}, the "
              "first batch not delivered, with new workers")
    said = f"; {e.hint}. Then iterate the loader again" if e.hint else f". {resume}"
    return e.reworded(f"DataLoader: {e.worker}{doing}{said}")


# -- counters per epoch ------------------------------------------------------------------------------
def _on_error_views(root: Any) -> list:
    """The ``on_error`` views of a pipeline: through ``children()``, and the dataset of a mapped
    function that reads one (the loader's ``batch_sampler`` reader)."""
    from ..views.faults import OnError

    found, seen, todo = [], set(), [root]
    while todo:
        node = todo.pop()
        if not isinstance(node, Node) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, OnError):
            found.append(node)
        todo += node.children()
        dataset = getattr(getattr(node, "f", None), "dataset", None)
        if dataset is not None:
            todo.append(dataset)
    return found


class Replaced:
    """The items the ``on_error`` views of one epoch's pipeline replaced in this process so far: in
    each process worker after each job (the prefetch's ``report``, summed over the workers), or in
    the reader for thread workers and ``num_workers=0``. Found once per pipeline, then a sum of
    counters per job. (Persistent workers read every epoch, and the views may be the same in
    each: ``Epochs`` counts theirs by epoch.)"""

    def __init__(self) -> None:
        self._key: Any = None
        self._views: list = []

    def __getstate__(self) -> dict:  # each worker counts its own
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __call__(self, seq: Any) -> int:
        if seq is not self._key:
            self._key, self._views = seq, _on_error_views(seq)
        return sum(v.errors.count for v in self._views)


_GAUGES = frozenset(("chunk", "slot_size", "slots_free", "nworkers", "max_buffered"))  # states, not counts


def epoch_counters(after: dict, before: dict | None) -> dict:
    """The prefetch's counters over one epoch: ``after`` less ``before`` (what persistent workers
    had counted before it; None: workers of this epoch alone); states as they are at the end.
    (Not ``reported_by``, the persistent workers' skips by epoch: ``skipped`` has this epoch's.)"""
    after = {k: v for k, v in after.items() if k != "reported_by"}
    if not before:
        return after
    return {k: v - before[k] if k not in _GAUGES and k in before and type(v) in (int, float) else v
            for k, v in after.items()}


# -- starvation --------------------------------------------------------------------------------------
STARVED = 0.1  # above this fraction of an epoch spent waiting in next(), the loader says why


def starved_hint(last: dict, nworkers: int) -> str | None:
    """What limited an epoch whose caller waited in ``next()`` more than a tenth of its wall time,
    from its workers' busy time (``last['prefetch']``); None when the loader kept ahead.

    >>> starved_hint({"starved": 0.5, "wall_s": 2.0, "prefetch": {"busy_seconds": 3.9}}, 2)
    'the workers were busy 98% of the time: more workers or a cheaper pipeline would help'
    >>> starved_hint({"starved": 0.5, "wall_s": 2.0, "prefetch": {"busy_seconds": 1.6}}, 2)
    'workers idle 60%: the reader or the batch conversion is the limit'
    """
    if last.get("starved", 0.0) <= STARVED:
        return None
    busy = (last.get("prefetch") or {}).get("busy_seconds")
    if not nworkers or busy is None or not last.get("wall_s"):
        return "no workers computed ahead: the caller waited for each batch to be computed (num_workers > 0 would help)"
    share = min(1.0, busy / (nworkers * last["wall_s"]))
    if share >= 0.8:
        return f"the workers were busy {share:.0%} of the time: more workers or a cheaper pipeline would help"
    return f"workers idle {1 - share:.0%}: the reader or the batch conversion is the limit"
