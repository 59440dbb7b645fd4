"""lazyseq.litdata (issue #33) against litdata's own reader: datasets written by ``litdata.optimize``
(one worker) with ints, floats, bools, str, bytes, numpy arrays, torch tensors, PIL images and
nested dicts, tuples and lists, uncompressed and zstd, every item compared with
``litdata.StreamingDataset``. Then indexing, pickling, fingerprints, thread and process workers,
block_shuffle over ``.cuts``, save, tensors without torch, HTTP and S3.

``StreamingDataset`` may remove a local dataset's chunks as it reads them (its cache): it reads a
copy (:func:`reference`)."""

import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq

litdata = pytest.importorskip("litdata")
torch = pytest.importorskip("torch")
PIL = pytest.importorskip("PIL.Image")


def item(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"i": i - 3, "f": i / 3, "ok": i % 2 == 0, "s": f"text {i} é" * (i % 3), "b": rng.bytes(i % 7),
            "a": np.arange(i % 5 + 1, dtype=np.int32), "m": rng.standard_normal((2, 3)).astype(np.float32),
            "t": torch.full((2, 2), i, dtype=torch.int16), "t1": torch.arange(i + 1, dtype=torch.float64),
            "img": PIL.fromarray(rng.integers(0, 255, (4, 5, 3), dtype=np.uint8)),
            "nest": (i, [i + 1, "x"], {"k": float(i)})}


def write(path, n=23, compression=None, fn=item) -> str:
    """``compression``: None, 'zstd' (each chunk file one stream) or 'batch' (framed: zstd frames of items)."""
    extra = {"compression": "zstd", "compression_level": "batch" if compression == "batch" else "chunk"} if compression else {}
    if compression == "batch":
        extra["compression_batch_size"] = 2
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=fn, inputs=list(range(n)), output_dir=str(path), chunk_size=5, num_workers=1, **extra)
    finally:  # optimize sets this process's start method to spawn: every later test's workers would spawn
        multiprocessing.set_start_method(method, force=True)
    return str(path)


def reference(path) -> list:
    copy = f"{path}-copy"
    shutil.copytree(path, copy)
    try:
        ds = litdata.StreamingDataset(copy)
        return [ds[i] for i in range(len(ds))]
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def same(a, b) -> bool:
    if isinstance(b, memoryview):  # (litdata's bytes; lazyseq gives bytes)
        return type(a) is bytes and a == bytes(b)
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(b, PIL.Image):
        return isinstance(a, PIL.Image) and (a.mode, a.size, a.tobytes()) == (b.mode, b.size, b.tobytes())
    if isinstance(b, dict):
        return type(a) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The module's datasets, written once: ``{None: path, "zstd": path, "batch": path, "pickle": path}``
    and the first three's references."""
    root = tmp_path_factory.mktemp("litdata")
    paths = {c: write(root / f"ds-{c}", compression=c) for c in (None, "zstd", "batch")}
    refs = {c: reference(p) for c, p in paths.items()}
    paths["pickle"] = write(root / "ds-pickle", n=4, fn=pickled)  # (optimize leaves threads: not in a test)
    paths["texts"] = write(root / "ds-texts", n=7, fn=texts)
    return paths, refs


@pytest.fixture
def plain(data):
    return data[0][None]


@pytest.mark.parametrize("compression", [None, "zstd", "batch"])
def test_every_item_reads_as_streamingdataset_reads_it(data, compression, tmp_path):
    paths, refs = data
    for cache_dir in (None, tmp_path / "cache"):
        v = lazyseq.litdata(paths[compression], cache_dir=cache_dir)
        assert len(v) == len(refs[compression]) == 23 and v.cuts == [5, 10, 15, 20]
        assert all(same(v[i], refs[compression][i]) for i in range(len(v)))
        assert all(same(a, refs[compression][i]) for a, i in zip(v[[22, 0, 7, 8, 3]], [22, 0, 7, 8, 3]))
    if compression == "zstd":
        assert len(os.listdir(tmp_path / "cache")) == 2 * 5  # a copy and its record per chunk, made once
        w = lazyseq.litdata(paths[compression], cache_dir=tmp_path / "cache")
        assert same(w[21], refs[compression][21]) and len(os.listdir(tmp_path / "cache")) == 10


@settings(max_examples=40, deadline=None)
@given(draw=st.data())
def test_indexing_slices_and_negatives(data, draw):
    v, ref = lazyseq.litdata(data[0][None]), data[1][None]
    n = len(ref)
    i = draw.draw(st.integers(-n, n - 1))
    assert same(v[i], ref[i])
    sl = slice(draw.draw(st.none() | st.integers(-n - 2, n + 2)), draw.draw(st.none() | st.integers(-n - 2, n + 2)),
               draw.draw(st.none() | st.integers(-5, 5).filter(bool)))
    assert len(v[sl]) == len(ref[sl]) and all(same(a, b) for a, b in zip(v[sl], ref[sl]))
    with pytest.raises(IndexError):
        v[n]


def test_pickles_without_data_and_fingerprints_by_identity(data, tmp_path):
    path, ref = data[0][None], data[1][None]
    v = lazyseq.litdata(path)
    blob = pickle.dumps(v)
    assert len(blob) < 20_000
    assert all(same(a, b) for a, b in zip(pickle.loads(blob), ref))
    assert lazyseq.fingerprint(v) == lazyseq.fingerprint(lazyseq.litdata(path))
    copy = shutil.copytree(path, tmp_path / "copy")
    before = lazyseq.fingerprint(lazyseq.litdata(copy))
    chunk = os.path.join(copy, lazyseq.litdata(copy).index.chunks[1].name)
    data_ = bytearray(open(chunk, "rb").read())
    data_[-1] ^= 1
    open(chunk, "wb").write(bytes(data_))
    os.utime(chunk, ns=(1, 1))
    assert lazyseq.fingerprint(lazyseq.litdata(copy)) != before
    fp = v.fingerprint_identity()
    assert fp["items"] == list(v.chunk_items) and v.nbytes() == sum(fp["bytes"])


