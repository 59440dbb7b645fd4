"""Faults in items and results: a stuck item holds up only itself and at most one worker, and a
result that does not unpickle fails only its own item (for thread and process workers)."""

from __future__ import annotations

import os
import signal
import time
import warnings

import numpy as np
import pytest

import lazyseq

STUCK = 40


def _stuck_at(i):
    if i == STUCK:  # stuck until the test lets it go (a thread cannot be killed; close() kills a process)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["LAZYSEQ_TEST_RELEASE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    return i


class Release:
    def __init__(self, path):
        self.path = path

    def set(self):
        self.path.touch()


@pytest.fixture
def released(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYSEQ_TEST_RELEASE", str(tmp_path / "release"))
    release = Release(tmp_path / "release")
    yield release
    release.set()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_stuck_item_holds_up_only_itself_and_one_worker(method, released):
    with lazyseq.prefetch(lazyseq.smap(_stuck_at, range(400)), 2, method, timeout=1.0) as p:
        got = []
        for i in range(400):
            try:
                got.append(p[i])
            except lazyseq.PrefetchTimeout as e:
                assert e.item == i and f"item {i}" in str(e)
                got.append(None)
        assert got == [None if i == STUCK else i for i in range(400)]
        for _ in range(2):  # asking again: still stuck, and still only one worker held
            with pytest.raises(lazyseq.PrefetchTimeout, match=f"item {STUCK}"):
                p[STUCK]
            assert [p[i] for i in range(STUCK + 1, STUCK + 60)] == list(range(STUCK + 1, STUCK + 60))
            assert [p[i] for i in range(300, 400, 7)] == list(range(300, 400, 7))
        released.set()
        assert p[STUCK] == STUCK  # once it ends, it arrives


@pytest.mark.parametrize("method", ["thread", "process"])
def test_items_before_a_stuck_chunk_mate_arrive_when_read_at_random(method, released):
    order = list(range(STUCK - 10, STUCK)) + list(range(STUCK + 1, STUCK + 10))
    with lazyseq.prefetch(lazyseq.smap(_stuck_at, range(200)), 2, method, timeout=1.0) as p:
        assert [p[i] for i in range(STUCK - 20)] == list(range(STUCK - 20))  # chunks have grown
        got = {i: p[i] for i in order}
        assert got == {i: i for i in order}
        released.set()


PARENT = os.getpid()


def _rebuild(x):
    if os.getpid() == PARENT:
        raise ValueError(f"{x} cannot be rebuilt in the reader")
    return x


class OnlyInWorkers:
    def __init__(self, x):
        self.x = x

    def __reduce__(self):
        return (_rebuild, (self.x,))


def _odd_at_seven(i):
    return OnlyInWorkers(i) if i % 50 == 7 else i


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_result_that_does_not_unpickle_fails_only_its_own_item(ctx):
    with lazyseq.prefetch(lazyseq.smap(_odd_at_seven, range(300)), 2, "process", mp_context=ctx) as p:
        for i in range(300):
            if i % 50 == 7:
                with pytest.raises(lazyseq.EvaluationError, match=f"item {i}") as info:
                    p[i]
                assert "could not be unpickled" in str(info.value)
            else:
                assert p[i] == i


# -- the fault matrix: exceptions, odd items, dead workers ----------------------------------------
METHODS = [("thread", None), ("process", "fork"), ("process", "spawn")]
ALL_METHODS = [*METHODS, ("process", "forkserver")]


def mk(seq, method, ctx, **kw):
    kw.setdefault("nworkers", 2)
    kw.setdefault("timeout", 30)  # a hang fails the test instead of the run
    return lazyseq.prefetch(seq, method=method, mp_context=ctx, **kw)


class Bad(Exception):
    pass


def _fails_where(bad):
    def f(i):
        if bad(i):
            raise Bad(f"item {i} is bad")
        return i * 10
    return f


N = 60
WHERE = {"first": lambda i: i == 0, "last": lambda i: i == N - 1, "one": lambda i: i == 17, "every": lambda i: True,
         "odd": lambda i: i % 2 == 1}


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("method,ctx", ALL_METHODS)
def test_failing_items_fail_alone_in_order_and_at_random(method, ctx, where):
    bad = WHERE[where]
    order = list(range(N)) + [int(i) for i in np.random.default_rng(1).permutation(N)]
    with mk(lazyseq.smap(_fails_where(bad), range(N)), method, ctx) as p:
        for i in order:
            if bad(i):
                with pytest.raises(lazyseq.EvaluationError, match=f"item {i}") as e:
                    p[i]
                assert isinstance(e.value.__cause__, Bad) and f"item {i} is bad" in str(e.value.__cause__)
            else:
                assert p[i] == i * 10


def _raises_base(i):
    if i == 5:
        raise SystemExit(3)
    if i == 9:
        raise KeyboardInterrupt
    return i


@pytest.mark.parametrize("method,ctx", ALL_METHODS)
def test_system_exit_and_keyboard_interrupt_in_an_item_fail_that_item_only(method, ctx):
    with mk(lazyseq.smap(_raises_base, range(30)), method, ctx) as p:
        for i in range(30):
            if i in (5, 9):
                with pytest.raises(lazyseq.EvaluationError, match=f"item {i}") as e:
                    p[i]
                cause = e.value.__cause__
                assert isinstance(cause, SystemExit if i == 5 else KeyboardInterrupt)
            else:
                assert p[i] == i
        assert p.worker_pids() == [] or all(_alive(pid) for pid in p.worker_pids())  # no worker exited


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _odd_items():
    struct = np.dtype([("a", "<i4"), ("b", "<f8", (2,)), ("c", "S3")])
    items = [np.zeros(0, np.float32), np.array(3.5), np.arange(12.0).reshape(3, 4)[:, ::2],
             np.arange(10, dtype=np.int16)[::-3], np.array([1, "x", None], dtype=object),
             np.array([(1, (2.0, 3.0), b"abc")], dtype=struct), np.ones((2, 3, 4), order="F"),
             {"x": [np.arange(3), (np.float16(1.5), "s")], "y": {"z": b"b" * 5000}}, (), [], {}, None]
    for dt in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
               "float32", "float64", "complex64", "complex128"):
        items.append((np.arange(7).astype(dt), np.array(1).astype(dt)))
    items.append(np.arange(300_000, dtype=np.float64))  # 2.4 MB: larger than a small slot
    return items


