"""How much of an epoch the caller starved (issue #35): the time inside next() over the epoch's wall
time, near 0 when the loader keeps ahead, near 1 when every batch is computed on demand, with a hint."""

import time

import lazyseq


def _slow(i):
    time.sleep(0.004)
    return i


def test_a_loader_that_keeps_ahead_starves_little():
    with lazyseq.DataLoader(list(range(64)), batch_size=4, num_workers=2, method="thread", to_tensor=False) as loader:
        for _ in loader:
            time.sleep(0.02)  # the training step: the workers have the next batch ready
        last = loader.stats()["last_epoch"]
    assert last["starved"] < 0.1 and last["hint"] is None
    assert 15 * 0.02 <= last["wall_s"]  # to the last batch delivered: its step comes after
    assert last["wait_s"] < 0.1 * last["wall_s"]
    assert "starved" in repr(loader) and "would help" not in repr(loader)


def test_a_loader_computing_each_batch_on_demand_starves_and_says_why():
    loader = lazyseq.DataLoader(lazyseq.smap(_slow, range(40)), batch_size=4, to_tensor=False)
    assert "starved" not in repr(loader)  # no epoch yet
    for _ in loader:
        pass
    last = loader.stats()["last_epoch"]
    assert last["starved"] > 0.9 and last["wait_s"] >= 40 * 0.004
    assert last["hint"].startswith("no workers computed ahead")
    assert "last epoch 0: starved" in repr(loader) and "num_workers > 0 would help" in repr(loader)


def test_busy_workers_are_named_as_the_limit():
    with lazyseq.DataLoader(lazyseq.smap(_slow, range(80)), batch_size=4, num_workers=2, method="thread",
                            to_tensor=False) as loader:
        for _ in loader:
            pass
        last = loader.stats()["last_epoch"]
    assert last["starved"] > 0.5
    assert "the workers were busy" in last["hint"] and "more workers or a cheaper pipeline would help" in last["hint"]


def test_time_before_the_first_next_is_not_counted_as_waiting():
    loader = lazyseq.DataLoader(list(range(8)), batch_size=4, to_tensor=False)
    it = iter(loader)
    time.sleep(0.2)  # the caller's own time, before asking
    list(it)
    last = loader.stats()["last_epoch"]
    assert last["wall_s"] >= 0.2 and last["wait_s"] < 0.05 and last["starved"] < 0.25
