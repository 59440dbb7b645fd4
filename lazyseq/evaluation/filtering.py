"""``lazyseq.filter``: the view is :class:`lazyseq.views.filtering.Filter`; its pass in workers runs
through :func:`prefetch`, here, a layer above the views."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.base import View
from ..views.filtering import Filter, Keep
from ..views.mapping import smap
from .view import BACKENDS, prefetch

__all__ = ["filter"]


class InWorkers:
    """The pass of a filter in ``nworkers`` workers of ``method``: a chunk an item of a prefetch,
    closed when the pass ends or fails (no worker, thread or shared memory left)."""

    def __init__(self, nworkers: int, method: str):
        self.nworkers, self.method = nworkers, method

    def __call__(self, keep: Keep, starts: range) -> list[np.ndarray]:
        with prefetch(smap(keep, starts), self.nworkers, self.method) as p:
            return list(p)


def filter(pred: Callable[[Any], Any], seq: Any, *, nworkers: int = 0, method: str = "thread") -> View:
    """The items of ``seq`` for which ``pred(item)`` is true, in order: ``[x for x in seq if pred(x)]``,
    with random access and a ``len``.

    The kept indices are computed once, at the first ``len``, read, ``repr`` or pickling, in one
    pass over ``seq`` read in bulk; they cost 8 bytes per kept item and are pickled with the view
    (computed first if need be), so workers never pass again. ``nworkers`` runs the pass in
    :func:`prefetch` workers of ``method`` (``'thread'``, ``'process'``, ...; ``pred`` and ``seq``
    must pickle for processes); 0 runs it in the reading thread. ``pred`` returns a bool (an int, a
    0-d array or tensor); if it raises, or returns something else, an :class:`EvaluationError`
    names the source's item and nothing is kept, so a later read passes again. ``seq`` must have a
    ``len``. Over a view that follows the loader's epoch, each epoch's copy (:func:`at_epoch`)
    passes again. ``lazyseq.fingerprint`` holds ``pred``'s code: a resume over another pred fails.

    >>> import lazyseq
    >>> odd = lazyseq.filter(lambda x: x % 2 == 1, range(10))
    >>> len(odd), odd[0], odd[-1], list(odd[1:3])
    (5, 1, 9, [3, 5])
    """
    if isinstance(nworkers, bool):
        raise TypeError(f"filter: nworkers must be an int, got {nworkers!r}")
    nworkers = operator.index(nworkers)
    if method not in BACKENDS:
        raise ValueError(f"filter: method must be one of {sorted(BACKENDS)}, got {method!r}")
    return Filter(pred, seq, None if nworkers == 0 else InWorkers(nworkers, method))
