"""Semantics of individual views: infinite views, shuffle, shard, add_cache, uniter, repr, laziness."""

from __future__ import annotations

import collections.abc
import pickle
import random
import threading
import time
import warnings

import cloudpickle
import numpy as np
import pytest

import lazyseq as ls


class Counting(collections.abc.Sequence):
    """A source that counts the reads of each index."""

    def __init__(self, items):
        self.items, self.reads = list(items), collections.Counter()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        self.reads[i] += 1
        return self.items[i]

    def __setitem__(self, i, value):
        self.items[i] = value


class CountingCalls:
    """A picklable function that counts its calls per argument."""

    def __init__(self, f=lambda x: x, delay: float = 0.0):
        self.f, self.delay, self.calls = f, delay, collections.Counter()
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            self.calls[x] += 1
        if self.delay:
            time.sleep(self.delay)
        return self.f(x)


def double(x):
    return 2 * x


# -- infinite views --------------------------------------------------------------------------------
def infinite_views():
    return {
        "cycle": (ls.cycle([1, 2, 3]), lambda i: [1, 2, 3][i % 3]),
        "repeat": (ls.repeat("r"), lambda i: "r"),
        "uniter": (ls.uniter(range(10**6)), lambda i: i),
        "smap(cycle)": (ls.smap(double, ls.cycle([1, 2, 3])), lambda i: 2 * [1, 2, 3][i % 3]),
        "gather(cycle)": (ls.gather(ls.cycle([1, 2, 3]), ls.cycle([2, 0])), lambda i: [3, 1][i % 2]),
        "interleave": (ls.interleave([10, 11], ls.repeat("r")), lambda i: [10, "r", 11, "r"][i] if i < 4 else "r"),
        "concatenate": (ls.concatenate([[7, 8], ls.cycle([1, 2, 3])]), lambda i: [7, 8][i] if i < 2 else [1, 2, 3][(i - 2) % 3]),
        "batch(cycle)": (ls.batch(ls.cycle([1, 2, 3]), 2), lambda i: [[1, 2, 3][(2 * i) % 3], [1, 2, 3][(2 * i + 1) % 3]]),
        "shard(repeat)": (ls.shard(ls.repeat(5), 1, 3), lambda i: 5),
        "add_cache(cycle)": (ls.add_cache(ls.cycle([1, 2]), 4), lambda i: [1, 2][i % 2]),
    }


@pytest.mark.parametrize("name", list(infinite_views()))
def test_infinite_views(name):
    view, ref = infinite_views()[name]
    assert not view.finite
    with pytest.raises(TypeError, match="no len"):
        len(view)
    for i in (0, 1, 5, 17, 2, 0):  # forward and backward
        assert view[i] == ref(i)
        assert view[np.int64(i)] == ref(i)
    for key in (-1, np.int64(-5)):
        with pytest.raises(IndexError, match="negative"):
            view[key]
    assert list(view[3:11]) == [ref(i) for i in range(3, 11)]
    assert list(view[3:11:3]) == [ref(i) for i in range(3, 11, 3)]
    assert list(view[10:2:-2]) == [ref(i) for i in range(10, 2, -2)]
    assert list(view[4::-1]) == [ref(i) for i in range(4, -1, -1)]
    assert len(view[5:5]) == 0 and len(view[9:3]) == 0
    tail = view[4::2]
    with pytest.raises(TypeError, match="no len"):
        len(tail)
    assert [tail[i] for i in range(5)] == [ref(4 + 2 * i) for i in range(5)]
    assert list(tail[:4]) == [ref(4 + 2 * i) for i in range(4)]
    for bad in (slice(-3, None), slice(0, -1), slice(None, 4, -1)):
        with pytest.raises(IndexError, match="no len"):
            view[bad]
    with pytest.raises(ValueError):
        view[::0]
    assert list(view[[0, 7, 3]]) == [ref(0), ref(7), ref(3)]
    with pytest.raises(IndexError, match="negative"):
        view[[0, -1]]
    with pytest.raises(TypeError, match="no len"):
        view[np.array([True, False])]
    it = iter(view)
    assert [next(it) for _ in range(7)] == [ref(i) for i in range(7)]
    assert bool(view)


