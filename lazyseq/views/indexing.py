"""Views that choose or repeat items: gather, arange, cycle, repeat, interleave, switch/case,
uniter. (The epoch orders, shuffle and shard, are in :mod:`lazyseq.views.order`.)"""

from __future__ import annotations

import bisect
import math
import operator
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core.base import Gather, Remap, View, _infinite_range
from ..core.keys import compose, span
from ..core.node import Exhausted, check_source, length, reader
from ..core.routed import Routed

__all__ = ["gather", "take", "arange", "cycle", "repeat", "interleave", "switch", "case", "uniter"]


# -- gather ----------------------------------------------------------------------------------------
def gather(seq: Any, indexes: Any) -> View:
    """The items of ``seq`` at ``indexes``, in that order: ``[seq[i] for i in indexes]``, lazily.

    ``indexes`` is any sequence of ints (a list, a numpy array, another view); negative indexes
    count from the end of ``seq``. Writes go through to ``seq``. (The view class, ``Gather``, is in
    :mod:`lazyseq.core.base`: an index-array key such as ``v[[3, 1]]`` builds one too.)

    >>> import lazyseq
    >>> words = ['d', 'e', 'h', 'l', 'o', 'r', 'w', ' ']
    >>> ''.join(lazyseq.gather(words, [2, 1, 3, 3, 4, 7, 6, 4, 5, 3, 0]))
    'hello world'
    """
    return Gather(seq, indexes)


def take(seq: Any, indexes: Any) -> View:
    """Alias of :func:`gather`.

    >>> import lazyseq
    >>> list(lazyseq.take([10, 20, 30], [2, -3]))
    [30, 10]
    """
    return Gather(seq, indexes)


# -- arange ----------------------------------------------------------------------------------------
class Arange(View):
    checks_keys = True

    def __init__(self, r: range):
        self.r = r

    def _len(self) -> int:
        return span(self.r)

    def _get(self, i: int) -> int:
        return self.r[i]

    def _get_many(self, idx: Sequence[int]) -> list:
        r = self.r
        return [r[i] for i in idx]

    def _get_array(self, idx: np.ndarray) -> np.ndarray:
        return self.r.start + idx * self.r.step

    def _slice(self, r: range) -> View:
        return Arange(compose(self.r.start, self.r.step, r))

    def describe(self) -> str:
        r = self.r
        return f"arange({r.start}, {r.stop}, {r.step})" if r.step != 1 else f"arange({r.start}, {r.stop})"


def arange(start: int, stop: int | None = None, step: int | None = None) -> View:
    """The integers of ``range(start, stop, step)`` as a view.

    Unlike seqtools, negative keys wrap and out-of-range keys raise ``IndexError``, as with
    ``range``; slices are aranges again.

    >>> import lazyseq
    >>> a = lazyseq.arange(2, 12, 3)
    >>> list(a), a[-1], list(a[::-1])
    ([2, 5, 8, 11], 11, [11, 8, 5, 2])
    """
    if stop is None:
        start, stop = 0, start
    r = range(operator.index(start), operator.index(stop), 1 if step is None else operator.index(step))
    return Arange(r)


# -- cycle and repeat ------------------------------------------------------------------------------
class Cycle(Remap):
    def __init__(self, seq: Any, limit: int | None):
        self._bind(seq, "cycle")
        n = length(seq)
        if n is None:
            raise TypeError("cycle: the sequence has no len() (it is infinite?); cycling needs a finite one")
        self.limit = None if limit is None else operator.index(limit)
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"cycle: limit must be >= 0 or None, got {limit}")
        if n == 0 and self.limit != 0:
            raise ValueError("cycle: the sequence is empty, so there is nothing to repeat")
        self.finite = self.limit is not None

    def _len(self) -> int:
        return self.limit

    def _map(self, i: int) -> int:
        return i % len(self.src)

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        n = len(self.src)
        return [i % n for i in idx]

    def describe(self) -> str:
        return "cycle()" if self.limit is None else f"cycle(limit={self.limit})"


def cycle(seq: Any, limit: int | None = None) -> View:
    """``seq`` repeated over and over, for ever or up to ``limit`` items.

    Without a limit the view is infinite: it has no ``len`` and only non-negative keys. Writes go
    to the underlying item. An empty ``seq`` raises ``ValueError`` at once (seqtools failed later,
    on the first read).

    >>> import lazyseq
    >>> loop = lazyseq.cycle(['a', 'b', 'c'])
    >>> loop[3], loop[3 * 10**9 + 1]
    ('a', 'b')
    >>> list(lazyseq.cycle(['a', 'b', 'c'], 7))
    ['a', 'b', 'c', 'a', 'b', 'c', 'a']
    >>> list(loop[2:6])
    ['c', 'a', 'b', 'c']
    """
    return Cycle(seq, limit)


