"""mix: items from several sources in fixed proportions, checked against a plain Python model."""

from __future__ import annotations

import itertools
import math
import pickle
import random
import time
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.views.mixing import BLOCK

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the model ---------------------------------------------------------------------------------------
def shape(tree):
    """The mix's tree with its integer bookkeeping dropped: leaves and (left, right) pairs."""
    return tree if isinstance(tree, int) else (shape(tree[0]), shape(tree[1]))


def leaves(node):
    return [node] if isinstance(node, int) else leaves(node[0]) + leaves(node[1])


def model_counts(node, weights, m, out):
    """Hand ``m`` items down the tree: a node gives round(m * w_left / w) to its left child."""
    if isinstance(node, int):
        out[node] = m
        return out
    wl = sum(weights[k] for k in leaves(node[0]))
    wr = sum(weights[k] for k in leaves(node[1]))
    c = math.floor(Fraction(m) * wl / (wl + wr) + Fraction(1, 2))
    model_counts(node[0], weights, c, out)
    return model_counts(node[1], weights, m - c, out)


def model_items(mixed, weights):
    """``(source, position)`` of every item of the even rule, one after the other, for ever."""
    tree, ws = shape(mixed._rule.tree), [Fraction(w) for w in weights]
    before = model_counts(tree, ws, 0, [0] * len(ws))
    for i in itertools.count():
        after = model_counts(tree, ws, i + 1, [0] * len(ws))
        grew = [k for k in range(len(ws)) if after[k] != before[k]]
        assert len(grew) == 1 and after[grew[0]] == before[grew[0]] + 1, "counts must grow one at a time"
        yield grew[0], before[grew[0]]
        before = after


def model_table(mixed, weights, n):
    return list(itertools.islice(model_items(mixed, weights), n))


def model_length(mixed, lens, weights, stop):
    if isinstance(stop, int):
        return stop
    live = [k for k, w in enumerate(weights) if w > 0 and lens[k] is not None]
    counts = Counter()
    for n, (k, _) in enumerate(model_items(mixed, weights)):
        if stop == "first" and counts[k] == lens[k]:
            return n  # the next item would read past the end of k
        if stop == "all" and all(counts[j] >= lens[j] for j in live):
            return n
        counts[k] += 1
    raise AssertionError("unreachable")


def sources(lens):
    return [[(k, j) for j in range(n)] for k, n in enumerate(lens)]


weights_st = st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(any)


# -- the even rule -----------------------------------------------------------------------------------
@SETTINGS
@given(weights_st, st.data())
def test_even_rule_matches_the_model(weights, data):
    lens = data.draw(st.lists(st.integers(0, 40), min_size=len(weights), max_size=len(weights)))
    stop = data.draw(st.sampled_from(["first", "all", 0, 1, 97]))
    live = [k for k, w in enumerate(weights) if w > 0]
    if stop != "first" and any(lens[k] == 0 for k in live):
        lens = [max(n, 1) for n in lens]  # an empty source cannot go round: see test_errors
    m = ls.mix(sources(lens), weights, stop=stop)
    n = model_length(m, lens, weights, stop)
    assert len(m) == n
    table = model_table(m, weights, n)
    expected = [(k, j % lens[k]) for k, j in table]
    assert list(m) == expected
    assert [m[i] for i in reversed(range(n))] == expected[::-1]
    assert m._get_many(list(range(n))) == expected
    assert m.counts() == [sum(1 for k, _ in table if k == s) for s in range(len(weights))]


def check_bounds(weights, n):
    m = ls.mix([ls.repeat(k) for k in range(len(weights))], weights, stop=n)
    total, counts, worst = sum(weights), [0] * len(weights), 0.0
    bound = 0.5 if len(weights) == 2 else 1 if len(weights) == 3 else 2
    for i, k in enumerate(m):
        counts[k] += 1
        for s, w in enumerate(weights):
            err = abs(counts[s] - Fraction((i + 1) * w, total))
            worst = max(worst, err)
            assert err <= bound, f"prefix {i + 1}: source {s} has {counts[s]} of share {(i + 1) * w / total}"
    return worst