def test_infinite_views_writes():
    data = [1, 2, 3]
    loop = ls.cycle(data)
    loop[4] = "x"
    loop[6:8] = ["y", "z"]
    assert data == ["y", "z", 3]
    with pytest.raises(IndexError, match="negative"):
        loop[-1] = 0
    with pytest.raises(ValueError, match="open-ended"):
        loop[3:] = [1, 2]
    r = ls.repeat(0)
    r[10**9] = 5
    assert r[0] == 5


def test_sizes_and_emptiness():
    assert len(ls.cycle([1, 2], 0)) == 0 and list(ls.cycle([], 0)) == []
    with pytest.raises(ValueError, match="empty"):
        ls.cycle([])
    with pytest.raises(ValueError, match="empty"):
        ls.cycle([], 3)
    with pytest.raises(TypeError, match="no len"):
        ls.cycle(ls.repeat(1))
    assert list(ls.repeat("x", 0)) == [] and list(ls.repeat("x", 1)) == ["x"]
    with pytest.raises(ValueError):
        ls.repeat("x", -1)
    with pytest.raises(TypeError):
        ls.repeat("x", 2.0)
    assert len(ls.uniter(range(7), size=7)) == 7
    assert list(ls.uniter(range(7), size=7)) == list(range(7))
    with pytest.raises(ValueError, match="only the last"):
        ls.concatenate([ls.cycle([1]), [2]])
    assert not ls.arange(0) and not ls.batch([], 3) and ls.batch([1], 3)


# -- laziness and the Sequence protocol ------------------------------------------------------------
def test_building_a_pipeline_evaluates_nothing():
    f = CountingCalls(double)
    src = Counting(range(20))
    m = ls.smap(f, src)
    v = ls.batch(ls.shuffle(ls.gather(m, np.arange(19, -1, -1)), seed=1), 3, pad=0, collate_fn=sum)
    v = ls.concatenate([v, ls.split(ls.collate([m, src]), [5]), ls.interleave(m, m)])
    v = ls.add_cache(ls.cycle(ls.shard(v, 0, 2), 10), 5)
    v = ls.switch(ls.repeat(True, 10), v, ls.repeat(0, 10))
    v = ls.case([0] * 10, v)[::-1][[1, 2]]
    v = ls.unbatch(ls.batch(ls.starmap(lambda a, b: a, ls.collate([m, m])), 4), 4)
    ls.uniter(iter(m))
    ls.instrument.debug(m, print), ls.instrument.monitor_throughput(m)
    assert not f.calls and not src.reads
    assert v[5] == 10  # reads the whole batch 4..7, each item of the collate twice
    assert f.calls == src.reads == dict.fromkeys(range(4, 8), 2)


def test_a_read_evaluates_only_what_it_needs():
    src = Counting(range(100))
    b = ls.batch(ls.smap(double, ls.gather(src, list(range(99, -1, -1)))), 10)
    assert b[2] == [2 * x for x in range(79, 69, -1)]
    assert src.reads == dict.fromkeys(range(70, 80), 1)
    s = ls.shuffle(src, seed=3)
    src.reads.clear()
    s[50]
    assert sum(src.reads.values()) == 1


def test_views_are_sequences():
    v = ls.smap(double, [3, 1, 4, 1, 5, 9, 2, 6])
    assert isinstance(v, collections.abc.Sequence) and isinstance(v, ls.View)
    assert 8 in v and 7 not in v
    assert v.index(2) == 1 and v.index(2, 2) == 3 and v.index(2, -5) == 3
    with pytest.raises(ValueError):
        v.index(2, 4)
    with pytest.raises(ValueError):
        v.index(2, 2, 3)
    assert v.count(2) == 2 and v.count(7) == 0
    assert list(reversed(v)) == [12, 4, 18, 10, 2, 8, 2, 6]
    assert ls.cycle([1, 2, 3]).index(3) == 2 and ls.cycle([1, 2, 3]).index(1, 4) == 6


def test_index_count_and_in_raise_inner_errors():
    """``index`` must not read an inner IndexError as 'not found' (Sequence.index would)."""
    bad = ls.smap(double, ls.gather([1, 2, 3], [0, 5, 1]))
    with pytest.raises((IndexError, ls.EvaluationError)):
        bad.index(4)
    with pytest.raises((IndexError, ls.EvaluationError)):
        bad.count(2)
    with pytest.raises((IndexError, ls.EvaluationError)):
        assert 4 in bad


