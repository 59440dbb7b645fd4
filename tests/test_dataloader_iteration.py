"""PyTorch's iteration rules (issue #34): each iter() is an epoch from its first batch; one left
early makes the next iter() the next epoch; state_dict() while live is exact; a newer iter()
ends a live one; in_order=False delivers the planned batches in completion order, exactly once."""

import functools
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls

KW = dict(batch_size=3, shuffle=True, seed=11, to_tensor=False)
N = 20  # 7 batches of 3 (the last of 2)


def epoch_of(loader, e):
    return [[int(x) for x in b] for b in loader.make_sequence(e)]


def ints(b):
    return [int(x) for x in b]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_peek_does_not_shorten_the_next_epoch(workers):
    with ls.DataLoader(list(range(N)), num_workers=workers, **KW) as loader:
        peek = ints(next(iter(loader)))
        assert peek == epoch_of(loader, 0)[0]
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (1, 0)  # the peeked epoch is over, as in PyTorch
        assert [ints(b) for b in loader] == epoch_of(loader, 1)
        assert [ints(b) for b in loader] == epoch_of(loader, 2)


@pytest.mark.parametrize("how", ["break", "user_error", "close"])
def test_an_iteration_left_early_makes_the_next_one_the_next_epoch(how):
    loader = ls.DataLoader(list(range(N)), **KW)
    it = iter(loader)
    got = [ints(next(it)) for _ in range(2)]
    if how == "close":
        it.close()
    elif how == "break":
        del it
        for _b in loader:
            break  # the loop's iterator dropped with the loop
    else:
        del it
        with pytest.raises(ZeroDivisionError):
            for b in loader:
                raise ZeroDivisionError(len(b))  # an error in the user's loop, not in the loader
    assert got == epoch_of(loader, 0)[:2]
    e = 1 if how == "close" else 2
    assert {k: loader.state_dict()[k] for k in ("epoch", "position")} == {"epoch": e, "position": 0}
    assert [ints(b) for b in loader] == epoch_of(loader, e)


def test_an_iterator_dropped_before_its_first_batch_leaves_the_epoch_whole():
    loader = ls.DataLoader(list(range(N)), **KW)
    it = iter(loader)
    assert len(it) == 7
    del it
    assert [ints(b) for b in loader] == epoch_of(loader, 0)


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_state_dict_while_live_resumes_exactly_there(workers, persistent):
    kw = dict(KW, num_workers=workers, persistent_workers=persistent)
    with ls.DataLoader(list(range(N)), **kw) as loader:
        want = epoch_of(loader, 0)
        it = iter(loader)
        seen = [ints(next(it)) for _ in range(3)]
        state = loader.state_dict()  # live: exactly after batch 2
        assert (state["epoch"], state["position"]) == (0, 9)
        it.close()
        assert loader.state_dict()["epoch"] == 1  # left early: the next epoch
        loader.load_state_dict(state)  # ... unless the state says otherwise
        assert seen + [ints(b) for b in loader] == want
    with ls.DataLoader(list(range(N)), **{**kw, "seed": None}) as resumed:  # the state brings the seed
        resumed.load_state_dict(state)
        assert [ints(b) for b in resumed] == want[3:]
        assert [ints(b) for b in resumed] == epoch_of(resumed, 1)


def test_a_newer_iteration_ends_the_live_one_and_no_batch_comes_twice():
    loader = ls.DataLoader(list(range(N)), **KW)
    first = iter(loader)
    a = ints(next(first))
    second = iter(loader)
    with pytest.raises(RuntimeError, match="a newer iteration of this DataLoader started"):
        next(first)
    with pytest.raises(RuntimeError, match=r"epoch 0\) has ended"):
        next(first)  # and stays ended
    rest = [ints(b) for b in second]
    assert a == epoch_of(loader, 0)[0] and rest == epoch_of(loader, 1)  # the earlier one counted as left early
    assert "ended" in repr(first) and "live" not in repr(first)


@pytest.mark.parametrize("call", ["set_epoch", "load_state_dict"])
def test_set_epoch_and_load_state_dict_end_a_live_iteration(call):
    loader = ls.DataLoader(list(range(N)), **KW)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    loader.set_epoch(5) if call == "set_epoch" else loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match=f"{call}\\(\\) was called"):
        next(it)
    assert [ints(b) for b in loader] == epoch_of(loader, 5 if call == "set_epoch" else 0)


