"""Fuzzing indexing: random pipelines of every view, read with random keys of every kind.

Finite pipelines (over lists, 1-D and 2-D numpy arrays, aranges) are checked against the list
they materialise, ``expect = list(view)``: for the same key, a scalar key (ints of any size,
bools, numpy scalars of every integer type, floats, None, strings, 0-d arrays...) gives the same
item or raises the same exception type as ``expect[key]``; a slice gives the same items or the
same exception type; an index array or mask follows the documented gather rule (numpy's: integer
entries in ``[-n, n)``, anything else ``IndexError``; a boolean mask of length ``n``; entries that
are not integers ``TypeError``). Infinite and huge (longer than ``sys.maxsize``) pipelines are
checked against a model of their items. Every example runs under an alarm: a hang fails it.

``LAZYSEQ_FUZZ_EXAMPLES`` sets the number of examples per test (default 150, 80 under ``CI``: about 20 s).
"""

from __future__ import annotations

import contextlib
import operator
import os
import signal
import sys
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.core.base import span

EXAMPLES = int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES") or (80 if os.environ.get("CI") else 150))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HANG = 20  # seconds: an example that runs longer is a hang
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.intp]
HUGE = [sys.maxsize, -sys.maxsize - 1, 2**63, -(2**63) - 1, 2**64, 2**64 - 1, 10**30, -(10**30)]


@contextlib.contextmanager
def alarm(seconds: float = HANG):
    """Fail, rather than hang, past ``seconds`` (SIGALRM: pytest runs tests in the main thread)."""

    def expire(signum, frame):
        raise TimeoutError(f"hang: the example ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- outcomes --------------------------------------------------------------------------------------
class Raised:
    def __init__(self, error: BaseException):
        self.error = error

    def __repr__(self) -> str:
        return f"Raised({type(self.error).__name__}: {self.error})"


def plain(x):
    """A comparable form of an item: arrays, numpy scalars and views made plain."""
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, ls.View):
        return ("view", [plain(y) for y in x])
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [plain(y) for y in x])
    return x


def read(seq, key):
    """``seq[key]``, or the exception it raised."""
    try:
        return seq[key]
    except Exception as e:
        return Raised(e)


def check_same(got, want, key) -> None:
    """``got`` (the view's outcome) matches ``want`` (the list's): value, or exception type."""
    if isinstance(want, Raised):
        assert isinstance(got, Raised), f"key {key!r}: got {got!r}, a list raises {want!r}"
        assert isinstance(got.error, type(want.error)), f"key {key!r}: {got!r}, a list raises {want!r}"
    else:
        assert not isinstance(got, Raised), f"key {key!r}: raised {got!r}, a list gives {want!r}"
        assert plain(got) == plain(want), (key, got, want)


