"""Async item functions: plain reads of an async smap, and prefetch(method='async')."""

import asyncio
import functools
import gc
import os
import pickle
import signal
import threading
import time

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.core import aio


async def double(x):
    await asyncio.sleep(0.001)
    return 2 * x


async def add(x, y, scale=1):
    await asyncio.sleep(0)
    return (x + y) * scale


async def noisy(x, rng):
    await asyncio.sleep(0)
    return x + int(rng.integers(1000))


async def fails_at_3(x):
    await asyncio.sleep(0)
    if x == 3:
        raise ValueError("corrupt record")
    return x


class Fetcher:
    async def __call__(self, x):
        await asyncio.sleep(0)
        return -x

    async def method(self, x):
        return x + 0.5


class Tracker:
    """Counts the coroutines running at once."""

    def __init__(self, pause=0.01):
        self.now = self.most = 0
        self.pause = pause

    async def __call__(self, x):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.pause)
        finally:
            self.now -= 1
        return x


def loop_threads():
    return [t for t in threading.enumerate() if t.name.startswith("lazyseq-async")]


def test_async_functions_are_detected():
    assert aio.is_async(double) and aio.is_async(functools.partial(add, 1)) and aio.is_async(Fetcher())
    assert aio.is_async(Fetcher().method) and aio.is_async(functools.partial(functools.partial(add, 1), 2))
    assert not any(aio.is_async(f) for f in (len, lambda x: x, Fetcher, functools.partial(max, 1), np.sqrt))


def test_plain_reads_run_the_coroutine():
    m = ls.smap(double, range(10))
    assert m[3] == 6 and m[-1] == 18 and list(m) == [2 * x for x in range(10)] and list(m[2:5]) == [4, 6, 8]
    assert repr(m).startswith("smap(double)")
    assert list(ls.smap(add, [1, 2], [10, 20])) == [11, 22]
    assert list(ls.starmap(add, [(1, 2, 3), (3, 4, 2)])) == [9, 14]
    assert list(ls.smap(functools.partial(add, scale=10), [1, 2], [0, 0])) == [10, 20]
    assert list(ls.smap(Fetcher(), range(3))) == [0, -1, -2]
    seeded = ls.smap(noisy, range(5), seed=7)
    assert list(seeded) == [seeded[i] for i in range(5)] == list(ls.smap(noisy, range(5), seed=7))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 50), key=st.slices(60))
def test_async_smap_indexes_like_a_list(n, key):
    m = ls.smap(double, range(n))
    assert list(m[key]) == [2 * x for x in range(n)][key]


def test_bulk_reads_run_their_coroutines_at_once():
    track = Tracker(pause=0.05)
    batches = ls.batch(ls.smap(track, range(64)), 32)
    t0 = time.perf_counter()
    assert [list(b) for b in batches] == [list(range(32)), list(range(32, 64))]
    assert time.perf_counter() - t0 < 1.0 and track.most >= 16  # sequentially: 3.2 s


def test_reads_inside_a_running_event_loop():
    m = ls.smap(double, range(5))

    async def main():
        return m[4], list(m)  # as in a Jupyter cell: asyncio.run would refuse here

    assert asyncio.run(main()) == (8, [0, 2, 4, 6, 8])

    async def reads_inside(x):  # a plain read inside a coroutine of the managed loop itself
        return m[x] + 1

    assert list(ls.smap(reads_inside, range(3))) == [1, 3, 5]


def test_errors_name_the_item():
    m = ls.smap(fails_at_3, range(6))
    with pytest.raises(ls.EvaluationError, match="item 3") as e:
        m[3]
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(ls.EvaluationError, match="item 3"):
        list(m)
    assert m[4] == 4
    ls.seterr("passthrough")
    with pytest.raises(ValueError, match="corrupt"):
        m[3]


def test_the_loop_stops_with_the_last_async_view():
    m = ls.smap(double, range(3))
    m[0]
    assert len(loop_threads()) == 1
    copy = pickle.loads(pickle.dumps(m))
    del m
    gc.collect()
    assert copy[2] == 4 and len(loop_threads()) == 1  # the copy holds the loop
    del copy
    deadline = time.monotonic() + 2
    while loop_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    assert not loop_threads()


@pytest.mark.parametrize("method,ctx", [("thread", None), ("process", "fork"), ("process", "spawn")])
def test_thread_and_process_prefetch_of_an_async_smap(method, ctx):
    offset = 5  # a closure: spawn needs cloudpickle

    async def shifted(x):
        await asyncio.sleep(0.001)
        return x + offset

    with ls.prefetch(ls.smap(shifted, range(50)), 2, method, mp_context=ctx) as p:
        assert list(p) == [x + 5 for x in range(50)] and p[7] == 12
    assert cloudpickle.loads(cloudpickle.dumps(ls.smap(shifted, range(3))))[2] == 7


