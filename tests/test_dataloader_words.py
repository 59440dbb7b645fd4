"""The DataLoader says things in its own terms (issue #20): a dead worker's ``WorkerCrashed`` names
the batches and says to iterate again (or the missing ``__main__`` guard); the shared-memory
warnings name ``shm_size`` and ``prefetch_factor`` and point at the user's line; ``stats()`` keeps
the last epoch's counters and the items ``on_error`` replaced in the workers; the slot size is one
number, explained; a loader that makes Tensors without tinygrad is refused when built."""

import functools
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import lazyseq

ROOT = Path(__file__).resolve().parents[1]


def _crash_on_file(path, at, i):
    if i == at and not os.path.exists(path):
        open(path, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return i


# -- 1. a dead worker ----------------------------------------------------------------------------------
@pytest.mark.parametrize("persistent", [False, True])
def test_a_crash_names_the_batches_and_says_to_iterate_again(tmp_path, persistent):
    # 100 batches an epoch: persistent workers do not compute item 30 of the next epoch (batch 7 too) first
    data = lazyseq.smap(functools.partial(_crash_on_file, str(tmp_path / "crashed"), 30), range(400))
    loader = lazyseq.DataLoader(data, batch_size=4, num_workers=2, to_tensor=False, persistent_workers=persistent)
    seen = []
    with pytest.raises(lazyseq.WorkerCrashed) as info:
        for b in loader:
            seen.append(b.tolist())
    e, message = info.value, str(info.value)
    assert e.exitcode == -signal.SIGKILL and e.pid is not None and 7 in e.items  # item 30 is in batch 7
    assert message.startswith("DataLoader: worker ") and f"(pid {e.pid}) was killed by signal SIGKILL" in message
    lo, hi = re.search(r"while computing batch(?:es)? ([0-9]+)(?:-([0-9]+))? of epoch 0\. ", message).groups()
    assert int(lo) <= 7 <= int(hi or lo), message  # batch 7, with its chunk-mates
    assert (f"Iterate the loader again (for batch in loader): it resumes at batch {len(seen)} of epoch 0, the first "
            "batch not delivered, with new workers") in message
    assert "prefetch" not in message and "create a new one" not in message
    rest = [b.tolist() for b in loader]  # as it says
    assert seen + rest == [list(range(i, i + 4)) for i in range(0, 400, 4)]
    loader.close()


def test_a_plain_prefetch_names_the_items_a_dead_worker_was_computing(tmp_path):
    data = lazyseq.smap(functools.partial(_crash_on_file, str(tmp_path / "crashed"), 30), range(200))
    with lazyseq.prefetch(data, 1, "process", max_buffered=2) as p:
        with pytest.raises(lazyseq.WorkerCrashed) as info:
            list(p)
    e = info.value
    assert 30 in e.items and not e.starting and e.hint is None
    assert re.search(rf"prefetch worker 0 \(pid {e.pid}\) was killed by signal SIGKILL while computing items? "
                     r"[0-9]+(-[0-9]+)?; that work is lost and this prefetch is closed: create a new one", str(e))


SCRIPT = """
import os
import lazyseq

def init(worker):
    if {die}:
        os._exit(3)

{guard}loader = lazyseq.DataLoader(list(range(8)), batch_size=2, num_workers=1, multiprocessing_context="spawn",
{indent}                            to_tensor=False, worker_init_fn=init)
{indent}try:
{indent}    print(len(list(loader)))
{indent}except lazyseq.WorkerCrashed as e:
{indent}    print("crashed:", e)
"""


def _script(tmp_path, guarded: bool, die: bool) -> str:
    guard, indent = ('if __name__ == "__main__":\n    ', "    ") if guarded else ("", "")
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(guard=guard, indent=indent, die=die))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_spawn_and_no_main_guard_is_named_the_likely_cause(tmp_path):
    out = _script(tmp_path, guarded=False, die=False)
    assert out.startswith("crashed: DataLoader: worker 0 (pid "), out
    assert "exited with code 1 while starting, before its first batch; Likely cause: with the 'spawn' start " \
           f"method the workers import the main script ({tmp_path / 'train.py'}) again" in out, out
    assert 'no `if __name__ == "__main__":` guard' in out and "Put the code that runs the pipeline under" in out


def test_a_guarded_script_is_not_blamed(tmp_path):
    assert _script(tmp_path, guarded=True, die=False) == "4\n"
    out = _script(tmp_path, guarded=True, die=True)  # dies while starting, for another reason
    assert "exited with code 3 while starting, before its first batch. Iterate the loader again" in out, out
    assert "Likely cause" not in out and "__main__" not in out