# -- keys ------------------------------------------------------------------------------------------
class Idx:
    """An object with ``__index__``: a list accepts it as an int."""

    def __init__(self, k: int):
        self.k = k

    def __index__(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Idx({self.k})"


def np_scalars(m: int):
    def draw_for(dt):
        info = np.iinfo(dt)
        near = st.integers(max(info.min, -2 * m - 3), min(info.max, 2 * m + 3))
        return (near | st.integers(info.min, info.max)).map(dt)

    return st.sampled_from(INT_DTYPES).flatmap(draw_for)


def int_keys(m: int):
    return (st.integers(-2 * m - 3, 2 * m + 3) | st.sampled_from(HUGE) | st.integers(min_value=2**62)
            | st.integers(max_value=-(2**62)))


def scalar_keys(m: int):
    ints = int_keys(m)
    return st.one_of(
        ints, ints, st.booleans(), np_scalars(m), ints.map(Idx),
        st.integers(-m - 1, m + 1).map(np.array),  # 0-d integer arrays have __index__
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([np.float64(1), np.float32(0), np.array(1.5)]),
        st.sampled_from([None, "0", "", b"1", np.True_, np.False_, 1j, Fraction(1), Decimal(0), (0,), (), {0: 1},
                         {0}, Ellipsis, object()]),
    )


def slice_keys(m: int):
    bound = st.one_of(st.none(), st.integers(-m - 3, m + 3), st.sampled_from(HUGE), np_scalars(m), st.booleans(),
                      st.integers(-m - 3, m + 3).map(Idx))
    step = st.one_of(st.none(), st.integers(-4, 4), st.sampled_from(HUGE), np_scalars(4), st.just(0))
    bad = st.sampled_from([1.0, "1", np.float64(2)])  # not indexes: TypeError, as a list raises
    return st.builds(slice, bound, bound, step) | st.builds(slice, bound | bad, bound | bad, step | bad)


def array_keys(m: int):
    entries = st.integers(-m - 2, m + 1) | st.sampled_from(HUGE)
    in_dtype = lambda dt: st.lists(
        st.integers(max(np.iinfo(dt).min, -m - 2), min(np.iinfo(dt).max, m + 1)) | st.sampled_from(
            [np.iinfo(dt).max, np.iinfo(dt).min]), max_size=12).map(lambda xs: np.array(xs, dtype=dt))
    return st.one_of(
        st.lists(st.integers(-m, m - 1), max_size=12) if m else st.just([]),  # valid
        st.lists(entries, max_size=12),
        st.sampled_from(INT_DTYPES).flatmap(in_dtype),
        st.lists(st.booleans(), min_size=m, max_size=m),
        st.lists(st.booleans(), min_size=m, max_size=m).map(lambda xs: np.array(xs, dtype=bool)),
        st.lists(st.booleans(), max_size=m + 3).map(lambda xs: np.array(xs, dtype=bool)),
        st.lists(st.floats(-5, 5) | st.integers(0, 3), max_size=5),
        st.lists(st.integers(0, 3), max_size=5).map(lambda xs: np.array(xs, dtype=float)),
        st.sampled_from([[], np.array([], dtype=np.int64), np.array([], dtype=float), [None], ["0"], [[0]],
                         np.zeros((1, 1), dtype=int), [0, None], [np.int8(1), 2**70], [True, 2]]),
        st.integers(0, m + 2).map(range),
    )


def gather_rule(n: int | None, get, key):
    """What ``view[key]`` gives for an index array or mask, by the documented rule, for a view of
    length ``n`` (None: no len) whose item ``i`` is ``get(i)``."""
    if isinstance(key, (str, bytes, tuple, dict)) or not hasattr(key, "__len__"):
        return Raised(TypeError())
    arr = np.asarray(key)
    if arr.ndim != 1:
        return Raised(TypeError())
    if arr.dtype == bool:
        if n is None:
            return Raised(TypeError())  # a mask needs a len
        return Raised(IndexError()) if len(arr) != n else [get(i) for i in np.flatnonzero(arr).tolist()]
    if arr.size == 0:
        return []
    entries = arr.tolist() if isinstance(key, np.ndarray) else list(key)
    if not all(isinstance(k, (int, np.integer)) for k in entries):
        return Raised(TypeError())
    if n is None:
        return Raised(IndexError()) if any(k < 0 for k in entries) else [get(k) for k in entries]
    if not all(-n <= k < n for k in entries):
        return Raised(IndexError())
    return [get(k + n if k < 0 else k) for k in entries]


# -- finite pipelines ------------------------------------------------------------------------------
def tag(x):
    return ("t", x)


def pair(a, b):
    return (a, b)


def sub(draw, m: int):
    bound = st.none() | st.integers(-m - 2, m + 2)
    return slice(draw(bound), draw(bound), draw(st.none() | st.integers(-3, 3).filter(bool)))


def valid_idx(draw, m: int, size: int = 12):
    return draw(st.lists(st.integers(-m, m - 1), max_size=size)) if m else []


def s_smap(draw, v):
    return ls.smap(tag, v) if draw(st.booleans()) else ls.smap(pair, v, v[::-1])


def s_starmap(draw, v):
    return ls.starmap(pair, ls.collate([v, v[::-1]]))


def s_gather(draw, v):
    idx = valid_idx(draw, len(v))
    fn = draw(st.sampled_from([ls.gather, ls.take]))
    return fn(v, np.array(idx, dtype=np.int64) if draw(st.booleans()) else idx)


def s_batch(draw, v):
    k, drop = draw(st.integers(1, 4)), draw(st.booleans())
    fn = draw(st.sampled_from([None, list, tuple]))
    pad = None if drop or fn is None or draw(st.booleans()) else ls.Pad("p")
    return ls.batch(v, k, drop_last=drop, pad=pad, collate_fn=fn)


def s_unbatch(draw, v):
    k = draw(st.integers(1, 4))
    return ls.unbatch(ls.batch(v, k), k, len(v) % k or None)


def s_split(draw, v):
    m = len(v)
    if draw(st.booleans()):
        return ls.split(v, sorted(draw(st.lists(st.integers(0, m), max_size=4))))
    pairs = draw(st.lists(st.tuples(st.integers(0, m), st.integers(0, m)), min_size=1, max_size=4))
    return ls.split(v, [(a, max(a, b)) for a, b in pairs])


def s_concatenate(draw, v):
    return ls.concatenate([v, v[sub(draw, len(v))]])


def s_interleave(draw, v):
    return ls.interleave(v, v[sub(draw, len(v))], v[::-1])


def s_cycle(draw, v):
    m = len(v)
    if not m:
        return ls.cycle(v, 0)
    if draw(st.booleans()):
        return ls.cycle(v, draw(st.integers(0, 3 * m)))
    start = draw(st.integers(0, 3 * m))
    return ls.cycle(v)[start : start + draw(st.integers(0, 2 * m)) : draw(st.integers(1, 3))]


def s_repeat(draw, v):
    r = ls.repeat("r", draw(st.integers(0, 5)))
    return ls.interleave(v, r) if draw(st.booleans()) else ls.concatenate([r, v])


def s_shuffle(draw, v):
    return ls.shuffle(v, draw(st.integers(0, 2**64)), draw(st.integers(0, 3)))


def s_shard(draw, v):
    count = draw(st.integers(1, 4))
    return ls.shard(v, draw(st.integers(0, count - 1)), count, draw(st.booleans()))


def s_collate(draw, v):
    return ls.collate([v, v[::-1]])


def s_cache(draw, v):
    return ls.add_cache(v, draw(st.integers(0, 4)))


def s_case(draw, v):
    m = len(v)
    if draw(st.booleans()):
        cond = draw(st.lists(st.booleans(), min_size=m, max_size=m))
        return ls.switch(np.array(cond, dtype=bool) if draw(st.booleans()) else cond, v, v[::-1])
    sel = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
    return ls.case(sel, v, v[::-1], ls.repeat("c", m))


def s_slice(draw, v):
    return v[sub(draw, len(v))]


def s_index(draw, v):
    m = len(v)
    if draw(st.booleans()):
        return v[np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)]
    return v[valid_idx(draw, m)]


