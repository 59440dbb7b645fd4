"""Views that apply a function to every item: smap, starmap; with a seed, each item gets its own
random generator, a pure function of (seed, epoch, index)."""

from __future__ import annotations

import hashlib
import inspect
import itertools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence

from ..core.aio import Blocking, gather, is_async
from ..core.aio import run as aio_run
from ..core.base import View
from ..core.node import Failed, bulk_reader, check_source, checks_keys, is_finite, is_node, length, read_each, read_many, reader
from ..errors import wrap_error
from ..helpers import fname
from .epochs import FollowsEpoch

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
        # a sized source that is not a view (a list, an array) is read by its own __getitem__, from C
        src = self.src
        self._fast = src.__getitem__ if src is not None and not is_node(src) and hasattr(src, "__len__") else None
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

    def _get_many_fn(self) -> Callable[[Sequence[int]], list]:
        plain = self._fast is not None and not self.star and type(self.f) is not Blocking
        return self._map_plain if plain and type(self)._get_many is Map._get_many else self._get_many

    def _map_plain(self, idx: Sequence[int]) -> list:
        """``_get_many`` of one function over a plain sequence (a list, an array)."""
        xs = list(map(self._fast, idx))  # a list: no frame per read
        out: list = []
        try:
            out.extend(map(self.f, xs))  # item by item: when f raises, out holds the items before it
        except Exception as e:
            raise wrap_error(e, idx[len(out)], self)  # noqa: B904
        return out

    def _get_many(self, idx: Sequence[int]) -> list:
        if type(self.f) is Blocking:
            return self._await_many(idx, None)
        f, out = self.f, []
        if self.src is not None:
            # list.extend appends item by item: when f raises, out holds the items before it
            xs = self._rdm(idx) if self._fast is None else list(map(self._fast, idx))  # a list: no frame per read
            try:
                out.extend(itertools.starmap(f, xs) if self.star else map(f, xs))
            except Exception as e:
                raise wrap_error(e, idx[len(out)], self)  # noqa: B904
            return out
        cols = [read_many(s, idx) for s in self.seqs]
        try:
            out.extend(itertools.starmap(f, zip(*cols)))
        except Exception as e:
            raise wrap_error(e, idx[len(out)], self)  # noqa: B904
        return out

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        if self.src is None:  # several sources: the default (bulk, then item by item if it fails)
            return View._get_each(self, idx, out)
        if type(self.f) is Blocking:
            return self._await_many(idx, [] if out is None else out)
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

    def _await_many(self, idx: Sequence[int], out: list | None) -> list:
        """Items ``idx`` of a map whose function is async: their coroutines run at once on the
        loop (at most ``aio.BULK`` at a time). ``out`` None: a bulk read (the first failure
        raises); else the items are appended to ``out``, a failing one as ``Failed``."""
        if self.src is not None:
            xs = read_each(self.src, idx) if out is not None else self._rdm(idx)
            argss = [x if type(x) is Failed else (tuple(x) if self.star else (x,)) for x in xs]
        else:
            argss = list(zip(*[read_many(s, idx) for s in self.seqs]))
        f, key = self.f.f, getattr(self, "_seedkey", None)

        def start(i: int, args: tuple) -> Any:  # a coroutine, or what stops it from being one
            if type(args) is Failed:
                return args
            try:
                return f(*args) if key is None else f(*args, rng=item_rng(key, i))
            except Exception as e:
                return Failed(e)

        done = aio_run(gather(list(map(start, idx, argss))))
        items = [] if out is None else out
        for i, args, (ok, x) in zip(idx, argss, done):
            if ok:
                items.append(x)
            elif x is args:
                items.append(x)  # the source's failure (reads past failures only), already wrapped
            else:
                err = wrap_error(x.error if type(x) is Failed else x, i, self)
                if out is None:
                    raise err
                items.append(Failed(err))
        return items

    def children(self) -> tuple:
        return self.seqs

    def describe(self) -> str:
        return f"{'starmap' if self.star else 'smap'}({fname(self.f)})"


# -- per-item randomness ----------------------------------------------------------------------------
def check_seed(seed: Any, where: str) -> tuple[int, ...]:
    """``seed`` (an int >= 0, or a non-empty tuple or list of them) as a tuple of ints."""
    parts = tuple(seed) if isinstance(seed, (tuple, list)) else (seed,)
    if not parts:
        raise ValueError(f"{where}: seed must be an int >= 0 or a non-empty tuple of them, got {seed!r}")
    for s in parts:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{where}: seed must be an int >= 0 or a tuple of them (e.g. (seed, epoch)), "
                            f"got {type(s).__name__} {s!r}")
        if s < 0:
            raise ValueError(f"{where}: seed must be >= 0, got {int(s)}")
    return tuple(int(s) for s in parts)