# -- 2. shared-memory warnings --------------------------------------------------------------------------
def test_holding_numpy_batches_warns_in_the_loaders_terms_at_the_users_line():
    data = [np.full((32, 32), i, np.float32) for i in range(120)]
    loader = lazyseq.DataLoader(data, batch_size=4, num_workers=2, to_tensor=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)  # every batch kept: their slots with them
    assert [int(b[0, 0, 0]) for b in batches] == list(range(0, 120, 4))
    [w] = [w for w in caught if "shared-memory slot" in str(w.message)]
    message, slot = str(w.message), loader.stats()["slot_size"]
    assert w.filename == __file__ and w.lineno == batches_line(), (w.filename, w.lineno)
    assert message.startswith("DataLoader: the batches you hold keep every shared-memory slot (shm_size=")
    assert f"is 5 slots of {slot} bytes: one per batch in flight, num_workers=2 x prefetch_factor=2 + 1" in message
    assert "through the pipe: pickled and copied once more each" in message and "garbage collection" in message
    assert "keeping numpy batches (list(loader)" in message and "np.array(x)" in message and "to_tensor=True" in message
    assert "max_buffered" not in message and "prefetch:" not in message
    assert loader.stats()["last_epoch"]["prefetch"]["fallbacks"] > 0


def batches_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return 1 + next(k for k, line in enumerate(lines) if "batches = list(loader)  # every batch kept" in line)


