"""on_error: failing items replaced (next good item, a function of the index, a value), counted,
logged, and limited by max_errors, in this process and in prefetch / DataLoader workers."""

from __future__ import annotations

import logging
import pickle
import threading

import cloudpickle
import numpy as np
import pytest

import lazyseq as ls
from lazyseq.core.node import Failed

BAD = {3, 4, 9}


def load(i: int) -> int:
    if i in BAD:
        raise OSError(f"sample {i} is corrupt")
    return i * 10


class Counted:
    """``load`` that counts how often each index is read (thread-safe)."""

    def __init__(self):
        self.reads: dict[int, int] = {}
        self.lock = threading.Lock()

    def __call__(self, i: int) -> int:
        with self.lock:
            self.reads[i] = self.reads.get(i, 0) + 1
        return load(i)


def data(n: int = 12):
    return ls.smap(load, range(n))


# -- substitutes -----------------------------------------------------------------------------------
def test_skip_takes_the_next_good_item_and_wraps_around():
    v = ls.on_error(data())
    assert len(v) == 12 and list(v) == [0, 10, 20, 50, 50, 50, 60, 70, 80, 100, 100, 110]
    w = ls.on_error(ls.smap(load, range(10)))  # item 9 is the last: wraps around to item 0
    assert w[9] == 0 and w[-1] == 0
    assert ls.on_error(data(), ls.Skip) .substitute.limit == 16
    assert list(ls.on_error(data(), ls.Skip(limit=2))[3:5]) == [50, 50]


