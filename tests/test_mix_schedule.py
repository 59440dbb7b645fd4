"""mix with a weight schedule: bounds against the integral share, random access, exact counts, `then`."""

from __future__ import annotations

import json
import pickle
import random
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.loader.checks import order_checks
from lazyseq.views.mixing import BLOCK

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOUND = {("step", 2): 2, ("step", 3): 3, ("linear", 2): 3, ("linear", 3): 4}


def weights_st(k):
    one = st.one_of(st.integers(0, 20), st.sampled_from([0, 1, 50, 1000]))
    return st.lists(one, min_size=k, max_size=k).filter(any)


@st.composite
def schedules(draw, k=None, n=300):
    k = k or draw(st.integers(2, 6))
    cuts = draw(st.lists(st.integers(1, n), max_size=6, unique=True))
    mode = draw(st.sampled_from(["step", "linear"]))
    return ls.schedule([(p, draw(weights_st(k))) for p in [0, *sorted(cuts)]], mode), mode


def sources(k):
    return [ls.repeat(s) for s in range(k)]


def check(sched, mode, n):
    """Iterate a mix of ``n`` items: counts grow one at a time and stay near the integral share."""
    m = ls.mix(sources(sched.n), sched, stop=n)
    bound = BOUND[mode, min(sched.n, 3)]
    counts, order = [0] * sched.n, list(m)
    for i, k in enumerate(order):
        assert m.where(i) == (k, counts[k])  # source k's counts[k]-th item
        counts[k] += 1
        share = sched.share(i + 1)
        assert all(abs(c - s) <= bound for c, s in zip(counts, share)), (i, counts, [float(s) for s in share])
    return m, order


# -- bounds, counts, random access --------------------------------------------------------------------
@SETTINGS
@given(schedules(k=2))
def test_two_sources_within_their_bound(s):
    check(*s, 300)


@SETTINGS
@given(schedules())
def test_more_sources_within_their_bound(s):
    check(*s, 300)


@SETTINGS
@given(schedules(), st.data())
def test_random_access_and_counts_are_exact(s, data):
    m, order = check(*s, 250)
    idx = data.draw(st.lists(st.integers(0, 249), max_size=40))
    assert [m[i] for i in idx] == [order[i] for i in idx] == m._get_many(idx)
    assert [m[i] for i in reversed(range(250))] == order[::-1]
    for n in data.draw(st.lists(st.integers(0, 250), max_size=10)):
        assert m.counts(n) == [order[:n].count(k) for k in range(s[0].n)]


def test_one_step_is_the_plain_mix():
    for w in ([5, 3, 2], [1, 1], [0, 3, 1], [2**k for k in range(8)]):
        plain = ls.mix(sources(len(w)), w, stop=500)
        assert list(ls.mix(sources(len(w)), ls.schedule([(0, w)]), stop=500)) == list(plain)


def test_a_long_run_is_exact_at_huge_positions():
    s = ls.schedule([(0, [0.9, 0.1]), (10**15, [0.5, 0.5]), (4 * 10**15, [0.2, 0.8])], interpolate="linear")
    n = 10**16
    m = ls.mix([range(10**16), range(10**16)], s, stop=n)
    counts = m.counts(n)
    assert sum(counts) == n and all(abs(c - x) <= 3 for c, x in zip(counts, s.share(n)))
    k, j = m.where(n - 1)
    assert m.counts(n - 1)[k] == counts[k] - 1 == j


def test_weights_follow_the_schedule():
    s = ls.schedule([(0, [1, 0]), (100, [0, 1])])
    m = ls.mix(sources(2), s, stop=200)
    assert list(m) == [0] * 100 + [1] * 100
    lin = ls.schedule([(0, [1, 0]), (1000, [0, 1])], interpolate="linear")
    c = ls.mix(sources(2), lin, stop=1000).counts()
    assert c == [500, 500] and [float(x) for x in lin.fractions(250)] == [0.75, 0.25]


