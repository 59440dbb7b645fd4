import gc
import multiprocessing
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import lazyseq as ls
from lazyseq.evaluation import processes, wire

METHODS = [("thread", None), ("process", "fork"), ("process", "forkserver"), ("process", "spawn")]


def square(x):
    return x * x


def mk(seq, method="process", ctx="fork", **kw):
    kw.setdefault("nworkers", 2)
    return ls.prefetch(seq, method=method, mp_context=ctx if method == "process" else None, **kw)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("method,ctx", METHODS)
def test_items_and_keys_match_the_source(method, ctx):
    offset = 3  # a closure, so spawn/forkserver need cloudpickle
    seq = ls.smap(lambda x: square(x) + offset, range(300))
    expected = [x * x + offset for x in range(300)]
    with mk(seq, method, ctx) as p:
        assert len(p) == 300
        assert list(p) == expected
        assert p[-1] == expected[-1] and p[np.int64(5)] == expected[5]
        assert list(p[10:50:7]) == expected[10:50:7] and list(p[::-30]) == expected[::-30]
        keys = list(range(300))
        random.Random(0).shuffle(keys)
        assert [p[k] for k in keys[:60]] == [expected[k] for k in keys[:60]]
        with pytest.raises(IndexError):
            p[300]


def test_reading_the_same_index_twice_keeps_the_window():
    calls = []
    with mk(ls.smap(lambda x: calls.append(x) or [x], range(100)), "thread") as p:
        a = p[0]
        a.append("changed")
        assert [p[0], p[1], p[1], p[2]] == [[0], [1], [1], [2]]  # a fresh item, as seq[i] gives
        assert p.stats()["jumps"] == 0
        assert list(p[3:100]) == [[i] for i in range(3, 100)]
    assert sorted(calls) == sorted([*range(100), 0, 1])  # only the items read twice ran twice


def test_a_jump_keeps_work_still_wanted():
    with mk(ls.smap(square, range(2000)), "thread", nworkers=1) as p:
        for i in range(50):
            assert p[i] == i * i
        before = p.stats()["items"]
        assert p[52] == 52 * 52  # a small skip forward: what is in flight stays useful
        assert [p[i] for i in range(53, 80)] == [i * i for i in range(53, 80)]
        assert p.stats()["items"] - before < 200
        assert p[1500] == 1500**2 and p[3] == 9 and p[1999] == 1999**2


def test_strided_reads():
    with mk(ls.smap(square, range(400)), "process") as p:
        assert [p[i] for i in range(0, 400, 3)] == [i * i for i in range(0, 400, 3)]
        assert [p[i] for i in range(399, -1, -2)] == [i * i for i in range(399, -1, -2)]


@pytest.mark.parametrize("step", [1000, -700])
def test_a_large_stride_is_prefetched_not_jumped_to(step):
    calls = []
    with mk(ls.smap(lambda x: calls.append(x) or x, range(100_000)), "thread", nworkers=1) as p:
        keys = list(range(0 if step > 0 else 99_999, 100_000 if step > 0 else -1, step))
        assert [p[k] for k in keys] == keys
        assert p.stats()["jumps"] <= 3  # the first steps, until the stride shows twice
        # The window ran along the stride, not through the items between (a few strays around the
        # first reads, before the stride showed).
        assert set(keys) <= set(calls) and len(calls) <= len(keys) + 60


def test_nworkers_non_positive_means_cores_plus_n():
    cores = len(os.sched_getaffinity(0))
    with mk(range(3), "thread", nworkers=0, lazy_start=True) as p:
        assert p.nworkers == cores
    with mk(range(3), "thread", nworkers=-cores - 5, lazy_start=True) as p:
        assert p.nworkers == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        ls.prefetch(range(3), method="fiber")
    with pytest.raises(ValueError, match="max_buffered"):
        ls.prefetch(range(3), max_buffered=0)
    with pytest.raises(ValueError, match="shm_size"):
        ls.prefetch(range(3), method="thread", shm_size=1000)
    with pytest.raises(TypeError, match="sequence"):
        ls.prefetch(x for x in range(3))


