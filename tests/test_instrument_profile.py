"""instrument.profile / profiling: time per stage of a pipeline, its sources excluded."""

import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import instrument


def sleepy(x):
    time.sleep(0.001)
    return x


class Dataset:
    """A user's map-style dataset: its Python __getitem__ is a stage of its own."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        time.sleep(0.002)
        return i


def test_sleeping_smap_shows_its_millisecond_and_a_slice_nearly_nothing():
    decode = lazyseq.smap(sleepy, range(100))
    part = decode[10:70]
    prof = instrument.profile(part, n=30)
    assert [s.name for s in prof.stages] == ["slice[10:70]", "smap(sleepy)", "range(0, 100)"]
    assert prof.reads == 30
    assert [s.items for s in prof] == [30, 30, 0]
    assert 0.9e-3 < prof[decode].seconds_per_item < 5e-3
    assert prof[part].seconds_per_item < 0.1e-3
    assert 200 < prof[decode].items_per_s < 1100
    assert prof[part].items_per_s > 10 * prof[decode].items_per_s
    assert sum(s.seconds for s in prof) <= prof.total
    assert prof[decode].seconds > 0.8 * prof.total  # nearly all the time is the sleep


def test_batches_count_items_at_every_stage():
    src = lazyseq.smap(sleepy, list(range(64)))
    shuffled = lazyseq.shuffle(src, seed=1, epoch=0)
    batches = lazyseq.batch(shuffled, 8, collate_fn=np.array)
    prof = instrument.profile(batches)  # n=100 > len: every batch once
    assert prof.reads == 8
    assert prof[batches].items == 8 and prof[shuffled].items == prof[src].items == 64
    assert prof[batches].calls == 8
    assert 0.9e-3 < prof[src].seconds_per_item < 5e-3
    assert prof[batches].seconds_per_item < 1e-3 and prof[shuffled].seconds_per_item < 0.1e-3


def test_python_dataset_is_a_stage_and_shared_sources_appear_once():
    data = Dataset()
    both = lazyseq.concatenate([data, data])
    prof = instrument.profile(both, keys=[0, 49, 50, 99])
    assert [s.name for s in prof.stages] == ["concatenate(2 sequences)", "Dataset  len=50"]
    assert prof[data].items == 4 and prof[both].items == 4
    assert 1.8e-3 < prof[data].seconds_per_item < 10e-3
    assert prof[both].seconds_per_item < 0.2e-3


def test_profiling_a_loop_restores_the_previous_profiler_even_on_error():
    calls = []

    def outer(frame, event, arg):
        calls.append(event)

    bad = lazyseq.smap(lambda x: 1 / (x - 3), range(10))
    sys.setprofile(outer)
    try:
        with pytest.raises(lazyseq.EvaluationError, match="item 3"):
            with instrument.profiling(bad) as prof:
                for _x in bad:
                    pass
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert prof[bad].items == 4 and prof.total > 0  # the failing read counts: it was attempted
    assert sys.getprofile() is None


def test_failures_inside_bulk_reads_keep_the_stack_straight():
    def fragile(x):
        if x % 5 == 0:
            raise ValueError(x)
        time.sleep(0.001)
        return x

    mapped = lazyseq.smap(fragile, range(40))
    with instrument.profiling(mapped) as prof:
        out = mapped._get_each(range(40))
    assert sum(isinstance(v, int) for v in out) == 32
    assert prof[mapped].items == 40 and prof[mapped].calls == 1
    assert 0.025 < prof[mapped].seconds < 0.5


def test_stages_below_prefetch_run_in_workers():
    src = lazyseq.smap(sleepy, range(40))
    with lazyseq.prefetch(src, nworkers=2, method="thread") as p:
        prof = instrument.profile(p, n=40)
    assert prof[p].items == 40 and prof[src].items == 0 and prof[src].seconds == 0
    assert prof[p].seconds > 0


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_prefetch_stage_tells_how_busy_its_workers_were(method):
    src = lazyseq.smap(sleepy, range(40))
    with lazyseq.prefetch(src, nworkers=2, method=method) as p:
        prof = instrument.profile(p, n=40)
    stage = prof[p]
    assert stage.workers == 2 and stage.busy >= 40 * 0.001  # every item sleeps 1 ms inside a job
    assert prof[src].busy is None
    line = prof.table().splitlines()[-1]
    assert line.startswith(f"{p.describe()}: its 2 workers were inside jobs {stage.busy:.3f} s, ")


def test_table_and_errors():
    decode = lazyseq.smap(sleepy, range(20))
    prof = instrument.profile(decode, n=5)
    table = prof.table()
    assert table.splitlines()[0].split() == ["stage", "items", "ms/item", "items/s", "share"]
    assert "smap(sleepy)" in table and "└─ range(0, 20)" in table and "5 reads in" in table
    assert repr(prof) == table
    with pytest.raises(KeyError, match="not a stage of the profiled pipeline"):
        prof[[1, 2]]
    with pytest.raises(ValueError, match="n must be >= 0"):
        instrument.profile(decode, n=-1)
    with pytest.raises(TypeError, match="expected a sequence"):
        instrument.profile(iter([1, 2]))
    assert instrument.profile(lazyseq.cycle(decode), n=3).reads == 3  # infinite: the first n


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 99), max_size=30), st.integers(1, 7))
def test_item_counts_follow_the_keys(keys, size):
    src = lazyseq.smap(lambda x: x, list(range(100)))
    batches = lazyseq.batch(src, size)
    keys = [k % len(batches) for k in keys]
    prof = instrument.profile(batches, keys=keys)
    expected = sum(len(range(k * size, min(100, (k + 1) * size))) for k in keys)
    assert prof[batches].items == len(keys) and prof[src].items == expected
    assert prof.reads == len(keys)