@SETTINGS
@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=2), st.integers(1, 400))
def test_two_sources_within_half_an_item_of_their_share(weights, n):
    check_bounds(weights, n)


@SETTINGS
@given(st.lists(st.integers(0, 1000), min_size=3, max_size=9).filter(any), st.integers(1, 400))
def test_many_sources_within_two_items_of_their_share(weights, n):
    check_bounds(weights, n)


def test_bounds_on_hard_weights():
    # Geometric, Fibonacci and one-heavy weights make deep, lopsided trees.
    for weights in ([2**k for k in range(12)], [1, 1, 2, 3, 5, 8, 13, 21, 34, 55], [1000] + [1] * 20,
                    [1] * 17, [5, 3, 2]):
        assert check_bounds(weights, 3000) < 2


def test_proportions_over_every_prefix_with_float_weights():
    m = ls.mix([ls.repeat(k) for k in range(3)], [0.5, 0.3, 0.2], stop=1000)
    assert m.weights == [5, 3, 2]
    c = Counter()
    for i, k in enumerate(m):
        c[k] += 1
        assert all(abs(c[s] - (i + 1) * w) < 1 for s, w in enumerate([0.5, 0.3, 0.2]))
    assert list(m[:10]) == list(m[10:20]) == list(m[990:])  # 5:3:2 repeats every 10 items


def test_exact_for_huge_indices():
    n = 10**18 + 7
    weights = [Fraction(1, 3), Fraction(1, 7), Decimal("0.25"), 2]
    m = ls.mix([range(3), range(5), range(7), range(11)], weights, stop=n)
    shares = [Fraction(1, 3), Fraction(1, 7), Fraction(1, 4), Fraction(2)]
    total = sum(shares)
    counts = m.counts(n)
    assert sum(counts) == n and all(abs(c - n * w / total) < 2 for c, w in zip(counts, shares))
    ws = [Fraction(w) for w in m.weights]
    assert counts == model_counts(shape(m._rule.tree), ws, n, [0] * 4)
    k, j = m.where(n - 1)
    assert m[n - 1] == m[-1] == j % [3, 5, 7, 11][k]
    assert m.counts(n - 1)[k] == counts[k] - 1


def test_no_table_is_built():
    t = time.perf_counter()
    m = ls.mix([ls.cycle(range(5)), range(10**15), range(3 * 10**15)], [1, 2, 3], seed=1, stop="all")
    counts = m.counts()
    assert counts[2] == 3 * 10**15 and counts[1] > 10**15 and abs(len(m) - 6 * 10**15) < 3
    assert m[-1] == m[len(m) - 1] and m._get_many([5, 10**14, 10]) == [m[5], m[10**14], m[10]]
    assert time.perf_counter() - t < 1.0


# -- seeded blocks -----------------------------------------------------------------------------------
def blocks(seq, n):
    return [list(seq[b : min(b + BLOCK, n)]) for b in range(0, n, BLOCK)]


@SETTINGS
@given(weights_st, st.data())
def test_seeded_blocks_keep_the_rule_and_shuffle_it(weights, data):
    lens = data.draw(st.lists(st.integers(1, 150), min_size=len(weights), max_size=len(weights)))
    stop = data.draw(st.sampled_from(["first", "all", 300]))
    seed = data.draw(st.integers(0, 2**64))
    even = ls.mix(sources(lens), weights, stop=stop)
    m = ls.mix(sources(lens), weights, seed=seed, epoch=data.draw(st.integers(0, 5)), stop=stop)
    n = len(m)
    assert n == len(even)
    table = model_table(even, weights, n)
    got = list(m)
    seen = Counter()
    for b, (mine, theirs) in enumerate(zip(blocks(got, n), blocks(table, n))):
        assert Counter(k for k, _ in mine) == Counter(k for k, _ in theirs)  # the rule's sources
        assert m.counts(min((b + 1) * BLOCK, n)) == even.counts(min((b + 1) * BLOCK, n))
        for k, j in mine:  # each source is read in its own order
            assert j == seen[k] % lens[k]
            seen[k] += 1
    assert stop != "first" or all(seen[k] <= lens[k] for k in seen)  # 'first' never goes round
    assert [m[i] for i in random.Random(seed).sample(range(n), n)] == \
        [got[i] for i in random.Random(seed).sample(range(n), n)]
    idx = [random.Random(seed + 1).randrange(n) for _ in range(50)] if n else []
    assert m._get_many(idx) == [got[i] for i in idx] == m._get_each(idx)


