"""Mixture schedules: ``schedule(breakpoints, interpolate)``, weights that change with the mix position.

A schedule is a list of *segments*, each starting at a mix position (an item index): a ``'step'``
segment keeps its weights; a ``'linear'`` one moves its weight *fractions* (the weights over their
sum) along a line towards the next breakpoint. From the last breakpoint on, its weights hold for
ever. A segment is kept as its own definition (where it starts, its weights, and for a line its
end and end weights), and it ends where the next segment starts: :meth:`Schedule.then` cuts a
schedule at a position and goes on with other segments, leaving every segment before the cut (and
so every item of a mix before it) as it was. How a mix follows a schedule: ``schedule_rule.py``.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from .mixrule import integer_weights

__all__ = ["Schedule", "schedule"]

INTERPOLATE = ("step", "linear")
Segment = tuple  # (start, weights, end, end_weights): integer weights; end and end_weights None for a step


def _position(p: Any, where: str) -> int:
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)) or p < 0:
        raise ValueError(f"{where}: a breakpoint's position must be an int >= 0 (a mix position), got {p!r}")
    return operator.index(p)


def _segments(breakpoints: Any, interpolate: str, where: str) -> list[Segment]:
    """The segments of ``[(position, weights), ...]``: one per breakpoint, the last one a step."""
    if interpolate not in INTERPOLATE:
        raise ValueError(f"{where}: interpolate must be 'step' or 'linear', got {interpolate!r}")
    if isinstance(breakpoints, (str, bytes, dict)) or not hasattr(breakpoints, "__iter__"):
        raise TypeError(f"{where}: give a list of (position, weights) pairs, got {type(breakpoints).__name__}")
    points = []
    for bp in breakpoints:
        if not (isinstance(bp, (tuple, list)) and len(bp) == 2):
            raise TypeError(f"{where}: each breakpoint is a pair (position, weights), got {bp!r}")
        points.append((_position(bp[0], where), bp[1]))
    if not points or points[0][0] != 0:
        raise ValueError(f"{where}: the first breakpoint must be at position 0 (the weights of the first item)")
    n = len(points[0][1]) if hasattr(points[0][1], "__len__") else 0
    segs = []
    for j, (p, w) in enumerate(points):
        if j and p <= points[j - 1][0]:
            raise ValueError(f"{where}: breakpoints out of order: breakpoint {j} is at position {p}, after one at "
                             f"{points[j - 1][0]}; give them in increasing positions, each position once")
        ints = tuple(_weights(w, n, j, p, where))
        if interpolate == "linear" and j + 1 < len(points):
            end = points[j + 1][0]
            segs.append((p, ints, end, tuple(_weights(points[j + 1][1], n, j + 1, end, where))))
        else:
            segs.append((p, ints, None, None))
    return segs


def _weights(w: Any, n: int, j: int, p: int, where: str) -> list[int]:
    """Breakpoint ``j``'s weights as integers; errors name the breakpoint and its position."""
    at = f"{where}: breakpoint {j} (position {p})"
    if j and hasattr(w, "__len__") and not isinstance(w, (str, bytes, dict)) and len(w) != n:
        raise ValueError(f"{at} has {len(w)} weight{'s' * (len(w) != 1)}, the first breakpoint {n}; give every "
                         "breakpoint one weight per sequence of the mix")
    return integer_weights(w, n, at)


def _canonical(segs: list[Segment]) -> tuple[Segment, ...]:
    """``segs`` with a step that follows a step of the same weights merged into it: the same
    fractions everywhere give one segment, so equal schedules compare equal."""
    out: list[Segment] = []
    for s in segs:
        if out and s[2] is None and out[-1][2] is None and out[-1][1] == s[1]:
            continue
        out.append(s)
    return tuple(out)


def _fractions(ints: Sequence[int]) -> list[Fraction]:
    total = sum(ints)
    return [Fraction(a, total) for a in ints]


