"""Bulk reads that go past failing items (``View._get_each``, what prefetch workers evaluate chunks
with) give, for every item, what reading it alone gives, and read each item once: cases found by a
review (the property tests in test_views_properties.py cover random pipelines)."""

import collections
import pickle

import pytest

import lazyseq as ls
from lazyseq.core.node import Failed
from lazyseq.errors import raised
from lazyseq.evaluation import wire


def outcome(view, i):
    try:
        return ("value", view[i])
    except Exception as e:
        return (type(e).__name__, str(e))


def bulk_outcomes(view, idx):
    out = []
    for i, x in zip(idx, view._get_each(idx)):
        if type(x) is Failed:
            e = raised(x.error, i, view)
            out.append((type(e).__name__, str(e)))
        else:
            out.append(("value", x))
    return out


def test_get_each_past_the_end_of_an_unsized_source_does_not_fail_the_items_after_it():
    # A gather (or a shuffle of one) over a uniter reads its source in any order: the items after
    # one past the end may still be there.
    g = ls.gather(ls.uniter(range(3)), [0, 10, 1, 2])
    assert bulk_outcomes(g, range(4)) == [outcome(g, i) for i in range(4)]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_prefetch_of_a_finite_view_over_an_unsized_source_keeps_the_items_after_a_bad_one(method):
    # Only a view of unknown size ends at an Exhausted: a finite one has just that item failing.
    idx = [i % 100 if i % 97 != 50 else 1000 for i in range(600)]
    g = ls.smap(abs, ls.gather(ls.uniter(range(100), n_parallel=4), idx))
    want = [outcome(g, i) for i in range(600)]
    with ls.prefetch(g, nworkers=2, method=method, mp_context="fork" if method == "process" else None) as p:
        got = [outcome(p, i) for i in range(600)]
    assert [i for i in range(600) if got[i][0] != want[i][0]] == []


def test_get_each_of_a_gather_over_a_slice_with_a_bad_index_returns_failed():
    # A gather over a slice leaves the index checks to the slice: one bad index fails that item only.
    g = ls.gather(ls.smap(abs, list(range(20)))[2:12], [0, 1, 50, 2])
    assert bulk_outcomes(g, range(4)) == [outcome(g, i) for i in range(4)]


@pytest.mark.parametrize("src", ["slice", "shuffle"])
def test_get_each_reads_a_gather_index_view_once_when_one_index_is_bad(src):
    calls = collections.Counter()

    def h(j):
        calls[j] += 1
        return j

    base = ls.smap(abs, list(range(20)))
    base = base[0:10] if src == "slice" else ls.shuffle(base[0:10], seed=1)
    g = ls.gather(base, ls.smap(h, [0, 1, 50, 3]))
    wire.evaluate(g, range(4), portable=False)
    assert set(calls.values()) == {1}, calls


def test_get_each_reads_a_gather_index_view_once_when_an_index_item_fails():
    calls = collections.Counter()

    def h(j):
        calls[j] += 1
        if j == 2:
            raise ValueError("bad index record")
        return j

    g = ls.gather(ls.shuffle(list(range(10)), seed=1), ls.smap(h, [0, 1, 2, 3]))
    g._get_each(range(4))
    assert set(calls.values()) == {1}, calls


def test_notes_of_an_evaluation_error_survive_pickling():
    # Process workers send errors pickled: the notes ("while reading item i of ...") must survive.
    for e in (ls.EvaluationError("m", 3, "smap(f)"), ls.WorkerCrashed("m", 123, -9), ls.PrefetchTimeout("m", 3)):
        e.add_note("while reading item 3 of batch(2)")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.args == e.args and back.__dict__ == e.__dict__
        assert back.__notes__ == ["while reading item 3 of batch(2)"]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_bad_gather_index_raises_the_same_index_error_through_a_prefetch(method):
    g = ls.smap(abs, ls.gather(list(range(10)), ls.smap(int, [1, 2, 30, 4])))
    with pytest.raises(IndexError) as direct:
        g[2]
    with ls.prefetch(g, nworkers=1, method=method, mp_context="fork" if method == "process" else None) as p:
        assert [p[0], p[1], p[3]] == [1, 2, 4]
        with pytest.raises(IndexError) as through:
            p[2]
    assert type(through.value) is type(direct.value) and str(through.value) == str(direct.value)