def test_no_earlier_item_is_evaluated():
    reads = Counter()

    def item(k):
        return lambda j: reads.update([(k, j)]) or (k, j)

    parts = [ls.smap(item(k), ls.arange(10**6)) for k in range(3)]
    s = ls.schedule([(0, [1, 2, 3]), (5000, [3, 0, 1]), (9000, [1, 1, 1])], "linear")
    m = ls.mix(parts, s, stop=20000)
    idx = (19999, 7000, 3)
    assert [m[i] for i in idx] == [m.where(i) for i in idx]
    assert reads == Counter(m.where(i) for i in idx)  # the items read, once each: none before them


# -- then, equality, identity --------------------------------------------------------------------------
@SETTINGS
@given(schedules(k=3), schedules(k=3), st.integers(0, 300))
def test_then_keeps_every_item_before_k(s, other, k):
    (a, mode), (b, _) = s, other
    t = a.then(k, b)
    assert t.equal_before(a, k) and a.equal_before(t, k)
    assert list(ls.mix(sources(3), t, stop=k)) == list(ls.mix(sources(3), a, stop=k))
    assert all(t.fractions(x) == a.fractions(x) for x in range(0, k, 7))
    assert all(t.fractions(k + x) == b.fractions(x) for x in range(0, 300, 11))
    check(t, "linear" if "linear" in (mode, other[1]) else "step", 300 + k)


def test_then_with_breakpoints_and_equality():
    s = ls.schedule([(0, [0.9, 0.1]), (100, [0.5, 0.5])])
    t = s.then(150, [(0, [0.2, 0.8]), (50, [0.1, 0.9])])
    assert t == ls.schedule([(0, [9, 1]), (100, [1, 1]), (150, [2, 8]), (200, [1, 9])])
    assert t != s and t.equal_before(s, 150) and not t.equal_before(s, 151)
    assert s.then(150, [(0, [1, 1])]) == s  # the same weights go on: the same schedule
    assert hash(s) == hash(ls.schedule([(0, [9, 1]), (100, [5, 5])]))
    lin = ls.schedule([(0, [1, 0]), (100, [0, 1])], "linear")
    cut = lin.then(40, [(0, [1, 1])])
    assert cut.fractions(39) == lin.fractions(39) and cut.fractions(40) == [0.5, 0.5]
    assert not cut.equal_before(lin, 41) and not s.equal_before([(0, [9, 1])], 10)


def test_describe_json_and_pickle():
    s = ls.schedule([(0, [0.9, 0.1]), (100, [0.5, 0.5])], interpolate="linear").then(70, [(0, [1, 3])])
    d = s.describe_json()
    assert json.loads(json.dumps(d)) == d == [
        {"at": 0, "weights": [9, 1], "to": 100, "to_weights": [1, 1]}, {"at": 70, "weights": [1, 3]}]
    assert pickle.loads(pickle.dumps(s)) == s
    m = ls.mix([range(300), range(300)], s, seed=3, stop="all")
    copy = pickle.loads(pickle.dumps(m))
    assert list(copy) == list(m) and copy.schedule == s
    assert "schedule(0: 9:1 -> 100: 1:1, 70: 1:3)" in m.describe()


# -- seeds, stop, loaders ------------------------------------------------------------------------------
@SETTINGS
@given(schedules(), st.integers(0, 2**32), st.integers(0, 3))
def test_seeded_blocks_keep_the_schedule(s, seed, epoch):
    sched, _ = s
    even = ls.mix(sources(sched.n), sched, stop=400)
    m = ls.mix(sources(sched.n), sched, seed=seed, epoch=epoch, stop=400)
    got, ref = list(m), list(even)
    for b in range(0, 400, BLOCK):
        end = min(b + BLOCK, 400)
        assert Counter(got[b:end]) == Counter(ref[b:end])
        assert m.counts(end) == even.counts(end)
    idx = random.Random(seed).sample(range(400), 50)
    assert [m[i] for i in idx] == [got[i] for i in idx]
    assert m.counts(100) == [got[:100].count(k) for k in range(sched.n)]


