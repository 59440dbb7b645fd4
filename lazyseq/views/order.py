"""The orders of training epochs: shuffle (a random permutation in O(1) memory) and shard (one
rank's part of it)."""

from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.base import Remap, View
from ..core.node import is_finite, length
from .epochs import FollowsEpoch

__all__ = ["shuffle", "shard"]


# -- shuffle ---------------------------------------------------------------------------------------
_M64 = (1 << 64) - 1
_C1, _C2 = 0x9E3779B1, 0xBF58476D1CE4E5B9
_U = tuple(np.uint64(v) for v in (_C1, _C2, 32, 29))
_BLOCK = 1 << 15  # positions of a shuffle mapped at once by a bulk read (a batch): see Shuffle._block


def _mix(v, key):
    """The Feistel round function; identical on Python ints and numpy uint64 arrays."""
    h = (v * _C1 + key) & _M64
    h ^= h >> 32
    h = (h * _C2) & _M64
    return h ^ (h >> 29)


class Shuffle(FollowsEpoch, Remap):
    ROUNDS = 4

    def __init__(self, seq: Any, seed: int | None, epoch: int | None):
        self._bind(seq, "shuffle")
        if length(seq) is None:
            raise TypeError("shuffle: the sequence has no len(); only finite sequences can be shuffled")
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else operator.index(seed)
        self._init_epoch(epoch, "shuffle")

    def _epoch_setup(self) -> None:
        self._setup(len(self.src))

    def _setup(self, n: int) -> None:
        # A bijection of [0, 2**bits) from an unbalanced Feistel network; cycle-walking (applying
        # it again while the result is >= n) makes it a bijection of [0, n) with O(1) state.
        self._n, bits = n, max(2, (n - 1).bit_length())
        digest = hashlib.blake2b(f"lazyseq.shuffle:{self.seed}:{self._epoch}".encode(), digest_size=4 * self.ROUNDS).digest()
        keys = [int.from_bytes(digest[4 * r : 4 * r + 4], "little") for r in range(self.ROUNDS)]
        hi = bits // 2
        self._rounds = []
        for key in keys:
            lo = bits - hi
            self._rounds.append((lo, (1 << lo) - 1, hi, (1 << hi) - 1, key))
            hi = lo
        self._urounds = [tuple(np.uint64(v) for v in r) for r in self._rounds]
        self._recent: tuple = ()  # ((block, positions' source indices), ...): see _block

    def _len(self) -> int:
        n = len(self.src)
        if n != self._n:  # the source grew or shrank: the permutation follows its length
            self._setup(n)
        return n

    def _map(self, x: int) -> int:
        n = self._n
        while True:
            for lo, lo_mask, hi, hi_mask, key in self._rounds:
                x = ((x & lo_mask) << hi) | ((x >> lo) ^ (_mix(x & lo_mask, key) & hi_mask))
            if x < n:
                return x

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        if len(idx) < 32:
            return [self._map(i) for i in idx]
        return self._map_array(np.asarray(idx, dtype=np.int64)).tolist()

    def _map_array(self, idx: np.ndarray) -> np.ndarray:
        if len(idx) >= 32:  # a batch reads neighbouring positions: map them from a block of the order
            first, last = int(idx.min()), int(idx.max())
            b0, b1 = first // _BLOCK, last // _BLOCK
            if b1 - b0 < 2:
                table = self._block(b0) if b0 == b1 else np.concatenate([self._block(b0), self._block(b1)])
                return table[idx - b0 * _BLOCK].astype(np.int64)
        return self._permute(idx)

    def _block(self, b: int) -> np.ndarray:
        """Where positions ``b * _BLOCK`` on go (computed at once, ~0.05 us a position, and a few
        hundred us per block for the last indices' cycle walks); the last two blocks are kept
        (int32 below 2**31 items: 256 kB), so reading an epoch in order computes each block once."""
        for k, table in self._recent:
            if k == b:
                return table
        table = self._walk(np.arange(b * _BLOCK, min(self._n, (b + 1) * _BLOCK), dtype=np.uint64))
        if self._n <= 2**31:
            table = table.astype(np.int32)
        self._recent = ((b, table), *self._recent[:1])  # one assignment: readers in other threads see either
        return table

    def _permute(self, idx: np.ndarray) -> np.ndarray:
        """``_map`` of every index, vectorised: the Feistel rounds on uint64 arrays (wrapping as the
        Python version masks), cycle-walking only the indices still outside [0, n)."""
        return self._walk(idx.astype(np.uint64))

    def _walk(self, out: np.ndarray) -> np.ndarray:
        """``_permute`` in place on a uint64 array of indices; returns it as int64."""
        n = np.uint64(self._n)
        self._rounds_on(out)
        todo = np.flatnonzero(out >= n)
        while len(todo):
            y = out[todo]
            self._rounds_on(y)
            out[todo] = y
            todo = todo[y >= n]
        return out.view(np.int64)  # every value < n

    def _rounds_on(self, y: np.ndarray) -> None:
        """The Feistel network on ``y`` in place, 8192 values at a time (three scratch arrays of
        64 kB: what a worker's heap keeps of them stays small)."""
        m = min(len(y), 8192)
        low, h, t = np.empty(m, np.uint64), np.empty(m, np.uint64), np.empty(m, np.uint64)
        for a in range(0, len(y), m):
            b = min(len(y), a + m)
            self._rounds_part(y[a:b], low[: b - a], h[: b - a], t[: b - a])

    def _rounds_part(self, y: np.ndarray, low: np.ndarray, h: np.ndarray, t: np.ndarray) -> None:
        c1, c2, s32, s29 = _U[0], _U[1], _U[2], _U[3]
        for lo, lo_mask, hi, hi_mask, key in self._urounds:
            np.bitwise_and(y, lo_mask, out=low)
            np.multiply(low, c1, out=h)
            h += key
            np.right_shift(h, s32, out=t)
            h ^= t
            h *= c2
            np.right_shift(h, s29, out=t)
            h ^= t
            h &= hi_mask
            y >>= lo
            y ^= h
            low <<= hi
            y |= low

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_recent": ()}

    def order(self) -> list[int]:
        """The source index of every item: ``[source index of item 0, of item 1, ...]``."""
        return self._map_many(range(len(self)))

    def describe(self) -> str:
        return f"shuffle(seed={self.seed}, {self._epoch_text()})"


