"""The view of :func:`lazyseq.filter`: the items of a source for which a predicate is true, with
random access. The kept indices come from one pass over the source, here or in workers: the pass
in workers runs through ``prefetch``, a layer above, so :mod:`lazyseq.evaluation.filtering` hands
it in (``run``) and holds the public function."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..core.base import Remap
from ..core.fingerprints import _value
from ..core.node import is_finite, length, read_many
from ..errors import EvaluationError, NotWrapped, passthrough
from ..helpers import fname
from .packplan import Lazy

__all__ = ["Filter", "Keep"]

_CHUNK, _MIN_CHUNK = 1024, 16  # items per bulk read of the pass; at least 64 chunks below 64 K items, for workers

Run = Callable[["Keep", range], Iterable[np.ndarray]]  # the kept indices of each chunk, in order


class Keep:
    """The kept indices of the chunk of ``size`` items from ``a`` (an int64 array): ``pred`` over
    the chunk's items, read in one bulk read. ``what`` names the filter in errors."""

    def __init__(self, pred: Callable[[Any], Any], src: Any, n: int, size: int, what: str):
        self.pred, self.src, self.n, self.size, self.what = pred, src, n, size, what

    def __call__(self, a: int) -> np.ndarray:
        xs = read_many(self.src, range(a, min(self.n, a + self.size)))
        flags: list = []
        try:
            flags.extend(map(self.pred, xs))  # item by item: when pred raises, flags holds the items before it
        except Exception as e:
            raise self._failed(e, a + len(flags))  # noqa: B904 (wrapped once, with its cause)
        if not all(type(f) is bool for f in flags):
            flags = [self._truth(f, a + k) for k, f in enumerate(flags)]
        return (a + np.flatnonzero(np.array(flags, dtype=bool))).astype(np.int64)

    def _truth(self, f: Any, j: int) -> bool:
        # a bool, an int, or a 0-d array or tensor; not None (a pred that forgot to return would drop all)
        if isinstance(f, (int, np.integer, np.bool_)) or getattr(f, "shape", None) == ():
            return bool(f)
        why = TypeError(f"pred returned {type(f).__name__} {f!r:.40}, expected a bool (True keeps the item)")
        raise self._failed(why, j)

    def _failed(self, e: BaseException, j: int) -> BaseException:
        if passthrough() or isinstance(e, (EvaluationError, NotWrapped)):
            return e
        err = EvaluationError(f"{self.what}: pred failed on item {j} of its source: {type(e).__name__}: {e}", j, self.what)
        err.__cause__ = e
        return err


class Filter(Remap):
    """Items ``kept()`` of ``src``: those for which ``pred`` is true (see :func:`lazyseq.filter`)."""

    def __init__(self, pred: Callable[[Any], Any], seq: Any, run: Run | None = None):
        if not callable(pred):
            raise TypeError(f"filter: pred must be callable, got {type(pred).__name__}")
        self._bind(seq, "filter")
        if not is_finite(seq):
            raise TypeError("filter: the sequence has no len() (it is infinite, or an iterable of unknown size); "
                            "filter a finite one: take a part first (seq[:n]), or give uniter its size=")
        self.pred, self._run, self._kept = pred, run, Lazy()

    def kept(self) -> np.ndarray:
        """The indices of the source's items that ``pred`` keeps, in order: an int64 array computed
        at the first call (the first ``len`` or read), once; a pass that fails keeps nothing.

        >>> import lazyseq
        >>> lazyseq.filter(str.isupper, 'aBcD').kept()
        array([1, 3])
        """
        return self._kept.get(self._compute)

    def _compute(self) -> np.ndarray:
        n = length(self.src)
        size = max(_MIN_CHUNK, min(_CHUNK, -(-n // 64)))
        keep, starts = Keep(self.pred, self.src, n, size, self.describe()), range(0, n, size)
        parts = map(keep, starts) if self._run is None else self._run(keep, starts)
        return np.concatenate([np.zeros(0, np.int64), *parts])

    def _sources_rebound(self) -> None:
        # at_epoch gave this copy a source that reads another epoch: its items differ, so pass again
        self._kept = Lazy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickled with the kept indices, so that workers never run a pass (at_epoch copies through
        # __getstate__ and does not run one either)
        self.kept()
        return super().__reduce_ex__(protocol)

    def fingerprint_extra(self) -> dict:
        # pred decides which item lands where (as a seed does): its code counts even without code=True
        return {"pred": _value(self.pred, True)}

    def _len(self) -> int:
        return len(self.kept())

    def _map(self, i: int) -> int:
        return int(self.kept()[i])

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        k = self.kept()
        return k[np.asarray(idx, dtype=np.int64)].tolist() if len(idx) > 32 else [int(k[i]) for i in idx]

    def _map_array(self, idx: np.ndarray) -> np.ndarray:
        return self.kept()[idx]

    def _set(self, i: int, value: Any) -> None:
        raise TypeError(f"{self.describe()} does not support item assignment: its items were chosen by pred once, "
                        "and a write could make one fail it; write to its source, and filter again")

    def describe(self) -> str:
        return f"filter({fname(self.pred)})"