class Repeat(View):
    def __init__(self, value: Any, times: int | None):
        self.value, self.times = value, times
        self.finite = times is not None

    def _len(self) -> int:
        return self.times

    def _get(self, i: int) -> Any:
        return self.value

    def _get_many(self, idx: Sequence[int]) -> list:
        return [self.value] * len(idx)

    def _set(self, i: int, value: Any) -> None:
        self.value = value

    def _set_many(self, key: Any, values: Any) -> None:
        if self.finite or not isinstance(key, slice):
            return super()._set_many(key, values)
        # As in seqtools, an infinite repeat takes any number of values for a bounded slice: every
        # item is the one value, which writing the values in turn leaves at the last one.
        targets = _infinite_range(self, key)
        if targets is None:
            raise ValueError(f"{self.describe()} has no len(): cannot assign to an open-ended slice, give a stop")
        values = list(values)
        if targets and not values:
            raise ValueError(f"{self.describe()}: no value given for the {len(targets)} items of the slice")
        if targets:
            self.value = values[-1]

    def children(self) -> tuple:
        return ()

    def describe(self) -> str:
        v = repr(self.value)
        v = v if len(v) <= 30 else type(self.value).__name__
        return f"repeat({v})" if self.times is None else f"repeat({v}, {self.times})"


def repeat(value: Any, times: int | None = None) -> View:
    """``value`` repeated ``times`` times, or for ever when ``times`` is None.

    All items are the same object, so writing any item replaces the value of every item (as in
    seqtools); a slice of an infinite repeat takes any number of values, the last one stays.
    Unlike seqtools, ``times`` may be 0 or 1.

    >>> import lazyseq
    >>> list(lazyseq.repeat(3, 4)), list(lazyseq.repeat('x', 1)), list(lazyseq.repeat('x', 0))
    ([3, 3, 3, 3], ['x'], [])
    >>> r = lazyseq.repeat(7)
    >>> r[10**12]
    7
    >>> r[5:9] = [1, 2]
    >>> r[0]
    2
    """
    if times is not None:
        if isinstance(times, bool) or not isinstance(times, (int, np.integer)):
            raise TypeError(f"repeat: times must be an int >= 0 or None, got {type(times).__name__}")
        times = operator.index(times)
        if times < 0:
            raise ValueError(f"repeat: times must be >= 0, got {times}")
    return Repeat(value, times)


# -- interleave ------------------------------------------------------------------------------------
class Interleave(Routed):
    def __init__(self, seqs: Sequence[Any]):
        self.seqs = tuple(check_source(s, "interleave") for s in seqs)
        self._rds = tuple(reader(s) for s in self.seqs)
        lens = [length(s) for s in self.seqs]
        self.finite = all(n is not None for n in lens)
        key = [math.inf if n is None else n for n in lens]
        order = sorted(range(len(seqs)), key=lambda k: key[k])
        # Round-robin over the sequences not yet exhausted: out_off[g] is the first output index
        # of round-group g, in_off[g] how far every remaining sequence has been read by then.
        self._out_off, self._in_off, self._groups = [0], [0], []
        for pos, k in enumerate(order):
            self._groups.append(sorted(order[pos:]))
            if key[k] == math.inf:
                break
            self._out_off.append(self._out_off[-1] + (key[k] - self._in_off[-1]) * (len(order) - pos))
            self._in_off.append(key[k])

    def _len(self) -> int:
        return sum(len(s) for s in self.seqs)

    def _where(self, i: int) -> tuple[int, int]:
        g = bisect.bisect_right(self._out_off, i) - 1
        group = self._groups[g]
        i -= self._out_off[g]
        return group[i % len(group)], self._in_off[g] + i // len(group)

    def describe(self) -> str:
        return f"interleave({len(self.seqs)} sequences)"


def interleave(*seqs: Any) -> View:
    """Items taken from each sequence in turn; when one runs out, the others go on.

    >>> import lazyseq
    >>> list(lazyseq.interleave([1, 2, 3, 4, 5], ['a', 'b', 'c'], [.1, .2, .3, .4]))
    [1, 'a', 0.1, 2, 'b', 0.2, 3, 'c', 0.3, 4, 0.4, 5]
    """
    if not seqs:
        raise ValueError("interleave: give at least one sequence")
    return Interleave(seqs)


# -- switch and case -------------------------------------------------------------------------------
class Case(View):
    def __init__(self, selector: Any, values: Sequence[Any], switch: bool = False):
        self.src = check_source(selector, "case")
        self.values = tuple(check_source(v, "case") for v in values)
        if not self.values:
            raise ValueError("case: give at least one sequence of values")
        self._sel, self._rds, self._switch = reader(selector), tuple(reader(v) for v in values), switch
        n = length(selector)
        for k, v in enumerate(self.values):
            m = length(v)
            if m != n and not (m is None and n is not None):
                raise ValueError(f"{'switch' if switch else 'case'}: all sequences must have the same "
                                 f"length; the selector has {n}, values[{k}] has {m}")
        self.finite = n is not None

    def _pick(self, i: int) -> int:
        s = self._sel(i)
        if self._switch:  # switch(condition, x, y) holds values (y, x)
            return 1 if s else 0
        k = operator.index(s)
        if not 0 <= k < len(self.values):
            raise ValueError(f"case: selector[{i}] is {k}, expected an int in [0, {len(self.values)})")
        return k

    def _get(self, i: int) -> Any:
        return self._rds[self._pick(i)](i)

    def _set(self, i: int, value: Any) -> None:
        self.values[self._pick(i)][i] = value

    def children(self) -> tuple:
        return (self.src, *self.values)

    def describe(self) -> str:
        return "switch(condition, x, y)" if self._switch else f"case({len(self.values)} choices)"


