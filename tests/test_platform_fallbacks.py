"""The portable paths that macOS (and the BSDs) take, forced on Linux so that CI runs them.

``LAZYSEQ_FORCE_FALLBACKS`` reaches spawned workers through the environment; in the reader,
the Linux-only functions are also taken away (``os.memfd_create``, ``os.sched_getaffinity``)
so nothing can reach them. ``select.poll`` stays: multiprocessing's own waits use it (as they do
on macOS); lazyseq's wait takes the ``selectors`` path through the variable.
"""

import builtins
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lazyseq as ls
from lazyseq import helpers
from lazyseq.evaluation import slots, window

CONTEXTS = ["spawn", "forkserver", "fork"]


@pytest.fixture
def macos_like(monkeypatch):
    """Every fallback forced: in the workers by the environment, in the reader by that and by
    removing the Linux-only calls."""
    monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "all")
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)


def segment_mappings() -> list[str]:
    """This process's shared mappings of lazyseq segments, as /proc names them (a test aid: Linux)."""
    with open("/proc/self/maps") as f:
        return [line.split(None, 5)[-1].strip() for line in f if "lazyseq" in line]


def scheduler_policy(x):
    return x, os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else -1


def image(i):
    return np.full((64, 64), i, np.float32), i


def fails_on_7(i):
    if i == 7:
        raise ValueError("seven")
    return i


def dies_on_5(i):
    if i == 5:
        os._exit(9)
    return i


# -- the switch --------------------------------------------------------------------------------------
def test_forced_reads_names_and_all(monkeypatch):
    monkeypatch.delenv("LAZYSEQ_FORCE_FALLBACKS", raising=False)
    assert not any(helpers.forced(n) for n in helpers.FALLBACKS)
    monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "memfd, poll")
    assert helpers.forced("memfd") and helpers.forced("poll") and not helpers.forced("sched")
    monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "all")
    assert all(helpers.forced(n) for n in helpers.FALLBACKS)
    monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "memfd,mmemfd")
    with pytest.raises(ValueError, match=r"unknown fallback\(s\) \['mmemfd'\]; known: all, memfd, poll"):
        helpers.forced("memfd")


# -- each fallback on its own ------------------------------------------------------------------------
def test_cores_without_an_affinity_mask(monkeypatch):
    monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "affinity")
    assert helpers.usable_cores() == os.cpu_count()
    monkeypatch.delenv("LAZYSEQ_FORCE_FALLBACKS")
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert helpers.usable_cores() == os.cpu_count()
    with ls.prefetch(range(10), nworkers=0, method="thread") as p:  # nworkers <= 0 counts cores
        assert list(p) == list(range(10))