def test_seeded_order_is_random_and_a_function_of_seed_and_epoch():
    def order(seed, epoch, n=640):
        return [k for k, _ in ls.mix(sources([400, 400]), seed=seed, epoch=epoch, stop=n)]

    a = order(1, 0)
    assert a == order(1, 0) == order((1,), 0)
    assert a != order(1, 1) and a != order(2, 0) and order(1, 1) != order(1, 2)
    even = [k for k, _ in ls.mix(sources([400, 400]), stop=640)]
    assert even == [0, 1] * 320 and a != even
    # within a block the arrangement is uniform: source 0 leads a block about half the time
    leads = [order(s, 0, 64)[0] for s in range(200)]
    assert 60 < leads.count(0) < 140


def test_recipe_three_datasets_with_a_shuffle_per_epoch():
    data = [[f"a{i}" for i in range(500)], [f"b{i}" for i in range(300)], [f"c{i}" for i in range(200)]]
    epochs = []
    for epoch in range(2):
        parts = [ls.shuffle(d, seed=10 + k, epoch=epoch) for k, d in enumerate(data)]
        m = ls.mix(parts, [0.5, 0.3, 0.2], seed=0, epoch=epoch)
        epochs.append(list(m))
        assert len(m) == 1000 and sorted(m) == sorted(itertools.chain(*data))  # every item once
        for end in range(BLOCK, 1000, BLOCK):
            c = Counter(x[0] for x in epochs[-1][:end])
            assert all(abs(c[s] - end * w) < 2 for s, w in zip("abc", (0.5, 0.3, 0.2)))
    assert epochs[0] != epochs[1]


# -- stop, sources, writes ----------------------------------------------------------------------------
def test_stop_modes():
    a, b = "AAAAAA", "bbb"
    assert "".join(ls.mix([a, b])) == "AbAbAbA"  # the next item would be a fourth b
    assert "".join(ls.mix([a, b], stop="all")) == "AbAbAbAbAbA"  # b went round once
    assert "".join(ls.mix([a, b], stop=14)) == "AbAbAbAbAbAbAb"
    assert "".join(ls.mix(["abc", "xyz"])) == "axbycz"
    assert len(ls.mix(["abc", "xyz"], stop=0)) == 0
    assert list(ls.mix([[], [1, 2]], stop="first")) in ([], [1])


def test_endless_sources():
    loop = ls.cycle("xy")
    m = ls.mix([loop, "ABCD"], [1, 1])
    assert "".join(m) == "xAyBxCyDx"  # the finite source bounds it
    assert "".join(ls.mix([loop, "AB"], stop="all")) == "xAyB"
    assert "".join(ls.mix([loop, ls.repeat("-")], [2, 1], stop=6)) == "x-yx-y"
    with pytest.raises(ValueError, match="endless"):
        ls.mix([loop, ls.repeat(1)])
    with pytest.raises(ValueError, match="endless"):
        ls.mix([loop, "ab"], [1, 0], stop="all")  # a weight-0 source does not bound the mix


def test_zero_weight_sources_are_never_read():
    class Boom:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            raise AssertionError("read")

    m = ls.mix(["abc", Boom(), "xyz"], [1, 0, 1])
    assert "".join(m) == "axbycz" and m.counts() == [3, 0, 3]


