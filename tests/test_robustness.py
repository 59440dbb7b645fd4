"""Stuck items, a killed reader, Ctrl-C and close() at awkward moments: prefetch and DataLoader
keep their guarantees (found by adversarial testing; each test names the guarantee it checks).
"""

import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import lazyseq


def _stuck_at_zero(i):
    if i == 0:
        time.sleep(60)  # stands for an item stuck in C code (a lock, a hung read)
    return np.full(1000, i)


def test_a_stuck_cancelled_job_does_not_starve_every_other_item():
    """docs/prefetch.md: "timeout= bounds the wait for one item ... the prefetch goes on" and "No free
    slot ...: nothing hangs ... the job's results go through the pipe".

    Item 0 is stuck in worker A; the reader times out on it and jumps away, which gives its job
    up, but the job keeps the only slot until worker A answers. The next items must still come
    (from worker B, through the pipe)."""
    seq = lazyseq.smap(_stuck_at_zero, range(100))
    with lazyseq.prefetch(seq, 2, "process", max_buffered=1, shm_size=16000, timeout=2) as p:
        with pytest.raises(lazyseq.PrefetchTimeout):
            p[0]
        got = []
        for i in (50, 51, 70):
            try:
                got.append(int(p[i][0]))
            except lazyseq.PrefetchTimeout:
                got.append(None)
        assert got == [50, 51, 70]


_ORPHAN_CHILD = r"""
import sys, time, lazyseq
def f(i):
    if i == 0:
        time.sleep(60)
    return i
if __name__ == "__main__":
    p = lazyseq.prefetch(lazyseq.smap(f, range(10)), 2, "process", timeout=0.5)
    try:
        p[0]
    except lazyseq.PrefetchTimeout:
        pass
    print(*p.worker_pids(), flush=True)
    time.sleep(60)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_busy_in_an_item_exit_when_the_reader_is_killed():
    """docs/prefetch.md: "If the reader's process dies, workers notice within a second ... and exit."

    Also a worker busy in a long (or stuck) item, which does not get back to its pipe."""
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_CHILD], stdout=subprocess.PIPE, text=True)
    pids = []
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if _alive(p)]
        assert not left, f"workers {left} still running 5 s after the reader was killed"
    finally:
        proc.kill()
        proc.wait()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _slow_first_batch(i):
    if i < 4:
        time.sleep(2)
    return np.full(4, i, np.int64)


@pytest.mark.usefixtures("sigint_default")
def test_persistent_loader_works_again_after_ctrl_c():
    """docs/dataloader.md: persistent workers "live until close()"; Ctrl-C while reading stops the
    prefetch (docs/prefetch.md); the loader starts new workers for the next pass."""
    loader = lazyseq.DataLoader(lazyseq.smap(_slow_first_batch, range(16)), batch_size=4, num_workers=2,
                                persistent_workers=True, to_tensor=False, shm_size=1 << 16)
    try:
        timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:  # waits ~2 s for batch 0: the SIGINT lands in the prefetch wait
                pass
        timer.join()
        got = [b[:, 0].tolist() for b in loader]  # resumes at batch 0 of epoch 0
        assert got == [[4 * k + j for j in range(4)] for k in range(4)]
    finally:
        loader.close()


def _ident(i):
    return i


@pytest.mark.parametrize("method", ["thread", "process"])
def test_close_while_the_first_read_starts_the_workers_stops_them(monkeypatch, method):
    """docs/prefetch.md: "close() (from any thread ...) stop[s] every worker in bounded time".

    With lazy_start, close() from another thread may run while the first read starts the
    workers: they must be stopped too. The window is widened here by closing the prefetch from
    another thread at the moment ``_start`` builds the backend."""
    backends = importlib.import_module("lazyseq.evaluation.view").BACKENDS
    real = backends[method]
    box = {}

    class ClosingFirst(real):
        def __init__(self, *args, **kwargs):
            t = threading.Thread(target=box["p"].close)
            t.start()
            t.join()
            super().__init__(*args, **kwargs)

    monkeypatch.setitem(backends, method, ClosingFirst)
    before = set(threading.enumerate())
    p = box["p"] = lazyseq.prefetch(lazyseq.smap(_ident, range(10)), 2, method, lazy_start=True)
    with pytest.raises(lazyseq.PrefetchClosed):
        p[0]
    monkeypatch.setitem(backends, method, real)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        children = multiprocessing.active_children()
        threads = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not children and not threads:
            break
        time.sleep(0.05)
    backend, p._m.backend = p._m.backend, None  # clean up what close() left running
    if backend is not None:
        backend.close()
    assert not children and not threads, f"still running after close(): {children} {threads}"