# -- prefetch(method='async') ----------------------------------------------------------------------
def test_async_prefetch_runs_nworkers_items_at_once():
    track = Tracker(pause=0.01)
    t0 = time.perf_counter()
    with ls.prefetch(ls.smap(track, range(1000)), nworkers=64, method="async") as p:
        assert list(p) == list(range(1000))
        assert "64 coroutines" in p.describe() and p.stats()["method"] == "async"
    elapsed = time.perf_counter() - t0
    assert 32 <= track.most <= 64
    assert elapsed < 2.0  # 10 s one at a time; ~0.2 s measured


@pytest.mark.parametrize("shape", ["async", "sync over async", "async over sync", "shuffled", "batched",
                                   "seeded", "all sync", "two sources"])
def test_async_prefetch_evaluates_mixed_pipelines(shape):
    base = ls.smap(double, range(40))
    seq, expected = {
        "async": (base, [2 * x for x in range(40)]),
        "sync over async": (ls.smap(lambda x: x + 1, base), [2 * x + 1 for x in range(40)]),
        "async over sync": (ls.smap(double, ls.smap(lambda x: x + 1, range(40))), [2 * x + 2 for x in range(40)]),
        "shuffled": (ls.shuffle(base, seed=3)[5:], list(ls.shuffle([2 * x for x in range(40)], seed=3)[5:])),
        "batched": (ls.batch(base, 8), [list(range(k, k + 16, 2)) for k in range(0, 80, 16)]),
        "seeded": (ls.smap(noisy, range(40), seed=1), list(ls.smap(noisy, range(40), seed=1))),
        "all sync": (ls.smap(lambda x: x * 3, range(40)), [3 * x for x in range(40)]),
        "two sources": (ls.smap(add, range(40), base), [3 * x for x in range(40)]),
    }[shape]
    with ls.prefetch(seq, nworkers=16, method="async") as p:
        got = [list(x) if shape == "batched" else x for x in p]
        assert got == expected
        assert sorted(i for i, _ in p.unordered()) == list(range(len(expected)))
        assert (list(p[-1]) if shape == "batched" else p[-1]) == expected[-1]


def test_async_prefetch_errors_timeout_and_close():
    with ls.prefetch(ls.smap(fails_at_3, range(8)), nworkers=4, method="async") as p:
        with pytest.raises(ls.EvaluationError, match="item 3") as e:
            p[3]
        assert isinstance(e.value.__cause__, ValueError) and p[4] == 4 and p[2] == 2

    async def stuck(x):
        await asyncio.sleep(30 if x == 1 else 0)
        return x

    with ls.prefetch(ls.smap(stuck, range(10)), nworkers=4, method="async", timeout=0.3) as p:
        assert p[0] == 0
        with pytest.raises(ls.PrefetchTimeout):
            p[1]
        assert p[5] == 5  # the prefetch goes on
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 1.5  # close cancels the stuck coroutine
    p = ls.prefetch(ls.smap(stuck, range(10)), nworkers=4, method="async")
    threading.Timer(0.3, p.close).start()
    with pytest.raises(ls.PrefetchClosed):
        p[1]


def test_async_prefetch_passthrough_and_start_hook():
    ls.seterr("passthrough")
    with ls.prefetch(ls.smap(fails_at_3, range(8)), nworkers=4, method="async") as p:
        with pytest.raises(ValueError, match="corrupt"):
            p[3]
    ls.seterr("wrap")
    seen = []
    with ls.prefetch(ls.smap(double, range(4)), nworkers=4, method="async", start_hook=seen.append) as p:
        assert list(p) == [0, 2, 4, 6] and seen == [0]

    def bad_hook(k):
        raise OSError("no credentials")

    with pytest.raises(ls.WorkerStartError, match="no credentials"):
        with ls.prefetch(ls.smap(double, range(4)), nworkers=4, method="async", start_hook=bad_hook) as p:
            p[0]


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_while_waiting_stops_the_loop():
    async def slow(x):
        await asyncio.sleep(0.2)
        return x

    p = ls.prefetch(ls.smap(slow, range(1000)), nworkers=2, method="async")
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in p:
            pass
    assert p.closed
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        p[0]


def test_unordered_over_the_async_backend_a_slow_item_last():
    async def slow_first(x):
        await asyncio.sleep(0.5 if x == 0 else 0.005)
        return x

    with ls.prefetch(ls.smap(slow_first, range(100)), nworkers=16, method="async") as p:
        order = [i for i, _ in p.unordered()]
        assert sorted(order) == list(range(100)) and order[-1] == 0
        assert p[0] == 0
