"""How a mix follows a :class:`~lazyseq.views.schedules.Schedule`: counts computed from ``n``, exactly.

Each segment of the schedule has its own tree (Huffman's, on its weights, as
:class:`~lazyseq.views.mixrule.Rule` builds it) and starts from the counts the earlier segments
left (computed once, when the mix is built: O(segments)). A node of the tree that has handed out
``t`` items gives its left child

    ``min(max(round(G(t)), L), L + t - M)``

where ``M`` and ``L`` are the node's and its left child's counts at the segment's start, and
``G(t)`` is the left child's integral share at the position where the node's own integral share
reaches ``t``. In a step segment ``G`` is linear (``S_l + w_l / w_v * (t - S_v)``); in a linear
one it solves a quadratic, and ``round`` is done exactly with integer square roots. Without the
clamp, each node rounds its share as the even rule does (the first segment of a schedule with one
step *is* the even rule, item for item); the clamp makes a segment start where the last one
ended, and only lets a child that is ahead of (behind) its share wait (catch up): an error carried
over a breakpoint shrinks, it never adds up. ``round(G)`` grows by at most 1 when ``t`` does
(``G`` grows by the left child's share of one of the node's items), so exactly one leaf's count
grows per item, and item ``n`` is found by walking down the tree, O(depth) per item plus a
binary search over the segments.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from typing import Any

from .mixrule import Rule
from .schedules import Schedule

__all__ = ["ScheduledRule"]


def _floor_sqrt_sum(p: Fraction, q: Fraction, d: Fraction) -> int:
    """``floor(p + q * sqrt(d))``, exactly (``d >= 0``)."""
    x = q * q * d
    r = math.isqrt(x.numerator * x.denominator) // x.denominator  # floor(sqrt(x)), exactly

    def at_least(c: Fraction) -> bool:  # p + q * sqrt(d) >= c
        c -= p
        return (c <= 0 or x >= c * c) if q >= 0 else (c <= 0 and x <= c * c)

    k = math.floor(p) + (r if q >= 0 else -r - 1)  # within 2 of the answer
    while not at_least(k):
        k -= 1
    while at_least(k + 1):
        k += 1
    return k


class _Segment:
    """One segment's tree, with each node's constants: ``(left, right, L, M, kind, params)``."""

    def __init__(self, sched: Schedule, j: int, carried: list[int]):
        seg = sched.segments[j]
        self.start, self.carried = seg[0], carried
        f0, slope, length = sched.line(seg)
        ends = [a + b * length for a, b in zip(f0, slope)]
        weights = list(seg[1]) if seg[2] is None else [a + b for a, b in zip(seg[1], seg[3])]
        self.linear = seg[2] is not None and any(slope)
        self.line = (sched._at_start[j], f0, slope, length, ends, sched._integral(seg, length))
        tree = Rule(weights).tree
        self.out = sum(c for k, c in enumerate(carried) if weights[k] == 0)  # sources left out: counts fixed
        self.paths: dict[int, list[tuple[Any, bool]]] = {}
        self.tree = self._build(tree, [])

    def _build(self, node: Any, path: list) -> Any:
        if type(node) is int:
            self.paths[node] = path
            return node
        left, right = node[0], node[1]
        lv, vv = _leaves(left), _leaves(left) + _leaves(right)
        built: list = [None, None, sum(self.carried[k] for k in lv), sum(self.carried[k] for k in vv),
                       self._params(lv, vv)]
        built[0] = self._build(left, [*path, (built, True)])
        built[1] = self._build(right, [*path, (built, False)])
        return built

    def _params(self, lv: list[int], vv: list[int]) -> tuple:
        at, f0, slope, _, ends, full = self.line
        sl, sv = sum(at[k] for k in lv), sum(at[k] for k in vv)
        al, av = sum(f0[k] for k in lv), sum(f0[k] for k in vv)
        if not self.linear:  # round(sl + al / av * (t - sv)) = (t * x + y) // z, in integers
            den = math.lcm(sl.denominator, sv.denominator, al.denominator, av.denominator)
            a_l, a_v = al * den, av * den  # (integers: the weights over a common denominator)
            x, z = 2 * int(a_l) * den, 2 * int(a_v) * den
            y = int(2 * a_v * sl * den - 2 * a_l * sv * den + a_v * den)
            return (x, y, z)
        bl, bv = sum(slope[k] for k in lv), sum(slope[k] for k in vv)
        el, ev = sum(ends[k] for k in lv), sum(ends[k] for k in vv)
        fl, fv = sl + sum(full[k] for k in lv), sv + sum(full[k] for k in vv)  # the shares at the line's end
        mean = (fl - sl) / (fv - sv) if fv > sv else Fraction(1, 2)  # the left's part of the node's share
        return (sl, sv, al, av, bl, bv, el, ev, fl, fv, mean)

    def left(self, node: list, t: int) -> int:
        """How many of the node's first ``t`` items (counted from the mix's start) went left."""
        p = node[4]
        if len(p) == 3:
            g = (t * p[0] + p[1]) // p[2]
        else:
            g = _round_linear(p, t)
        return min(max(g, node[2]), node[2] + t - node[3])

    def counts(self, n: int) -> list[int]:
        out, todo = list(self.carried), [(self.tree, n - self.out)]
        while todo:
            node, m = todo.pop()
            if type(node) is int:
                out[node] = m
                continue
            c = self.left(node, m)
            todo += [(node[0], c), (node[1], m - c)]
        return out

    def count(self, k: int, n: int) -> int:
        if k not in self.paths:
            return self.carried[k]
        n -= self.out
        for node, is_left in self.paths[k]:
            c = self.left(node, n)
            n = c if is_left else n - c
        return n

    def source(self, n: int) -> tuple[int, int]:
        node, t = self.tree, n - self.out
        while type(node) is not int:
            c = self.left(node, t)
            node, t = (node[0], c) if self.left(node, t + 1) > c else (node[1], t - c)
        return node, t


def _round_linear(p: tuple, t: int) -> int:
    """``round(G(t))`` in a linear segment: the left child's share where the node's reaches ``t``."""
    sl, sv, al, av, bl, bv, el, ev, fl, fv, mean = p
    # Before the line (the node is behind its share) and past its end (ahead), G goes on at the
    # ratio of the line's end, or at its mean where the node's fraction is 0 there: any ratio in
    # [0, 1] keeps round(G) growing by at most 1 per item, and G continuous.
    u = t - sv
    if u < 0:
        return math.floor(sl + (al / av if av else mean) * u + Fraction(1, 2))
    if u > fv - sv:
        return math.floor(fl + (el / ev if ev else mean) * (t - fv) + Fraction(1, 2))
    if bv == 0:  # the node's fraction is constant: its share is linear in the position
        if av == 0:
            return math.floor(sl + Fraction(1, 2))
        y = u / av
        return math.floor(sl + al * y + bl * y * y / 2 + Fraction(1, 2))
    # sv + av*y + bv*y^2/2 = t: y = (sqrt(d) - av) / bv, and G = sl + al*y + bl*y^2/2 = P + Q*sqrt(d)
    d = av * av + 2 * bv * u
    q = al / bv - bl * av / (bv * bv)
    p0 = sl - al * av / bv + bl * (av * av + bv * u) / (bv * bv)
    return _floor_sqrt_sum(p0 + Fraction(1, 2), q, d)


def _leaves(node: Any) -> list[int]:
    return [node] if type(node) is int else _leaves(node[0]) + _leaves(node[1])


class ScheduledRule:
    """:class:`~lazyseq.views.mixrule.Rule`'s interface (``source``, ``count``, ``counts``,
    ``first``) for a schedule: the segment that holds ``n``, then its tree."""

    def __init__(self, sched: Schedule):
        self.schedule, self.starts = sched, sched.starts
        carried = [0] * sched.n
        self.segs: list[_Segment] = []
        for j in range(len(sched.segments)):
            if j:
                carried = self.segs[-1].counts(sched.starts[j])
            self.segs.append(_Segment(sched, j, carried))
        last = sched.segments[-1][1]
        self.limit = [None if w else self.segs[-1].carried[k] for k, w in enumerate(last)]  # None: no end

    def _seg(self, n: int) -> _Segment:
        return self.segs[bisect.bisect_right(self.starts, n) - 1]

    def source(self, n: int) -> tuple[int, int]:
        return self._seg(n).source(n)

    def count(self, k: int, n: int) -> int:
        return self._seg(n).count(k, n)

    def counts(self, n: int) -> list[int]:
        return self._seg(n).counts(n)

    def first(self, k: int, t: int) -> int | None:
        """The smallest ``n`` with ``count(k, n) >= t``; None when source ``k`` never gives ``t`` items."""
        if t <= 0:
            return 0
        if self.limit[k] is not None and self.limit[k] < t:
            return None
        lo, hi = 0, max(1, self.starts[-1])
        while self.count(k, hi) < t:  # O(log n) doublings: the last segment gives k a fixed share
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # count(k, lo) < t <= count(k, hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.count(k, mid) < t else (lo, mid)
        return hi
