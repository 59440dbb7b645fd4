"""Prefetch.unordered: items in completion order, over any backend."""

import gc
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.evaluation import completion

METHODS = [("thread", None), ("process", "fork"), ("process", "spawn")]


def mk(seq, method="thread", ctx=None, **kw):
    kw.setdefault("nworkers", 2)
    return ls.prefetch(seq, method=method, mp_context=ctx, **kw)


def slow_first(i):
    time.sleep(0.8 if i == 0 else 0.002)
    return i * 10


def fails_at_3(i):
    if i == 3:
        raise ValueError("corrupt record")
    return i


@pytest.mark.parametrize("method,ctx", METHODS)
def test_every_index_once_and_a_slow_item_arrives_last(method, ctx):
    with mk(ls.smap(slow_first, range(40)), method, ctx) as p:
        pairs = list(p.unordered())
        assert sorted(pairs) == [(i, i * 10) for i in range(40)]
        order = [i for i, _ in pairs]
        assert order[-1] == 0 and order != sorted(order)
        assert p[5] == 50 and list(p[:3]) == [0, 10, 20]  # random access works after the pass


@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_ranges_read_like_slices(method, ctx):
    with mk(ls.smap(lambda x: x + 1, range(100)), method, ctx) as p:
        assert sorted(p.unordered(10, 20)) == [(i, i + 1) for i in range(10, 20)]
        assert sorted(p.unordered(-5)) == [(i, i + 1) for i in range(95, 100)]
        assert sorted(p.unordered(90, 1000)) == [(i, i + 1) for i in range(90, 100)]
        assert list(p.unordered(50, 50)) == [] and list(p.unordered(60, 40)) == []


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 300), start=st.integers(-350, 350), stop=st.none() | st.integers(-350, 350),
       nworkers=st.integers(1, 4), max_buffered=st.integers(1, 12))
def test_unordered_is_a_permutation_of_the_slice(n, start, stop, nworkers, max_buffered):
    expected = list(range(n))[start:stop]
    with mk(ls.smap(lambda x: x * 2, range(n)), nworkers=nworkers, max_buffered=max_buffered) as p:
        got = list(p.unordered(start, stop))
    assert sorted(i for i, _ in got) == expected and all(x == 2 * i for i, x in got)


@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_early_break_cancels_the_rest_and_random_access_works(method, ctx):
    calls = []
    with mk(ls.smap(lambda x: calls.append(x) or time.sleep(0.002) or x, range(10_000)), method, ctx,
            max_buffered=4) as p:
        for k, (_i, _x) in enumerate(p.unordered()):
            if k == 20:
                break
        assert p[9000] == 9000 and p[17] == 17 and list(p[100:105]) == list(range(100, 105))
        it = p.unordered(0, 50)
        next(it)
        del it
        gc.collect()
        assert p[1] == 1
        it = p.unordered(0, 50)
        next(it)
        it.close()
        it.close()
        assert p[2] == 2 and sorted(p.unordered(0, 30)) == [(i, i) for i in range(30)]
    if method == "thread":
        assert len(calls) < 2000  # the rest was cancelled, not computed


def test_random_access_while_open_is_refused_and_one_pass_at_a_time():
    with mk(ls.smap(lambda x: x, range(100))) as p:
        with p.unordered() as it:
            next(it)
            with pytest.raises(RuntimeError, match="unordered.*open"):
                p[0]
            with pytest.raises(RuntimeError, match="open already"):
                p.unordered()
        assert p[0] == 0
        it = p.unordered(0, 10)
        assert len(list(it)) == 10
        assert p[9] == 9  # an exhausted iterator is closed
        assert list(it) == []


@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_a_failing_item_raises_for_itself_and_the_iteration_goes_on(method, ctx):
    with mk(ls.smap(fails_at_3, range(12)), method, ctx) as p:
        it, got, errors = p.unordered(), [], []
        while True:
            try:
                got.append(next(it))
            except StopIteration:
                break
            except ls.EvaluationError as e:
                errors.append(e)
        assert sorted(i for i, _ in got) == [i for i in range(12) if i != 3]
        assert len(errors) == 1 and "item 3" in str(errors[0]) and isinstance(errors[0].__cause__, ValueError)
        ls.seterr("passthrough")
        with pytest.raises(ValueError, match="corrupt record"):
            list(p.unordered(0, 5))