def test_a_slot_too_small_says_what_shm_size_fits_at_the_users_line():
    data = [np.zeros((64, 64), np.float32) for _ in range(12)]
    loader = lazyseq.DataLoader(data, batch_size=4, num_workers=1, to_tensor=False, shm_size=3 * 5000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
    [w] = [w for w in caught if "needed" in str(w.message)]
    needed = 4 * 64 * 64 * 4 + 64
    fit = -(-needed // 64) * 64 * 3
    assert str(w.message) == (
        f"DataLoader: a batch needed {needed} bytes of shared memory, but shm_size=15000 is 3 slots of 4992 bytes: one "
        "per batch in flight, num_workers=1 x prefetch_factor=2 + 1. What did not fit came through the pipe (pickled: "
        f"one more copy of each such batch). Pass shm_size >= {fit} to fit it")
    assert w.filename == __file__
    assert loader.stats()["slot_size"] == 4992 == loader.stats()["last_epoch"]["prefetch"]["slot_size"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what it says fits
        fitted = lazyseq.DataLoader(data, batch_size=4, num_workers=1, to_tensor=False, shm_size=fit)
        assert len(list(fitted)) == 3 and fitted.stats()["last_epoch"]["prefetch"]["fallbacks"] == 0


def test_a_prefetch_warning_points_at_the_readers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with lazyseq.prefetch(lazyseq.smap(np.zeros, [1000] * 6), 1, "process", shm_size=1000) as p:
            items = [p[i] for i in range(6)]  # the line the warning names
    [w] = caught
    assert len(items) == 6 and w.filename == __file__ and "shm_size >= 80640 would fit" in str(w.message)
    assert Path(__file__).read_text().splitlines()[w.lineno - 1].strip().startswith("items = [p[i]")


# -- 3. stats per epoch ---------------------------------------------------------------------------------
def test_stats_keep_the_last_epochs_prefetch_counters():
    data = [np.full(16, i, np.float32) for i in range(40)]
    loader = lazyseq.DataLoader(data, batch_size=4, num_workers=2, to_tensor=False)
    assert "last_epoch" not in loader.stats()
    for _ in loader:
        pass
    s = loader.stats()
    assert "prefetch" not in s and "worker_pids" not in s  # its workers have stopped
    last = s["last_epoch"]
    assert (last["epoch"], last["batches"], last["finished"], last["skipped"]) == (0, 10, True, 0)
    assert last["prefetch"]["items"] == 10 and last["prefetch"]["bytes_shm"] == 40 * 16 * 4
    it = iter(loader)
    next(it)
    next(it)
    del it  # epoch 1 left after two batches
    last = loader.stats()["last_epoch"]
    assert (last["epoch"], last["batches"], last["finished"]) == (1, 2, False)


def test_persistent_workers_count_each_epoch_apart():
    data = [np.full(16, i, np.float32) for i in range(40)]
    epochs = []
    with lazyseq.DataLoader(data, batch_size=4, num_workers=2, to_tensor=False, persistent_workers=True) as loader:
        for _ in range(3):
            for _ in loader:
                pass
            epochs.append(loader.stats()["last_epoch"])
        p = loader.stats()["prefetch"]  # the workers' counters since they started
    assert [(e["epoch"], e["batches"], e["finished"]) for e in epochs] == [(0, 10, True), (1, 10, True), (2, 10, True)]
    # each epoch's counters are what changed while it was read (with what was computed ahead for the next)
    assert epochs[0]["prefetch"]["items"] >= 10 and p["items"] >= 30
    for key in ("items", "jobs", "bytes_shm", "bytes_pipe", "waits"):
        assert sum(e["prefetch"][key] for e in epochs) == p[key], key


# -- 4. the slot size: one number, explained ------------------------------------------------------------
def test_the_shm_note_adds_up_and_is_the_slot_the_workers_use():
    data = [(np.zeros((1, 8, 8), np.float32), np.int32(i)) for i in range(64)]  # the demo's samples
    loader = lazyseq.DataLoader(data, batch_size=32, num_workers=2, to_tensor=False, persistent_workers=True)
    with loader:
        next(iter(loader))
        s = loader.stats()
    assert s["shm"] == ("sized from the first sample: (264 bytes x batch 32 + 64 bytes of alignment x 2 arrays) x 1.25"
                        " = 10720 bytes, rounded up to whole 4096-byte pages: 12288 bytes per slot; x 5 slots "
                        "(num_workers 2 x prefetch_factor 2 + 1) = shm_size 61440")
    assert (264 * 32 + 64 * 2) * 1.25 == 10720 and 12288 == 3 * 4096 and 5 * 12288 == 61440
    assert s["shm_size"] == 61440 and s["slot_size"] == 12288 == s["prefetch"]["slot_size"]
    given = lazyseq.DataLoader(data, batch_size=32, num_workers=2, to_tensor=False, shm_size=50_000)
    assert given.stats()["shm"] == ("given: shm_size=50000 / 5 slots (num_workers 2 x prefetch_factor 2 + 1) = 10000 "
                                    "bytes, rounded down to a multiple of 64: 9984 bytes per slot")
    assert given.stats()["slot_size"] == 9984


# -- 6. no tinygrad ---------------------------------------------------------------------------------------
def test_a_loader_of_tensors_without_tinygrad_is_refused_when_built(monkeypatch):
    monkeypatch.setitem(sys.modules, "tinygrad", None)  # import tinygrad fails; find_spec says None
    with pytest.raises(ImportError) as info:
        lazyseq.DataLoader(list(range(8)), batch_size=4)
    assert str(info.value) == ("DataLoader(to_tensor=True), the default, makes tinygrad Tensors, and tinygrad is not "
                               "installed: pip install 'lazyseq[tinygrad]', or pass to_tensor='torch', 'jax' or False (numpy)")
    assert [b.tolist() for b in lazyseq.DataLoader(list(range(8)), batch_size=4, to_tensor=False)] == [[0, 1, 2, 3],
                                                                                                        [4, 5, 6, 7]]


# -- 7. on_error counts, summed over the workers ----------------------------------------------------------
def _fails_at_28_and_33(i):
    if i in (28, 33):
        raise OSError(f"sample {i} is corrupt")
    return np.full(3, i, np.int64)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("workers,method,persistent", [(0, "process", False), (2, "process", False),
                                                       (2, "process", True), (2, "thread", False),
                                                       (2, "thread", True)])
def test_items_on_error_replaced_are_counted_per_epoch(workers, method, persistent):
    data = lazyseq.on_error(lazyseq.smap(_fails_at_28_and_33, range(40)))
    with lazyseq.DataLoader(data, batch_size=4, num_workers=workers, method=method, to_tensor=False,
                            persistent_workers=persistent and workers > 0) as loader:
        skipped = []
        for epoch in range(3):
            batches = [b[:, 0].tolist() for b in loader]
            assert batches[7] == [29, 29, 30, 31] and batches[8] == [32, 34, 34, 35]  # skipped: the next item
            last = loader.stats()["last_epoch"]
            assert last["epoch"] == epoch
            skipped.append(last["skipped"])
        # persistent workers compute ahead into the next epochs: their skips count for the epoch read
        assert skipped == [2, 2, 2]


def _fails_at_3_mod_7(i):
    if i % 7 == 3:
        raise ValueError(f"sample {i} is corrupt")
    return np.full(2, i, np.int64)


@pytest.mark.parametrize("method,substitute", [("process", lazyseq.Skip), ("thread", lazyseq.Skip),
                                               ("process", np.full(2, -1, np.int64))])
def test_persistent_workers_count_each_epochs_own_skips(method, substitute):
    # drop_last with a shuffle leaves out other items each epoch: other failing items, another count.
    # The workers run ahead into the next epoch; each skip counts for the epoch of the batch that read it.
    kw = dict(batch_size=6, shuffle=True, drop_last=True, seed=2, to_tensor=False)
    twin = lazyseq.DataLoader(lazyseq.arange(40), **kw)  # the same order, nothing failing: what each epoch reads
    expected = [sum(int(i) % 7 == 3 for b in twin for i in b) for _ in range(5)]
    assert len(set(expected)) > 1, expected
    data = lazyseq.on_error(lazyseq.smap(_fails_at_3_mod_7, range(40)), substitute)
    skipped = []
    with lazyseq.DataLoader(data, num_workers=2, method=method, persistent_workers=True, **kw) as loader:
        for epoch in range(5):
            assert sum(1 for _ in loader) == 6
            last = loader.stats()["last_epoch"]
            assert (last["epoch"], last["finished"]) == (epoch, True)
            skipped.append(last["skipped"])
    assert skipped == expected
