"""seqtools 1.4.1 compatibility: the API names, the examples of its docstrings, and side-by-side runs.

The examples are those of seqtools' own docstrings (inputs and expected outputs), run with
``import lazyseq as seqtools``. The side-by-side part needs seqtools installed (an optional
dependency) and only covers inputs where seqtools is not buggy.
"""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
import lazyseq as seqtools

# seqtools 1.4.1 seqtools.__all__ ('prefetch' comes with the prefetch package)
SEQTOOLS_ALL = [
    "prefetch", "EvaluationError", "seterr", "add_cache", "arange", "case", "gather", "take", "cycle",
    "interleave", "repeat", "switch", "uniter", "smap", "starmap", "collate", "concatenate", "batch",
    "unbatch", "split",
]


def test_api_is_a_superset_of_seqtools():
    missing = [name for name in SEQTOOLS_ALL if name != "prefetch" and not hasattr(lazyseq, name)]
    assert not missing
    assert all(name in lazyseq.__all__ for name in SEQTOOLS_ALL if name != "prefetch")
    assert callable(lazyseq.instrument.debug) and callable(lazyseq.instrument.monitor_throughput)
    assert issubclass(lazyseq.EvaluationError, Exception)


def test_api_matches_installed_seqtools():
    st_ = pytest.importorskip("seqtools")
    assert sorted(st_.__all__) == sorted(SEQTOOLS_ALL)
    assert set(dir(st_.instrument)) >= {"debug", "monitor_throughput"}


# -- the examples of seqtools' docstrings ----------------------------------------------------------
def test_doc_gather():
    arr = ["d", "e", "h", "l", "o", "r", "w", " "]
    idx = [2, 1, 3, 3, 4, 7, 6, 4, 5, 3, 0]
    assert list(seqtools.gather(arr, idx)) == ["h", "e", "l", "l", "o", " ", "w", "o", "r", "l", "d"]
    assert list(seqtools.take(arr, idx)) == list(seqtools.gather(arr, idx))


def test_doc_cycle():
    data = ["a", "b", "c"]
    loop = seqtools.cycle(data)
    assert loop[3] == "a"
    assert loop[3 * 10**9 + 1] == "b"
    loop = seqtools.cycle(data, 7)
    assert list(loop) == ["a", "b", "c", "a", "b", "c", "a"]


def test_doc_interleave():
    arr1 = [1, 2, 3, 4, 5]
    arr2 = ["a", "b", "c"]
    arr3 = [0.1, 0.2, 0.3, 0.4]
    assert list(seqtools.interleave(arr1, arr2, arr3)) == [1, "a", 0.1, 2, "b", 0.2, 3, "c", 0.3, 4, 0.4, 5]


def test_doc_repeat():
    assert list(seqtools.repeat(3, 10)) == [3] * 10


def test_doc_uniter():
    a = seqtools.uniter(range(5000), cache_size=10, n_parallel=5, size=5000)
    assert a[10] == 10
    assert a[1] == 1


def test_doc_smap(capsys):
    a = [1, 2, 3, 4]
    m = seqtools.smap(lambda x: x + 2, a)
    assert [v for v in m] == [3, 4, 5, 6]

    def do(y, z):
        print("computing now")
        return y + z

    a, b = [1, 2, 3, 4], [4, 3, 2, 1]
    m = seqtools.smap(do, a, b)
    assert capsys.readouterr().out == ""  # lazy
    assert [v for v in m] == [5, 5, 5, 5]
    assert capsys.readouterr().out == "computing now\n" * 4


def test_doc_starmap():
    assert list(seqtools.starmap(pow, [(2, 5), (3, 2), (10, 3)])) == [32, 9, 1000]


def test_doc_collate():
    arr = seqtools.collate([[1, 2, 3, 4], ["a", "b", "c", "d"], [5, 6, 7, 8]])
    assert arr[2] == (3, "c", 7)


def test_doc_concatenate():
    data1 = [0, 1, 2, 3]
    data2 = [4, 5]
    data3 = [6, 7, 8, 9, 10, 11]
    cat = seqtools.concatenate([data1, data2, data3])
    assert [cat[i] for i in range(12)] == list(range(12))


def test_doc_batch():
    data = [i for i in range(25)]
    batches = seqtools.batch(data, 4, pad=-1, collate_fn=list)
    assert batches[0] == [0, 1, 2, 3]
    assert batches[-1] == [24, -1, -1, -1]


def test_doc_split():
    data = ["aa", "ab", "ac", "ad", "ba", "bb", "ca", "cb", "cc", "cd"]
    chunks = seqtools.split(data, [4, 6])
    assert list(chunks) == [["aa", "ab", "ac", "ad"], ["ba", "bb"], ["ca", "cb", "cc", "cd"]]
    chunks = seqtools.split(data, [(0, 2), (4, 6), (6, 8)])
    assert list(chunks) == [["aa", "ab"], ["ba", "bb"], ["ca", "cb"]]