@pytest.mark.parametrize("method,ctx", METHODS)
def test_start_hook_runs_once_in_every_worker(method, ctx, tmp_path):
    def hook(k):
        with open(tmp_path / f"w{k}-{os.getpid()}-{threading.get_ident()}", "w"):
            pass

    with mk(range(50), method, ctx, start_hook=hook) as p:
        assert list(p) == list(range(50))
    names = sorted(f.name for f in tmp_path.iterdir())
    assert [n.split("-")[0] for n in names] == ["w0", "w1"]
    if method == "process":
        assert len({n.split("-")[1] for n in names}) == 2 and str(os.getpid()) not in {n.split("-")[1] for n in names}


@pytest.mark.parametrize("method,ctx", METHODS)
def test_start_failure_cleans_up(method, ctx):
    def hook(k):
        raise OSError(f"no device for worker {k}")

    p = mk(range(50), method, ctx, start_hook=hook)
    with pytest.raises(ls.WorkerStartError, match="no device") as e:
        p[0]
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(ls.WorkerStartError):
        p[1]  # stays failed, and everything it started is gone (the leak check says so)


def test_unpicklable_pipeline_for_spawn_says_so():
    lock = threading.Lock()
    with pytest.raises(TypeError, match="pickled"):
        mk(ls.smap(lambda x: (lock, x)[1], range(5)), "process", "spawn")


def test_lazy_start_starts_nothing_until_the_first_read():
    p = mk(range(10), "process", lazy_start=True)
    assert p._m.backend is None
    assert p[3] == 3 and p._m.backend is not None
    p.close()


# -- shared memory -------------------------------------------------------------------------------------
def nested(i):
    return {"img": np.full((8, 8), i, np.float32), "pair": (np.arange(i, i + 3), [bytearray(b"x" * 5000), b"y" * 5000]),
            "label": i}


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_nested_buffers_travel_through_shared_memory(ctx):
    with mk(ls.smap(nested, range(40)), "process", ctx, shm_size=1 << 20) as p:
        for i, item in enumerate(p):
            assert item["label"] == i and (item["img"] == i).all() and item["img"].dtype == np.float32
            assert list(item["pair"][0]) == [i, i + 1, i + 2]
            assert item["pair"][1] == [bytearray(b"x" * 5000), b"y" * 5000]
            assert isinstance(item["pair"][1][1], bytes)
        stats = p.stats()
    assert stats["bytes_shm"] >= 40 * (256 + 24 + 10000)
    assert stats["bytes_pipe"] < stats["bytes_shm"] / 4
    assert stats["fallbacks"] == 0


def test_held_items_are_never_overwritten():
    mb = 4
    with mk(ls.smap(lambda i: np.full(2048, i, np.int64), range(200)), "process", max_buffered=mb,
            shm_size=mb * 3 * 2048 * 8) as p:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # holding every slot falls back, once
            held = [p[i] for i in range(3 * mb)]
            rest = [int(p[i][0]) for i in range(3 * mb, 200)]
        assert rest == list(range(3 * mb, 200))
        for i, a in enumerate(held):
            assert (a == i).all(), f"item {i} was overwritten"
        del held, a
        gc.collect()
        assert p.stats()["slots_free"] >= mb - 1  # dropping the items gives the slots back


def test_slot_returns_only_when_every_view_is_gone():
    with mk(ls.smap(lambda i: np.full(1000, i, np.float64), range(100)), "process", nworkers=1, max_buffered=2,
            shm_size=2 * 8192) as p:
        view = p[0][10:20]  # a view of a view keeps the slot
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for i in range(1, 100):
                assert (p[i] == i).all()
        assert (view == 0).all()


def test_oversized_items_fall_back_to_the_pipe_with_one_warning():
    with mk(ls.smap(lambda i: np.full(100_000, i, np.float64), range(30)), "process", shm_size=10 * 4096) as p:
        with pytest.warns(RuntimeWarning, match="would fit") as w:
            assert all((p[i] == i).all() for i in range(30))
        assert sum("would fit" in str(x.message) for x in w) == 1
        assert p.stats()["fallbacks"] > 0 and p.stats()["bytes_pipe"] > 30 * 800_000 * 0.9


def fill(i):
    out = ls.empty((256, 256), np.float32)
    out[:] = i
    return out


def test_empty_writes_straight_into_the_slot():
    assert type(ls.empty(3)) is np.ndarray and ls.empty_like(np.zeros((2, 2), np.uint8)).dtype == np.uint8
    with mk(ls.smap(fill, range(20)), "process", shm_size=10 * 300_000) as p:
        assert all((x == i).all() and x.shape == (256, 256) for i, x in enumerate(p))
        stats = p.stats()
    assert stats["bytes_shm"] == 20 * 256 * 256 * 4 and stats["bytes_pipe"] < 20 * 1000


