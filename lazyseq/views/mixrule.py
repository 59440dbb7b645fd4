"""The arithmetic of a mixture: weights as exact integers in the same ratios
(:func:`integer_weights`), and :class:`Rule`, which source each item of the even interleaving of
integer weights comes from. :mod:`.mixing` (fixed weights) and :mod:`.schedule_rule` (weights
that change with the position) read their items through it.

The order is a rule, not a table: how many of the first ``n`` items come from each source is
computed from ``n`` in O(number of sources), exactly (integer weights), so item ``i`` of a mix of
any length costs the same to find. The rule splits the sources into a binary tree (Huffman's, on
the weights) and rounds at every node: a node that has handed out ``m`` items has handed
``round(m * w_left / (w_left + w_right))`` of them to its left child. Each rounding is off by at
most 1/2, so a source's count after ``n`` items is within 1/2 of its share for two sources, within
1 for three, and within ``1/2 * (1 + sum over its ancestors G below the root of w_k / w_G)`` in
general, which Huffman's tree keeps below 2 (a node weighs at least twice its grandchild).

>>> integer_weights([0.3, 0.2], 2), [Rule([3, 2]).source(n)[0] for n in range(5)]
([3, 2], [0, 1, 0, 1, 0])
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["Rule", "integer_weights"]


# -- weights -----------------------------------------------------------------------------------------
def _exact(w: Any, k: int, where: str) -> Fraction:
    """Weight ``k`` as an exact fraction; a float is read as the decimal it prints as (0.3 is 3/10)."""
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, (numbers.Real, Decimal)):
        raise TypeError(f"{where}: weights must be real numbers, got weights[{k}] = {w!r} ({type(w).__name__})")
    if isinstance(w, (int, np.integer)):
        q = Fraction(int(w))
    elif isinstance(w, numbers.Rational):
        q = Fraction(w.numerator, w.denominator)
    elif isinstance(w, Decimal):
        if not w.is_finite():
            raise ValueError(f"{where}: weights[{k}] is {w}; weights must be finite")
        q = Fraction(w)
    else:
        f = float(w)
        if not math.isfinite(f):
            raise ValueError(f"{where}: weights[{k}] is {f}; weights must be finite")
        q = Fraction(repr(f))
    if q < 0:
        raise ValueError(f"{where}: weights[{k}] is {w}; weights must be >= 0")
    return q


def integer_weights(weights: Any, n: int, where: str = "mix") -> list[int]:
    """``weights`` (``None``: equal) as integers in the same ratios, with no common factor; errors
    begin with ``where`` (the call, and which weights)."""
    if weights is None:
        return [1] * n
    if isinstance(weights, (str, bytes, dict)) or not hasattr(weights, "__len__"):
        raise TypeError(f"{where}: weights must be a list of numbers, one per sequence, got {type(weights).__name__}")
    if len(weights) != n:
        raise ValueError(f"{where}: {len(weights)} weight{'s' * (len(weights) != 1)} for {n} sequences; give one weight "
                         "per sequence")
    qs = [_exact(w, k, where) for k, w in enumerate(weights)]
    if not any(qs):
        raise ValueError(f"{where}: the weights sum to zero ({list(weights)}); give at least one positive weight")
    den = math.lcm(*(q.denominator for q in qs))
    ints = [q.numerator * (den // q.denominator) for q in qs]
    g = math.gcd(*ints)
    return [a // g for a in ints]


# -- the even interleaving ----------------------------------------------------------------------------
class Rule:
    """Which source each item of the even interleaving comes from, for integer weights ``a``.

    ``tree`` is a source index (a leaf) or ``(left, right, 2 * a_left, a, 2 * a)`` (a node whose
    leaves weigh ``a`` in all, ``a_left`` of it on the left); sources of weight 0 are left out."""

    def __init__(self, a: Sequence[int]):
        self.a, self.total = list(a), sum(a)
        heap = [(w, k, k) for k, w in enumerate(self.a) if w > 0]  # (weight, tie-break, subtree)
        heapq.heapify(heap)
        order = len(self.a)
        while len(heap) > 1:  # Huffman: join the two lightest subtrees
            (wl, _, left), (wr, _, right) = heapq.heappop(heap), heapq.heappop(heap)
            heapq.heappush(heap, (wl + wr, order, (left, right, 2 * wl, wl + wr, 2 * (wl + wr))))
            order += 1
        self.tree = heap[0][2]
        self.paths: dict[int, list[tuple[int, int, int, bool]]] = {}
        self._paths(self.tree, [])

    def _paths(self, node: Any, path: list) -> None:
        if type(node) is int:
            self.paths[node] = path
            return
        left, right, al2, a, a2 = node
        self._paths(left, [*path, (al2, a, a2, True)])
        self._paths(right, [*path, (al2, a, a2, False)])

    def source(self, n: int) -> tuple[int, int]:
        """``(k, c)``: item ``n`` comes from source ``k``, which gave ``c`` of the first ``n`` items."""
        node = self.tree
        while type(node) is not int:
            left, right, al2, a, a2 = node
            c = (n * al2 + a) // a2  # how many of the node's first n items went left
            if (n * al2 + al2 + a) // a2 > c:
                node, n = left, c
            else:
                node, n = right, n - c
        return node, n

    def count(self, k: int, n: int) -> int:
        """How many of the first ``n`` items come from source ``k``."""
        if self.a[k] == 0:
            return 0
        for al2, a, a2, left in self.paths[k]:
            c = (n * al2 + a) // a2
            n = c if left else n - c
        return n

    def counts(self, n: int) -> list[int]:
        """``count(k, n)`` for every source, in one pass over the tree."""
        out, todo = [0] * len(self.a), [(self.tree, n)]
        while todo:
            node, m = todo.pop()
            if type(node) is int:
                out[node] = m
                continue
            left, right, al2, a, a2 = node
            c = (m * al2 + a) // a2
            todo += [(left, c), (right, m - c)]
        return out

    def first(self, k: int, t: int) -> int:
        """The smallest ``n`` with ``count(k, n) >= t`` (source ``k`` has a positive weight)."""
        if t <= 0:
            return 0
        lo, hi = 0, -(-(t + 2) * self.total // self.a[k])  # count(k, n) > n * share - 2
        while self.count(k, hi) < t:  # (never taken: the bound holds; kept as a guard)
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # count(k, lo) < t <= count(k, hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.count(k, mid) < t else (lo, mid)
        return hi
