"""lazyseq.formats.lance: Lance datasets read at random, compared with pylance's own ``take``."""

import os
import pickle
import shutil
import threading
import warnings

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pylance = pytest.importorskip("lance")

import lazyseq  # noqa: E402
from lazyseq import StoreError  # noqa: E402
from lazyseq.core.node import Failed  # noqa: E402
from lazyseq.errors import EvaluationError  # noqa: E402
from lazyseq.formats.lance import Lance, lance  # noqa: E402
from tests.hostile import raised_within  # noqa: E402
from tests.rows import norm as plain  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # process workers fork; the view reopens




def table(n, start=0):
    r = range(start, start + n)
    return pa.table({
        "x": pa.array(list(r), pa.int64()),
        "f": pa.array([None if i % 5 == 0 else i / 4 for i in r], pa.float32()),
        "s": [None if i % 7 == 0 else f"row {i} é" for i in r],
        "b": [bytes([i % 256]) * (i % 4) for i in r],
        "v": pa.array([[float(i)] * (i % 3) for i in r], pa.list_(pa.float64())),
        "w": pa.array([None if i % 6 == 0 else [i, None] for i in r], pa.list_(pa.int32())),
        "st": [{"a": i, "t": str(i)} if i % 4 else None for i in r],
    })


def write(path, n=100, per_file=30, **kw):
    return pylance.write_dataset(table(n), str(path), max_rows_per_file=per_file, **kw)


@pytest.fixture
def ds(tmp_path):
    return write(tmp_path / "d.lance")


def test_items_equal_lances_take(ds):
    v = lance(ds.uri)
    assert isinstance(v, Lance) and len(v) == 100 and v.blocks == 4 and v.block_rows == (30, 30, 30, 10)
    assert v.cuts == [30, 60, 90]
    want = ds.to_table().to_pylist()
    assert [plain(v[i]) for i in range(len(v))] == want
    assert plain(list(v[::-1])) == want[::-1]
    idx = [99, 3, 3, 61, 0, 45]
    assert plain(v._get_many(idx)) == ds.take(idx).to_pylist()
    assert plain(v._get_each(idx)) == ds.take(idx).to_pylist()
    item = v[1]
    assert type(item["x"]) is np.int64 and item["f"] == np.float32(0.25) and item["st"] == {"a": 1, "t": "1"}
    assert isinstance(item["v"], np.ndarray) and not item["v"].flags.writeable
    assert v[0]["f"] is None and v[0]["s"] is None and v[0]["st"] is None and v[0]["w"] is None
    assert v[1]["w"] == [1, None]  # a list with a null: a Python list
    fresh = lance(ds.uri, cache=2)
    fresh[5], fresh[6], fresh[95], fresh[7]
    assert fresh.held() == [(3, 0), (0, 0)]  # windows: all the rows of a fragment here (fewer than WINDOW_ROWS)