def _same(a, b):
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and ((a.dtype == object and a.tolist() == b.tolist()) or np.array_equal(a, b, equal_nan=False)))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("shm_size", [0, 100_000, 64 << 20])
@pytest.mark.parametrize("method,ctx", METHODS)
def test_odd_items_arrive_intact_whatever_the_slots(method, ctx, shm_size):
    if method == "thread" and shm_size:
        pytest.skip("threads share memory: no slots")
    items = _odd_items()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # items larger than a slot warn once
        with mk(items, method, ctx, shm_size=shm_size, max_buffered=4) as p:
            got = [p[i] for i in range(len(items))] + [p[i] for i in reversed(range(len(items)))]
    for k, (a, b) in enumerate(zip(items + items[::-1], got)):
        assert _same(a, b), k


def _slow(i):
    time.sleep(0.002)
    return np.full(1000, i)


@pytest.mark.filterwarnings("ignore:prefetch. the reader holds every")
@pytest.mark.parametrize("when", ["busy", "idle", "holding"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_killed_worker_gives_worker_crashed_and_leaves_held_items_intact(when, sig):
    p = mk(lazyseq.smap(_slow, range(10_000)), "process", "fork", shm_size=8 << 20, start_hook=_quiet)
    try:
        held = [p[i] for i in range(20)]
        if when == "idle":
            time.sleep(0.3)  # the window is full: workers wait for the reader
        os.kill(p.worker_pids()[0], sig)
        with pytest.raises(lazyseq.WorkerCrashed, match=f"pid {p.worker_pids()[0]}") as e:
            for i in range(20, 10_000):
                got = p[i]
                assert got[0] == i
                if when == "holding":
                    held.append(got)
        assert e.value.exitcode == -sig
        assert all(int(a[0]) == a.sum() // 1000 for a in held) and [int(a[0]) for a in held[:20]] == list(range(20))
    finally:
        p.close()
    assert not any(_alive(pid) and _not_zombie(pid) for pid in p.worker_pids())


def _quiet(worker):
    import faulthandler

    faulthandler.disable()  # pytest's handler would print every loaded module into the log on SIGSEGV


def _not_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _crash_on_file(path, i):
    if i == 30 and not os.path.exists(path):
        open(path, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return i


@pytest.mark.parametrize("workers", [1, 2])
def test_a_dataloader_resumes_after_a_crash_with_every_batch_once(workers, tmp_path):
    import functools

    data = lazyseq.smap(functools.partial(_crash_on_file, str(tmp_path / "crashed")), range(64))
    kw = dict(batch_size=4, shuffle=True, seed=3, to_tensor=False, num_workers=workers)
    reference = [list(b) for b in lazyseq.DataLoader(list(range(64)), **{**kw, "num_workers": 0})]
    loader = lazyseq.DataLoader(data, **kw)
    seen = []
    with pytest.raises(lazyseq.WorkerCrashed):
        for b in loader:
            seen.append(list(b))
    state = loader.state_dict()
    loader.close()
    resumed = lazyseq.DataLoader(data, **kw)
    resumed.load_state_dict(state)
    rest = [list(b) for b in resumed]
    resumed.close()
    assert seen + rest == reference


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("at", [3, 7])
def test_a_dataloader_resumes_after_ctrl_c_with_every_batch_once(workers, at):
    kw = dict(batch_size=4, shuffle=True, seed=5, to_tensor=False, num_workers=workers)
    data = lazyseq.smap(_slow_int, range(64))
    reference = [list(b) for b in lazyseq.DataLoader(list(range(64)), **{**kw, "num_workers": 0})]
    loader = lazyseq.DataLoader(data, **kw)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        for b in loader:
            seen.append([int(x) for x in b])
            if len(seen) == at:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: lands in the loop or inside the next read
    state = loader.state_dict()
    loader.close()
    resumed = lazyseq.DataLoader(data, **kw)
    resumed.load_state_dict(state)
    rest = [[int(x) for x in b] for b in resumed]
    resumed.close()
    assert seen + rest == reference


def _slow_int(i):
    time.sleep(0.002)
    return i