def shuffle(seq: Any, seed: int | None, epoch: int | None = None) -> View:
    """A random permutation of ``seq``, fixed by ``(seed, epoch)``; each epoch gets another order.

    Building it is O(1): item ``i`` is ``seq[p(i)]`` where ``p`` is a keyed bijection (a Feistel
    network with cycle-walking), computed per read, so no permutation table is ever stored.
    ``seed=None`` draws a seed once (kept in ``.seed``, so copies sent to workers agree).
    ``epoch=None`` follows the epoch of the :class:`DataLoader` that reads it (0 outside one);
    an int fixes it (see :mod:`lazyseq.views.epochs`).

    >>> import lazyseq
    >>> s = lazyseq.shuffle(range(10), seed=42)
    >>> sorted(s) == list(range(10)), list(s) == list(lazyseq.shuffle(range(10), seed=42))
    (True, True)
    >>> list(s) != list(lazyseq.shuffle(range(10), seed=42, epoch=1))
    True
    """
    return Shuffle(seq, seed, epoch)


# -- shard -----------------------------------------------------------------------------------------
class Shard(Remap):
    def __init__(self, seq: Any, index: int, count: int, drop_remainder: bool):
        self._bind(seq, "shard")
        # not self.index/self.count: those would hide the Sequence methods index() and count()
        self.shard_index, self.shard_count = operator.index(index), operator.index(count)
        self.drop_remainder = drop_remainder
        if self.shard_count < 1 or not 0 <= self.shard_index < self.shard_count:
            raise ValueError(f"shard: need 0 <= index < count, got index={index}, count={count}")
        self.finite = is_finite(seq)

    def _len(self) -> int:
        n, c = len(self.src), self.shard_count
        return n // c if self.drop_remainder else len(range(self.shard_index, n, c))

    def _map(self, i: int) -> int:
        return self.shard_index + i * self.shard_count

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        a, c = self.shard_index, self.shard_count
        return [a + i * c for i in idx]

    def _map_array(self, idx: np.ndarray) -> np.ndarray:
        return self.shard_index + idx * self.shard_count

    def describe(self) -> str:
        extra = ", drop_remainder" if self.drop_remainder else ""
        return f"shard({self.shard_index} of {self.shard_count}{extra})"


def shard(seq: Any, index: int, count: int, drop_remainder: bool = False) -> View:
    """The ``index``-th of ``count`` disjoint parts of ``seq``: items ``index, index + count, ...``.

    Together the parts cover ``seq``; their lengths differ by at most one. With
    ``drop_remainder=True`` every part has exactly ``len(seq) // count`` items, so data-parallel
    ranks take the same number of steps (the last ``len(seq) % count`` items are left out).

    >>> import lazyseq
    >>> [list(lazyseq.shard(range(10), r, 3)) for r in range(3)]
    [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    >>> [list(lazyseq.shard(range(10), r, 3, drop_remainder=True)) for r in range(3)]
    [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    """
    return Shard(seq, index, count, drop_remainder)