def test_a_window_of_big_rows_is_a_few_rows(tmp_path):
    rng = np.random.default_rng(0)  # random bytes: Lance does not compress them
    blobs = [rng.bytes(200_000) for _ in range(30)]  # 200 KB a row: about 5 rows in a 1 MiB window
    ds = pylance.write_dataset(pa.table({"k": list(range(30)), "blob": blobs}), str(tmp_path / "big.lance"))
    v = lance(ds.uri, cache=2)
    assert 1 <= v.window <= 6
    assert [(int(x["k"]), x["blob"]) for x in v] == list(enumerate(blobs))
    assert v.held() == [(0, (29 // v.window) - 1), (0, 29 // v.window)]


def test_columns_in_schema_order(ds):
    v = lance(ds.uri, columns=["s", "x"])
    assert list(v[7]) == ["x", "s"] and plain(v[8]) == {"x": 8, "s": "row 8 é"}
    assert v.fingerprint_identity()["columns"] == ["x", "s"]
    with pytest.raises(KeyError, match="no column 'nope'"):
        lance(ds.uri, columns=["x", "nope"])
    with pytest.raises(TypeError, match="use \\[name\\]"):
        lance(ds.uri, columns="x")
    with pytest.raises(ValueError, match="cache must be an int"):
        lance(ds.uri, cache=0)


def test_deleted_rows_are_not_there_and_an_older_view_keeps_its_version(ds):
    before = lance(ds.uri)
    ds.delete("x < 10 or (x >= 40 and x < 45)")
    now = pylance.dataset(ds.uri)
    v = lance(ds.uri)
    assert v.version == now.version == before.version + 1
    assert len(v) == now.count_rows() == 85
    assert list(v.block_rows) == [f.count_rows() for f in now.get_fragments()] == [20, 25, 30, 10]
    assert [plain(v[i]) for i in range(len(v))] == now.to_table().to_pylist()
    assert plain(v._get_many([0, 84, 20])) == now.take([0, 84, 20]).to_pylist()
    assert len(before) == 100 and plain(before[0])["x"] == 0 and plain(before._get_many([40]))[0]["x"] == 40
    assert lazyseq.fingerprint(before) != lazyseq.fingerprint(v)


def test_pickled_small_and_read_alike(ds):
    v = lance(ds.uri, columns=["x", "v"])
    v[3]
    data = pickle.dumps(v)
    assert len(data) < 4000
    w = pickle.loads(data)
    assert w._ds is None  # unpickling opens nothing: the first read does
    assert plain(list(w)) == plain(list(v)) and plain(w._get_many([5, 2])) == plain(v._get_many([5, 2]))
    assert lazyseq.fingerprint(w) == lazyseq.fingerprint(v)


def test_prefetch_in_processes_and_threads(ds):
    v = lance(ds.uri)
    want = ds.to_table().to_pylist()
    with lazyseq.prefetch(v, nworkers=2, method="process") as p:
        assert [plain(x) for x in p] == want
    with lazyseq.prefetch(lazyseq.batch(v, 16, collate_fn=list), nworkers=4, method="thread") as p:
        assert [plain(x) for b in p for x in b] == want


def test_threads_share_one_view(ds):
    v = lance(ds.uri, cache=2)
    want = ds.to_table().to_pylist()
    bad = []

    def read(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            i = int(rng.integers(len(v)))
            idx = rng.integers(0, len(v), 8).tolist()
            if plain(v[i]) != want[i] or plain(v._get_many(idx)) != [want[j] for j in idx]:
                bad.append(i)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not bad
    assert len(v.held()) <= 2


def test_block_shuffle_by_fragment(ds):
    v = lance(ds.uri, columns=["x"])
    order = [int(x["x"]) for x in lazyseq.block_shuffle(v, v.cuts, seed=0)]
    assert sorted(order) == list(range(100)) and order != list(range(100))


def test_save_and_load(ds, tmp_path):
    v = lance(ds.uri, columns=["x", "b", "v"])  # columns without nulls: a store's items share one structure
    lazyseq.save(v, tmp_path / "store")
    assert [plain(x) for x in lazyseq.load(tmp_path / "store")] == plain(list(v))


def test_fingerprint_follows_the_version(ds, tmp_path):
    v = lance(ds.uri)
    fp = lazyseq.fingerprint(v)
    assert lazyseq.fingerprint(lance(ds.uri)) == fp
    pylance.write_dataset(table(5, 100), ds.uri, mode="append")
    w = lance(ds.uri)
    assert len(w) == 105 and w.version == v.version + 1 and lazyseq.fingerprint(w) != fp
    assert len(v) == 100 and plain(v._get_many([99]))[0]["x"] == 99 and lazyseq.fingerprint(v) == fp
    copy = tmp_path / "elsewhere" / "d.lance"
    shutil.copytree(ds.uri, copy)
    assert lazyseq.fingerprint(lance(copy, strict=False)) == lazyseq.fingerprint(lance(ds.uri, strict=False))


def test_a_version_rewritten_under_its_number(tmp_path):
    path = tmp_path / "d.lance"
    write(path)
    strict, loose = lance(path), lance(path, strict=False)
    sent, sent_loose = pickle.dumps(strict), pickle.dumps(loose)
    shutil.rmtree(path)
    write(path)  # version 1 again, same rows, another timestamp
    assert lazyseq.fingerprint(lance(path)) != lazyseq.fingerprint(strict)
    assert lazyseq.fingerprint(lance(path, strict=False)) == lazyseq.fingerprint(loose)
    with pytest.raises(EvaluationError) as e:
        pickle.loads(sent)[0]
    assert isinstance(e.value.__cause__, StoreError) and "changed since this view was made" in str(e.value)
    assert plain(pickle.loads(sent_loose)[3])["x"] == 3
    shutil.rmtree(path)
    write(path, per_file=50)  # other fragments: refused even without strict
    with pytest.raises(StoreError, match="changed since"):
        pickle.loads(sent_loose)._get_many([0])


def data_file(ds, k):
    return os.path.join(ds.uri, "data", ds.get_fragments()[k].metadata.files[0].path)


def test_strangers_at_construction(ds, tmp_path):
    with pytest.raises(FileNotFoundError, match="is missing"):
        lance(tmp_path / "nothing.lance")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no _versions/ folder"):
        lance(tmp_path / "empty")
    (tmp_path / "f.lance").write_bytes(b"not a folder")
    with pytest.raises(StoreError, match="is a file"):
        lance(tmp_path / "f.lance")
    os.symlink(ds.uri, tmp_path / "link.lance")
    with pytest.raises(StoreError, match="is a symbolic link"):
        lance(tmp_path / "link.lance")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "junk.parquet").write_bytes(b"x")  # unlisted files are ignored
    with open(os.path.join(ds.uri, "data", "unlisted.lance"), "wb") as f:
        f.write(b"junk")
    assert len(lance(ds.uri)) == 100


@pytest.mark.parametrize("harm", ["missing", "truncated", "longer", "symlink"])
def test_a_data_file_not_as_listed(ds, tmp_path, harm):
    path = data_file(ds, 2)
    body = open(path, "rb").read()
    if harm == "missing":
        os.remove(path)
    elif harm in ("truncated", "longer"):
        with open(path, "wb") as f:
            f.write(body[:-50] if harm == "truncated" else body + b"\0" * 50)
    else:
        moved = tmp_path / "moved.lance"
        moved.write_bytes(body)
        os.remove(path)
        os.symlink(moved, path)
    words = {"missing": "is missing", "truncated": "the manifest says", "longer": "the manifest says",
             "symlink": "a symbolic link"}[harm]
    with pytest.raises(StoreError, match=words) as e:
        lance(ds.uri)
    assert "fragment 2" in str(e.value) and os.path.basename(path) in str(e.value)


def test_a_deletion_file_missing(ds):
    ds.delete("x < 10")
    m = pylance.dataset(ds.uri).get_fragments()[0].metadata
    os.remove(os.path.join(ds.uri, m.deletion_file.path(m.id)))
    with pytest.raises(StoreError, match="fragment 0: its deletion file .* is missing"):
        lance(ds.uri)


def test_a_manifest_cut_short(ds):
    versions = os.path.join(ds.uri, "_versions")
    for name in os.listdir(versions):
        if name.endswith(".manifest"):
            p = os.path.join(versions, name)
            body = open(p, "rb").read()
            with open(p, "wb") as f:
                f.write(body[: len(body) // 2])
    with pytest.raises(StoreError, match="d.lance \\(a Lance dataset, version latest\\) is not valid") as e:
        lance(ds.uri)
    assert "LanceError" in str(e.value) or "ValueError" in str(e.value)


def test_garbled_data_fails_its_reads_only(ds, capfd):
    v = lance(ds.uri, columns=["x", "s"])
    path = data_file(ds, 1)  # rows 30 to 59
    body = bytearray(open(path, "rb").read())
    body[: len(body) - 40] = bytes(len(body) - 40)  # same size: the manifest cannot tell
    with open(path, "wb") as f:
        f.write(body)
    err = raised_within(60, lambda: v[35])
    assert isinstance(err, EvaluationError) and isinstance(err.__cause__, StoreError)
    assert "d.lance (a Lance dataset, version 1), 30 rows of fragment 1 is not valid" in str(err.__cause__)
    err = raised_within(60, lambda: v._get_many([2, 40]))
    assert isinstance(err, StoreError) and "2 rows of fragments 0, 1" in str(err)
    got = v._get_each([2, 40, 95])
    assert plain(got[0]) == {"x": 2, "s": "row 2 é"} and plain(got[2]) == {"x": 95, "s": "row 95 é"}
    assert isinstance(got[1], Failed) and isinstance(got[1].error, StoreError) and "fragment 1" in str(got[1].error)
    capfd.readouterr()  # Lance's panic message on stderr


def test_on_s3(s3):
    so = {"aws_endpoint": s3.endpoint_url, "allow_http": "true", "aws_access_key_id": s3.key,
          "aws_secret_access_key": s3.secret, "aws_region": s3.region}
    uri = f"s3://{s3.bucket}/d.lance"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = write(uri, storage_options=so)
    v = lance(uri, storage_options=so, columns=["x", "s", "st"])
    assert len(v) == 100 and v.cuts == [30, 60, 90] and v.nbytes() > 0
    assert plain(list(v)) == ds.to_table(columns=["x", "s", "st"]).to_pylist()
    w = pickle.loads(pickle.dumps(v))
    assert plain(w._get_many([99, 0])) == ds.take([99, 0], columns=["x", "s", "st"]).to_pylist()
    assert v.fingerprint_identity()["dataset"] == "d.lance"
    with pytest.raises(FileNotFoundError, match="is missing"):
        lance(f"s3://{s3.bucket}/nothing.lance", storage_options=so)
    key = f"d.lance/data/{ds.get_fragments()[1].metadata.files[0].path}"
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body[:-100])  # cut short: Lance's ranged reads fail
    err = raised_within(60, lambda: lance(uri, storage_options=so)._get_many([35]))
    assert isinstance(err, StoreError) and "s3://" in str(err) and "1 row of fragment 1 is not valid" in str(err)


def test_process_workers_over_lance_start_without_fork(ds):
    # the parent has used Lance (its runtime threads run): a forked child opening the dataset can hang
    v = lazyseq.batch(lance(ds.uri), 10, collate_fn=list)
    p = lazyseq.prefetch(v, nworkers=2, method="process", timeout=60)
    try:
        assert p.mp_context.get_start_method() in ("forkserver", "spawn")
        assert [plain(x) for b in p for x in b] == ds.to_table().to_pylist()
    finally:
        p.close()
    q = lazyseq.prefetch(v, nworkers=1, method="process", mp_context="fork", lazy_start=True)
    assert q.mp_context.get_start_method() == "fork"  # a method asked for is kept
    q.close()
    assert lazyseq.prefetch(lazyseq.arange(4), nworkers=1, method="process",
                            lazy_start=True).mp_context.get_start_method() == "fork"


def test_save_of_a_lance_view_starts_its_workers_without_fork(ds, tmp_path, monkeypatch):
    import lazyseq.evaluation.view as V

    started = []
    real = V._start_method
    monkeypatch.setattr(V, "_start_method", lambda seq: started.append(real(seq)) or started[-1])
    lazyseq.save(lance(ds.uri, columns=["x"]), tmp_path / "s", nworkers=2, method="process")
    assert started and started[-1] in ("forkserver", "spawn")  # save's shard writer shows no children, but reads it
    assert [int(r["x"]) for r in lazyseq.load(tmp_path / "s")] == ds.to_table().column("x").to_pylist()