def test_doc_add_cache(capsys):
    def process(x):
        print("working")
        return x * 2

    data = [0, 1, 2, 3, 4, 5, 6]
    result = seqtools.smap(process, data)
    cached = seqtools.add_cache(result)
    outputs = []
    for view in (result, result, cached, cached):
        assert view[3] == 6
        outputs.append(capsys.readouterr().out)
    assert outputs == ["working\n", "working\n", "working\n", ""]  # smap recomputes; the cache does not


def test_doc_instrument_debug(capsys):
    sequence = [1, 2, 3, 4, 5]
    watchthis = seqtools.instrument.debug(sequence, lambda i, v: print(v), 2)
    assert capsys.readouterr().out == ""
    assert watchthis[0] == 1
    assert capsys.readouterr().out == "1\n"
    assert watchthis[2] == 3
    assert capsys.readouterr().out == "3\n"
    assert watchthis[3] == 4
    assert capsys.readouterr().out == ""  # max_calls=2 reached


def test_doc_instrument_monitor_throughput():
    def process(x):
        time.sleep(0.02)  # seqtools' example sleeps 0.1 s and prints 0.1
        return x

    data = [0, 1, 2, 3, 4]
    result = seqtools.instrument.monitor_throughput(seqtools.smap(process, data))
    assert list(result) == data
    assert 0.015 < result.read_delay() < 0.5
    assert abs(result.throughput() * result.read_delay() - 1) < 1e-9
    result.reset()
    with pytest.raises(RuntimeError):
        result.read_delay()


def test_doc_seterr():
    assert seqtools.seterr("passthrough") == "passthrough"
    assert seqtools.seterr() == "passthrough"
    assert seqtools.seterr("wrap") == "wrap"
    with pytest.raises(seqtools.EvaluationError):
        seqtools.smap(lambda x: 1 / x, [0])[0]


# -- side by side with the installed seqtools ------------------------------------------------------
SIDE = settings(max_examples=60, deadline=None)
lists = st.lists(st.integers(-100, 100), max_size=20)
nonempty = st.lists(st.integers(-100, 100), min_size=1, max_size=20)


@pytest.fixture(scope="module")
def real():
    return pytest.importorskip("seqtools")


def both(real, build):
    """``build(module)`` run with seqtools and with lazyseq."""
    return build(real), build(lazyseq)


def check_same(a, b, data=None, negative: bool = True):
    """Same length, items, and (in range) int keys and forward slices."""
    assert len(a) == len(b)
    n = len(a)
    norm = lambda x: list(x) if hasattr(x, "__len__") and not isinstance(x, (str, tuple)) else x
    assert [norm(x) for x in a] == [norm(x) for x in b]
    for i in range(-n if negative else 0, n):
        assert norm(a[i]) == norm(b[i])
    if data is not None and n:
        start = data.draw(st.integers(0, n - 1), label="start")
        stop = data.draw(st.integers(start, n), label="stop")
        step = data.draw(st.integers(1, 3), label="step")
        assert [norm(x) for x in a[start:stop:step]] == [norm(x) for x in b[start:stop:step]]


@SIDE
@given(lists, lists, st.data())
def test_side_by_side_mapping_and_indexing(real, x, y, data):
    check_same(*both(real, lambda m: m.smap(lambda v: v * 3, x)), data)
    check_same(*both(real, lambda m: m.smap(lambda a, b: a - b, x, x[::-1])), data)
    check_same(*both(real, lambda m: m.starmap(lambda a, b: a * b, list(zip(x, y)))), data)
    idx = data.draw(st.lists(st.integers(0, len(x) - 1), max_size=25) if x else st.just([]), label="idx")
    check_same(*both(real, lambda m: m.gather(x, idx)), data)
    check_same(*both(real, lambda m: m.take(x, idx)), data)
    check_same(*both(real, lambda m: m.interleave(x, y, x[::2])), data)
    check_same(*both(real, lambda m: m.concatenate([x, y, x])), data)
    check_same(*both(real, lambda m: m.collate([x, x[::-1]])), data)
    cond = [v > 0 for v in x]
    check_same(*both(real, lambda m: m.switch(cond, x, x[::-1])), data)
    sel = [abs(v) % 3 for v in x]
    check_same(*both(real, lambda m: m.case(sel, x, x[::-1], [0] * len(x))), data)
    check_same(*both(real, lambda m: m.add_cache(m.smap(str, x), 3)), data)
    stop = data.draw(st.integers(0, 30), label="arange stop")
    check_same(*both(real, lambda m: m.arange(stop)), data, negative=False)  # seqtools: arange(5)[-1] == -1
    check_same(*both(real, lambda m: m.arange(3, stop, 2)), data, negative=False)


@SIDE
@given(nonempty, st.integers(2, 12), st.integers(1, 40), st.data())  # seqtools: list(cycle(x, 0)) never ends
def test_side_by_side_cycle_repeat_uniter(real, x, times, limit, data):
    check_same(*both(real, lambda m: m.cycle(x, limit)), data)
    a, b = both(real, lambda m: m.cycle(x))
    for i in data.draw(st.lists(st.integers(0, 10**6), max_size=10), label="cycle keys"):
        assert a[i] == b[i]
    check_same(*both(real, lambda m: m.repeat("v", times)), data)
    a, b = both(real, lambda m: m.repeat("v"))
    assert a[10**9] == b[10**9]
    cache, par = data.draw(st.integers(0, 5), label="cache"), data.draw(st.integers(1, 3), label="n_parallel")
    a, b = both(real, lambda m: m.uniter(x, cache_size=cache, n_parallel=par, size=len(x)))
    for i in data.draw(st.lists(st.integers(0, len(x) - 1), max_size=20), label="uniter keys"):
        assert a[i] == b[i]