def test_skip_gives_up_after_its_limit_with_a_clear_error():
    v = ls.on_error(data(), ls.Skip(limit=1))
    with pytest.raises(ls.EvaluationError) as e:
        v[3]
    assert e.value.item == 3 and "so did the 1 items after it" in str(e.value) and "Skip(limit=...)" in str(e.value)
    assert isinstance(e.value.__cause__.__cause__, OSError)
    allbad = ls.on_error(ls.smap(lambda i: 1 // 0, range(5)))
    with pytest.raises(ls.EvaluationError, match="so did the 4 items after it .wrapping around.: none to take"):
        allbad[2]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        ls.Skip(0)


def test_a_function_of_the_index_and_the_error():
    seen = []

    def sub(i, error):
        seen.append((i, type(error.__cause__).__name__))
        return -i

    v = ls.on_error(data(), sub)
    assert list(v) == [0, 10, 20, -3, -4, 50, 60, 70, 80, -9, 100, 110]
    assert seen == [(3, "OSError"), (4, "OSError"), (9, "OSError")]
    plain = ls.on_error([1, 2], lambda i, e: "x")  # any sequence: errors arrive as raised
    assert list(plain) == [1, 2]


def test_a_fixed_value():
    fill = np.zeros(2)
    v = ls.on_error(ls.smap(lambda i: np.full(2, float(load(i))), range(6)), fill)
    assert [float(x[0]) for x in v] == [0, 10, 20, 0, 0, 50] and v[3] is fill
    assert list(ls.on_error(data(6), None)) == [0, 10, 20, None, None, 50]


def test_a_substitute_that_raises_is_an_error_of_the_item():
    def sub(i, error):
        raise KeyError(i)

    v = ls.on_error(data(), sub)
    with pytest.raises(ls.EvaluationError) as e:
        v[4]
    assert e.value.item == 4 and isinstance(e.value.__cause__, KeyError)
    assert any("sub raised while replacing item 4, which failed: failed to evaluate item 4" in n
               for n in e.value.__notes__)


def test_only_exceptions_are_caught():
    def stop(i):
        if i == 1:
            raise KeyboardInterrupt
        return i

    v = ls.on_error(ls.smap(stop, range(3)), -1)
    with pytest.raises(KeyboardInterrupt):
        v[1]
    assert v.errors.count == 0


# -- counting and logging --------------------------------------------------------------------------
def test_each_replacement_is_counted_and_logged(caplog):
    v = ls.on_error(data(), -1)
    with caplog.at_level(logging.WARNING, logger="lazyseq"):
        assert list(v) == [0, 10, 20, -1, -1, 50, 60, 70, 80, -1, 100, 110]
    assert v.errors.count == 3 and v.errors.reads == 12
    assert [i for i, _ in v.errors.recent] == [3, 4, 9]
    assert v.errors.recent[0][1] == "failed to evaluate item 3 of smap(load): OSError: sample 3 is corrupt"
    records = [r for r in caplog.records if r.name == "lazyseq"]
    assert len(records) == 3 and all(r.levelno == logging.WARNING for r in records)
    assert "item 9 of smap(load) failed" in records[2].getMessage()
    assert "replaced by the fixed value [3 failed in this process so far]" in records[2].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lazyseq"):
        ls.on_error(data())[3]
    assert "replaced by item 5" in caplog.records[0].getMessage()
    assert "Errors(count=3, reads=12" in repr(v.errors)


def test_recent_keeps_the_last_ten():
    v = ls.on_error(ls.smap(lambda i: 1 // (i % 2), range(40)), 0)
    list(v)
    assert v.errors.count == 20 and [i for i, _ in v.errors.recent] == list(range(20, 40, 2))


def test_max_errors_as_a_count():
    v = ls.on_error(data(), -1, max_errors=2)
    assert v[3] == -1 and v[4] == -1 and v[5] == 50
    with pytest.raises(ls.EvaluationError) as e:
        v[9]
    err = e.value
    assert err.item == 9 and err.view == "on_error(-1, max_errors=2)"
    assert "3 failed items in this process, more than max_errors allows (2 failed items)" in str(err)
    assert isinstance(err.__cause__.__cause__, OSError) and "sample 9" in str(err)
    assert v[10] == 100  # good items still read
    with pytest.raises(ls.EvaluationError):
        list(ls.on_error(data(), max_errors=0))
    ls.seterr("passthrough")
    with pytest.raises(OSError):
        v[9]


def test_max_errors_as_a_fraction_of_the_items_read_counting_at_least_len():
    v = ls.on_error(data(), -1, max_errors=0.25)  # 3 of 12 allowed in the first epoch
    assert list(v) == [0, 10, 20, -1, -1, 50, 60, 70, 80, -1, 100, 110]
    with pytest.raises(ls.EvaluationError, match=r"more than max_errors allows \(0.25 of the items read \(3.25 now\)\)"):
        v[3]  # a 4th failure in 13 reads: the allowance is 0.25 * max(13, 12)
    steady = ls.on_error(data(), -1, max_errors=0.25)
    for _ in range(4):  # epoch after epoch, 3 failures in every 12 reads stays within the rate
        assert steady._get_many(range(12))[9] == -1
    assert steady.errors.count == 12 and steady.errors.reads == 48
    with pytest.raises(ls.EvaluationError):
        steady[4]
    tight = ls.on_error(data(), -1, max_errors=0.2)  # 2.4 of 12
    with pytest.raises(ls.EvaluationError):
        list(tight)
    assert tight.errors.count == 3


def test_bulk_reads_read_good_items_once():
    f = Counted()
    v = ls.on_error(ls.smap(f, range(12)))
    assert v._get_many(list(range(12))) == [0, 10, 20, 50, 50, 50, 60, 70, 80, 100, 100, 110]
    assert all(n == 1 for n in f.reads.values()) and len(f.reads) == 12
    assert ls.batch(v, 5)[0] == [0, 10, 20, 50, 50] and f.reads[5] == 2  # item 5 (past the batch): once
    each = ls.on_error(data(), -1, max_errors=1)._get_each(list(range(12)))
    assert each[3] == -1 and type(each[4]) is Failed and type(each[9]) is Failed and each[11] == 110
    assert "more than max_errors" in str(each[4].error)
    with pytest.raises(ls.EvaluationError, match="more than max_errors"):
        ls.on_error(data(), -1, max_errors=1)._get_many(list(range(12)))


# -- workers ---------------------------------------------------------------------------------------
def test_thread_workers_share_one_count():
    v = ls.on_error(data(40), -1, max_errors=2)
    got = []
    with ls.prefetch(v, nworkers=2) as p:
        for i in range(40):
            try:
                got.append(p[i])
            except ls.EvaluationError as e:
                assert "3 failed items in this process, more than max_errors" in str(e)
                got.append("stop")
    assert v.errors.count == 3 and sorted(i for i, _ in v.errors.recent) == [3, 4, 9]
    assert [got[i] for i in (3, 4, 9)].count("stop") == 1 and [got[i] for i in (3, 4, 9)].count(-1) == 2
    assert [x for i, x in enumerate(got) if i not in BAD] == [i * 10 for i in range(40) if i not in BAD]


def test_process_workers_count_their_own():
    v = ls.on_error(data(), -1, max_errors=3)
    with ls.prefetch(v, nworkers=2, method="process") as p:
        assert list(p) == [0, 10, 20, -1, -1, 50, 60, 70, 80, -1, 100, 110]
    assert v.errors.count == 0  # counted in the workers, not here
    strict = ls.on_error(data(), -1, max_errors=0)
    with ls.prefetch(strict, nworkers=2, method="process") as p:
        assert p[2] == 20
        with pytest.raises(ls.EvaluationError, match="more than max_errors") as e:
            p[3]
        assert e.value.item == 3


def test_counted_in_the_reader_above_a_prefetch():
    with ls.prefetch(data(), nworkers=2, method="process") as p:
        v = ls.on_error(p, -1, max_errors=3)
        assert list(v) == [0, 10, 20, -1, -1, 50, 60, 70, 80, -1, 100, 110]
        assert v.errors.count == 3
        with pytest.raises(ls.EvaluationError, match="more than max_errors"):
            v[4]
        skip = ls.on_error(p)
        assert list(skip[2:6]) == [20, 50, 50, 50]


def test_in_a_dataloader():
    ds = ls.on_error(data(20), lambda i, e: -1)
    loader = ls.DataLoader(dataset=ds, batch_size=4, num_workers=2, to_tensor=False)
    batches = [b.tolist() for b in loader]
    assert batches[0] == [0, 10, 20, -1] and batches[2] == [80, -1, 100, 110]
    strict = ls.DataLoader(dataset=ls.on_error(data(20), -1, max_errors=1), batch_size=4, num_workers=2,
                           to_tensor=False)
    with pytest.raises(ls.EvaluationError, match="more than max_errors"):
        list(strict)
    strict.close()


def test_pickled_copies_count_from_zero():
    v = ls.on_error(data(), ls.Skip(limit=3), max_errors=5)
    list(v)
    copy = pickle.loads(pickle.dumps(v))
    assert v.errors.count == 3 and copy.errors.count == 0 and copy.substitute.limit == 3
    assert list(copy) == [0, 10, 20, 50, 50, 50, 60, 70, 80, 100, 100, 110] and copy.errors.count == 3
    assert list(pickle.loads(cloudpickle.dumps(ls.on_error(data(), lambda i, e: i)))) [3] == 3


def test_writes_go_to_the_source_and_repr():
    src = [1, 2, 3]
    v = ls.on_error(src, 0)
    v[1] = 20
    assert src == [1, 20, 3]
    assert repr(ls.on_error(data(), max_errors=0.01)).startswith("on_error(Skip(limit=16), max_errors=0.01)  len=12")


def test_infinite_sources():
    v = ls.on_error(ls.smap(load, ls.cycle(range(12))), max_errors=2)
    assert v[15] == 50 and v[3] == 50
    with pytest.raises(TypeError, match="no len"):
        len(v)
    assert list(ls.on_error(ls.uniter(iter([1, 2])), -1)) == [1, 2]  # the end of the source is no failure


def test_argument_errors():
    with pytest.raises(TypeError, match="expected a sequence"):
        ls.on_error(3)
    with pytest.raises(TypeError, match="an int .a count. or a float .a fraction."):
        ls.on_error(data(), max_errors="1%")
    with pytest.raises(TypeError, match="an int .a count. or a float .a fraction."):
        ls.on_error(data(), max_errors=True)
    with pytest.raises(ValueError, match="must lie in"):
        ls.on_error(data(), max_errors=1.5)
    with pytest.raises(ValueError, match="must be >= 0"):
        ls.on_error(data(), max_errors=-1)
    assert ls.on_error(data(), max_errors=np.int64(2)).max_errors == 2
    assert ls.on_error(data(), max_errors=np.float64(0.5)).max_errors == 0.5


def _count_in_child(v, q) -> None:
    q.put((v.errors.count, v[3], v.errors.count))


def test_a_forked_worker_counts_from_zero():
    import multiprocessing

    v = ls.on_error(data(), -1)
    list(v)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_count_in_child, args=(v, q))
    p.start()
    try:
        assert q.get(timeout=30) == (0, -1, 1)
    finally:
        p.join(30)
    assert p.exitcode == 0 and v.errors.count == 3


def test_passthrough_lets_the_substitutes_error_through():
    def sub(i, error):
        raise KeyError(i)

    ls.seterr("passthrough")
    with pytest.raises(KeyError) as e:
        ls.on_error(data(), sub)[3]
    assert e.value.__cause__ is not e.value
