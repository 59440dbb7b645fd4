"""Errors: wrapping in EvaluationError, notes through pipelines, seterr, iteration, bad keys."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import lazyseq as ls


def inverse(x):
    return 1 / x


def fail_on_3(x):
    if x == 3:
        raise KeyError("three")
    return x


def index_error_on_2(x):
    if x == 2:
        raise IndexError("from user code")
    return x


def test_error_in_mapped_function_names_item_and_view():
    v = ls.smap(inverse, [1, 2, 0, 4])
    assert v[1] == 0.5
    with pytest.raises(ls.EvaluationError) as info:
        v[2]
    e = info.value
    assert isinstance(e.__cause__, ZeroDivisionError)
    assert e.item == 2 and e.view == "smap(inverse)"
    assert "item 2" in str(e) and "smap(inverse)" in str(e) and "ZeroDivisionError" in str(e)
    with pytest.raises(ls.EvaluationError) as info:
        v[-2]  # the index reported is the normalised one
    assert info.value.item == 2
    star = ls.starmap(lambda a, b: a / b, [(1, 1), (1, 0)])
    with pytest.raises(ls.EvaluationError, match=r"item 1 of starmap\(.*<lambda>\)") as info:
        star[1]
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    multi = ls.smap(lambda a, b: a / b, [1, 1], [1, 0])
    with pytest.raises(ls.EvaluationError, match="item 1 of smap"):
        multi[1]


def test_error_note_names_the_top_level_item():
    inner = ls.smap(fail_on_3, list(range(10)))
    pipeline = ls.smap(sum, ls.batch(inner, 2))[::-1]
    with pytest.raises(ls.EvaluationError) as info:
        pipeline[3]  # batch 1 holds items 2 and 3
    e = info.value
    assert e.item == 3 and e.view == "smap(fail_on_3)" and isinstance(e.__cause__, KeyError)
    assert any("while reading item 3 of slice[4:-1:-1]" in note for note in e.__notes__)
    with pytest.raises(ls.EvaluationError) as info:
        list(ls.smap(str, ls.shuffle(ls.concatenate([[0, 1], inner]), seed=0)))
    assert info.value.view == "smap(fail_on_3)" and info.value.item == 3
    assert any("of smap(str)" in note for note in info.value.__notes__)
    # no note when the failing view is the one read
    with pytest.raises(ls.EvaluationError) as info:
        inner[3]
    assert not getattr(info.value, "__notes__", [])


def test_errors_through_bulk_reads_name_the_right_item():
    v = ls.smap(fail_on_3, ls.gather(list(range(10)), [5, 4, 3, 2]))
    with pytest.raises(ls.EvaluationError) as info:
        v._get_many([0, 1, 2, 3])
    assert info.value.item == 2
    c = ls.collate([ls.smap(fail_on_3, list(range(10))), list(range(10))])
    with pytest.raises(ls.EvaluationError) as info:
        c._get_many([0, 1, 3])
    assert info.value.item == 3


def test_errors_in_other_user_functions():
    b = ls.batch([1, 2, 3], 2, collate_fn=lambda items: items[5])
    with pytest.raises(ls.EvaluationError, match=r"item 0 of batch\(2, collate_fn=") as info:
        b[0]
    assert isinstance(info.value.__cause__, IndexError)
    seen = []
    d = ls.instrument.debug([1, 2], lambda i, v: seen.append(1 / 0))
    with pytest.raises(ls.EvaluationError, match="debug"):
        d[0]


def test_passthrough_reraises_the_original():
    v = ls.smap(inverse, [1, 0])
    pipeline = ls.batch(ls.cycle(v, 6), 2)
    assert ls.seterr() == "wrap"
    try:
        assert ls.seterr("passthrough") == "passthrough"
        with pytest.raises(ZeroDivisionError):
            v[1]
        with pytest.raises(ZeroDivisionError):
            pipeline[1]
        with pytest.raises(ZeroDivisionError):
            list(v)
    finally:
        assert ls.seterr("wrap") == "wrap"
    with pytest.raises(ls.EvaluationError):
        v[1]
    with pytest.raises(ValueError, match="evaluation"):
        ls.seterr("ignore")
    assert ls.seterr(None) == "wrap"


def test_seterr_is_process_wide():
    seen = []
    v = ls.smap(inverse, [0])

    def worker():
        seen.append(ls.seterr())
        try:
            v[0]
        except Exception as e:
            seen.append(type(e))

    try:
        ls.seterr("passthrough")
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert seen == ["passthrough", ZeroDivisionError]
    finally:
        ls.seterr("wrap")
    # and a thread that flips it flips it for the main thread too
    t = threading.Thread(target=ls.seterr, args=("passthrough",))
    t.start()
    t.join()
    try:
        assert ls.seterr() == "passthrough"
    finally:
        ls.seterr("wrap")


def test_iteration_raises_and_does_not_stop_silently():
    # a user function raising IndexError must not end iteration early
    v = ls.smap(index_error_on_2, list(range(5)))
    with pytest.raises(ls.EvaluationError) as info:
        list(v)
    assert info.value.item == 2 and isinstance(info.value.__cause__, IndexError)
    # nor a bad gather index inside a finite or an infinite view
    bad = ls.gather([1, 2, 3], [0, 5, 1])
    with pytest.raises(ls.EvaluationError) as info:
        list(ls.smap(str, bad))
    assert isinstance(info.value.__cause__, IndexError) and "out of range" in str(info.value.__cause__)
    it = iter(ls.cycle(bad))
    assert next(it) == 1
    with pytest.raises(ls.EvaluationError):
        next(it)
    it = iter(ls.smap(index_error_on_2, ls.cycle([0, 1, 2])))
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(ls.EvaluationError):
        next(it)
    # a StopIteration from user code is not taken for the end either
    stops = ls.smap(lambda x: next(iter([])) if x == 1 else x, [0, 1, 2])
    with pytest.raises(ls.EvaluationError):
        list(stops)
    ls.seterr("passthrough")
    try:
        with pytest.raises((RuntimeError, StopIteration)):
            list(stops)
        with pytest.raises(IndexError):
            list(v)
    finally:
        ls.seterr("wrap")
    # sum/in/count/index read through iteration too
    with pytest.raises(ls.EvaluationError):
        sum(ls.smap(inverse, [1, 0]))
    with pytest.raises((ls.EvaluationError, IndexError)):
        ls.smap(str, bad).index("2")


@pytest.mark.parametrize(
    "view",
    [
        ls.smap(str, [1, 2, 3]),
        ls.gather([1, 2, 3], [0, 1]),
        ls.cycle([1, 2]),
        ls.batch([1, 2, 3], 2),
        ls.arange(5),
        ls.repeat(1, 3),
        ls.concatenate([[1], [2]]),
        ls.shuffle([1, 2, 3], seed=0),
        ls.uniter(range(4)),
    ],
    ids=lambda v: v.describe(),
)
def test_bad_keys_raise_type_error_naming_the_view(view):
    desc = view.describe()
    for key in ("1", 1.5, None, (0, 1), {0: 1}, b"0", object()):
        with pytest.raises(TypeError, match=r"indices must be integers") as info:
            view[key]
        assert desc in str(info.value)
    for key in ([0.5, 1.0], np.array([0.0, 1.0]), ["a"]):
        with pytest.raises(TypeError, match="must hold integers") as info:
            view[key]
        assert desc in str(info.value)
    with pytest.raises(TypeError, match="1-D") as info:
        view[np.zeros((1, 1), dtype=int)]
    assert desc in str(info.value)
    with pytest.raises(TypeError, match="indices must be integers"):
        view["1"] = 0
    if view.finite:
        n = len(view)
        for key in (n, -n - 1, np.int64(n), [0, n], np.array([-n - 1])):
            with pytest.raises(IndexError, match="out of range") as info:
                view[key]
            assert desc in str(info.value)
        with pytest.raises(IndexError, match="out of range"):
            view[n] = 0
        with pytest.raises(IndexError, match="boolean mask"):
            view[np.ones(n + 1, dtype=bool)]


def test_gather_with_bad_indexes_raises_a_clear_index_error():
    class NoChecks:  # a source that does not raise IndexError itself
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i

    for src in ([1, 2, 3], np.array([1, 2, 3]), ls.smap(str, [1, 2, 3]), NoChecks(), ls.arange(3)):
        for bad in (3, -4, 10):
            g = ls.gather(src, [0, bad])
            assert g[0] in (1, "1", 0)
            with pytest.raises(IndexError, match=rf"gather\(2 indexes\): index {bad} is out of range for its source of length 3"):
                g[1]
            with pytest.raises(IndexError, match="out of range for its source"):
                g._get_many([0, 1])
            with pytest.raises(IndexError, match="out of range for its source"):
                g[1] = 0
    with pytest.raises(IndexError, match="gather"):
        ls.smap(str, ls.gather([1, 2, 3], [7]))[0]
    with pytest.raises(TypeError, match="gather"):
        ls.gather([1, 2], 5)
    with pytest.raises(TypeError, match=r"uniter"):
        ls.gather(iter([1, 2]), [0])


def test_sources_must_be_sequences():
    makers = (lambda s: ls.smap(str, s), lambda s: ls.batch(s, 2), ls.cycle, ls.add_cache, lambda s: ls.shuffle(s, 0))
    for make in makers:
        with pytest.raises(TypeError, match="expected a sequence"):
            make(5)
    with pytest.raises(TypeError, match="callable"):
        ls.smap(3, [1])
    with pytest.raises(ValueError):
        ls.smap(str)


def test_evaluation_error_pickles():
    with pytest.raises(ls.EvaluationError) as info:
        ls.smap(inverse, [0])[0]
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.item == 0 and copy.view == "smap(inverse)" and str(copy) == str(info.value)