@pytest.mark.parametrize("method", ["thread", "process"])
def test_workers_read_the_same(data, method):
    v, ref = lazyseq.litdata(data[0][None]), data[1][None]
    with lazyseq.prefetch(lazyseq.smap(lambda s: (s["s"], s["a"].tolist()), v), nworkers=2, method=method) as p:
        assert list(p) == [(s["s"], s["a"].tolist()) for s in ref]


def test_block_shuffle_over_cuts(data):
    v = lazyseq.litdata(data[0][None])
    order = lazyseq.block_shuffle(v, v.cuts, seed=3)
    got = [s["i"] + 3 for s in order]
    assert sorted(got) == list(range(len(v))) and got != list(range(len(v)))


def test_save_then_load_gives_the_same_items(data, tmp_path):
    v = lazyseq.smap(lambda s: {"s": s["s"], "a": s["a"], "i": s["i"]}, lazyseq.litdata(data[0][None]))
    lazyseq.save(v, tmp_path / "saved", nworkers=2, method="thread")
    store = lazyseq.load(tmp_path / "saved")
    assert len(store) == len(v)
    for a, b in zip(store, v):
        assert a["s"] == b["s"] and np.array_equal(a["a"], b["a"]) and int(a["i"]) == b["i"]


def test_tensors_are_numpy_arrays_without_torch(data):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, lazyseq\n"
            f"v = lazyseq.litdata({data[0]['zstd']!r})\n"
            "x = v[4]\n"
            "assert type(x['t']) is np.ndarray and x['t'].dtype == np.int16 and x['t'].shape == (2, 2), x['t']\n"
            "assert x['t1'].dtype == np.float64 and x['t1'].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(lazyseq.__file__))))
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_http_reads_the_same(data, http_files, tmp_path):
    for c in (None, "zstd", "batch"):
        shutil.copytree(data[0][c], http_files.root / f"ds-{c}")
        ref = data[1][c]
        v = lazyseq.litdata(f"{http_files.url}/ds-{c}")
        assert all(same(v[i], ref[i]) for i in range(len(ref)))
        assert all(same(a, ref[i]) for a, i in zip(v[[3, 19, 0, 4]], [3, 19, 0, 4]))
        assert same(pickle.loads(pickle.dumps(v))[7], ref[7])
    for c in (None, "batch"):  # (batch: frames of 2 items, item 2 the first of the second frame)
        v = lazyseq.litdata(f"{http_files.url}/ds-{c}")
        v[1]
        http_files.reset_counts()
        assert same(v[2], data[1][c][2])
        gets = [r for r in http_files.requests if r.method == "GET"]
        assert len(http_files.requests) == 1 and len(gets) == 1 and gets[0].range, "an item: one ranged GET"
        http_files.reset_counts()
        assert all(same(a, data[1][c][i]) for a, i in zip(v[[4, 3, 0, 1]], [4, 3, 0, 1]))
        assert len(http_files.requests) <= 4, "a batch: its ranges at once"


def test_s3_reads_the_same(data, s3):
    pytest.importorskip("s3fs")
    path, ref = data[0][None], data[1][None]
    for name in os.listdir(path):
        s3.client.upload_file(os.path.join(path, name), s3.bucket, f"ds/{name}")
    v = lazyseq.litdata(f"s3://{s3.bucket}/ds", storage_options=s3.storage_options)
    assert len(v) == len(ref) and all(same(a, b) for a, b in zip(v, ref))


def pickled(i: int) -> dict:
    return {"i": i, "o": {1, 2, i}}  # (a set: litdata pickles it)


def test_pickled_leaves_are_refused_unless_allowed(data):
    path = data[0]["pickle"]
    with pytest.raises(lazyseq.StoreError, match="'o'.*pickle.*allow_pickle"):
        lazyseq.litdata(path)
    v = lazyseq.litdata(path, allow_pickle=True)
    assert [x["o"] for x in v] == [{1, 2, i} for i in range(4)]


def texts(i: int) -> dict:
    return {"text": f"row {i}", "title": "t"}  # (rows of strings only: litdata keeps them as an Arrow footer)


def test_items_kept_only_as_an_arrow_footer_read_as_streamingdataset_reads_them(data):
    path = data[0]["texts"]
    v, ref = lazyseq.litdata(path), reference(path)
    assert len(v) == len(ref) == 7 and all(same(v[i], ref[i]) for i in range(len(v)))
    assert [x["text"] for x in v[[6, 0, 5]]] == ["row 6", "row 0", "row 5"]


def test_a_missing_dataset_and_bad_arguments():
    with pytest.raises(FileNotFoundError, match="index.json"):
        lazyseq.litdata("/nonexistent/ds")
    with pytest.raises(TypeError, match="lazyseq.litdata"):
        lazyseq.litdata(3)


def test_writing_the_datasets_left_the_start_method_as_it_was(data):
    """litdata.optimize sets multiprocessing's start method to spawn; the fixture puts it back, so
    later tests' workers start as they would have (a spawned worker cannot import a test module)."""
    assert multiprocessing.get_start_method(allow_none=True) in (None, "fork")
