"""lazyseq.filter: the items a predicate keeps, with random access; one pass, here or in workers,
pickled with the view; fingerprinted by the predicate's code."""

import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.core.base import View


def even(x):
    return x % 2 == 0


def fails_at_7(x):
    return 1 // (x - 7) > -5


class Counted:
    """A predicate that counts its calls (a list: appends are atomic across thread workers)."""

    def __init__(self, limit):
        self.limit, self.calls = limit, []

    def __call__(self, x):
        self.calls.append(x)
        return x < self.limit


class Source(View):
    """A source that records how it is read: single reads and bulk reads."""

    def __init__(self, n):
        self.n, self.single, self.bulk = n, 0, 0

    def _len(self):
        return self.n

    def _get(self, i):
        self.single += 1
        return i * 10

    def _get_many(self, idx):
        self.bulk += 1
        return [i * 10 for i in idx]


@pytest.mark.parametrize("src", [list(range(50)), range(2, 90, 3), np.arange(40), ls.smap(lambda x: x + 1, range(30))],
                         ids=["list", "range", "array", "smap"])
def test_items_are_pythons_filter(src):
    f = ls.filter(even, src)
    want = [x for x in src if even(x)]
    assert len(f) == len(want) and list(f) == want and f[-1] == want[-1]
    assert f.kept().dtype == np.int64 and f.kept().tolist() == [i for i, x in enumerate(src) if even(x)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=60), st.integers(-50, 50), st.integers(-80, 80),
       st.one_of(st.none(), st.integers(-80, 80)), st.one_of(st.none(), st.integers(-80, 80)),
       st.one_of(st.none(), st.integers(-5, 5).filter(bool)))
def test_indexing_is_a_lists(data, threshold, i, start, stop, step):
    f = ls.filter(lambda x: x > threshold, data)
    model = [x for x in data if x > threshold]
    assert len(f) == len(model)
    if -len(model) <= i < len(model):
        assert f[i] == model[i]
    else:
        with pytest.raises(IndexError):
            model[i]
        with pytest.raises(IndexError, match=r"out of range for filter\(.*<lambda>\) of length"):
            f[i]
    assert list(f[start:stop:step]) == model[start:stop:step]


def test_one_pass_for_len_reads_slices_and_batches():
    pred, src = Counted(300), Source(1000)
    f = ls.filter(pred, src)
    assert pred.calls == [] and src.bulk == 0  # built lazily
    assert len(f) == 30
    assert f[0] == 0 and f[-1] == 290 and list(f[5:8]) == [50, 60, 70] and f[[2, 1]][0] == 20
    assert [list(b) for b in ls.batch(f, 8)][1] == [80, 90, 100, 110, 120, 130, 140, 150]
    assert len(pred.calls) == 1000 and src.single > 0  # pred ran once over every item, in order
    assert pred.calls == list(range(0, 10000, 10))


def test_a_batch_reads_the_source_in_bulk():
    src = Source(100)
    f = ls.filter(lambda x: x % 20 == 0, src)
    len(f)
    src.single = src.bulk = 0
    assert list(ls.batch(f, 4)[1]) == [80, 100, 120, 140]  # source items 8, 10, 12, 14
    assert src.single == 0 and src.bulk >= 1


def test_pickling_carries_the_kept_indices():
    pred = Counted(5)
    f = ls.filter(pred, list(range(10)))
    blob = pickle.dumps(f)  # pickling before any read runs the pass first, here
    assert len(pred.calls) == 10
    copy = pickle.loads(blob)
    before = len(copy.pred.calls)
    assert list(copy) == [0, 1, 2, 3, 4] and len(copy) == 5
    assert len(copy.pred.calls) == before  # the copy never called pred


@pytest.mark.parametrize("method", ["thread", "process"])
def test_workers_keep_the_same_indices(method):
    src = ls.smap(int, range(3000))
    serial = ls.filter(even, src).kept()
    f = ls.filter(even, src, nworkers=2, method=method)
    assert np.array_equal(f.kept(), serial) and f[1] == 2