def switch(condition: Any, x: Any, y: Any) -> View:
    """``x[i] if condition[i] else y[i]`` for every ``i``.

    >>> import lazyseq
    >>> list(lazyseq.switch([True, False, True], 'abc', 'ABC'))
    ['a', 'B', 'c']
    """
    return Case(condition, (y, x), switch=True)


def case(selector: Any, *values: Any) -> View:
    """``values[selector[i]][i]`` for every ``i``: pick each item from the sequence the selector names.

    >>> import lazyseq
    >>> list(lazyseq.case([0, 2, 1, 0], 'abcd', 'ABCD', '0123'))
    ['a', '1', 'C', 'd']
    """
    return Case(selector, values)


# -- uniter ----------------------------------------------------------------------------------------
class _Cursor:
    __slots__ = ("cache", "it", "next")

    def __init__(self, it, cache_size: int):
        self.it, self.next, self.cache = it, 0, deque(maxlen=max(cache_size, 1))


class Uniter(View):
    def fingerprint_refuse(self) -> str:
        """Why a position in this view cannot be saved (lazyseq.fingerprint)."""
        return (f"{self.describe()} reads an iterable in order: its items are not a function of an index, so a "
                "position in it cannot be saved and resumed; save the data first (lazyseq.save) or give a sequence")

    def __init__(self, iterable: Iterable, cache_size: int, n_parallel: int, size: int | None):
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"uniter: expected an iterable, got {type(iterable).__name__}")
        if n_parallel < 1:
            raise ValueError(f"uniter: n_parallel must be >= 1, got {n_parallel}")
        self.iterable, self.cache_size, self.n_parallel = iterable, cache_size, n_parallel
        self.size = None if size is None else operator.index(size)
        self.one_shot = iter(iterable) is iterable
        if self.one_shot and n_parallel > 1:
            raise ValueError("uniter: n_parallel > 1 needs an iterable that can be iterated again "
                             "(a list, a range, a class with __iter__), not an iterator or generator")
        self.finite = self.size is not None
        self._setup()

    def _setup(self) -> None:
        self._lock, self._cursors, self._started = threading.Lock(), [], False

    def __getstate__(self) -> dict:
        if self.one_shot:
            raise TypeError("uniter over an iterator or generator cannot be pickled (its position "
                            "would be lost); give uniter a re-iterable object")
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_cursors", "_started")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _len(self) -> int:
        return self.size

    def _get(self, i: int) -> Any:
        with self._lock:
            for c in self._cursors:
                if c.next - len(c.cache) <= i < c.next:
                    return c.cache[i - c.next]
            behind = [c for c in self._cursors if c.next <= i]
            if behind:
                c = max(behind, key=lambda c: c.next)
                self._cursors.remove(c)
            else:
                if self.one_shot and self._started:
                    raise ValueError(
                        f"uniter: item {i} is behind the iterator, which cannot be restarted (it is "
                        "a one-shot iterator); pass a re-iterable object or a larger cache_size")
                if len(self._cursors) >= self.n_parallel:
                    self._cursors.pop(0)  # the least recently used
                c, self._started = _Cursor(iter(self.iterable), self.cache_size), True
            self._cursors.append(c)
            try:
                while c.next <= i:
                    c.cache.append(next(c.it))
                    c.next += 1
            except StopIteration:
                raise Exhausted(f"index {i} is past the end of uniter: the iterable ended after "
                                 f"{c.next} items" + (f" (size={self.size} was given)" if self.size else "")) from None
            return c.cache[-1]

    def children(self) -> tuple:
        return ()

    def describe(self) -> str:
        return f"uniter({type(self.iterable).__name__}, cache_size={self.cache_size})"


def uniter(iterable: Iterable, cache_size: int = 0, n_parallel: int = 1, size: int | None = None) -> View:
    """Random access to an iterable, by stepping (and restarting) iterators over it.

    ``n_parallel`` iterators are kept, so that one of them is usually just behind the requested
    item; each remembers its last ``cache_size`` items. Without ``size`` the view has no ``len``
    and reading past the end raises ``IndexError`` (seqtools leaked ``StopIteration``). A one-shot
    iterator (a generator) works for forward reads only.

    >>> import lazyseq
    >>> a = lazyseq.uniter(range(5000), cache_size=10, n_parallel=5, size=5000)
    >>> a[10], a[1], a[-1]
    (10, 1, 4999)
    >>> list(lazyseq.uniter(x * x for x in range(4)))
    [0, 1, 4, 9]
    """
    return Uniter(iterable, cache_size, n_parallel, size)