def _fails_once(flag, i):
    import os

    if i == 7 and not os.path.exists(flag):
        open(flag, "w").close()
        raise ValueError("item 7 fails once")
    return i


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failure_inside_the_loader_resumes_at_the_first_batch_not_delivered(tmp_path, workers):
    data = ls.smap(functools.partial(_fails_once, str(tmp_path / "failed")), range(N))
    kw = dict(KW, shuffle=False, num_workers=workers)
    with ls.DataLoader(data, **kw) as loader:
        seen = []
        with pytest.raises(Exception, match="item 7 fails once"):
            for b in loader:
                seen.append(ints(b))
        assert seen == [[0, 1, 2], [3, 4, 5]]
        assert loader.state_dict()["position"] == 6
        assert [ints(b) for b in loader] == [list(range(i, min(i + 3, N))) for i in range(6, N, 3)]


# -- in_order=False --------------------------------------------------------------------------------
def _slow_first(i):
    time.sleep(0.4 if i < 3 else 0.01)  # batch 0 is slow: later ones overtake it
    return i


@pytest.mark.parametrize("method,persistent", [("process", False), ("thread", False), ("process", True)])
def test_in_order_false_delivers_each_planned_batch_once_in_completion_order(method, persistent):
    data = ls.smap(_slow_first, range(N))
    kw = dict(KW, shuffle=False, num_workers=2, method=method, persistent_workers=persistent)
    with ls.DataLoader(data, in_order=False, **kw) as loader:
        want = epoch_of(loader, 0)
        got = [ints(b) for b in loader]
        assert sorted(got) == sorted(want) and len(got) == len(want)  # each planned batch, once
        assert got[0] != want[0]  # the slow first batch was overtaken
        assert loader.state_dict()["epoch"] == 1
        assert sorted(ints(b) for b in loader) == sorted(epoch_of(loader, 1))


def test_in_order_false_state_dict_is_exact_and_resumes_without_repeats():
    data = ls.smap(_slow_first, range(N))
    kw = dict(KW, shuffle=False, num_workers=2)
    with ls.DataLoader(data, in_order=False, **kw) as loader:
        want = epoch_of(loader, 0)
        it = iter(loader)
        seen = [ints(next(it)) for _ in range(3)]
        state = loader.state_dict()
        it.close()
    assert [0, 1, 2] not in seen  # batch 0 still pending: the position stays at item 0
    assert state["position"] == 0 and sorted(state["delivered"]) == sorted(want.index(b) for b in seen)
    with ls.DataLoader(data, in_order=False, **{**kw, "seed": None}) as resumed:
        resumed.load_state_dict(state)
        rest = [ints(b) for b in resumed]
    assert sorted(seen + rest) == sorted(want) and len(seen) + len(rest) == len(want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        other = ls.DataLoader(data, **{**kw, "batch_size": 4})
    with pytest.raises(ValueError, match="delivered out of order past its position with world_size=1, batch_size=3"):
        other.load_state_dict(state)
    with pytest.warns(RuntimeWarning, match="read those batches' items again"):
        other.load_state_dict(state, strict=False)
    assert sorted(x for b in other for x in ints(b)) == list(range(N))


def test_in_order_false_without_workers_is_in_order():
    loader = ls.DataLoader(list(range(N)), in_order=False, **KW)
    assert [ints(b) for b in loader] == epoch_of(loader, 0)


# -- the rules as a model ----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=6))
def test_any_sequence_of_partial_iterations_follows_the_epoch_model(program):
    """Each step reads k batches from a new iterator, then saves the state while live and resumes
    a new loader from it (``save``) or leaves the iterator: the batches are always those of the
    model's epoch from its position, and a left iterator moves the model to the next epoch."""
    loader = ls.DataLoader(list(range(N)), **KW)
    epoch, pos = 0, 0  # the model: the epoch and batch the next iteration starts at
    for k, save in program:
        it = iter(loader)
        got = [ints(b) for _, b in zip(range(k), it)]
        want = epoch_of(loader, epoch)[pos : pos + k]
        assert got == want
        if save and 0 < len(got) < 7 - pos:
            state = loader.state_dict()
            loader = ls.DataLoader(list(range(N)), **KW)
            loader.load_state_dict(state)
            epoch, pos = epoch, pos + len(got)
        elif got or pos + len(got) >= 7:
            epoch, pos = epoch + 1, 0
        it.close()