@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_timeout_names_an_item_and_the_pass_goes_on(method, ctx):
    def stuck(i):
        time.sleep(2.5 if i == 2 else 0.001)
        return i

    with mk(ls.smap(stuck, range(6)), method, ctx, timeout=1.0) as p:
        it = p.unordered()
        got = [next(it) for _ in range(5)]  # the rest of item 2's job moves on within 50x an item's cost
        with pytest.raises(ls.PrefetchTimeout, match="timeout=1.0") as e:
            next(it)
        assert e.value.item == 2
        for _ in range(5):  # each wait is bounded; item 2 arrives within two more
            try:
                got += list(it)
                break
            except ls.PrefetchTimeout:
                pass
        assert sorted(got) == [(i, i) for i in range(6)]


def test_a_long_job_answers_in_parts_and_its_rest_moves_on():
    def slow_5(i):
        time.sleep(1.0 if i == 5 else 0)
        return i

    with mk(ls.smap(slow_5, range(400)), nworkers=2, max_buffered=4) as p:
        list(p[:50])  # costs known: chunks of several items
        t0, seen = time.monotonic(), {}
        for i, _x in p.unordered(0, 400):
            seen[i] = time.monotonic() - t0
        assert sorted(seen) == list(range(400)) and max(seen, key=seen.get) == 5
        assert max(t for i, t in seen.items() if i != 5) < 0.9  # nothing waited for item 5


def test_sources_of_unknown_size_end():
    it = iter(range(25))
    src = ls.uniter(it) if hasattr(ls, "uniter") else None

    class NoLen:
        def __getitem__(self, i):
            if i >= 25:
                raise IndexError(i)
            return i

    with mk(ls.smap(lambda x: x, NoLen())) as p:
        assert sorted(i for i, _ in p.unordered()) == list(range(25))
        assert sorted(i for i, _ in p.unordered(20)) == list(range(20, 25))
        with pytest.raises(IndexError):
            p.unordered(-3)
    del src


def test_close_from_another_thread_and_closing_the_prefetch():
    def slow(i):
        time.sleep(0.05)
        return i

    with mk(ls.smap(slow, range(1000))) as p:
        it = p.unordered()
        next(it)
        threading.Timer(0.2, it.close).start()
        rest = list(it)  # stops once closed
        assert len(rest) < 100
        time.sleep(0.1)
        assert p[3] == 3
        it = p.unordered()
        next(it)
        p.close()
        with pytest.raises(ls.PrefetchClosed):
            next(it)
        it.close()


def test_max_buffered_bounds_the_items_in_flight():
    running, most = [0], [0]
    lock = threading.Lock()

    def tracked(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return i

    with mk(ls.smap(tracked, range(60)), nworkers=8, max_buffered=3) as p:
        it = p.unordered()
        for _ in it:
            time.sleep(0.005)
            pending = it._pass
            if pending is not None:  # items sent and not taken: max_buffered jobs of `chunk` items
                assert len(pending.owed) + len(pending.out) <= 3 * p._window.chunk
    assert most[0] <= 8


def test_completion_uses_only_the_backend_protocol():
    src = open(completion.__file__).read()
    assert "ThreadBackend" not in src and "ProcessBackend" not in src and "shm" not in src


@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_reads_in_any_direction_work_around_a_pass(method, ctx):
    with mk(ls.smap(lambda x: -x, range(200)), method, ctx) as p:
        assert list(reversed(p))[:3] == [-199, -198, -197] and list(p[::-7])[:2] == [-199, -192]
        assert sorted(p.unordered(150)) == [(i, -i) for i in range(150, 200)]
        assert list(p) == [-x for x in range(200)] and list(reversed(p[:10])) == [-x for x in range(9, -1, -1)]
        assert [x for _, x in sorted(p.unordered(0, 10))] == [-x for x in range(10)]
        assert p.stats()["items"] >= 200


def test_shared_memory_slots_and_items_held_by_the_consumer():
    import numpy as np

    def img(i):
        return np.full((64, 64), i, np.float32)

    with mk(ls.smap(img, range(60)), "process", "fork", shm_size=4 * 64 * 64 * 4 * 2, max_buffered=4) as p:
        with pytest.warns(RuntimeWarning):  # every slot held: the pipe, with a warning, never a hang
            held = list(p.unordered())
        assert sorted(int(a[0, 0]) for _, a in held) == list(range(60))
        assert all((a == i).all() for i, a in held)
        del held
        assert sorted(int(a[0, 0]) for _, a in p.unordered(0, 20)) == list(range(20))


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("method,ctx", METHODS[:2])
def test_ctrl_c_in_an_unordered_pass_stops_the_workers(method, ctx):
    import os
    import signal

    p = mk(ls.smap(lambda x: time.sleep(0.1) or x, range(1000)), method, ctx)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in p.unordered():
            pass
    assert p.closed and p._m.backend is None
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        p[0]
