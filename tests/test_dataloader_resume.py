"""Resuming a DataLoader mid-epoch with another world_size (issue #11): the ranks after the resume
read exactly what the ranks before it left of the epoch's global order."""

import itertools
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls


def loaders(n, world_size, **kw):
    return [ls.DataLoader(list(range(n)), rank=r, world_size=world_size, to_tensor=False, **kw)
            for r in range(world_size)]


class Read(list):
    """The items read, and ``state``: rank 0's state_dict while its iteration was live (after it,
    the loader stands at the next epoch: PyTorch's rule for an iteration left early)."""
    state: dict


def run(ranks, steps=None):
    """Every rank reads ``steps`` batches in lockstep (all of the epoch if None): the items read."""
    its = [iter(loader) for loader in ranks]
    read = Read()
    for _ in itertools.count() if steps is None else range(steps):
        got = [next(it, None) for it in its]
        if all(b is None for b in got):
            break
        read += [int(x) for b in got if b is not None for x in b]
    read.state = ranks[0].state_dict()
    for it in its:
        it.close()
    return read


def global_order(n, seed, epoch, shuffle):
    return [int(i) for i in ls.shuffle(range(n), seed, epoch)] if shuffle else list(range(n))


def expected_after(n, order, position, world_size, batch_size, drop_last):
    """What the resumed ranks read: the rest of the order, less (with drop_last) its last
    ``(n - position) % (world_size * batch_size)`` items."""
    rest = order[position:]
    if drop_last:
        rest = rest[: len(rest) - len(rest) % (world_size * batch_size)]
    return rest


def resume_case(n, bs, before, after, steps, shuffle, drop_last, seed=3, epoch=0):
    kw = dict(batch_size=bs, shuffle=shuffle, drop_last=drop_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # uneven ranks warn: these tests build them on purpose
        first = loaders(n, before, seed=seed, **kw)
        for loader in first:
            loader.set_epoch(epoch)
        read_before = run(first, steps)
        state = read_before.state  # rank 0's: it has at least as many batches as any rank
        second = loaders(n, after, seed=None, **kw)  # no seed given: the state brings the saved one
    for loader in second:
        loader.load_state_dict(state)
    read_after = run(second)
    return read_before, read_after, state, second


CASES = [(1, 2), (2, 3), (4, 1), (3, 2), (2, 2), (1, 4)]


@pytest.mark.parametrize("before,after", CASES)
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("steps", [1, 2])
def test_resume_with_another_world_size_reads_the_rest_of_the_epoch_once(before, after, shuffle, drop_last, steps):
    n, bs = 37, 3
    read_before, read_after, state, _ = resume_case(n, bs, before, after, steps, shuffle, drop_last)
    order = global_order(n, 3, 0, shuffle)
    assert state["epoch"] == 0 and state["position"] == before * steps * bs  # mid-epoch
    assert sorted(read_before) == sorted(order[: state["position"]])  # the prefix was read, each once
    assert sorted(read_after) == sorted(expected_after(n, order, state["position"], after, bs, drop_last))
    union = read_before + read_after
    assert len(union) == len(set(union))
    if not drop_last:
        assert sorted(union) == list(range(n))


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 60), bs=st.integers(1, 5), before=st.integers(1, 4), after=st.integers(1, 4),
       steps=st.integers(0, 12), shuffle=st.booleans(), drop_last=st.booleans(), epoch=st.integers(0, 3))
def test_any_resume_reads_each_item_at_most_once_and_all_without_drop_last(n, bs, before, after, steps, shuffle,
                                                                          drop_last, epoch):
    read_before, read_after, state, second = resume_case(n, bs, before, after, steps, shuffle, drop_last, epoch=epoch)
    order = global_order(n, 3, epoch, shuffle)
    if state["epoch"] == epoch + 1:  # rank 0 had read its whole part: the next epoch, from its start
        assert state["position"] == 0
        full = loaders(n, after, seed=3, batch_size=bs, shuffle=shuffle, drop_last=drop_last)
        for loader in full:
            loader.set_epoch(epoch + 1)
        assert read_after == run(full)
        return
    position = state["position"]
    assert state["epoch"] == epoch and position == before * steps * bs and (position < n or steps == 0)
    assert sorted(read_before) == sorted(order[:position])
    want = expected_after(n, order, position, after, bs, drop_last)
    assert sorted(read_after) == sorted(want)
    assert len(set(read_before + read_after)) == len(read_before) + len(read_after)
    for loader in second:  # the resumed part read to its end: each new rank is at the next epoch's start
        assert loader.epoch == epoch + 1 and loader.state_dict()["position"] == 0


def test_resumed_ranks_take_strided_parts_of_the_rest_and_the_next_epoch_is_whole():
    n, bs = 20, 2
    order = global_order(n, 5, 0, True)
    first = loaders(n, 2, batch_size=bs, shuffle=True, seed=5)
    state = run(first, 2).state  # 2 ranks x 2 batches x 2 items: 8 items
    assert {k: state[k] for k in ("epoch", "position", "seed", "rank", "world_size")} == \
        {"epoch": 0, "position": 8, "seed": 5, "rank": 0, "world_size": 2}
    assert state["fingerprint"] == ls.fingerprint(list(range(n))) and state["seed_given"]
    second = loaders(n, 3, batch_size=bs, shuffle=True, seed=None)  # the state brings seed 5
    for loader in second:
        loader.load_state_dict(state)
    parts = [[[int(x) for x in b] for b in loader] for loader in second]
    rest = order[8:]
    assert parts == [[rest[r::3][i : i + bs] for i in range(0, len(rest[r::3]), bs)] for r in range(3)]
    fresh = loaders(n, 3, batch_size=bs, shuffle=True, seed=5)
    for loader in fresh:
        loader.set_epoch(1)
    assert [[list(b) for b in loader] for loader in second] == [[list(b) for b in loader] for loader in fresh]


