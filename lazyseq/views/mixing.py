"""Mixtures: ``mix(seqs, weights)``, items taken from several sources in fixed proportions.

The order is a rule, not a table (:mod:`.mixrule`): how many of the first ``n`` items come from
each source is computed from ``n`` in O(number of sources), exactly, so item ``i`` of a mix of any
length costs the same to find, within 2 items of every source's share. With a seed, blocks of
:data:`BLOCK` items keep the rule's sources and shuffle their order.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.base import View
from ..core.node import check_source, length, reader
from ..core.routed import Routed
from .epochs import FollowsEpoch
from .mapping import check_seed, item_rng, seed_key
from .mixrule import Rule, integer_weights
from .schedule_rule import ScheduledRule

__all__ = ["mix", "BLOCK"]

BLOCK = 64  # items per block of a seeded mix: proportions hold at the end of every block


# -- the view ------------------------------------------------------------------------------------------
class Mix(FollowsEpoch, Routed):
    def __init__(self, seqs: Sequence[Any], weights: Any, seed: Any, epoch: int | None, stop: Any):
        if isinstance(seqs, dict) or not hasattr(seqs, "__iter__"):
            raise TypeError(f"mix: seqs must be a list of sequences, got {type(seqs).__name__}")
        self.seqs = tuple(check_source(s, "mix") for s in seqs)
        if not self.seqs:
            raise ValueError("mix: give at least one sequence to mix")
        self._rds = tuple(reader(s) for s in self.seqs)
        self._lens = [length(s) for s in self.seqs]  # None: endless (or of unknown size)
        self.schedule = None
        if type(weights).__name__ == "Schedule":  # (imported only when one is used: schedules imports us)
            if weights.n != len(self.seqs):
                raise ValueError(f"mix: the schedule's weights are for {weights.n} sources; "
                                 f"{len(self.seqs)} sequences were given")
            self.schedule, self._rule = weights, ScheduledRule(weights)
            self.weights = [int(any(seg[1][k] or (seg[3] and seg[3][k]) for seg in weights.segments))
                            for k in range(len(self.seqs))]  # 1: the source has a positive weight somewhere
        else:
            self.weights = integer_weights(weights, len(self.seqs))
            self._rule = Rule(self.weights)
        if isinstance(stop, (bool, np.bool_)) or not (stop in ("first", "all") or isinstance(stop, (int, np.integer))):
            raise ValueError(f"mix: stop must be 'first', 'all' or a length (an int >= 0), got {stop!r}")
        self.stop = stop if isinstance(stop, str) else operator.index(stop)
        if isinstance(self.stop, int) and self.stop < 0:
            raise ValueError(f"mix: stop must be 'first', 'all' or a length >= 0, got {stop}")
        self._n = self._length()
        self.seed, self._parts = None, None
        if seed is not None:
            self._parts = check_seed(seed, "mix")
            self.seed = self._parts if isinstance(seed, (tuple, list)) else self._parts[0]
        self._init_epoch(epoch, "mix")

    def _epoch_setup(self) -> None:
        self._blockkey = None if self._parts is None else seed_key("mix", (*self._parts, self._epoch))
        self._blocks: dict[int, list[tuple[int, int]]] = {}

    def _length(self) -> int:
        rule, lens = self._rule, self._lens
        live = [k for k, w in enumerate(self.weights) if w > 0]
        if isinstance(self.stop, int):
            n = self.stop
        else:
            finite = [k for k in live if lens[k] is not None]
            if not finite:
                raise ValueError(f"mix: every sequence with a positive weight is endless, so stop={self.stop!r} "
                                 "never comes; give the length instead: stop=<int>")
            if self.stop == "first":  # the longest mix that reads no sequence past its end
                ends = [rule.first(k, lens[k] + 1) for k in finite]  # (None: a schedule never gets there)
                if all(e is None for e in ends):
                    raise ValueError("mix: the schedule never reads a sequence past its end, so stop='first' "
                                     "never comes; give the length instead: stop=<int>")
                n = min(e - 1 for e in ends if e is not None)
            else:  # the shortest mix that reads every sequence to its end
                ends = [rule.first(k, lens[k]) for k in finite]
                if None in ends:
                    k = finite[ends.index(None)]
                    raise ValueError(f"mix: the schedule never reads sequence {k} to its end, so stop='all' "
                                     "never comes; give the length instead: stop=<int>")
                n = max(ends)
        for k in live:
            if lens[k] == 0 and rule.count(k, n):
                raise ValueError(f"mix: sequence {k} is empty, but {rule.count(k, n)} of the {n} items "
                                 f"should come from it (stop={self.stop!r}); give it weight 0 or drop it")
        return n

    def _len(self) -> int:
        return self._n

    def _where(self, i: int) -> tuple[int, int]:
        if self._blockkey is None:
            k, j = self._rule.source(i)
        else:
            b, r = divmod(i, BLOCK)
            k, j = (self._blocks.get(b) or self._block(b))[r]
        n = self._lens[k]
        if n is not None and j >= n:  # stop='all' or a length: the source goes round again
            j %= n
        return k, j

    def _block(self, b: int) -> list[tuple[int, int]]:
        """Block ``b`` of a seeded mix: the rule's sources for its items, in a random order that
        is a pure function of (seed, epoch, b), each with its index in its source."""
        start = b * BLOCK
        before, after = self._rule.counts(start), self._rule.counts(min(start + BLOCK, self._n))
        layout = [k for k, (c0, c1) in enumerate(zip(before, after)) for _ in range(c1 - c0)]
        table = []
        for p in item_rng(self._blockkey, b).permutation(len(layout)).tolist():
            k = layout[p]
            table.append((k, before[k]))
            before[k] += 1
        if len(self._blocks) >= 16:  # threads reading different blocks each keep theirs a while
            self._blocks.clear()
        self._blocks[b] = table
        return table

    def where(self, i: int) -> tuple[int, int]:
        """``(k, j)``: item ``i`` is item ``j`` of ``seqs[k]``.

        >>> import lazyseq
        >>> m = lazyseq.mix(['abc', 'xyz'])
        >>> list(m), m.where(3), m.where(-1)
        (['a', 'x', 'b', 'y', 'c', 'z'], (1, 1), (1, 2))
        """
        return self._where(self._key(operator.index(i)))

    def counts(self, n: int | None = None) -> list[int]:
        """How many of the first ``n`` items (all by default) come from each source, repeats of a
        source that went round again included.

        >>> import lazyseq
        >>> lazyseq.mix([range(100), range(100)], weights=[3, 1], stop=8).counts()
        [6, 2]
        """
        n = self._n if n is None else operator.index(n)
        if not 0 <= n <= self._n:
            raise ValueError(f"{self.describe()}.counts: n must be in [0, {self._n}], got {n}")
        b, r = divmod(n, BLOCK)
        if self._blockkey is None or r == 0:
            return self._rule.counts(n)
        out = self._rule.counts(b * BLOCK)
        for k, _ in (self._blocks.get(b) or self._block(b))[:r]:
            out[k] += 1
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_blocks": {}}

    @property
    def ordered_only(self) -> bool:
        """Whether the mix is meant to be read in order: a scheduled mix is (its weights follow
        the position; a loader's ``shuffle=True`` would mix the schedule's phases), so the
        DataLoader warns about ``shuffle=True`` over it (shuffle inside each source instead)."""
        return self.schedule is not None

    def describe(self) -> str:
        w = ":".join(map(str, self.weights))
        if self.schedule is not None:
            w = repr(self.schedule)
        elif len(w) > 40:
            w = ":".join(f"{a / self._rule.total:.3g}" for a in self.weights)
        seed = "" if self.seed is None else f", seed={self.seed!r}, {self._epoch_text()}"
        return f"mix({len(self.seqs)} sequences, weights={w}{seed}, stop={self.stop!r})"


def mix(seqs: Sequence[Any], weights: Any = None, seed: Any = None, epoch: int | None = None, stop: Any = "first") -> View:
    """Items taken from several sequences in the proportions of ``weights`` (equal when None).

    In every prefix of the mix, each sequence's count is within 1 of its share for two sequences
    and within 2 for more. The ``j``-th item taken from a sequence is its item ``j`` (compose with
    :func:`shuffle` for a random order within each). Without a seed the interleaving is even and
    fixed; with a seed (an int >= 0 or a tuple of them), each block of :data:`BLOCK` items has the
    same sources in a random order, a pure function of ``(seed, epoch)``; ``epoch=None`` follows
    the :class:`DataLoader`'s epoch (0 outside one). Under a loader, a :func:`shuffle` inside (with
    ``epoch=None``) gives each epoch another part of a large source.

    ``stop='first'``: the longest mix that reads no sequence past its end; ``'all'``: the shortest
    that reads every sequence to its end (those done earlier go round again); an int: that length
    (every sequence goes round as often as needed). Sequences without ``len`` are endless. Weights
    are exact: ints and Fractions as they are, a float as the decimal it prints as (0.3 is 3/10).
    Writes go to the sequence the item comes from.

    ``weights`` may also be a :func:`schedule`: weights that change with the position. Item ``i``
    then follows the weights in force at ``i``, each sequence's count in every prefix staying
    within 2 items of its integral share for two sequences and 3 for more with steps, 3 and 4 with
    lines (in fact 1/2 for two); ``counts`` stays exact. A scheduled mix is meant to be read in
    order (``ordered_only``).

    >>> import lazyseq
    >>> ''.join(lazyseq.mix(['AAAAAA', 'bbb']))
    'AbAbAbA'
    >>> ''.join(lazyseq.mix(['AAAAAA', 'bbb'], weights=[2, 1], stop='all'))
    'AbAAbAAbA'
    >>> m = lazyseq.mix([range(0, 1000), range(1000, 2000)], weights=[0.75, 0.25], seed=0, epoch=3)
    >>> len(m), m.counts(64), sorted(m[:64]) == [*range(48), *range(1000, 1016)]
    (1334, [48, 16], True)
    """
    return Mix(seqs, weights, seed, epoch, stop)