def seed_key(tag: str, seed: tuple[int, ...]) -> bytes:
    """The 32-byte key of one view's random streams: a pure function of ``(tag, seed)``."""
    return hashlib.blake2b(f"lazyseq.{tag}:{seed}".encode(), digest_size=32).digest()


_LITTLE = sys.byteorder == "little"
_blake2b = hashlib.blake2b
_WORDS = {t: (np.dtype(c), int(c[-1])) for t, c in
          [(np.uint32, "<u4"), (np.uint64, "<u8"), (np.dtype(np.uint32), "<u4"), (np.dtype(np.uint64), "<u8")]}


class ItemSeed(ISpawnableSeedSequence):
    """The seed of stream ``i`` of a view: blake2b of ``i`` keyed with the view's key.

    numpy's ``SeedSequence([*seed, i])`` would do, but costs ~20 us per item; one keyed hash is
    ~1 us. Streams of different ``i`` are independent as far as a 256-bit hash can tell, which is
    what ``SeedSequence`` offers too. ``spawn`` hands out ``SeedSequence`` children, so
    ``rng.spawn(n)`` works inside ``f``."""

    __slots__ = ("key", "i", "n_children_spawned")

    def __init__(self, key: bytes, i: int):
        self.key, self.i, self.n_children_spawned = key, i, 0

    def _digest(self, size: int) -> bytes:
        i = self.i
        try:
            data = i.to_bytes(16, "little")
        except OverflowError:  # an index past 2**128 (of an infinite view): more bytes, still one-to-one
            data = i.to_bytes((i.bit_length() + 7) // 8, "little")
        return _blake2b(data, key=self.key, digest_size=size).digest()

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        word = _WORDS.get(dtype)
        if word is None:
            raise TypeError(f"ItemSeed.generate_state: dtype must be uint32 or uint64, got {dtype}")
        size = n_words * word[1]
        if size > 64:  # more than one digest holds: let numpy's SeedSequence expand one
            return np.random.SeedSequence(int.from_bytes(self._digest(32), "little")).generate_state(n_words, dtype)
        words = np.frombuffer(self._digest(size), word[0])
        return words if _LITTLE else words.astype(dtype)

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        root, first = int.from_bytes(self._digest(32), "little"), self.n_children_spawned
        self.n_children_spawned += n_children
        return [np.random.SeedSequence(root, spawn_key=(first + c,)) for c in range(n_children)]


def item_rng(key: bytes, i: int) -> np.random.Generator:
    """Stream ``i`` of the view whose key is ``key`` (see :func:`seed_key`): a PCG64 generator."""
    return np.random.Generator(np.random.PCG64(ItemSeed(key, i)))


def _takes_rng(f: Callable) -> bool:
    """False when ``f``'s signature is known and has no ``rng`` keyword (nor ``**kwargs``)."""
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return True
    return any(p.kind is p.VAR_KEYWORD or (p.name == "rng" and p.kind is not p.POSITIONAL_ONLY) for p in params)


class SeededMap(FollowsEpoch, Map):
    """``f(*items, rng=g)``: ``g`` is item ``i``'s own generator, a pure function of ``(seed, epoch, i)``."""

    def __init__(self, f: Callable, *seqs: Any, star: bool = False, seed: Any, epoch: int | None = None):
        super().__init__(f, *seqs, star=star)
        name = "starmap" if star else "smap"
        self._parts = check_seed(seed, name)
        if not _takes_rng(f):
            raise TypeError(f"{name}: with a seed, f is called as f(..., rng=generator), but "
                            f"{fname(f)} takes no rng keyword; add one (def {fname(f)}(..., rng): ...)")
        self.seed = self._parts if isinstance(seed, (tuple, list)) else self._parts[0]
        self._init_epoch(epoch, name)

    def _epoch_setup(self) -> None:
        # epoch 0 keeps the numbers smap(seed=) gave before epochs existed; another epoch is its own
        # domain of the hash, so (seed, epoch) never collides with another seed tuple's epoch 0
        e = self._epoch
        self._seedkey = seed_key("smap" if e == 0 else f"smap.epoch{e}", self._parts)

    def _call(self, i: int, args: Any) -> Any:
        rng = np.random.Generator(np.random.PCG64(ItemSeed(self._seedkey, i)))
        try:
            return self.f(*args, rng=rng)
        except Exception as e:
            raise wrap_error(e, i, self)  # noqa: B904

    def _get(self, i: int) -> Any:
        if self.src is not None:
            x = self._rds[0](i)
            return self._call(i, x if self.star else (x,))
        return self._call(i, [r(i) for r in self._rds])

    def _get_many(self, idx: Sequence[int]) -> list:
        if type(self.f) is Blocking:
            return self._await_many(idx, None)
        call = self._call
        if self.src is None:
            return [call(i, args) for i, args in zip(idx, zip(*[read_many(s, idx) for s in self.seqs]))]
        xs = self._rdm(idx)
        if self.star:
            return [call(i, x) for i, x in zip(idx, xs)]
        return [call(i, (x,)) for i, x in zip(idx, xs)]

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        if self.src is None:  # several sources: the default (bulk, then item by item if it fails)
            return View._get_each(self, idx, out)
        if type(self.f) is Blocking:
            return self._await_many(idx, [] if out is None else out)
        call, star = self._call, self.star
        if out is None:
            out = []
        add = out.append
        for i, x in zip(idx, read_each(self.src, idx)):
            if type(x) is Failed:
                add(x)
                continue
            try:
                add(call(i, x if star else (x,)))
            except Exception as e:  # already wrapped by _call
                add(Failed(e))
        return out

    def describe(self) -> str:
        epoch = "" if self.epoch is None and self._epoch == 0 else f", {self._epoch_text()}"
        return f"{'starmap' if self.star else 'smap'}({fname(self.f)}, seed={self.seed!r}{epoch})"


def smap(f: Callable, *seqs: Any, seed: Any = None, epoch: int | None = None) -> View:
    """Map ``f`` over the items of one or more sequences, lazily: ``[f(*x) for x in zip(*seqs)]``.

    Items are computed each time they are read (add :func:`add_cache` to keep them). With several
    sequences the length is the shortest one's, as with ``zip``.

    With ``seed`` (an int >= 0 or a tuple of them, e.g. ``(seed, epoch)``), ``f`` is called as
    ``f(*x, rng=g)``: ``g`` is a ``numpy.random.Generator`` of item ``i``'s own, a pure function
    of ``(seed, epoch, i)``, so an item gets the same random numbers whoever reads it, in any
    order, in any worker. ``epoch=None`` follows the epoch of the :class:`DataLoader` that reads
    it, so each epoch draws anew (outside a loader it is 0); an int fixes it.

    >>> import lazyseq
    >>> m = lazyseq.smap(lambda x: x + 2, [1, 2, 3, 4])
    >>> m[0], m[-1], list(m)
    (3, 6, [3, 4, 5, 6])
    >>> list(lazyseq.smap(max, [1, 5, 3], [4, 2, 6]))
    [4, 5, 6]
    >>> noisy = lazyseq.smap(lambda x, rng: x + rng.integers(100), [0, 1000, 2000], seed=7)
    >>> list(noisy) == list(noisy) == [noisy[0], noisy[1], noisy[2]]
    True
    """
    if seed is None and epoch is not None:
        raise ValueError("smap: epoch= only matters with a seed (it selects the items' random numbers)")
    return _awaiting(Map(f, *seqs) if seed is None else SeededMap(f, *seqs, seed=seed, epoch=epoch))


def starmap(f: Callable, seq: Any, seed: Any = None, epoch: int | None = None) -> View:
    """Map ``f`` over a sequence of argument tuples: ``[f(*args) for args in seq]``, lazily.

    With ``seed`` (and ``epoch``), ``f(*args, rng=g)`` as in :func:`smap`.

    >>> import lazyseq
    >>> list(lazyseq.starmap(pow, [(2, 3), (3, 2)]))
    [8, 9]
    >>> jitter = lazyseq.starmap(lambda a, b, rng: a * b + rng.random(), [(2, 3), (3, 2)], seed=(1, 0))
    >>> [round(x) for x in jitter] in ([6, 6], [6, 7], [7, 6], [7, 7])
    True
    """
    if seed is None and epoch is not None:
        raise ValueError("starmap: epoch= only matters with a seed (it selects the items' random numbers)")
    return _awaiting(Map(f, seq, star=True) if seed is None else SeededMap(f, seq, star=True, seed=seed, epoch=epoch))


def _awaiting(view: Map) -> Map:
    """``view``, whose function runs its coroutine to completion if it is async (see aio.py)."""
    if is_async(view.f):
        view.f = Blocking(view.f)
    return view