# -- shuffle ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7, 10, 31, 32, 33, 100, 257, 1000, 4097])
def test_shuffle_is_a_permutation(n):
    src = list(range(n))
    s = ls.shuffle(src, seed=12345)
    items = list(s)
    assert sorted(items) == src and len(s) == n
    assert items == list(ls.shuffle(src, seed=12345, epoch=0)) == s.order()
    assert s._get_many(range(n)) == items  # vectorised for >= 32 indices
    idx = random.Random(n).choices(range(n), k=200) if n else []
    assert s._get_many(idx) == [items[i] for i in idx] == [s[i] for i in idx]
    assert [s[-i] for i in range(1, min(n, 5) + 1)] == [items[-i] for i in range(1, min(n, 5) + 1)]
    if n >= 10:
        orders = {tuple(ls.shuffle(src, seed=12345, epoch=e)) for e in range(5)}
        assert len(orders) == 5
        assert items != list(ls.shuffle(src, seed=54321))
        assert items != src  # 1 / n! chance of a false failure for a fixed seed: none here


def test_shuffle_seed_and_epoch():
    src = list(range(50))
    a = ls.shuffle(src, seed=7, epoch=3)
    assert list(a) == list(ls.shuffle(list(range(50)), seed=7, epoch=3))
    assert list(a) != list(ls.shuffle(src, seed=7, epoch=4))
    r = ls.shuffle(src, seed=None)
    assert isinstance(r.seed, int) and list(r) == list(ls.shuffle(src, seed=r.seed))
    assert list(pickle.loads(pickle.dumps(r))) == list(r)
    assert "seed=7" in repr(a) and "epoch=3" in repr(a)
    with pytest.raises(TypeError, match="no len"):
        ls.shuffle(ls.cycle([1]), seed=0)