def s_uniter(draw, v):
    return ls.uniter(v, cache_size=draw(st.integers(0, 3)), n_parallel=draw(st.integers(1, 3)), size=len(v))


STAGES = {
    "smap": s_smap, "starmap": s_starmap, "gather": s_gather, "batch": s_batch, "unbatch": s_unbatch,
    "split": s_split, "concatenate": s_concatenate, "interleave": s_interleave, "cycle": s_cycle,
    "repeat": s_repeat, "shuffle": s_shuffle, "shard": s_shard, "collate": s_collate, "add_cache": s_cache,
    "case": s_case, "slice": s_slice, "index": s_index, "uniter": s_uniter,
}


@st.composite
def sources(draw):
    n = draw(st.integers(0, 3) | st.integers(4, 25))
    kind = draw(st.sampled_from(["list", "array", "rows", "arange", "range"]))
    if kind == "list":
        return [f"s{i}" for i in range(n)]
    if kind == "array":
        return np.arange(n, dtype=draw(st.sampled_from([np.int64, np.int8, np.uint32, np.float32]))) * 3 + 1
    if kind == "rows":
        return np.arange(2 * n, dtype=np.float64).reshape(n, 2)
    if kind == "arange":
        start, step = draw(st.integers(-50, 50)), draw(st.integers(-7, 7).filter(bool))
        return ls.arange(start, start + n * step, step)
    return range(n)