# -- errors --------------------------------------------------------------------------------------------
def fails_on_7(x):
    if x == 7:
        raise ValueError("seven is bad")
    return x


@pytest.mark.parametrize("method,ctx", METHODS)
def test_worker_exception_names_the_item_and_later_items_work(method, ctx):
    with mk(ls.smap(fails_on_7, range(30)), method, ctx) as p:
        assert p[6] == 6
        with pytest.raises(ls.EvaluationError, match="item 7") as e:
            p[7]
        assert isinstance(e.value.__cause__, ValueError)
        if method == "process":
            remote = e.value.__cause__.__cause__
            assert "fails_on_7" in str(remote) and "seven is bad" in str(remote)  # the worker's traceback
        assert list(p[8:30]) == list(range(8, 30))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_passthrough_reraises_the_original_type(method):
    ls.seterr("passthrough")
    with mk(ls.smap(fails_on_7, range(30)), method) as p:
        with pytest.raises(ValueError, match="seven"):
            p[7]


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickling re-creates it with one argument: fails
        super().__init__(a)
        self.lock = threading.Lock()


def raise_unpicklable(x):
    if x == 3:
        raise Unpicklable("weird", 1)
    return x


def test_unpicklable_exception_and_result_come_back_clearly():
    with mk(ls.smap(raise_unpicklable, range(10)), "process") as p:
        with pytest.raises(ls.EvaluationError, match="item 3.*Unpicklable") as e:
            p[3]
        assert "could not be pickled" in str(e.value.__cause__)
        assert p[4] == 4
    with mk(ls.smap(lambda x: threading.Lock() if x == 2 else x, range(10)), "process") as p:
        with pytest.raises(ls.EvaluationError, match="item 2.*cannot be pickled"):
            p[2]
        assert p[5] == 5


def test_system_exit_in_a_thread_worker_does_not_hang():
    def f(x):
        if x == 4:
            raise SystemExit(1)
        return x

    with mk(ls.smap(f, range(10)), "thread", timeout=10) as p:
        with pytest.raises(ls.EvaluationError, match="item 4"):
            p[4]
        assert p[5] == 5


def test_timeout_names_the_item():
    with mk(ls.smap(lambda x: time.sleep(5 if x == 2 else 0) or x, range(5)), "thread", nworkers=1, timeout=0.3) as p:
        assert p[1] == 1
        with pytest.raises(ls.PrefetchTimeout, match="item 2") as e:
            p[2]
        assert e.value.item == 2 and isinstance(e.value, TimeoutError)