class Schedule:
    """Weights as a function of the mix position; build one with :func:`schedule`."""

    def __init__(self, segments: Sequence[Segment]):
        self.segments = _canonical(list(segments))
        self.starts = [s[0] for s in self.segments]
        self.n = len(self.segments[0][1])
        # the integral share at each segment's start: what every later count is measured against
        self._at_start = [[Fraction(0)] * self.n]
        for j, seg in enumerate(self.segments[1:], 1):
            prev = self.segments[j - 1]
            inc = self._integral(prev, seg[0] - prev[0])
            self._at_start.append([a + b for a, b in zip(self._at_start[-1], inc)])

    # -- values ---------------------------------------------------------------------------------------
    @staticmethod
    def line(seg: Segment) -> tuple[list[Fraction], list[Fraction], int]:
        """``(f0, slope, length)``: a segment's fractions at its start and their change per
        position (0 for a step), and the length of its line (0 for a step)."""
        f0 = _fractions(seg[1])
        if seg[2] is None:
            return f0, [Fraction(0)] * len(f0), 0
        length = seg[2] - seg[0]
        return f0, [(b - a) / length for a, b in zip(f0, _fractions(seg[3]))], length

    @classmethod
    def _integral(cls, seg: Segment, y: Any) -> list[Fraction]:
        """The integral of the segment's fractions over ``[start, start + y)`` (constant past a line's end)."""
        f0, slope, length = cls.line(seg)
        if seg[2] is None or y <= length:
            return [a * y + b * y * y / 2 for a, b in zip(f0, slope)]
        full = [a * length + b * length * length / 2 for a, b in zip(f0, slope)]
        return [s + (a + b * length) * (y - length) for s, a, b in zip(full, f0, slope)]

    def _segment(self, x: Any) -> int:
        return bisect.bisect_right(self.starts, x) - 1

    def fractions(self, x: Any) -> list[Fraction]:
        """The weight fractions in force at mix position ``x`` (exact).

        >>> import lazyseq
        >>> s = lazyseq.schedule([(0, [1, 0]), (100, [0, 1])], interpolate='linear')
        >>> [str(f) for f in s.fractions(25)], [str(f) for f in s.fractions(500)]
        (['3/4', '1/4'], ['0', '1'])
        """
        if x < 0:
            raise ValueError(f"schedule.fractions: a position is >= 0, got {x}")
        seg = self.segments[self._segment(x)]
        f0, slope, length = self.line(seg)
        y = min(x - seg[0], length) if seg[2] is not None else 0
        return [a + b * y for a, b in zip(f0, slope)]

    def share(self, n: Any) -> list[Fraction]:
        """Each source's integral share of the first ``n`` items: the integral of its weight
        fraction over positions ``[0, n)`` (exact). A mix's counts stay within a few items of it.

        >>> import lazyseq
        >>> s = lazyseq.schedule([(0, [3, 1]), (8, [1, 1])])
        >>> [int(x) for x in s.share(8)], [int(x) for x in s.share(12)]
        ([6, 2], [8, 4])
        """
        if n < 0:
            raise ValueError(f"schedule.share: n must be >= 0, got {n}")
        j = self._segment(n)
        inc = self._integral(self.segments[j], n - self.starts[j])
        return [a + b for a, b in zip(self._at_start[j], inc)]

    # -- changing it ----------------------------------------------------------------------------------
    def then(self, k: int, other: Any, interpolate: str = "step") -> Schedule:
        """This schedule before mix position ``k``, and from ``k`` on ``other``: a :class:`Schedule`,
        or breakpoints ``[(0, weights), ...]`` counted from ``k`` (with ``interpolate``). A mix with
        the result gives the same items as with this schedule at every position before ``k``.

        >>> import lazyseq
        >>> s = lazyseq.schedule([(0, [0.9, 0.1])])
        >>> t = s.then(1000, [(0, [0.5, 0.5])])
        >>> t.equal_before(s, 1000), t == s, t.fractions(999) == s.fractions(999)
        (True, False, True)
        """
        k = _position(k, "schedule.then")
        if isinstance(other, Schedule):
            segs = other.segments
        else:
            segs = _segments(other, interpolate, "schedule.then")
        if len(segs[0][1]) != self.n:
            raise ValueError(f"schedule.then: the new weights are for {len(segs[0][1])} sources, "
                             f"this schedule's for {self.n}")
        shift = [(s + k, w, None if e is None else e + k, w1) for s, w, e, w1 in segs]
        return Schedule([s for s in self.segments if s[0] < k] + shift)

    def equal_before(self, other: Any, k: int) -> bool:
        """Whether a mix gives the same items with ``other`` as with this schedule at every
        position before ``k``: the segments that start before ``k`` are the same (a resume at
        position ``k`` may go on with new weights from there, as :meth:`then` makes them).

        >>> import lazyseq
        >>> s = lazyseq.schedule([(0, [9, 1]), (500, [1, 1])])
        >>> s.equal_before(lazyseq.schedule([(0, [9, 1]), (800, [1, 3])]), 500)
        True
        >>> s.equal_before(lazyseq.schedule([(0, [9, 1]), (800, [1, 3])]), 501)
        False
        """
        if not isinstance(other, Schedule):
            return False
        before = [s for s in self.segments if s[0] < k]
        return before == [s for s in other.segments if s[0] < k]

    # -- identity -------------------------------------------------------------------------------------
    def describe_json(self) -> list[dict]:
        """A JSON-serialisable value that is equal for equal schedules (in any interpreter): one
        ``{"at": start, "weights": [ints]}`` per segment, with ``"to"`` and ``"to_weights"`` for
        a line. Weights are the integer ratios the mix uses (``[0.9, 0.1]`` is ``[9, 1]``).

        >>> import lazyseq
        >>> lazyseq.schedule([(0, [0.9, 0.1]), (100, [0.5, 0.5])], interpolate='linear').describe_json()
        [{'at': 0, 'weights': [9, 1], 'to': 100, 'to_weights': [1, 1]}, {'at': 100, 'weights': [1, 1]}]
        """
        out = []
        for s, w, e, w1 in self.segments:
            d: dict = {"at": s, "weights": list(w)}
            if e is not None:
                d.update(to=e, to_weights=list(w1))
            out.append(d)
        return out

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Schedule) and self.segments == other.segments

    def __hash__(self) -> int:
        return hash(self.segments)

    def __reduce__(self) -> tuple:
        return Schedule, (self.segments,)

    def __repr__(self) -> str:
        parts = []
        for s, w, e, w1 in self.segments:
            text = f"{s}: {':'.join(map(str, w))}"
            parts.append(text if e is None else f"{text} -> {e}: {':'.join(map(str, w1))}")
        text = ", ".join(parts)
        return f"schedule({text if len(text) <= 120 else text[:117] + '...'})"


