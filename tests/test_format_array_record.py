"""lazyseq.array_record against the array-record package's own reader: files written by
``ArrayRecordWriter`` with several options (group sizes, compressions), empty and large records,
many files, a folder; then indexing semantics, pickling, fingerprints, thread and process workers,
block_shuffle over ``.cuts``, save, HTTP and S3 (a verified local copy)."""

import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq

arm = pytest.importorskip("array_record.python.array_record_module")

OPTIONS = ["", "group_size:1", "zstd", "uncompressed", "snappy", "group_size:7,zstd:3"]


def records(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(0, 40))) if i % 5 else b"" for i in range(n)]


def write(path, recs, options="") -> str:
    w = arm.ArrayRecordWriter(str(path), options)
    for r in recs:
        w.write(r)
    w.close()
    return str(path)


def reference(path) -> list[bytes]:
    r = arm.ArrayRecordReader(str(path))
    try:
        return list(r.read_all())
    finally:
        r.close()


def make(root):
    root.mkdir()
    for k, n in enumerate([7, 1, 12]):
        write(root / f"part-{k}.array_record", records(n, seed=k), "group_size:3")
    return root


@pytest.fixture
def folder(tmp_path):
    return make(tmp_path / "ds")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A folder no test changes (for hypothesis: a fixture made once)."""
    return make(tmp_path_factory.mktemp("ar") / "ds")


def every(folder) -> list[bytes]:
    return [r for p in sorted(os.listdir(folder)) for r in reference(folder / p)]


@pytest.mark.parametrize("options", OPTIONS)
def test_reads_as_the_packages_reader_reads(tmp_path, options):
    recs = [*records(30), b"\0" * (3 * 2**20), b""]
    path = write(tmp_path / "a.array_record", recs, options)
    v = lazyseq.array_record(path)
    assert list(v) == reference(path) == recs
    assert list(v[[31, 0, 30, 5]]) == [recs[31], recs[0], recs[30], recs[5]]


def test_a_folder_and_many_files(folder, tmp_path):
    v, ref = lazyseq.array_record(folder), every(folder)
    assert len(v) == 20 and v.cuts == [7, 8] and list(v) == ref
    assert repr(v).startswith("array_record(3 files)")
    many = [write(tmp_path / f"m{k:03d}.array_record", records(3, k)) for k in range(40)]
    w = lazyseq.array_record(many)
    assert list(w) == [r for p in many for r in reference(p)] and len(w.cuts) == 39


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_indexing_follows_list_semantics(shared, data):
    v, ref = lazyseq.array_record(shared), every(shared)
    n = len(ref)
    i = data.draw(st.integers(-n, n - 1))
    assert v[i] == ref[i]
    sl = slice(data.draw(st.none() | st.integers(-n - 2, n + 2)), data.draw(st.none() | st.integers(-n - 2, n + 2)),
               data.draw(st.none() | st.integers(-5, 5).filter(bool)))
    assert list(v[sl]) == ref[sl]
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=12))
    assert list(v[np.array(idx, dtype=np.int64)]) == [ref[k] for k in idx]
    with pytest.raises(IndexError):
        v[n]
    with pytest.raises(IndexError):
        v[-n - 1]


def test_pickles_without_data_and_fingerprints_by_identity(folder):
    v = lazyseq.array_record(folder)
    v[0]
    blob = pickle.dumps(v)
    assert len(blob) < 5_000
    assert list(pickle.loads(blob)) == every(folder)
    fp = lazyseq.fingerprint(v)
    assert fp == lazyseq.fingerprint(lazyseq.array_record(folder))
    write(folder / "part-1.array_record", [b"other"], "group_size:3")
    assert lazyseq.fingerprint(lazyseq.array_record(folder)) != fp
    assert v.nbytes() == sum(v.fingerprint_identity()["bytes"])


def test_a_changed_file_is_refused_after_pickling(folder):
    v = lazyseq.array_record(folder)
    w = pickle.loads(pickle.dumps(v))
    write(folder / "part-0.array_record", [b"x"] * 9)
    with pytest.raises(lazyseq.EvaluationError) as e:
        w[0]
    assert isinstance(e.value.__cause__, lazyseq.StoreError) and "changed" in str(e.value.__cause__)


@pytest.mark.parametrize("method", ["thread", "process"])
def test_workers_read_the_same(folder, method):
    v, ref = lazyseq.array_record(folder), every(folder)
    with lazyseq.prefetch(v, nworkers=2, method=method) as p:
        assert list(p) == ref
    batches = lazyseq.batch(v, 4, collate_fn=list)
    with lazyseq.prefetch(batches, nworkers=2, method=method) as p:
        assert [r for b in p for r in b] == ref


def test_concurrent_bulk_reads_from_threads(folder):
    from concurrent.futures import ThreadPoolExecutor

    v, ref = lazyseq.array_record(folder), every(folder)
    rng = np.random.default_rng(1)
    asks = [rng.integers(0, len(ref), 30).tolist() for _ in range(64)]
    with ThreadPoolExecutor(8) as ex:
        for idx, got in zip(asks, ex.map(lambda idx: v[idx], asks)):
            assert list(got) == [ref[i] for i in idx]


def test_open_readers_are_bounded(tmp_path, monkeypatch):
    """Each open reader holds a descriptor: a view over many files keeps OPEN_READERS of them open."""
    from concurrent.futures import ThreadPoolExecutor

    from lazyseq.formats import array_record as module

    monkeypatch.setattr(module, "OPEN_READERS", 3)
    paths = [write(tmp_path / f"m{k:02d}.array_record", records(4, k)) for k in range(12)]
    v, ref = lazyseq.array_record(paths), [r for p in paths for r in reference(p)]
    assert len(v._readers) <= 3
    rng = np.random.default_rng(2)
    asks = [rng.integers(0, len(ref), 10).tolist() for _ in range(48)]
    with ThreadPoolExecutor(6) as ex:
        for idx, got in zip(asks, ex.map(lambda idx: list(v[idx]), asks)):
            assert got == [ref[i] for i in idx]
    assert len(v._readers) <= 3 + 6, "at most the limit, and those in use while a reader opened"


def test_block_shuffle_over_cuts(folder):
    v, ref = lazyseq.array_record(folder), every(folder)
    for epoch in range(2):
        order = lazyseq.block_shuffle(v, v.cuts, seed=3 + epoch)
        got = list(order)
        assert sorted(got) == sorted(ref)
    assert list(lazyseq.block_shuffle(v, v.cuts, seed=3)) == list(lazyseq.block_shuffle(v, v.cuts, seed=3))


def test_save_then_load_gives_the_same_records(folder, tmp_path):
    v = lazyseq.array_record(folder)
    lazyseq.save(v, tmp_path / "saved", nworkers=2, method="thread")
    store = lazyseq.load(tmp_path / "saved")
    assert [bytes(x) for x in store] == every(folder)


def test_http_reads_a_verified_copy(http_files, tmp_path):
    recs = records(25)
    write(http_files.root / "a.array_record", recs, "group_size:1")
    url = f"{http_files.url}/a.array_record"
    v = lazyseq.array_record(url, cache_dir=tmp_path / "cache")
    assert list(v) == recs and list(v[[3, 0, 24]]) == [recs[3], recs[0], recs[24]]
    copies = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".array_record")]
    assert len(copies) == 1
    w = pickle.loads(pickle.dumps(v))
    http_files.reset_counts()
    assert w[7] == recs[7]
    assert not [r for r in http_files.requests if r.method == "GET" and r.range], "the copy is reused"


def test_s3_reads_the_same(s3, tmp_path):
    pytest.importorskip("s3fs")
    for k in range(2):
        path = write(tmp_path / f"p{k}.array_record", records(6, k))
        s3.client.upload_file(path, s3.bucket, f"ds/p{k}.array_record")
    v = lazyseq.array_record(f"s3://{s3.bucket}/ds", storage_options=s3.storage_options, cache_dir=tmp_path / "c")
    assert list(v) == records(6, 0) + records(6, 1) and v.cuts == [6]


def test_bad_arguments():
    with pytest.raises(ValueError):
        lazyseq.array_record([])
    with pytest.raises(TypeError):
        lazyseq.array_record([3])