def test_shuffle_large_is_lazy():
    n = 10**6
    src = Counting(range(n))
    t = time.perf_counter()
    s = ls.shuffle(src, seed=0, epoch=2)
    assert not src.reads  # construction reads nothing and builds no table
    assert time.perf_counter() - t < 1.0
    items = [s[i] for i in (0, 1, 2, n - 1, n // 2)]
    assert sum(src.reads.values()) == 5
    assert len(set(items)) == 5 and all(0 <= x < n for x in items)
    idx = list(range(0, n, n // 1000))
    bulk = s._get_many(idx)
    assert bulk[0] == items[0] and len(set(bulk)) == len(idx)
    assert bulk == [s[i] for i in idx]


def test_shuffle_writes_and_source_changes():
    src = list(range(10))
    s = ls.shuffle(src, seed=1)
    order = s.order()
    s[0] = "x"
    assert src[order[0]] == "x"
    src.extend(range(10, 15))  # the permutation follows the source's length
    assert len(s) == 15 and sorted(map(str, s)) == sorted(map(str, src))


# -- shard -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 6, 7, 23, 100])
def test_shard_partitions(n, count):
    src = list(range(n))
    parts = [list(ls.shard(src, r, count)) for r in range(count)]
    flat = [x for p in parts for x in p]
    assert sorted(flat) == src and len(flat) == len(set(flat))  # disjoint and covering
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert all(p == src[r::count] for r, p in enumerate(parts))
    dropped = [ls.shard(src, r, count, drop_remainder=True) for r in range(count)]
    assert {len(d) for d in dropped} == {n // count}
    got = [x for d in dropped for x in d]
    assert len(got) == len(set(got)) == n - n % count
    assert set(src) - set(got) == set(src[n - n % count :])


def test_shard_arguments():
    for index, count in ((0, 0), (3, 3), (-1, 2)):
        with pytest.raises(ValueError, match="shard"):
            ls.shard([1, 2], index, count)
    src = list(range(10))
    sh = ls.shard(src, 1, 3)
    sh[1] = "x"
    sh[-1] = "y"
    assert src == [0, 1, 2, 3, "x", 5, 6, "y", 8, 9]


# -- add_cache -------------------------------------------------------------------------------------
def test_cache_evicts_least_recently_used():
    f = CountingCalls(double)
    c = ls.add_cache(ls.smap(f, list(range(10))), cache_size=2)
    assert c[0] == 0 and c[1] == 2
    assert c[0] == 0  # 0 is now the most recently used
    assert c[2] == 4  # evicts 1, not 0 (seqtools evicted the oldest insert, 0)
    assert f.calls == {0: 1, 1: 1, 2: 1}
    c[0]
    assert f.calls[0] == 1
    c[1]
    assert f.calls[1] == 2
    assert list(c.cache) == [0, 1]  # least recently used first: 2 was evicted by 1
    nocache = ls.add_cache(ls.smap(f, list(range(10))), cache_size=0)
    nocache[5], nocache[5]
    assert f.calls[5] == 2


def test_cache_writes_and_custom_mapping():
    src = list(range(5))
    store: dict = {}
    c = ls.add_cache(src, cache_size=3, cache=store)
    c[1], c[2]
    assert store == {1: 1, 2: 2}
    c[1] = "x"
    assert src[1] == "x" and c[1] == "x" and store[1] == "x"
    c[4] = "y"
    assert src[4] == "y" and 4 not in store


def test_cache_does_not_keep_failures():
    state = {"fail": True}

    def flaky(x):
        if state["fail"]:
            raise RuntimeError("flaky")
        return x

    c = ls.add_cache(ls.smap(flaky, [1, 2]), 2)
    with pytest.raises(ls.EvaluationError):
        c[0]
    state["fail"] = False
    assert c[0] == 1


def test_cache_is_thread_safe_and_computes_each_item_once():
    f = CountingCalls(double, delay=0.002)
    n = 40
    c = ls.add_cache(ls.smap(f, list(range(n))), cache_size=n)
    results, errors = [], []
    start = threading.Barrier(8)

    def reader(seed: int) -> None:
        order = list(range(n)) * 2
        random.Random(seed).shuffle(order)
        try:
            start.wait()
            results.append([(i, c[i]) for i in order])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(v == 2 * i for r in results for i, v in r) and len(results) == 8
    assert f.calls == dict.fromkeys(range(n), 1)


def test_cache_pickles():
    c = ls.add_cache(ls.smap(double, list(range(10))), cache_size=4)
    c[1], c[2]
    for dumps in (pickle.dumps, cloudpickle.dumps):
        c2 = pickle.loads(dumps(c))
        assert not c2.cache and c2.cache_size == 4  # the copy starts empty
        assert c2[3] == 6 and list(c2.cache) == [3] and list(c.cache) == [1, 2]
        assert list(c2) == [2 * i for i in range(10)]
    lam = ls.add_cache(ls.smap(lambda x: x + 1, [1, 2, 3]), 2)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(lam)
    copy = cloudpickle.loads(cloudpickle.dumps(lam))
    assert list(copy) == [2, 3, 4] and copy[1] == 3


def test_pipelines_pickle():
    data = list(range(30))
    views = [
        ls.batch(ls.shuffle(ls.gather(data, np.arange(29, -1, -1)), seed=3, epoch=1), 4, pad=ls.Pad(None)),
        ls.interleave(ls.shard(data, 0, 2), ls.cycle([1, 2], 5), ls.repeat("r", 3)),
        ls.case(ls.smap(lambda x: x % 3, data), data, ls.arange(30), ls.concatenate([data[:10], data[10:]])),
        ls.split(ls.collate([data, data]), [3, 9]),
        ls.unbatch(ls.batch(data, 7, collate_fn=tuple), 7, 2),
        ls.switch([i % 2 == 0 for i in range(30)], data, ls.smap(str, data))[5:25:3],
        ls.uniter(range(30), cache_size=3, size=30),
        ls.instrument.monitor_throughput(ls.instrument.debug(data, lambda i, x: None))[::-1],
    ]
    for v in views:
        copy = cloudpickle.loads(cloudpickle.dumps(v))
        assert [list(x) if isinstance(x, ls.View) else x for x in copy] == [list(x) if isinstance(x, ls.View) else x for x in v]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ls.uniter(iter([1, 2])))


# -- uniter ----------------------------------------------------------------------------------------
class Reiterable:
    def __init__(self, n: int):
        self.n, self.starts, self.steps = n, 0, 0

    def __iter__(self):
        self.starts += 1
        for i in range(self.n):
            self.steps += 1
            yield i


def test_uniter_reads_and_end():
    u = ls.uniter(Reiterable(10))
    assert u[3] == 3 and u[9] == 9 and u[0] == 0
    with pytest.raises(IndexError, match="past the end"):
        u[10]
    with pytest.raises(IndexError, match="past the end"):
        u[10**6]
    assert list(u) == list(range(10))  # iteration stops at the end
    assert list(u[2:5]) == [2, 3, 4]
    sized = ls.uniter(Reiterable(10), size=10)
    assert sized[-1] == 9 and list(sized[::-3]) == [9, 6, 3, 0]
    with pytest.raises(IndexError):
        sized[10]
    short = ls.uniter(Reiterable(3), size=5)
    with pytest.raises((IndexError, ls.EvaluationError)):
        list(short)
    with pytest.raises(TypeError, match="uniter"):
        ls.uniter(Reiterable(3))[0] = 1


def test_uniter_one_shot_iterator():
    u = ls.uniter(x * 10 for x in range(6))
    assert u[1] == 10 and u[2] == 20 and u[2] == 20 and u[4] == 40
    with pytest.raises(ls.EvaluationError, match="restart") as e:
        u[0]
    assert isinstance(e.value.__cause__, ValueError) and e.value.item == 0 and "uniter" in e.value.view
    cached = ls.uniter(iter(range(6)), cache_size=3)
    assert cached[4] == 4 and cached[2] == 2 and cached[3] == 3
    with pytest.raises(ls.EvaluationError):
        cached[1]
    with pytest.raises(ValueError, match="n_parallel"):
        ls.uniter(iter(range(3)), n_parallel=2)
    with pytest.raises(TypeError):
        ls.uniter(5)
    with pytest.raises(ValueError):
        ls.uniter(range(3), n_parallel=0)


def test_uniter_n_parallel_keeps_several_iterators():
    src = Reiterable(200)
    u = ls.uniter(src, n_parallel=2)
    for i in range(20):  # two interleaved forward scans
        assert u[i] == i and u[100 + i] == 100 + i
    assert src.starts == 2 and src.steps == 140  # one scan 0..119, the other 0..19
    one = Reiterable(200)
    u1 = ls.uniter(one, n_parallel=1)
    for i in range(5):
        assert u1[i] == i and u1[100 + i] == 100 + i
    assert one.starts == 5  # each backward read restarts the single iterator
    cached = Reiterable(50)
    uc = ls.uniter(cached, cache_size=10)
    assert [uc[i] for i in (20, 15, 11, 20, 19)] == [20, 15, 11, 20, 19] and cached.starts == 1


def test_uniter_is_thread_safe():
    src = Reiterable(300)
    u = ls.uniter(src, cache_size=5, n_parallel=3)
    out, threads = [], []
    for s in range(4):
        order = random.Random(s).sample(range(300), 100)
        threads.append(threading.Thread(target=lambda o=order: out.append([(i, u[i]) for i in o])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 4 and all(i == v for r in out for i, v in r)


def test_batch_of_unsized_source_keeps_the_short_last_batch():
    assert list(ls.batch(ls.uniter(iter(range(10))), 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(ls.batch(ls.uniter(iter(range(10))), 4, pad=-1)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]]
    assert list(ls.batch(ls.uniter(iter(range(10))), 4, drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(ls.batch(ls.uniter(iter(range(8))), 4, pad=-1)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(IndexError):
        ls.batch(ls.uniter(range(8)), 4)[2]


def test_old_protocol_source_without_len():
    class Old:
        def __getitem__(self, i):
            if i >= 4:
                raise IndexError(i)
            return i

    assert list(ls.smap(double, Old())) == [0, 2, 4, 6]
    assert list(ls.batch(Old(), 3)) == [[0, 1, 2], [3]]
    with pytest.raises(TypeError, match="no len"):
        len(ls.smap(double, Old()))


# -- interleave / switch / case / batch / split details --------------------------------------------
def test_interleave_switch_case_details():
    assert list(ls.interleave([], [1, 2], [], ["a"])) == [1, "a", 2]
    assert list(ls.interleave([1, 2], ["a", "b"])) == [1, "a", 2, "b"]
    with pytest.raises(ValueError):
        ls.interleave()
    assert list(ls.switch(np.array([0, 1, 2, 0]), "abcd", "ABCD")) == ["A", "b", "c", "D"]
    with pytest.raises(ValueError, match="same length"):
        ls.switch([True, False], [1, 2, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="same length"):
        ls.case([0, 1], [1, 2], [3])
    bad = ls.case([0, 3], "ab", "AB")
    assert bad[0] == "a"
    with pytest.raises(ls.EvaluationError, match="selector"):
        bad[1]
    with pytest.raises(ValueError):
        ls.case([0, 1])
    x, y = [1, 2, 3], [4, 5, 6]
    sw = ls.switch([True, False, True], x, y)
    sw[:] = ["a", "b", "c"]
    assert x == ["a", 2, "c"] and y == [4, "b", 6]


def test_batch_details():
    with pytest.warns(UserWarning, match="pad is ignored"):
        b = ls.batch(list(range(10)), 4, drop_last=True, pad=0)
    assert list(b) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ls.batch(list(range(10)), 4, drop_last=True)
        ls.batch(list(range(10)), 4, pad=0)
    assert len(ls.batch(range(8), 4, pad=-1)) == 2  # no extra all-padding batch
    assert list(ls.batch(range(5), 2, pad=ls.Pad(None))) == [[0, 1], [2, 3], [4, None]]
    assert list(ls.batch(range(5), 2, pad=None)) == [[0, 1], [2, 3], [4]]
    stacked = ls.batch(np.arange(10).reshape(5, 2), 2, pad=np.zeros(2, dtype=int), collate_fn=np.stack)
    assert stacked[-1].tolist() == [[8, 9], [0, 0]] and stacked[0].shape == (2, 2)
    for k in (0, -1):
        with pytest.raises(ValueError):
            ls.batch([1], k)
    with pytest.raises(TypeError):
        ls.batch([1], 1, collate_fn=3)
    assert repr(ls.Pad(None)) == "Pad(None)" and pickle.loads(pickle.dumps(ls.Pad(3))).value == 3


def test_unbatch_details():
    assert len(ls.unbatch([], 3)) == 0  # seqtools said 3
    assert list(ls.unbatch(ls.batch(list(range(7)), 3, pad=-1), 3, 1)) == list(range(7))
    with pytest.raises(ValueError):
        ls.unbatch([[1]], 2, 3)
    with pytest.raises(ValueError):
        ls.unbatch([[1]], 0)
    src = list(range(7))
    u = ls.unbatch(ls.batch(src, 3), 3, 1)
    u[6], u[0] = "a", "b"
    assert src == ["b", 1, 2, 3, 4, 5, "a"]
    parts = ls.unbatch(ls.split(src, [2, 4]), 2)
    parts[3] = "c"
    assert src[3] == "c"
    # the batches of a mapped or reordered view are copies: a write would be lost, so it is refused
    for bad in (ls.batch(src, 3)[::-1], ls.smap(list, ls.batch(src, 3))):
        with pytest.raises(TypeError, match="unbatch"):
            ls.unbatch(bad, 3, 1)[0] = "lost"
    assert src == ["b", 1, 2, "c", 4, 5, "a"]


def test_split_details():
    data = list(range(4))
    assert [list(p) for p in ls.split(data, [4, 4])] == [[0, 1, 2, 3], [], []]
    assert [list(p) for p in ls.split(data, [(4, 4), (1, 3), (3, 1)])] == [[], [1, 2], []]
    arr = np.arange(6)
    parts = ls.split(arr, 2)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.tolist() for p in ls.split(arr, np.int64(1))] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="divide"):
        ls.split(arr, 3)


def test_concatenate_and_collate_details():
    a, b = [1, 2], [3]
    cat = ls.concatenate([a, ls.concatenate([[], b]), []])
    assert list(cat) == [1, 2, 3] and len(cat.seqs) == 4
    cat[2] = "x"
    assert b == ["x"]
    assert list(ls.concatenate([])) == []
    with pytest.raises(ValueError, match="different lengths"):
        ls.collate([[1, 2], [1]])
    with pytest.raises(ValueError):
        ls.collate([])
    inf = ls.collate([[1, 2], ls.repeat(0)])
    assert len(inf) == 2 and list(inf) == [(1, 0), (2, 0)]
    assert list(ls.smap(max, [1, 5, 3], ls.cycle([2]))) == [2, 5, 3]
    assert len(ls.smap(max, [1, 5, 3], [4, 4])) == 2


# -- repr ------------------------------------------------------------------------------------------
def test_repr_is_a_tree():
    data = list(range(20))
    v = ls.smap(double, ls.batch(ls.gather(data, np.arange(20)), 4))
    text = repr(v)
    lines = text.splitlines()
    assert lines[0] == "smap(double)  len=5"
    assert "batch(4)" in lines[1] and "gather(20 indexes)" in lines[2]
    assert lines[1].startswith("└─ ")
    assert lines[3] == "      └─ list  len=20"
    assert str(v) == text
    cat = repr(ls.concatenate([data, ls.cycle(data, 3), ls.repeat(1)]))
    assert cat.splitlines()[0] == "concatenate(3 sequences)"
    assert "├─ list  len=20" in cat and "├─ cycle(limit=3)  len=3" in cat and "└─ repeat(1)" in cat
    shared = ls.smap(double, data)
    twice = repr(ls.collate([shared, shared]))
    assert "(shown above)" in twice
    deep = data
    for _ in range(30):
        deep = ls.smap(double, deep)
    assert len(repr(deep).splitlines()) < 15  # deep pipelines are cut
    for view in infinite_views().values():
        assert "len=" not in repr(view).splitlines()[0]


# -- a user-defined view ---------------------------------------------------------------------------
class Squares(ls.View):
    """The minimum a view implements: __len__ and _get."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def _get(self, i: int) -> int:
        return i * i


def test_a_subclass_gets_keys_slices_arrays_and_errors_from_the_base():
    sq, ref = Squares(10), [i * i for i in range(10)]
    assert list(sq) == ref and sq[-1] == 81 and sq[np.uint8(3)] == 9
    assert list(sq[8:2:-2]) == ref[8:2:-2] and list(sq[::3][1:]) == ref[::3][1:]
    assert list(sq[[1, -1, 1]]) == [1, 81, 1] and list(sq[np.arange(10) % 4 == 0]) == [0, 16, 64]
    assert sq._get_many([3, 1]) == [9, 1] and 49 in sq and sq.index(49) == 7
    with pytest.raises(IndexError, match="squares of length 10"):
        sq[10]
    with pytest.raises(TypeError, match="squares does not support item assignment"):
        sq[0] = 1
    with pytest.raises(TypeError, match="squares does not support item assignment"):
        sq[2:4] = [1, 2]
    assert repr(ls.smap(double, sq)).splitlines() == ["smap(double)  len=10", "└─ squares  len=10"]
    assert sorted(x for b in ls.batch(ls.shuffle(sq, seed=0), 5) for x in b) == ref



def test_the_bound_fast_reads_keep_every_check_and_error():
    """The reads a view above binds once (Node._get_fn, _get_many_fn) where the general case cannot
    arise: a slice read in one frame, a batch without pad, a gather of a list, a map over a list."""

    def f(x):
        if x == 17:
            raise ValueError("bad 17")
        return x * 10

    m = ls.smap(f, list(range(30)))
    g = ls.gather(m, [3, 5, -1, 0, 17, 1, 40, 2])  # -1: the last item; 40: out of range
    b = ls.batch(g, 3)
    top = ls.smap(len, b)[1:]
    assert m._get_many_fn() == m._map_plain and g._get_many_fn() == g._gather_trusted and b._get_fn() == b._get_listed
    padded = ls.batch(g, 3, pad=0)
    assert padded._get_fn() == padded._get  # a pad: the general read
    assert b[0] == [30, 50, 290] and ls.smap(sum, b)[:1][-1] == 370
    with pytest.raises(ls.EvaluationError, match="bad 17") as e:
        top[0]
    assert "item 17" in str(e.value) and "smap" in str(e.value)
    with pytest.raises(IndexError, match="index 40 is out of range for its source of length 30"):
        top[-1]
    with pytest.raises(IndexError, match="out of range"):
        top[2]