@SIDE
@given(lists, st.integers(1, 6), st.booleans(), st.data())
def test_side_by_side_batch_unbatch_split(real, x, k, drop_last, data):
    check_same(*both(real, lambda m: m.batch(x, k, drop_last=drop_last)), data)
    check_same(*both(real, lambda m: m.batch(x, k, collate_fn=tuple)), data)
    if len(x) % k:  # seqtools pads a full last batch with k more items when len(x) % k == 0
        check_same(*both(real, lambda m: m.batch(x, k, pad=0)), data)
    if x:  # seqtools says an empty unbatch has last_batch_size items
        batches = [x[i : i + k] for i in range(0, len(x), k)]
        check_same(*both(real, lambda m: m.unbatch(batches, k, len(x) % k)), data)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(x) - 1), min_size=1, max_size=4), label="cuts"))
        check_same(*both(real, lambda m: m.split(x, cuts)), data)
        pairs = list(itertools.pairwise(cuts))
        if pairs:
            check_same(*both(real, lambda m: m.split(x, pairs)), data)
        parts = data.draw(st.sampled_from([d for d in range(1, len(x) + 1) if len(x) % d == 0]), label="parts")
        check_same(*both(real, lambda m: m.split(x, parts - 1)), data)


@SIDE
@given(nonempty, st.data())
def test_side_by_side_writes(real, x, data):
    n = len(x)
    i = data.draw(st.integers(-n, n - 1), label="i")
    idx = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10), label="idx")
    for build in (
        lambda m, s: m.gather(s, idx),
        lambda m, s: m.cycle(s, 2 * n),
        lambda m, s: m.concatenate([s[: n // 2], s]),
        lambda m, s: m.add_cache(s, 2),
        lambda m, s: m.interleave(s, s[::-1]),
    ):
        srcs = [list(x), list(x)]
        a, b = build(real, srcs[0]), build(lazyseq, srcs[1])
        j = i % len(a) - len(a) if i < 0 else i % len(a)
        a[j] = b[j] = "w"
        a[::2] = b[::2] = ["s"] * len(range(len(a))[::2])  # seqtools: a start >= len is clipped to len - 1
        assert srcs[0] == srcs[1] and [*a] == [*b]
    srcs = [list(x), list(x)]
    a, b = (m.collate([s, s[::-1]]) for m, s in ((real, srcs[0]), (lazyseq, srcs[1])))
    a[0] = b[0] = (1, 2)
    assert srcs[0] == srcs[1]
    if n >= 2:  # seqtools wants 2 values for a lone short batch
        srcs = [list(x), list(x)]
        a, b = (m.batch(s, 2) for m, s in ((real, srcs[0]), (lazyseq, srcs[1])))
        a[0] = b[0] = ["b", "c"]
        assert srcs[0] == srcs[1]


def test_seqtools_bugs_that_lazyseq_fixes(real):
    """The documented differences, shown against the installed seqtools."""
    assert real.arange(5)[7] == 7 and real.arange(5)[-1] == -1  # no bounds, no wrapping
    with pytest.raises(IndexError):
        lazyseq.arange(5)[7]
    assert lazyseq.arange(5)[-1] == 4
    with pytest.raises(TypeError):
        real.repeat("x", 1)
    assert list(lazyseq.repeat("x", 1)) == ["x"] and list(lazyseq.repeat("x", 0)) == []
    assert len(real.batch(range(8), 4, pad=-1)) == 2
    assert list(real.batch(list(range(8)), 4, pad=-1)[-1]) == [4, 5, 6, 7, -1, -1, -1, -1]  # padded although full
    assert list(lazyseq.batch(list(range(8)), 4, pad=-1)[-1]) == [4, 5, 6, 7]
    assert list(real.batch([1, 2, 3], 2, pad=None)) == [[1, 2], [3]]
    assert list(lazyseq.batch([1, 2, 3], 2, pad=lazyseq.Pad(None))) == [[1, 2], [3, None]]
    with pytest.raises(StopIteration):
        real.uniter(iter([1, 2]))[5]
    with pytest.raises(IndexError):
        lazyseq.uniter(iter([1, 2]))[5]
    with pytest.raises(ValueError):
        lazyseq.cycle([])
    c = real.add_cache(real.smap(lambda x: x, list(range(5))), 2)
    c[0], c[1], c[0], c[2]  # seqtools evicts 0 (first inserted) although it was just used
    assert 0 not in c.cache
    c = lazyseq.add_cache(lazyseq.smap(lambda x: x, list(range(5))), 2)
    c[0], c[1], c[0], c[2]
    assert 0 in c.cache and 1 not in c.cache