@pytest.mark.parametrize("nworkers,method", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_pred_that_raises_names_the_item_and_keeps_nothing(nworkers, method):
    f = ls.filter(fails_at_7, list(range(40)), nworkers=nworkers, method=method)
    for _ in range(2):  # nothing kept: the second try passes again and fails the same way
        with pytest.raises(ls.EvaluationError, match=r"filter\(fails_at_7\): pred failed on item 7 of its source") as e:
            len(f)
        assert e.value.item == 7 and isinstance(e.value.__cause__, ZeroDivisionError)
    assert f._kept.value is None


def test_a_later_read_retries_after_a_failure():
    flaky = {"fail": True}

    def pred(x):
        if flaky["fail"] and x == 3:
            raise OSError("transient")
        return x > 1

    f = ls.filter(pred, range(6))
    with pytest.raises(ls.EvaluationError, match="item 3"):
        f[0]
    flaky["fail"] = False
    assert list(f) == [2, 3, 4, 5]


def test_what_pred_may_return():
    assert list(ls.filter(lambda x: np.bool_(x > 2), range(5))) == [3, 4]
    assert list(ls.filter(lambda x: x % 3, range(6))) == [1, 2, 4, 5]
    assert list(ls.filter(lambda x: np.array(x > 3), range(5))) == [4]
    for bad, shown in [(None, "NoneType None"), ("yes", "str 'yes'"), ([1], "list")]:
        f = ls.filter(lambda x, bad=bad: bad, range(5))
        with pytest.raises(ls.EvaluationError, match=f"item 0 of its source: TypeError: pred returned {shown}"):
            len(f)


def test_refusals():
    with pytest.raises(TypeError, match="no len"):
        ls.filter(even, ls.uniter(iter(range(5))))
    with pytest.raises(TypeError, match="no len"):
        ls.filter(even, ls.cycle([1, 2]))
    with pytest.raises(TypeError, match="pred must be callable"):
        ls.filter(3, range(5))
    with pytest.raises(ValueError, match="method must be one of"):
        ls.filter(even, range(5), nworkers=2, method="fork")
    f = ls.filter(even, list(range(5)))
    with pytest.raises(TypeError, match=r"filter\(even\) does not support item assignment"):
        f[0] = 2
    assert list(ls.filter(even, ls.uniter(range(6), size=6))) == [0, 2, 4]
    assert "filter(even)  len=3" in repr(f)


def test_at_epoch_passes_again_over_a_view_that_follows_the_epoch():
    f = ls.filter(lambda x: x < 10, ls.shuffle(range(100), seed=3))
    e1 = ls.at_epoch(f, 1)
    assert list(e1) == [x for x in ls.shuffle(range(100), 3, epoch=1) if x < 10] != list(f)
    assert list(f) == [x for x in ls.shuffle(range(100), 3) if x < 10]
    fixed = ls.filter(even, range(10))
    assert ls.at_epoch(fixed, 4) is fixed


def test_fingerprint_holds_preds_code_and_the_source():
    def a():
        return ls.filter(lambda x: x > 2, range(10))

    def b():
        return ls.filter(lambda x: x > 3, range(10))  # the same name (<lambda>), other code

    assert ls.fingerprint(a()) == ls.fingerprint(a())
    assert ls.fingerprint(a()) != ls.fingerprint(b())
    assert ls.fingerprint(ls.filter(even, range(10))) != ls.fingerprint(ls.filter(even, range(12)))


def near(x):
    return x % 3 != 0


def test_dataloader_reads_and_resumes_exactly():
    data = ls.filter(near, ls.smap(int, range(60)))  # 40 items
    kw = dict(batch_size=6, shuffle=True, seed=5, num_workers=2, to_tensor=False)
    with ls.DataLoader(data, **kw) as loader:
        want = [[int(x) for x in b] for b in loader.make_sequence(0)]
        assert sorted(x for b in want for x in b) == [x for x in range(60) if near(x)]
        it = iter(loader)
        seen = [[int(x) for x in next(it)] for _ in range(3)]
        state = loader.state_dict()  # while live: exactly after batch 2
        it.close()
    assert seen == want[:3]
    with ls.DataLoader(ls.filter(near, ls.smap(int, range(60))), **kw) as resumed:
        resumed.load_state_dict(state)
        assert [[int(x) for x in b] for b in resumed] == want[3:]
    other = ls.DataLoader(ls.filter(lambda x: x % 3 != 1, ls.smap(int, range(60))), **kw)
    with pytest.raises(ls.ResumeMismatch):
        other.load_state_dict(state)


MAIN = os.getpid()


def only_in_the_reader(x):
    if os.getpid() != MAIN:
        raise RuntimeError("pred ran in a worker")
    return x % 2 == 0


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_prefetch_workers_receive_the_indices(ctx):
    """Forked workers copy the pipeline without pickling it: prefetch asks its len first, so the pass
    runs once, here, and no worker runs pred."""
    f = ls.filter(only_in_the_reader, list(range(100)))
    with ls.prefetch(f, 2, "process", mp_context=ctx) as p:
        assert list(p) == list(range(0, 100, 2))