def test_stop_modes():
    s = ls.schedule([(0, [1, 1]), (4, [3, 1])])
    a, b = "AAAAAAAAAA", "bbbbb"
    first = "".join(ls.mix([a, b], s))
    assert first == "AbAbAbAAAbAAAbA"  # 1:1, then 3:1 from item 4; the next item would be an 11th A
    full = "".join(ls.mix([a, b], s, stop="all"))
    assert full[:15] == first and full.count("b") >= 5 and full.count("A") >= 10
    assert len(ls.mix([a, b], s, stop=40)) == 40  # both go round
    gone = ls.schedule([(0, [1, 1]), (4, [1, 0])])  # b gets nothing after 4: only A bounds the mix
    assert "".join(ls.mix([a, b], gone)) == "AbAbAAAAAAAA"
    with pytest.raises(ValueError, match="never reads sequence 1 to its end"):
        ls.mix([a, b], gone, stop="all")
    with pytest.raises(ValueError, match="never reads a sequence past its end"):
        ls.mix([ls.repeat(0), b], gone)


def test_errors():
    with pytest.raises(ValueError, match="at position 0"):
        ls.schedule([(5, [1, 1])])
    with pytest.raises(ValueError, match=r"^schedule: breakpoints out of order: breakpoint 2 is at position 10, after one at 10"):
        ls.schedule([(0, [1, 1]), (10, [1, 2]), (10, [2, 1])])
    with pytest.raises(ValueError, match=r"^schedule: breakpoints out of order: breakpoint 2 is at position 5, after one at 10"):
        ls.schedule([(0, [1, 1]), (10, [1, 2]), (5, [2, 1])])
    with pytest.raises(ValueError, match="'step' or 'linear'"):
        ls.schedule([(0, [1, 1])], interpolate="cubic")
    with pytest.raises(ValueError, match=r"^schedule: breakpoint 1 \(position 10\) has 2 weights, the first breakpoint 3"):
        ls.schedule([(0, [1, 1, 1]), (10, [1, 2])])
    with pytest.raises(ValueError, match=r"^schedule: breakpoint 1 \(position 10\) has 1 weight, the first breakpoint 2"):
        ls.schedule([(0, [1, 1]), (10, [1])])  # said 'mix: 1 weights for 2 sequences'
    with pytest.raises(ValueError, match=r"^schedule: breakpoint 2 \(position 20\): the weights sum to zero"):
        ls.schedule([(0, [1, 1]), (10, [1, 2]), (20, [0, 0])], interpolate="linear")
    with pytest.raises(TypeError, match=r"^schedule: breakpoint 0 \(position 0\): weights must be real numbers"):
        ls.schedule([(0, [1, "a"])])
    with pytest.raises(ValueError, match="for 2 sources; 3 sequences"):
        ls.mix(["a", "b", "c"], ls.schedule([(0, [1, 1])]))
    with pytest.raises(ValueError, match="are for 3 sources"):
        ls.schedule([(0, [1, 1])]).then(5, [(0, [1, 1, 1])])
    with pytest.raises(TypeError, match="pair"):
        ls.schedule([(0, [1, 1]), 5])


def test_a_loader_shuffle_over_a_scheduled_mix_warns():
    sched = ls.mix(["ab", "cd"], ls.schedule([(0, [1, 1])]))
    assert sched.ordered_only and not ls.mix(["ab", "cd"]).ordered_only
    with pytest.warns(UserWarning, match="shuffle inside each source"):
        order_checks(ls.batch(sched, 2), True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        order_checks(ls.batch(sched, 2), False)
        order_checks(ls.mix(["ab", "cd"]), True)