def crash_at_20(how):
    def f(x):
        if x == 20:
            if how == "exit":
                os._exit(3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            import ctypes
            import faulthandler

            faulthandler.disable()  # pytest's handler would print every loaded module into the log
            ctypes.string_at(0)  # segfault
        return x

    return f


@pytest.mark.parametrize("how,code", [("exit", "code 3"), ("kill", "SIGKILL"), ("segv", "SIGSEGV")])
def test_dead_worker_raises_worker_crashed(how, code):
    p = mk(ls.smap(crash_at_20(how), range(100)), "process")
    t = time.monotonic()
    with pytest.raises(ls.WorkerCrashed, match=code) as e:
        for _ in p:
            pass
    assert time.monotonic() - t < 10
    assert e.value.pid and f"pid {e.value.pid}" in str(e.value) and isinstance(e.value, RuntimeError)
    with pytest.raises(ls.WorkerCrashed):
        p[0]  # closed for good
    assert not alive(e.value.pid)


def test_close_with_and_gc_stop_the_workers():
    p = mk(range(100), "process")
    p[0]
    pids = p.worker_pids()
    assert len(pids) == 2 and all(alive(x) for x in pids)
    t = time.monotonic()
    p.close()
    assert time.monotonic() - t < 2 and not any(alive(x) for x in pids)
    with mk(range(100), "process") as p:
        p[0]
        pids = p.worker_pids()
    assert not any(alive(x) for x in pids)
    p = mk(range(100), "process")
    p[0]
    pids = p.worker_pids()
    del p
    gc.collect()
    assert not any(alive(x) for x in pids)


def test_a_worker_inside_a_given_up_job_does_not_hold_up_the_items_read_next():
    # Item 1 never ends; the reader skips it. Its slot (max_buffered=1: the only one) and its
    # worker are taken: the next items must come through the pipe and from the other worker.
    def f(i):
        if i == 1:
            time.sleep(30)
        return np.full(100, i)

    for shm in (0, 1 << 16):
        with mk(ls.smap(f, range(200)), "process", max_buffered=1 if shm else 2, shm_size=shm, timeout=10) as p:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the pipe fallback says so once
                assert p[0][0] == 0
                time.sleep(0.3)  # item 1 is under way now
                assert [int(p[k][0]) for k in range(2, 60)] == list(range(2, 60))
                assert [int(p[k][0]) for k in range(150, 100, -7)] == list(range(150, 100, -7))


def test_close_does_not_wait_for_a_busy_worker_long():
    p = mk(ls.smap(lambda x: time.sleep(30) or x, range(10)), "process", timeout=0.2)
    with pytest.raises(ls.PrefetchTimeout):
        p[0]
    pids = p.worker_pids()
    t = time.monotonic()
    p.close()
    assert time.monotonic() - t < 5 and not any(alive(x) for x in pids)


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_in_the_reader_stops_workers_and_restores_handlers():
    before = signal.getsignal(signal.SIGINT)
    p = mk(ls.smap(lambda x: time.sleep(0.2) or x, range(100)), "process")
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        for _ in p:
            pass
    assert signal.getsignal(signal.SIGINT) is before
    assert p._m.backend is None
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        p[0]


PARENT = textwrap.dedent("""
    import sys, time, lazyseq as ls
    pause = 1e6 if sys.argv[2] == "stuck" else 0.01  # stuck: workers inside items that never end
    p = ls.prefetch(ls.smap(lambda x: time.sleep(pause if x else 0) or x, range(10**6)), 2, "process",
                    shm_size=1 << 20, mp_context=sys.argv[1])
    p[0]
    print(" ".join(map(str, p.worker_pids())), flush=True)
    for x in p:
        pass
""")


@pytest.mark.parametrize("ctx,busy", [("fork", "idle"), ("spawn", "idle"), ("fork", "stuck")])
def test_workers_exit_when_the_parent_is_killed(ctx, busy):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", PARENT, ctx, busy], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": root})
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(x) for x in pids)
    finally:  # whatever happened, the reader dies here (and takes its workers with it)
        proc.kill()
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(x) for x in pids)
    assert not [n for n in os.listdir("/dev/shm") if "lazyseq" in n]


def test_nested_prefetch():
    inner = ls.prefetch(ls.smap(square, range(100)), 2, "thread", lazy_start=True)
    outer = mk(ls.smap(lambda x: x + 1, inner), "process")
    assert list(outer) == [x * x + 1 for x in range(100)]
    outer.close()
    inner.close()
    p = pickle.loads(pickle.dumps(ls.prefetch(range(10), 1, "thread", lazy_start=True)))
    assert list(p) == list(range(10))
    p.close()


def test_stats_count_what_happened():
    with mk(ls.smap(lambda i: np.zeros(100), range(50)), "process", shm_size=1 << 16) as p:
        for _ in p:
            pass
        s = p.stats()
    assert s["items"] == 50 and s["jobs"] >= 1 and s["bytes_shm"] == 50 * 800
    assert {"fallbacks", "waits", "wait_seconds", "chunk", "slot_size", "slots_free", "nworkers"} <= s.keys()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_busy_seconds_count_the_workers_time_in_jobs(method):
    t = time.monotonic()
    with mk(ls.smap(lambda i: time.sleep(0.004) or i, range(40)), method) as p:
        assert list(p) == list(range(40))
        s = p.stats()
    wall = time.monotonic() - t
    assert 40 * 0.004 <= s["busy_seconds"] <= wall * p.nworkers  # every item slept 4 ms inside a job


def test_a_failed_process_start_cleans_up_what_it_started(monkeypatch):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    started = []
    real_start = ctx.Process.start

    def start(self):
        if started:
            raise OSError("fork: resource temporarily unavailable")
        real_start(self)
        started.append(self.pid)

    monkeypatch.setattr(ctx.Process, "start", start)
    with pytest.raises(OSError, match="resource temporarily"):
        ls.prefetch(range(10), 3, "process", mp_context=ctx, shm_size=1 << 16)
    assert len(started) == 1 and not alive(started[0])


