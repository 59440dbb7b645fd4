"""smap/starmap with a seed: item i gets its own generator, a pure function of (seed, i)."""

from __future__ import annotations

import pickle
import random

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.views.mapping import ItemSeed, seed_key


def draw(x, rng):
    """A module-level f (process workers unpickle it by name): the item and three draws."""
    return (x, *rng.integers(0, 2**62, size=3).tolist())


def pair(a, b, rng):
    return (a, b, rng.random())


def fails_on_3(x, rng):
    if x == 3:
        raise ValueError("three")
    return rng.random()


SRC = list(range(40))


def reference(seed):
    """Every item read alone, in order, from a fresh view."""
    return [ls.smap(draw, SRC, seed=seed)[i] for i in range(len(SRC))]


def test_same_numbers_whatever_the_read():
    ref = reference(5)
    m = ls.smap(draw, SRC, seed=5)
    assert [x[0] for x in ref] == SRC
    assert list(m) == ref
    assert m._get_many(list(range(40))) == ref
    assert m._get_each(list(range(40))) == ref
    order = list(range(40))
    random.Random(0).shuffle(order)
    assert [m[i] for i in order] == [ref[i] for i in order]
    assert m._get_many(order) == [ref[i] for i in order]
    assert list(m[order]) == [ref[i] for i in order]
    assert list(m[::-3]) == ref[::-3]
    assert m[-1] == ref[-1] and m[np.int64(7)] == ref[7]
    assert [m[i] for i in range(40)] == ref  # reading again gives the same numbers


def test_bulk_read_of_a_bulk_source():
    """A source with its own bulk read (a view) and several sources."""
    src = ls.smap(lambda x: x * 10, ls.arange(30))
    m = ls.smap(draw, src, seed=(1, 2))
    idx = [29, 0, 5, 5, 17]
    assert m._get_many(idx) == [m[i] for i in idx] == m._get_each(idx)
    two = ls.smap(pair, src, ls.arange(100, 125), seed=3)
    assert len(two) == 25
    assert two._get_many(idx[1:]) == [two[i] for i in idx[1:]] == two._get_each(idx[1:])
    assert two[4][:2] == (40, 104)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_same_numbers_in_workers(method):
    ref = reference(11)
    with ls.prefetch(ls.smap(draw, SRC, seed=11), nworkers=2, method=method, timeout=60) as p:
        assert list(p) == ref
        assert [p[i] for i in (39, 2, 17, 2)] == [ref[i] for i in (39, 2, 17, 2)]


def test_indices_seeds_and_epochs_differ():
    ref = reference(5)
    draws = [x[1:] for x in ref]
    assert len(set(draws)) == len(draws)  # 3 draws of 62 bits: a repeat means shared streams
    other = [x[1:] for x in reference(6)]
    assert all(a != b for a, b in zip(draws, other))
    epochs = [[x[1:] for x in reference((5, e))] for e in range(3)]
    assert all(a != b for e1 in range(3) for e2 in range(e1) for a, b in zip(epochs[e1], epochs[e2]))
    assert reference(5) == reference((5,)) == reference([5]) == reference(np.int64(5))


def test_draws_look_uniform_and_uncorrelated():
    m = ls.smap(lambda x, rng: rng.random(), range(4000), seed=0)
    u = np.array(m._get_many(range(4000)))
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 1 / 12) < 0.01
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.06  # neighbouring items: independent streams
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert hist.min() > 320 and hist.max() < 480


def test_smap_after_the_shuffle_draws_anew_each_epoch():
    """The index is the smap's own: after a shuffle, a source item meets other numbers each epoch."""
    def noise(x, rng):
        return (x, rng.random())

    def per_item(seq):
        return dict(seq)

    after = [per_item(ls.smap(noise, ls.shuffle(range(50), seed=1, epoch=e), seed=9)) for e in range(2)]
    assert sum(after[0][x] == after[1][x] for x in range(50)) <= 2  # (a shuffle may fix an item or two)
    before = [per_item(ls.shuffle(ls.smap(noise, range(50), seed=9), seed=1, epoch=e)) for e in range(2)]
    assert before[0] == before[1]  # mapped before the shuffle: the same numbers every epoch


