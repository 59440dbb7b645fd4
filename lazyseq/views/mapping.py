"""Views that apply a function to every item: smap, starmap."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..base import View
from ..errors import wrap_error
from ..helpers import fname
from ..node import Failed, bulk_reader, check_source, checks_keys, is_finite, length, read_each, read_many, reader

__all__ = ["smap", "starmap"]


class Map(View):
    def __init__(self, f: Callable, *seqs: Any, star: bool = False):
        if not callable(f):
            raise TypeError(f"smap: f must be callable, got {type(f).__name__}")
        if not seqs:
            raise ValueError("smap: give at least one sequence to map over")
        self.f, self.seqs, self.star = f, tuple(check_source(s, "smap") for s in seqs), star
        self.src = seqs[0] if len(seqs) == 1 else None
        self._rds = tuple(reader(s) for s in self.seqs)
        self._rd = self._rds[0] if len(seqs) == 1 and not star else None
        self._rdm = bulk_reader(self.src) if self.src is not None else None
        self.checks_keys = self.src is not None and checks_keys(self.src)
        self.finite = any(is_finite(s) for s in seqs)

    def _len(self) -> int:
        if self.src is not None:
            return len(self.src)
        return min(n for n in map(length, self.seqs) if n is not None)  # zip semantics

    def _get(self, i: int) -> Any:
        rd = self._rd
        if rd is not None:
            x = rd(i)
            try:
                return self.f(x)
            except Exception as e:
                raise wrap_error(e, i, self)  # noqa: B904
        args = [r(i) for r in self._rds]
        try:
            return self.f(*args[0]) if self.star else self.f(*args)
        except Exception as e:
            raise wrap_error(e, i, self)  # noqa: B904

    def _get_many(self, idx: Sequence[int]) -> list:
        f, out = self.f, []
        add = out.append
        if self.src is not None:
            xs = self._rdm(idx)
            try:
                if self.star:
                    for x in xs:
                        add(f(*x))
                else:
                    for x in xs:
                        add(f(x))
            except Exception as e:
                raise wrap_error(e, idx[len(out)], self)  # noqa: B904
            return out
        cols = [read_many(s, idx) for s in self.seqs]
        try:
            for args in zip(*cols):
                add(f(*args))
        except Exception as e:
            raise wrap_error(e, idx[len(out)], self)  # noqa: B904
        return out

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        if self.src is None:  # several sources: the default (bulk, then item by item if it fails)
            return View._get_each(self, idx, out)
        f, star = self.f, self.star
        if out is None:
            out = []
        add = out.append
        for i, x in zip(idx, read_each(self.src, idx)):
            if type(x) is Failed:
                add(x)
                continue
            try:
                add(f(*x) if star else f(x))
            except Exception as e:
                add(Failed(wrap_error(e, i, self)))
        return out

    def children(self) -> tuple:
        return self.seqs

    def describe(self) -> str:
        return f"{'starmap' if self.star else 'smap'}({fname(self.f)})"


def smap(f: Callable, *seqs: Any) -> View:
    """Map ``f`` over the items of one or more sequences, lazily: ``[f(*x) for x in zip(*seqs)]``.

    Items are computed each time they are read (add :func:`add_cache` to keep them). With several
    sequences the length is the shortest one's, as with ``zip``.

    >>> import lazyseq
    >>> m = lazyseq.smap(lambda x: x + 2, [1, 2, 3, 4])
    >>> m[0], m[-1], list(m)
    (3, 6, [3, 4, 5, 6])
    >>> list(lazyseq.smap(max, [1, 5, 3], [4, 2, 6]))
    [4, 5, 6]
    """
    return Map(f, *seqs)


def starmap(f: Callable, seq: Any) -> View:
    """Map ``f`` over a sequence of argument tuples: ``[f(*args) for args in seq]``, lazily.

    >>> import lazyseq
    >>> list(lazyseq.starmap(pow, [(2, 3), (3, 2)]))
    [8, 9]
    """
    return Map(f, seq, star=True)