@st.composite
def pipelines(draw):
    src = draw(sources())
    view = src if isinstance(src, ls.View) else ls.gather(src, range(len(src))) if draw(st.booleans()) else src
    names = draw(st.lists(st.sampled_from(sorted(STAGES)), min_size=1, max_size=4))
    for name in names:
        if not isinstance(view, ls.View):  # a stage that slices needs a view (a numpy slice is not one)
            view = ls.gather(view, range(len(view)))
        view = STAGES[name](draw, view)
        if len(view) > 40:  # keep examples small
            view = view[:40]
    return names, view


@FUZZ
@given(pipelines(), st.data())
def test_finite_pipelines_index_like_their_list(p, data):
    names, view = p
    note(f"stages: {names}\n{view!r}")
    with alarm():
        expect = list(view)
        m = len(expect)
        assert len(view) == m and bool(view) == bool(expect)
        assert [plain(view[i]) for i in range(-m, m)] == [plain(x) for x in expect + expect]
        assert plain(view._get_many(range(m))) == plain(expect)
        for _ in range(6):
            key = data.draw(scalar_keys(m), label="scalar key")
            check_same(read(view, key), read(expect, key), key)
        for _ in range(4):
            key = data.draw(slice_keys(m), label="slice key")
            got = read(view, key)
            if not isinstance(got, Raised):
                assert isinstance(got, ls.View), (key, got)
                got = list(got)
            check_same(got, read(expect, key), key)
        for _ in range(4):
            key = data.draw(array_keys(m), label="array key")
            got = read(view, key)
            if not isinstance(got, Raised):
                assert isinstance(got, ls.View), (key, got)
                got = list(got)
            check_same(got, gather_rule(m, expect.__getitem__, key), key)
        if not any(has_array(x) for x in expect):  # == on arrays has no truth value; views compare by identity
            for _ in range(2):  # the Sequence methods that take positions
                value = data.draw(st.sampled_from([*expect, "absent"]), label="value")
                start, stop = data.draw(int_keys(m) | np_scalars(m)), data.draw(int_keys(m) | np_scalars(m))
                check_same(search(view, value, start, stop), search(expect, value, start, stop), (start, stop))
                assert view.count(value) == expect.count(value) and (value in view) == (value in expect)


def has_array(x) -> bool:
    """Whether ``x`` holds arrays or views, which ``==`` does not compare as values."""
    if isinstance(x, (np.ndarray, ls.View)):
        return True
    return isinstance(x, (list, tuple)) and any(has_array(y) for y in x)


def search(seq, value, start, stop):
    """``seq.index(value, start, stop)``, or the exception it raised."""
    try:
        found = seq.index(value, start, stop)
    except Exception as e:
        return Raised(e)
    assert type(found) is int, type(found)
    return found


# -- infinite and huge pipelines, against a model -------------------------------------------------
BIG = 10**30