def test_starmap_and_keyword_forms():
    pairs = [(1, 2), (3, 4), (5, 6)]
    s = ls.starmap(pair, pairs, seed=4)
    assert [x[:2] for x in s] == pairs
    assert list(s) == s._get_many([0, 1, 2]) == s._get_each([0, 1, 2])
    assert [x[2] for x in s] == [x[2] for x in ls.smap(lambda p, rng: pair(*p, rng=rng), pairs, seed=4)]
    kw = ls.smap(lambda x, **kw: kw["rng"].random(), [0, 1], seed=4)
    assert kw[1] == kw[1]


def test_errors_name_the_item_and_keep_the_others():
    m = ls.smap(fails_on_3, range(6), seed=0)
    with pytest.raises(ls.EvaluationError, match=r"item 3 of smap\(fails_on_3, seed=0\)") as info:
        m[3]
    assert isinstance(info.value.__cause__, ValueError)
    got = m._get_each(range(6))
    assert [type(x).__name__ for x in got].count("Failed") == 1
    assert [x for k, x in enumerate(got) if k != 3] == [m[k] for k in (0, 1, 2, 4, 5)]
    with pytest.raises(ls.EvaluationError, match="item 3"):
        m._get_many(range(6))


@pytest.mark.parametrize("seed, exc", [
    (-1, ValueError), ((1, -2), ValueError), ((), ValueError), (1.5, TypeError), ("3", TypeError),
    (True, TypeError), ((1, 2.0), TypeError), (None, None),
])
def test_bad_seeds(seed, exc):
    if exc is None:  # no seed: f is called without rng
        assert list(ls.smap(abs, [-1], seed=seed)) == [1]
        return
    with pytest.raises(exc, match="seed"):
        ls.smap(draw, SRC, seed=seed)
    with pytest.raises(exc, match="starmap: seed"):
        ls.starmap(pair, [(1, 2)], seed=seed)


def test_f_without_rng_is_refused_at_once():
    with pytest.raises(TypeError, match="takes no rng keyword"):
        ls.smap(lambda x: x, SRC, seed=1)
    with pytest.raises(TypeError, match="takes no rng keyword"):
        ls.smap(lambda x, rng, /: x, SRC, seed=1)  # positional-only: rng=... would fail
    assert ls.smap(lambda x, *, rng: x, SRC, seed=1)[3] == 3


def test_repr_and_pickles():
    m = ls.smap(draw, SRC, seed=(3, 1))
    assert m.describe() == "smap(draw, seed=(3, 1))"
    assert repr(ls.starmap(pair, [(1, 2)], seed=2)).startswith("starmap(pair, seed=2)  len=1")
    ref = list(m)
    assert list(pickle.loads(pickle.dumps(m))) == ref
    lam = ls.smap(lambda x, rng: rng.random(), SRC, seed=3)
    assert list(pickle.loads(cloudpickle.dumps(lam))) == list(lam)


def test_huge_indices_and_the_seed_sequence_protocol():
    endless = ls.smap(lambda x, rng: rng.random(), ls.repeat(0), seed=1)
    assert endless[2**130] == endless[2**130] != endless[2**130 + 1]
    key = seed_key("smap", (1,))
    s = ItemSeed(key, 7)
    w32, w64 = s.generate_state(8), s.generate_state(4, np.uint64)
    assert w32.dtype == np.uint32 and w64.dtype == np.uint64 and w64.tobytes() == w32.tobytes()
    assert len(s.generate_state(40, np.uint64)) == 40  # past one digest: expanded by SeedSequence
    with pytest.raises(TypeError, match="uint32 or uint64"):
        s.generate_state(2, np.float64)
    children = ls.smap(lambda x, rng: [g.random() for g in rng.spawn(2)], [0, 1], seed=1)
    assert children[1] == children[1] and children[0] != children[1] and len(set(children[0])) == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 59), max_size=30), st.integers(0, 2**40))
def test_any_order_any_chunks(idx, seed):
    m = ls.smap(lambda x, rng: (x, rng.integers(2**40)), range(60), seed=seed)
    ref = {i: ls.smap(lambda x, rng: (x, rng.integers(2**40)), range(60), seed=seed)[i] for i in set(idx)}
    assert m._get_many(idx) == [ref[i] for i in idx] == [m[i] for i in idx]