def test_infinite_sources():
    import itertools

    with mk(ls.smap(square, ls.cycle([1, 2, 3])), "process") as p:
        assert list(itertools.islice(p, 7)) == [1, 4, 9, 1, 4, 9, 1]
        assert p[100] == 4 and list(p[5:9]) == [9, 1, 4, 9]
        with pytest.raises(TypeError):
            len(p)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_sources_of_unknown_size_end_iteration(method):
    p = mk(ls.smap(lambda x: x + 1, ls.uniter(list(range(25)))), method)
    assert list(p) == list(range(1, 26))
    with pytest.raises(IndexError):
        p[30]
    p.close()


def test_random_reads_compute_little_beyond_what_is_read():
    with mk(ls.smap(lambda i: np.full(1000, i, np.float64), range(5000)), "process", shm_size=10 << 16) as p:
        assert all(p[i][0] == i for i in range(200))
        keys = random.Random(0).sample(range(5000), 200)
        before = p.stats()["items"]
        assert all(p[k][0] == k for k in keys)
        s = p.stats()
    assert s["items"] - before <= 3 * len(keys) + 2000  # the sequential window left behind + ~2 per read
    assert s["fallbacks"] == 0 and s["jumps"] >= len(keys)


# -- regressions found in review -----------------------------------------------------------------------
def test_forkserver_workers_survive_an_idle_reader():
    with mk(ls.smap(square, range(100)), "process", "forkserver") as p:
        assert p[0] == 0
        time.sleep(1.2)  # longer than the workers' orphan check
        assert p[1] == 1 and p[50] == 2500


class OldStyle:  # __getitem__ only: IndexError ends it
    def __getitem__(self, i):
        if i >= 10:
            raise IndexError(i)
        return i


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_source_without_len_ends_iteration(method):
    with mk(OldStyle(), method) as p:
        assert list(p) == list(range(10))


def from_a_helper_thread(x):
    out = []
    t = threading.Thread(target=lambda: out.append(ls.empty(1000)))
    t.start()
    t.join()
    return out[0]


def test_only_the_evaluating_thread_writes_into_the_slot():
    with mk(ls.smap(from_a_helper_thread, range(4)), "process", shm_size=1 << 18) as p:
        for _ in p:
            pass
        assert p.stats()["bytes_shm"] == 4 * 8000  # copied into the slot: the thread's arrays were plain


def test_cached_batches_do_not_keep_views_of_reused_slots():
    batches = ls.add_cache(ls.batch(ls.smap(lambda x: np.full(1000, x), range(80)), 4,
                                    collate_fn=ls.default_collate), 100)
    with mk(batches, "process", nworkers=1, max_buffered=3, shm_size=300_000) as p:
        for _ in range(2):
            for k in range(20):
                assert p[k][:, 0].tolist() == [4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3]


class OnlyPicklesOneWay(Exception):
    def __init__(self, a, b):
        super().__init__(a)


def odd_result(x):
    return OnlyPicklesOneWay("o", 1) if x == 5 else x


def test_a_result_that_does_not_unpickle_fails_its_items_only():
    with mk(ls.smap(odd_result, range(40)), "process", nworkers=1) as p:
        assert [p[i] for i in range(5)] == list(range(5))
        with pytest.raises(ls.EvaluationError, match="unpickled"):
            p[5]
        assert p[30] == 30


def test_a_forked_copy_of_a_started_prefetch_starts_its_own_workers():
    inner = mk(ls.smap(square, range(50)), "process", nworkers=1)
    assert inner[0] == 0
    with mk(ls.smap(lambda x: x + 1, inner), "process", nworkers=1) as outer:
        assert outer[10] == 101 and list(outer[:3]) == [1, 2, 5]
    inner.close()


def _records_before_blocking(conn) -> int:
    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setblocking(False)
        rec = wire.JOB.pack(1, 2, 3, 4, 5)
        msg = len(rec).to_bytes(4, "big", signed=True) + rec  # what Connection.send_bytes writes
        n = 0
        try:
            while n < 100_000:
                s.send(msg)
                n += 1
        except BlockingIOError:
            pass
        return n
    finally:
        s.close()