@st.composite
def unbounded(draw):
    """``(view, n, model)``: a view without len (``n`` None) or longer than sys.maxsize, and its item ``i``."""
    m = draw(st.integers(1, 6))
    src = [f"s{i}" for i in range(m)]
    kind = draw(st.sampled_from(["cycle", "repeat", "cycle_slice", "smap", "interleave", "concatenate", "collate",
                                 "batch", "unbatch", "shard", "cache", "arange", "cycle_big", "repeat_big",
                                 "bounded_slice", "gather_big"]))
    a, s = draw(st.integers(0, 10) | st.sampled_from([2**63, BIG])), draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    return {
        "cycle": lambda: (ls.cycle(src), None, lambda i: src[i % m]),
        "repeat": lambda: (ls.repeat("r"), None, lambda i: "r"),
        "cycle_slice": lambda: (ls.cycle(src)[a::s], None, lambda i: src[(a + i * s) % m]),
        "smap": lambda: (ls.smap(tag, ls.cycle(src)), None, lambda i: ("t", src[i % m])),
        "interleave": lambda: (ls.interleave(ls.cycle(src), ls.repeat("r")), None,
                               lambda i: src[(i // 2) % m] if i % 2 == 0 else "r"),
        "concatenate": lambda: (ls.concatenate([src, ls.cycle(src)]), None, lambda i: src[i % m]),
        "collate": lambda: (ls.collate([ls.cycle(src), ls.repeat("r")]), None, lambda i: (src[i % m], "r")),
        "batch": lambda: (ls.batch(ls.cycle(src), k), None, lambda i: [src[j % m] for j in range(i * k, i * k + k)]),
        "unbatch": lambda: (ls.unbatch(ls.batch(ls.cycle(src), k), k), None, lambda i: src[i % m]),
        "shard": lambda: (ls.shard(ls.cycle(src), k - 1, k), None, lambda i: src[(k - 1 + i * k) % m]),
        "cache": lambda: (ls.add_cache(ls.cycle(src), 2), None, lambda i: src[i % m]),
        "arange": lambda: (ls.arange(-a, BIG, s), span(range(-a, BIG, s)), lambda i: -a + i * s),
        "cycle_big": lambda: (ls.cycle(src, BIG), BIG, lambda i: src[i % m]),
        "repeat_big": lambda: (ls.repeat("r", BIG), BIG, lambda i: "r"),
        "bounded_slice": lambda: (ls.cycle(src)[a : a + BIG : s], span(range(a, a + BIG, s)),
                                  lambda i: src[(a + i * s) % m]),
        "gather_big": lambda: (ls.gather(ls.cycle(src), ls.arange(BIG)), BIG, lambda i: src[i % m]),
    }[kind]()


def model_scalar(n, model, key):
    """What ``view[key]`` gives for a scalar key, by the documented rule (a list's, without len:
    non-negative keys only)."""
    try:
        k = operator.index(key)
    except TypeError:
        return Raised(TypeError())
    if n is None:
        return Raised(IndexError()) if k < 0 else model(k)
    if not -n <= k < n:
        return Raised(IndexError())
    return model(k + n if k < 0 else k)


def model_slice(n, key):
    """The range of indices ``view[key]`` selects, ``"open"`` for an open-ended one, or the error."""
    index = lambda b: None if b is None else operator.index(b)
    try:  # the step first, as Python does: slice(1.5, None, 0) is a ValueError
        step = index(key.step)
        if step == 0:
            return Raised(ValueError())
        start, stop = index(key.start), index(key.stop)
    except TypeError:
        return Raised(TypeError())
    if n is not None:
        return range(n)[slice(start, stop, step)]
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        return Raised(IndexError())
    step = 1 if step is None else step
    if step > 0:
        return ("open", start or 0, step) if stop is None else range(start or 0, stop, step)
    if start is None:
        return Raised(IndexError())
    return range(start, -1 if stop is None else stop, step)


def check_range_view(got, r, model, key) -> None:
    """``got`` holds the items ``model(i)`` for ``i`` in ``r`` (checked at its ends, for huge ones)."""
    assert isinstance(got, ls.View), (key, got)
    length = span(r)
    assert got._len() == length, (key, got._len(), length)
    ends = sorted({0, 1, 2, length - 3, length - 2, length - 1} & set(range(length))) if length < 10**6 else \
        [0, 1, length - 1]
    for j in ends:
        assert plain(got[j]) == plain(model(r[j])), (key, j)
    if length and length < 200:
        assert [plain(x) for x in got] == [plain(model(i)) for i in r]


@FUZZ
@given(unbounded(), st.data())
def test_infinite_and_huge_pipelines_follow_the_model(u, data):
    view, n, model = u
    with alarm():
        assert view.finite == (n is not None)
        if n is None:
            with pytest.raises(TypeError):
                len(view)
        else:
            assert view._len() == n and bool(view)
        for _ in range(6):
            key = data.draw(scalar_keys(8), label="scalar key")
            check_same(read(view, key), model_scalar(n, model, key), key)
        for _ in range(4):
            key = data.draw(slice_keys(8), label="slice key")
            got, want = read(view, key), model_slice(n, key)
            if isinstance(want, Raised):
                check_same(got, want, key)
            elif isinstance(want, tuple):  # open-ended: an infinite view
                _, start, step = want
                assert isinstance(got, ls.View) and not got.finite, (key, got)
                for j in (0, 1, 7, BIG):
                    assert plain(got[j]) == plain(model(start + j * step)), (key, j)
            else:
                assert not isinstance(got, Raised), (key, got)
                check_range_view(got, want, model, key)
        for _ in range(3):
            key = data.draw(array_keys(8), label="array key")
            got = read(view, key)
            if not isinstance(got, Raised):
                got = list(got)
            check_same(got, gather_rule(n, model, key), key)


# -- regressions: what the fuzzer found ------------------------------------------------------------
def test_uint64_index_entries_do_not_wrap_to_negative():
    v = ls.smap(str, range(5))
    with pytest.raises(IndexError, match="18446744073709551615"):
        v[np.array([2**64 - 1], dtype=np.uint64)]  # was read as -1: the last item
    with pytest.raises(IndexError, match="9223372036854775808"):
        v[np.array([2**63], dtype=np.uint64)]
    assert list(v[np.array([4, 0], dtype=np.uint64)]) == ["4", "0"]
    with pytest.raises(IndexError):
        ls.arange(5)[np.array([2**64 - 2], dtype=np.uint64)]


def test_index_lists_with_huge_ints_raise_index_error():
    v = ls.smap(str, range(5))
    for key in ([10**30], [2**63], [2**63, -1], [-(2**63) - 1, 0], [np.int8(1), 2**70]):
        with pytest.raises(IndexError, match="out of range"):  # was TypeError: numpy held them as object/float
            v[key]
        with pytest.raises(IndexError, match="out of range"):
            v[key] = ["x"] * len(key)
    assert list(ls.cycle("ab")[[10**30, 3]]) == ["a", "b"]  # no len: any non-negative int
    with pytest.raises(TypeError, match=r"not float \(2.5\)"):
        v[[1, 2.5]]


def test_views_longer_than_sys_maxsize_read_and_slice():
    big = ls.arange(10**30)  # len() raised OverflowError on every read (len of a huge range)
    assert big[-1] == 10**30 - 1 and big[5] == 5 and bool(big)
    assert list(big[[-1, 2**63]]) == [10**30 - 1, 2**63]
    assert list(big[10**29 :: 10**29]) == [k * 10**29 for k in range(1, 10)]
    window = ls.cycle("abc")[0 : 10**30]  # a bounded slice of an infinite view
    assert window[5] == "c" and window[-1] == "abc"[(10**30 - 1) % 3] and window._len() == 10**30
    assert window[10**29 : 10**29 + 3][2] == "abc"[(10**29 + 2) % 3]
    with pytest.raises(OverflowError):  # as len(range(10**30)): Python's len is limited to sys.maxsize
        len(window)


def test_mask_on_a_view_without_len_is_a_type_error():
    with pytest.raises(TypeError, match="no len"):
        ls.cycle("abc")[np.array([True, False])]


def test_shard_has_the_sequence_methods_index_and_count():
    part = ls.shard(list("abcabc"), 1, 2)  # its attributes `index` and `count` hid the methods
    assert list(part) == ["b", "a", "c"] and part.index("a") == 1 and part.count("b") == 1 and "c" in part
    assert (part.shard_index, part.shard_count) == (1, 2) and part.describe() == "shard(1 of 2)"


def test_index_on_a_view_without_len_returns_a_python_int():
    loop = ls.cycle("abc")
    found = loop.index("c", np.int8(127))  # was np.int8(127) + 1: wrapped to -128
    assert found == 128 and type(found) is int
    assert loop.index("a", None) == 0 and loop.index("b", 2, 10**30) == 4


def test_empty_slices_of_a_gather_are_empty():
    g = ls.gather(list("abcde"), [4, 3, 2, 1, 0])
    # range(5)[key] is range(-1, 1, -2): empty, but a list slice from -1 is not (a slice of a gather
    # slices its index list, and gave ['a'])
    for key in (slice(-(2**63), 1, -(10**30)), slice(-10, 1, -2), slice(3, 1), slice(10, 20)):
        assert list(g[key]) == [] and list(g[key].indexes) == []
    assert g[::-1].indexes == [0, 1, 2, 3, 4] and list(g[4::-2]) == ["a", "c", "e"]
