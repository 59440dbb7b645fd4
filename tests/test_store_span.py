"""A bulk read over many shards of a local store reads each fixed field once, across the shards'
memory maps (lazyseq.store.span), with the values, dtypes and containers of the shard-by-shard
path; evicted shards, fields whose shape differs between shards and process workers' slots
included."""

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_columns import same

import lazyseq
from lazyseq import default_collate
from lazyseq.core.jobslot import JobSlot, set_current
from lazyseq.store import gather as gather_mod
from lazyseq.store import read


def item(i):
    return {"img": np.full((2, 3), i, np.float32) + np.arange(6, dtype=np.float32).reshape(2, 3),
            "y": i, "ok": i % 3 == 0, "c": np.complex64(i - 1j), "z": np.array(i, ">i4"), "s": "x" * (i % 4)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("span") / "s"
    lazyseq.save(lazyseq.smap(item, range(103)), path, method="thread", shard_bytes=800)
    s = lazyseq.load(path)
    assert len(s.records) >= 8 and s.records[-1]["stop"] - s.records[-1]["start"] < s.per_shard
    return s


def fixed_calls(monkeypatch):
    """Counts the shard-by-shard reads of fixed fields (gather._fixed)."""
    calls = []
    real = gather_mod._fixed
    monkeypatch.setattr(gather_mod, "_fixed", lambda *a: (calls.append(a[1]), real(*a))[1])
    return calls


def test_a_read_over_many_shards_reads_each_fixed_field_once(store, monkeypatch):
    idx = np.random.default_rng(0).permutation(len(store))
    gather_mod.gather(store, idx, True)  # opens every shard
    calls = fixed_calls(monkeypatch)
    for b in range(0, len(store), 16):
        part = idx[b:b + 16]
        same(gather_mod.gather(store, part, True), default_collate([store[int(i)] for i in part]), f"batch {b}")
        got = gather_mod.gather(store, part, False)
        for i, x in zip(part, got):
            same(x, store[int(i)], f"item {i}")
            assert not x["img"].flags.writeable and not x["z"].flags.writeable
    assert calls == [], "every fixed field came from the span"
    assert store._span is not None and store._span.covered.all()
    assert [s is None for s in store._span.fields] == [False, False, False, False, False, True]  # s varies


def test_the_last_short_shard_and_its_last_item(store):
    last = len(store) - 1
    idx = np.array([last, 0, last - 1, store.per_shard, last])
    gather_mod.gather(store, idx, True)
    same(gather_mod.gather(store, idx, True), default_collate([store[int(i)] for i in idx]))


def test_evicted_shards_stay_readable_through_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "_OPEN_SHARDS", 3)
    lazyseq.save(lazyseq.smap(item, range(60)), tmp_path / "s", method="thread", shard_bytes=400)
    s = lazyseq.load(tmp_path / "s")
    assert len(s.records) > 6
    idx = np.array([1, s.per_shard + 2, 2 * s.per_shard])
    gather_mod.gather(s, idx, True)
    snap = s._spans(idx // s.per_shard)
    assert snap is not None
    for k in range(len(s.records)):  # every other shard opens: the snapshot's shards are evicted
        s._shard(k)
    assert not s._is_open[idx // s.per_shard].all() and s._spans(idx // s.per_shard) is None
    k, j = idx // s.per_shard, idx % s.per_shard
    assert np.array_equal(snap.read(0, k, j, True), np.stack([item(int(i))["img"] for i in idx]))
    rng = np.random.default_rng(1)
    for _ in range(30):  # batches over more shards than stay open: still the items
        part = rng.integers(0, 60, 9)
        same(gather_mod.gather(s, part, True), default_collate([s[int(i)] for i in part]))
    assert len(s._open) <= 3


def test_a_field_whose_shape_differs_between_shards_is_read_shard_by_shard(tmp_path, monkeypatch):
    def items(per):  # the same bytes per item, a shape per shard: (2, 1) in even shards, (1, 2) in odd ones
        return [{"a": np.full((2, 1) if i // per % 2 == 0 else (1, 2), i, np.int16), "y": i} for i in range(40)]

    lazyseq.save(items(1), tmp_path / "s", method="thread", shard_bytes=100)
    per = lazyseq.load(tmp_path / "s").per_shard
    lazyseq.save(items(per), tmp_path / "s", method="thread", shard_bytes=100, overwrite=True)
    s = lazyseq.load(tmp_path / "s")
    assert s.per_shard == per and len(s.records) > 3
    idx = np.array([35, 1, 12, 27, 3])
    gather_mod.gather(s, np.arange(40), False)
    calls = fixed_calls(monkeypatch)
    for x, i in zip(gather_mod.gather(s, idx, False), idx):
        same(x, s[int(i)])
    assert calls == [0], "field a shard by shard, y from the span"
    assert s._span.fields[0] is None and s._span.fields[1] is not None


def test_in_a_process_workers_job_the_column_goes_into_its_slot(store):
    idx = np.array([5, 90, 40, 17])
    gather_mod.gather(store, idx, True)
    memory = np.zeros(1 << 16, np.uint8)
    job = JobSlot(memory, memory.ctypes.data)
    set_current(job)
    try:
        batch = gather_mod.gather(store, idx, True)
    finally:
        set_current(None)
    assert job.holds(batch["img"]) and job.holds(batch["y"])
    same(batch, default_collate([store[int(i)] for i in idx]))


def test_indices_outside_the_store_never_reach_the_span(store, monkeypatch):
    gather_mod.gather(store, np.arange(len(store)), True)
    monkeypatch.setattr(type(store._span), "read", lambda *a: pytest.fail("read a span with a bad index"))
    for bad in ([0, -len(store) - 1], [len(store), 0]):
        with pytest.raises((IndexError, lazyseq.EvaluationError)):
            lazyseq.batch(lazyseq.gather(store, bad), 2, collate_fn=default_collate)[0]
        with contextlib.suppress(Exception):  # gather itself, which trusts its caller: never the span
            gather_mod.gather(store, np.array([3, *bad, 70]), True)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 80), shard=st.integers(1, 12), data=st.data())
def test_any_store_any_indices(tmp_path_factory, n, shard, data):
    path = tmp_path_factory.mktemp("any") / "s"
    lazyseq.save([{"v": np.array([i, -i], np.int64), "f": i / 3} for i in range(n)], path, method="thread",
                 shard_bytes=shard * 24)
    s = lazyseq.load(path)
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40)), np.int64)
    for _ in range(2):  # the first read opens the shards, the second reads through the span
        same(gather_mod.gather(s, idx, True), default_collate([s[int(i)] for i in idx]))
        for x, i in zip(gather_mod.gather(s, idx, False), idx):
            same(x, s[int(i)])