def ours() -> set[str]:
    """lazyseq's names in /dev/shm (another pytest-xdist worker's tests make and drop others meanwhile)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("lazyseq")}


def test_segment_through_shm_open_leaves_no_name(macos_like):
    before = ours()
    fd = slots.create_segment(3 * 4096)
    try:
        assert not os.get_inheritable(fd)
        mem = slots.map_segment(fd, 3 * 4096)
        mem[:] = 7
        again = slots.map_segment(fd, 3 * 4096)  # the same memory through the descriptor
        assert again[-1] == 7 and len(again) == 3 * 4096
        assert ours() == before  # unlinked at once
        assert any(m.startswith("/dev/shm/lazyseq-") and m.endswith("(deleted)") for m in segment_mappings())
        del mem, again
    finally:
        os.close(fd)


def test_memfd_is_the_linux_default(monkeypatch):
    monkeypatch.delenv("LAZYSEQ_FORCE_FALLBACKS", raising=False)
    if not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create here")
    fd = slots.create_segment(4096)
    try:
        mem = slots.map_segment(fd, 4096)
        assert any(m.startswith("/memfd:lazyseq") for m in segment_mappings())
        del mem
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="the forced path is the only one here")
@pytest.mark.parametrize("force", [False, True])
def test_workers_scheduling_policy(monkeypatch, force):
    if force:
        monkeypatch.setenv("LAZYSEQ_FORCE_FALLBACKS", "sched")
    else:
        monkeypatch.delenv("LAZYSEQ_FORCE_FALLBACKS", raising=False)
    with ls.prefetch(ls.smap(scheduler_policy, range(4)), nworkers=1, method="process", mp_context="spawn") as p:
        policies = {policy for _, policy in p}
    assert policies == ({os.sched_getscheduler(0)} if force else {os.SCHED_BATCH})


def test_cache_budget_without_sys(monkeypatch):
    real_open = builtins.open

    def no_sys(path, *a, **kw):
        if str(path).startswith("/sys/"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_sys)
    assert window._cache_budget() == 16 << 20  # half of the 32 MiB assumed where the OS does not tell


# -- the process backend's essentials with every fallback forced ---------------------------------------
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_prefetch_essentials_with_every_fallback(macos_like, ctx):
    seq = ls.smap(image, range(40))
    with ls.prefetch(seq, nworkers=2, method="process", mp_context=ctx, shm_size=1 << 20) as p:
        mapped = segment_mappings()
        assert mapped and all("memfd" not in m for m in mapped)
        got = [p[i] for i in (0, 39, 5, 6, 7, 20)]
        poller = getattr(getattr(p._m.backend, "poller", None), "selector", None)  # made at the first wait
        assert poller is not None, "lazyseq's wait did not take the selectors path"
        assert [i for _, i in got] == [0, 39, 5, 6, 7, 20]
        assert all(a.shape == (64, 64) and (a == i).all() for a, i in got)
        assert p.stats()["bytes_shm"] > 0  # arrays came through the slots
        del got


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_prefetch_errors_crash_and_close_with_every_fallback(macos_like, ctx):
    with ls.prefetch(ls.smap(fails_on_7, range(20)), nworkers=2, method="process", mp_context=ctx) as p:
        assert p[6] == 6
        with pytest.raises(ls.EvaluationError, match="seven") as e:
            p[7]
        assert e.value.item == 7
        assert p[8] == 8
    with pytest.raises(ls.PrefetchClosed):
        p[0]
    p = ls.prefetch(ls.smap(dies_on_5, range(20)), nworkers=2, method="process", mp_context=ctx)
    try:
        with pytest.raises(ls.WorkerCrashed, match="exited with code 9"):
            list(p)
    finally:
        p.close()


def test_dataloader_with_every_fallback_and_spawn(macos_like):
    data = [(np.full((3, 4), i, np.float32), i) for i in range(50)]
    loader = ls.DataLoader(data, batch_size=8, shuffle=True, seed=1, num_workers=2, to_tensor=False,
                           multiprocessing_context="spawn", persistent_workers=True)
    with loader:
        epochs = [[(x.copy(), y.copy()) for x, y in loader] for _ in range(2)]
    for batches in epochs:
        labels = np.concatenate([y for _, y in batches])
        assert sorted(labels.tolist()) == list(range(50))
        assert all((x == y[:, None, None]).all() for x, y in batches)
    assert [y.tolist() for _, y in epochs[0]] != [y.tolist() for _, y in epochs[1]]  # reshuffled per epoch


def test_spawn_as_the_default_start_method_with_every_fallback(tmp_path):
    """As on macOS: spawn is the platform's default, so a prefetch and a DataLoader that name no
    context use it (in a fresh interpreter, where the default can still be set)."""
    script = textwrap.dedent("""
        import multiprocessing, os
        import numpy as np
        import lazyseq as ls

        def double(x):
            return 2 * x

        if __name__ == "__main__":
            multiprocessing.set_start_method("spawn")
            with ls.prefetch(ls.smap(double, range(30)), nworkers=2, method="process") as p:
                assert list(p) == [2 * x for x in range(30)]
                assert p._m.backend.method == "spawn", p._m.backend.method
            loader = ls.DataLoader([np.float32(i) for i in range(20)], batch_size=5, num_workers=2, to_tensor=False)
            assert [b.tolist() for b in loader] == [[5.0 * k + j for j in range(5)] for k in range(4)]
            assert not multiprocessing.active_children()
            print("ok")
    """)
    path = tmp_path / "spawn_default.py"
    path.write_text(script)
    env = dict(os.environ, LAZYSEQ_FORCE_FALLBACKS="all")
    proc = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr



def test_spawn_hands_the_segment_over_without_scm_rights(macos_like, monkeypatch):
    """spawn passes the segment's descriptor at exec (pass_fds): no descriptor passing over a
    socket (SCM_RIGHTS), which forkserver needs and systems without it lack."""
    from multiprocessing import reduction

    def no_scm_rights(*a, **k):
        raise AssertionError("SCM_RIGHTS used")

    monkeypatch.setattr(reduction, "HAVE_SEND_HANDLE", False)
    monkeypatch.setattr(reduction, "sendfds", no_scm_rights)
    monkeypatch.setattr(reduction, "recvfds", no_scm_rights)
    with ls.prefetch(ls.smap(image, range(12)), nworkers=2, method="process", mp_context="spawn",
                     shm_size=1 << 20) as p:
        assert [int(a[0, 0]) for a, _ in p] == list(range(12))
        assert p.stats()["bytes_shm"] > 0