def schedule(breakpoints: Sequence[tuple[int, Any]], interpolate: str = "step") -> Schedule:
    """Mixture weights that change with the mix position (the item index), for :func:`mix`.

    ``breakpoints`` is ``[(position, weights), ...]``, the first at position 0, positions
    increasing. With ``interpolate='step'`` the weights of a breakpoint hold until the next one;
    with ``'linear'`` the weight fractions (weights over their sum) move along a line to the next
    breakpoint's. After the last breakpoint its weights hold. Weights are exact as in :func:`mix`
    (0.3 is 3/10). With batch size ``B`` and world size ``W``, training step ``s`` starts at mix
    position ``s * B * W``. A schedule spans one epoch of the mix: for a whole run, give the mix
    ``stop=<total items>`` and read it as one epoch.

    >>> import lazyseq
    >>> s = lazyseq.schedule([(0, [0.9, 0.1]), (10, [0.5, 0.5])])
    >>> m = lazyseq.mix([lazyseq.repeat('a'), lazyseq.repeat('B')], weights=s, stop=20)
    >>> ''.join(m), m.counts(10), m.counts()
    ('aaaaBaaaaaaBaBaBaBaB', [9, 1], [14, 6])
    """
    return Schedule(_segments(breakpoints, interpolate, "schedule"))