def test_writes_go_to_the_owner():
    a, b = [0] * 4, [0] * 2
    m = ls.mix([a, b], [2, 1], stop=9)
    for i in range(9):
        m[i] = m[i] + 1  # b goes round: its items are written again
    assert a == [2, 2, 1, 1] and b == [2, 1]
    m[[0, 1]] = ["first", "second"]
    assert a[0] == "first" and b[0] == "second"


def test_bulk_reads_of_view_sources_and_prefetch():
    parts = [ls.smap(lambda x: x * 10, range(50)), ls.arange(1000, 1020), np.arange(-30, 0)]
    m = ls.mix(parts, [3, 1, 2], seed=2, stop="all")
    ref = [m[i] for i in range(len(m))]
    idx = list(range(len(m)))[::-1]
    assert m._get_many(idx) == ref[::-1] == m._get_each(idx)
    assert list(m[5:40:3]) == ref[5:40:3]
    with ls.prefetch(m, nworkers=2, method="thread") as p:
        assert list(p) == ref


def test_pickles_and_describes():
    m = ls.mix([range(100), range(50)], [0.7, 0.3], seed=(4, 2), epoch=1, stop="all")
    ref = list(m)
    copy = pickle.loads(pickle.dumps(m))
    assert copy._blocks == {} and list(copy) == ref
    assert m.describe() == "mix(2 sequences, weights=7:3, seed=(4, 2), epoch=1, stop='all')"
    assert repr(ls.mix(["ab", "cd"])).splitlines()[0] == "mix(2 sequences, weights=1:1, stop='first')  len=4"
    assert "weights=1:2," in ls.mix(["ab", "cd"], [1 / 3, 2 / 3]).describe()  # read as 0.333...: 0.666...
    assert "weights=0.432:0.374:0.194," in ls.mix(["a", "b", "c"], [math.pi, math.e, math.sqrt(2)]).describe()
    assert m.where(-1) == m._where(len(m) - 1)
    with pytest.raises(IndexError):
        m.where(len(m))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(weights=[1, -1]), ValueError, r"weights\[1\] is -1"),
    (dict(weights=[0, 0.0]), ValueError, "sum to zero"),
    (dict(weights=[1, float("nan")]), ValueError, "finite"),
    (dict(weights=[1, float("inf")]), ValueError, "finite"),
    (dict(weights=[1, Decimal("NaN")]), ValueError, "finite"),
    (dict(weights=[1]), ValueError, "1 weight for 2 sequences"),
    (dict(weights=[1, "2"]), TypeError, "real numbers"),
    (dict(weights=[1, True]), TypeError, "real numbers"),
    (dict(weights="12"), TypeError, "list of numbers"),
    (dict(weights=[1, 1j]), TypeError, "real numbers"),
    (dict(stop="last"), ValueError, "stop must be"),
    (dict(stop=-1), ValueError, "stop must be"),
    (dict(stop=1.5), ValueError, "stop must be"),
    (dict(stop=True), ValueError, "stop must be"),
    (dict(seed=-1), ValueError, "seed must be >= 0"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(seed="x"), TypeError, "seed must be an int"),
    (dict(seed=1, epoch=1.0), TypeError, "epoch must be None .* or an int"),
])
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ls.mix(["ab", "cd"], **kwargs)


def test_source_errors():
    with pytest.raises(ValueError, match="at least one"):
        ls.mix([])
    with pytest.raises(TypeError, match="list of sequences"):
        ls.mix({"a": [1]})
    with pytest.raises(TypeError, match="expected a sequence"):
        ls.mix([[1], iter([2])])
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        ls.mix([[1, 2], []], stop="all")
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        ls.mix([[1, 2], []], stop=3)
    assert list(ls.mix([[1, 2], []], [1, 0], stop=3)) == [1, 2, 1]
    m = ls.mix([ls.smap(lambda x: 1 // x, [1, 0]), [5, 6]])
    with pytest.raises(ls.EvaluationError, match="item 1"):
        list(m)