def test_resume_twice_through_three_world_sizes():
    n, bs = 50, 2
    a = loaders(n, 2, batch_size=bs, shuffle=True, seed=1)
    seen = run(a, 3)
    b = loaders(n, 3, batch_size=bs, shuffle=True, seed=1)
    for loader in b:
        loader.load_state_dict(seen.state)
    part = run(b, 2)
    seen += part
    state = part.state
    assert state["position"] == 12 + 12
    c = loaders(n, 1, batch_size=bs, shuffle=True, seed=1)
    c[0].load_state_dict(state)
    seen += run(c)
    assert sorted(seen) == list(range(n)) and len(seen) == n


def test_resume_with_another_batch_size():
    n = 30
    first = loaders(n, 1, batch_size=4, shuffle=True, seed=2)
    before = run(first, 3)
    resumed = loaders(n, 2, batch_size=5, shuffle=True, seed=2)
    for loader in resumed:
        loader.load_state_dict(before.state)
    after = run(resumed)
    assert len(before) == 12 and sorted(before + after) == list(range(n))


@pytest.mark.parametrize("before,after", [(2, 3), (3, 1)])
def test_resume_with_a_batch_sampler_counts_its_lists(before, after):
    lists = [[i, i + 1] for i in range(0, 24, 2)]  # 12 batches of the batch_sampler: the global order
    first = loaders(24, before, batch_sampler=lists)
    got = run(first, 2)
    state = got.state
    assert state["position"] == before * 2
    second = loaders(24, after, batch_sampler=lists)
    for loader in second:
        loader.load_state_dict(state)
    rest = run(second)
    assert sorted(got + rest) == list(range(24))
    assert sorted(got) == sorted(x for b in lists[: before * 2] for x in b)


def test_same_world_size_resumes_the_exact_batches():
    data = list(range(29))
    kw = dict(batch_size=3, shuffle=True, seed=4, rank=1, world_size=2, drop_last=True, to_tensor=False)
    ref = [list(b) for b in ls.DataLoader(data, **kw)]
    loader = ls.DataLoader(data, **kw)
    it = iter(loader)
    seen = [list(next(it)) for _ in range(2)]
    resumed = ls.DataLoader(data, **{**kw, "seed": None})  # no seed given: the state's
    resumed.load_state_dict(loader.state_dict())
    assert seen + [list(b) for b in resumed] == ref


def test_a_state_saved_before_positions_still_loads():
    data = list(range(20))
    kw = dict(batch_size=4, shuffle=True, seed=7, to_tensor=False)
    ref = [list(b) for b in ls.DataLoader(data, **kw)]
    resumed = ls.DataLoader(data, **kw)
    resumed.load_state_dict({"epoch": 0, "batch": 2, "seed": 7, "rank": 0, "world_size": 1})
    assert [list(b) for b in resumed] == ref[2:]


def test_a_state_past_the_epoch_is_refused():
    loader = ls.DataLoader(list(range(10)), batch_size=2, to_tensor=False)
    with pytest.raises(ValueError, match="item 11 of epoch 0, but an epoch of this loader has 10 items"):
        loader.load_state_dict({"epoch": 0, "position": 11, "seed": 0, "rank": 0, "world_size": 1})


@pytest.mark.parametrize("workers", [0, 2])
def test_persistent_workers_resume_with_another_world_size_then_keep_their_processes(workers):
    n, bs = 40, 4
    first = loaders(n, 2, batch_size=bs, shuffle=True, seed=6)
    state = run(first, 2).state
    ref = loaders(n, 3, batch_size=bs, shuffle=True, seed=6)
    for loader in ref:
        loader.load_state_dict(state)
    want = [[[list(b) for b in loader] for _ in range(2)] for loader in ref]  # the rest of epoch 0, epoch 1
    kw = dict(num_workers=2, persistent_workers=True) if workers else {}
    got = []
    for r in range(3):
        with ls.DataLoader(list(range(n)), batch_size=bs, shuffle=True, rank=r, world_size=3, to_tensor=False,
                           **kw) as loader:
            loader.load_state_dict(state)
            got.append([[list(b) for b in loader]])
            pids = loader.stats().get("worker_pids")
            got[-1].append([list(b) for b in loader])
            assert pids == loader.stats().get("worker_pids")
    assert got == want


def test_persistent_workers_read_any_epoch_set_and_restart_only_before_their_first():
    data = list(range(24))
    kw = dict(batch_size=5, shuffle=True, seed=3, to_tensor=False)
    ref = ls.DataLoader(data, **kw)
    want = [[list(b) for b in ref] for _ in range(4)]
    with ls.DataLoader(data, num_workers=2, persistent_workers=True, **kw) as loader:
        loader.set_epoch(1)
        got = [[list(b) for b in loader] for _ in range(2)]  # epochs 1, 2
        pids = loader.stats()["worker_pids"]
        loader.set_epoch(1)  # back, to an epoch of the workers' view: the same workers
        got.append([list(b) for b in loader])
        loader.set_epoch(3)
        got.append([list(b) for b in loader])
        assert loader.stats()["worker_pids"] == pids
        loader.set_epoch(0)  # before the epoch they started at: new workers
        got.append([list(b) for b in loader])
        assert loader.stats()["worker_pids"] != pids
    assert got == [want[1], want[2], want[1], want[3], want[0]]
