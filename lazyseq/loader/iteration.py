"""One iteration of a DataLoader, by PyTorch's rules.

Each ``iter(loader)`` reads one epoch from where the loader stands, and how it ends says where the
next one starts:

- its last batch read: the next epoch;
- dropped or closed early (a ``break``, ``next(iter(loader))``, an exception in the user's loop):
  the next epoch too, as PyTorch's shuffle does (a peek does not shorten the epoch after it);
- a failure inside the loader (a worker crash, a failing item) or Ctrl-C (while it waits or in the
  user's loop): the first batch not delivered, so iterating again loses nothing;
- a newer ``iter(loader)``, ``set_epoch`` or ``load_state_dict``: it is ended (as if dropped),
  and its next ``next()`` raises RuntimeError; two live iterators never share a batch.

While it is live, the loader's position is the batch after the last one delivered, so
``state_dict()`` resumes exactly there. With ``in_order=False`` batches come in completion order:
the position is the first batch not delivered, with the later ones delivered (``skip``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import WorkerCrashed
from ..evaluation import Prefetch
from .words import crashed

__all__ = ["Clock", "LoaderIter", "read_epoch"]


class LoaderIter:
    """What ``iter(loader)`` returns: the batches of one epoch (``len()`` of them), from where the
    loader stood. ``close()`` abandons it (the loader then stands at the next epoch's start)."""

    def __init__(self, batches: Iterator, epoch: int, n: int):
        self._batches, self.epoch, self._len = batches, epoch, n
        self._ended: str | None = None  # why a newer call ended it

    def __iter__(self) -> LoaderIter:
        return self

    def __next__(self) -> Any:
        if self._ended is not None:
            raise RuntimeError(f"DataLoader: this iteration (epoch {self.epoch}) has ended: {self._ended}. An "
                               "iterator of a DataLoader reads until a newer one starts; iterate the loader again "
                               "(for batch in loader) to go on")
        return next(self._batches)

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Stop this iteration early (its workers, if its own, stop too)."""
        self._batches.close()

    def end(self, why: str) -> None:
        """Ended by a newer call on the loader (``why``): later ``next()`` calls raise RuntimeError."""
        self._ended = why
        self._batches.close()

    def __repr__(self) -> str:
        state = f"ended: {self._ended}" if self._ended else "live"
        return f"<DataLoader iterator of epoch {self.epoch}, {self._len} batches, {state}>"


class Interrupts:
    """Whether Ctrl-C (SIGINT) came since the last batch was delivered: an iteration it stops in the
    user's loop is interrupted, not abandoned, and resumes where it was (as a failure does). Chained
    in front of the handler there was (main thread only; SIG_IGN and SIG_DFL are left alone), and
    put back when the iteration ends, unless another was set meanwhile."""

    def __init__(self) -> None:
        self.came, self._before, self._set = False, signal.default_int_handler, False
        if threading.current_thread() is threading.main_thread():
            before = signal.getsignal(signal.SIGINT)
            if callable(before):
                self._before, self._set = before, True
                signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.came = True
        self._before(signum, frame)  # default_int_handler raises KeyboardInterrupt

    def restore(self) -> None:
        if self._set and signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._before)
        self._set = False  # still chained if another was set over it: it goes on calling the one before


class Clock:
    """An iteration's time inside ``next()``: from ``iter()`` (``began``) to the first batch, then
    from each ``next()`` call to its batch; ``wall``: from ``iter()`` to the last batch delivered."""

    def __init__(self, began: float):  # made at the first next(): the time before it is the caller's
        self.began, self.wait, self.last, self._asked = began, 0.0, began, time.perf_counter()

    def asked(self) -> None:
        self._asked = time.perf_counter()

    def delivered(self) -> None:
        self.last = time.perf_counter()
        self.wait += self.last - self._asked

    @property
    def wall(self) -> float:
        return self.last - self.began


def _mark(loader: Any, b: int) -> None:
    """Batch ``b`` of the part delivered: the position moves past every batch delivered without a gap."""
    if b == loader._batch:
        loader._batch += 1
        while loader._batch in loader._skip:
            loader._skip.discard(loader._batch)
            loader._batch += 1
    else:
        loader._skip.add(b)


def _ordered(seq: Any, first: int, nb: int, skip: set[int]) -> Iterator[tuple[int, Any]]:
    for b in range(first, nb):
        if b not in skip:
            yield b, seq[b]


def _completed(p: Prefetch, off: int, first: int, nb: int, skip: set[int], convert: Any) -> Iterator[tuple[int, Any]]:
    """Batches ``first..nb`` of the part at ``off`` in prefetch ``p``, in the order they complete."""
    it = p.unordered(off + first, off + nb)
    try:
        for i, item in it:
            if i - off not in skip:
                yield i - off, convert(item)
    finally:
        it.close()  # cancels the work left, so the prefetch serves p[i] again


def _source(loader: Any, epoch: int, start: int) -> tuple[Any, Any, Prefetch | None, int, Prefetch | None]:
    """``(batches, what reads them, the prefetch, where they start in it, this iteration's own
    prefetch)``: the plan's batches read in the reader (no workers), by the persistent workers
    (from their offset), or by workers of this iteration's own, stopped when it ends."""
    order = None
    if loader._custom_order():
        bs = loader.batch_sampler
        order = [list(b) for b in bs] if bs is not None else list(loader.sampler)
    plan = loader._plan()
    batches = plan(epoch, order, start)
    if loader.num_workers == 0:
        return batches, batches, None, 0, None
    if loader.persistent_workers and not loader._custom_order():
        p, off = loader._persistent_part(plan, epoch, start, len(batches))
        return batches, p[off : off + len(batches)], p, off, None
    if loader.persistent_workers:
        loader._warn_custom_order()
    own = loader._prefetch(batches, epoch)
    loader._open.add(own)
    return batches, own, own, 0, own


def read_epoch(loader: Any, epoch: int, start: int, first: int, skip: set[int], began: float) -> Iterator:
    """The body of one iteration: this rank's batches of ``epoch`` from item ``start`` of its global
    order, from batch ``first`` on (those in ``skip`` already delivered), moving the loader's
    position as they are delivered (see the module's rules). ``began``: when ``iter()`` was called;
    ``clock`` counts from there the time the caller spent inside ``next()`` (the epoch's starvation)."""
    clock = Clock(began)
    batches, seq, p, off, own = _source(loader, epoch, start)
    nb = len(batches)
    root = batches if loader.num_workers == 0 or own is not None else loader._epochs  # where on_error views count
    before, finished, delivered = loader._counters(p, root), False, 0
    if p is not None and not loader.in_order:
        pairs = _completed(p, off, first, nb, skip, loader._convert())
    else:
        pairs = _ordered(loader._tensors(seq), first, nb, skip)
    interrupts = Interrupts()
    try:
        for b, item in pairs:
            _mark(loader, b)
            delivered += 1
            interrupts.came = False
            clock.delivered()
            yield item
            clock.asked()
            del item
        finished = True
    except GeneratorExit:  # dropped, closed or ended early: the next iteration is the next epoch
        finished = None if not interrupts.came else False
        raise
    except WorkerCrashed as e:
        if p is None or p._error is not e:  # not this loader's workers (a prefetch in the dataset)
            raise
        where = (lambda i: (epoch, i)) if own is not None else loader._epochs._where
        raise crashed(e, where, epoch, loader._batch) from None
    finally:
        interrupts.restore()
        pairs.close()
        if finished is not False:
            loader.epoch, loader._start, loader._batch = epoch + 1, 0, 0
            loader._skip.clear()
        loader._epoch_ended(epoch, delivered, bool(finished), p, root, before, clock)
        if own is not None and own in loader._open:
            loader._open.discard(own)
            own.close()