def test_max_queued_records_stay_far_below_what_the_worker_connection_holds():
    a, b = multiprocessing.get_context("fork").Pipe(duplex=True)
    try:
        capacity = _records_before_blocking(a)
    finally:
        a.close()
        b.close()
    assert processes.MAX_QUEUED * 2 <= capacity, capacity  # "far below": a 2x margin at least


@pytest.mark.parametrize("sndbuf", [None, 64000])
def test_jumping_about_behind_a_stuck_worker_never_blocks_the_reader(tmp_path, sndbuf):
    # Each read gives up the last job: without a cap, records pile up on the stuck worker's
    # connection until sending one blocks the reader, past any timeout. A socket pair holds about
    # 280 records on a stock kernel; with SO_SNDBUF=64000 (what some kernels give) about 166.
    marker = tmp_path / "stuck"

    def stuck_at_zero(x):
        if x == 0:
            marker.touch()
            time.sleep(30)
        return x

    p = mk(ls.smap(stuck_at_zero, range(10_000)), "process", nworkers=1, timeout=0.002)
    if sndbuf:
        for c in p._m.backend.conns:
            s = socket.socket(fileno=os.dup(c.fileno()))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)  # the kernel doubles it
            s.close()
    state = {"k": 0, "done": False}

    def reader():
        try:
            with pytest.raises(ls.PrefetchTimeout):
                p[0]
            deadline = time.monotonic() + 10
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert marker.exists()  # the worker is inside item 0 now
            for k in range(1, 600):
                state["k"] = k
                with pytest.raises(ls.PrefetchTimeout):
                    p[k * 3]
            assert max(p._m.backend.load) <= processes.MAX_QUEUED
            state["done"] = True
        except BaseException as e:  # reported below
            state["error"] = e

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(20)
    blocked = t.is_alive()
    p.close()  # terminates the worker: a reader blocked in send gets an error and returns
    t.join(10)
    assert not blocked, f"the reader blocked in send at read {state['k']} (a PrefetchTimeout was due)"
    assert state["done"], state.get("error")


def test_threads_starting_and_closing_fork_prefetches_at_once():
    errors, barrier = [], threading.Barrier(4)

    def run(k):
        try:
            barrier.wait(5)
            for _ in range(4):
                with mk(ls.smap(square, range(k, k + 30)), "process", nworkers=2, shm_size=1 << 16) as p:
                    assert list(p) == [i * i for i in range(k, k + 30)]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert not processes._PARENT_FDS  # every closed prefetch forgot its descriptors


def test_close_from_another_thread_while_the_reader_is_busy_gives_prefetch_closed():
    # Whatever the reader was doing (sending a job, collecting, rebuilding from a slot), it gets
    # PrefetchClosed, not an error of the machinery close() took away (a crash, an IndexError).
    def f(x):
        time.sleep((x % 7) * 0.0003)
        return np.full(100, x)

    outcomes = []
    for seed in range(25):
        rnd = random.Random(seed)
        p = mk(ls.smap(f, range(100_000)), "process", shm_size=1 << 20, max_buffered=4)

        def read(p, rnd):
            i = 0
            try:
                while True:
                    i = i + 1 if rnd.random() < 0.8 else rnd.randrange(100_000)
                    assert p[i][0] == i
            except BaseException as e:
                outcomes.append(e)

        t = threading.Thread(target=read, args=(p, random.Random(seed + 100)))
        t.start()
        time.sleep(rnd.random() * 0.2)
        p.close()
        t.join(10)
        assert not t.is_alive()
    assert all(isinstance(e, ls.PrefetchClosed) for e in outcomes), outcomes


def test_close_from_another_thread_stops_a_waiting_reader():
    p = mk(ls.smap(lambda x: time.sleep(3) or x, range(10)), "process", nworkers=1)
    got = []

    def read():
        try:
            p[0]
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.3)
    start = time.monotonic()
    p.close()
    t.join(5)
    assert time.monotonic() - start < 2.5 and not t.is_alive()
    assert got and isinstance(got[0], ls.PrefetchClosed)


def test_a_prefetch_whose_arguments_fail_still_has_a_repr():
    # a traceback prints the half-made object: its repr must not raise in turn
    try:
        ls.prefetch([1, 2], 2, "thread", shm_size=5)
    except ValueError as e:
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        assert repr(tb.tb_frame.f_locals["self"]).startswith("prefetch(2 threads, max_buffered=10, shm_size=5)")
    else:
        raise AssertionError("shm_size with threads must be refused")
