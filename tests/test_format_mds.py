"""lazyseq.mds (issue #33) against MosaicML Streaming's own reader: datasets written by
``streaming.MDSWriter`` with every encoding lazyseq.mds decodes, compressed (zstd, gz, bz2) and not,
with a split, every item compared with ``streaming.LocalDataset``. Then indexing semantics, pickling,
fingerprints, thread and process workers, the DataLoader, block_shuffle over ``.cuts``, save, and the
local HTTP server.

``streaming``'s own ``__init__`` imports its whole trainer stack (transformers, torchvision): the
tests import its writer and LocalDataset modules alone (:func:`peer`)."""

import importlib.util
import os
import pickle
import sys
import types
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq

if importlib.util.find_spec("streaming") is None:  # (importorskip would run streaming's __init__: see peer())
    pytest.skip("mosaicml-streaming is not installed", allow_module_level=True)
PIL = pytest.importorskip("PIL.Image")


def peer():
    """``(MDSWriter, LocalDataset)`` of mosaicml-streaming, without running its package's ``__init__``."""
    if "streaming" not in sys.modules or not hasattr(sys.modules["streaming"], "__path__"):
        root = os.path.dirname(importlib.util.find_spec("streaming").origin)
        for name, sub in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
            m = types.ModuleType(name)
            m.__path__ = [sub]
            sys.modules.setdefault(name, m)
    from streaming.base.format.mds.writer import MDSWriter
    from streaming.base.local import LocalDataset

    return MDSWriter, LocalDataset


COLUMNS = {"i8": "int8", "u16": "uint16", "i32": "int32", "u64": "uint64", "f16": "float16", "f32": "float32",
           "f64": "float64", "n": "int", "s": "str", "b": "bytes", "j": "json", "a": "ndarray", "a32": "ndarray:int32",
           "img": "ndarray:uint8:4,3", "jpg": "jpeg", "png": "png", "pil": "pil", "si": "str_int", "sf": "str_float",
           "u8": "uint8", "i16": "int16", "u32": "uint32", "i64": "int64", "sd": "str_decimal"}


def sample(i: int, rng) -> dict:
    img = PIL.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
    return {"i8": np.int8(i % 100 - 50), "u16": np.uint16(i), "i32": np.int32(-i), "u64": np.uint64(i * 7),
            "f16": np.float16(i / 3), "f32": np.float32(i / 7), "f64": np.float64(i / 11), "n": i - 5,
            "s": f"text {i} é" * (i % 4), "b": rng.bytes(int(rng.integers(0, 50))), "j": {"i": i, "l": [1, None]},
            "a": rng.standard_normal((1 + i % 3, 2)).astype(np.float32), "a32": np.arange(1 + i % 5, dtype=np.int32),
            "img": rng.integers(0, 255, (4, 3), dtype=np.uint8), "jpg": img, "png": img, "pil": img,
            "si": i * 1000, "sf": i / 4, "u8": np.uint8(i), "i16": np.int16(-3 * i), "u32": np.uint32(2**31 + i),
            "i64": np.int64(-(2**40) * i), "sd": Decimal(i) / 8}


def write(path, n=37, compression=None, columns=None, size_limit=1 << 12, seed=0) -> str:
    MDSWriter, _ = peer()
    rng = np.random.default_rng(seed)
    cols = columns or COLUMNS
    with MDSWriter(out=str(path), columns=cols, compression=compression, size_limit=size_limit) as w:
        for i in range(n):
            s = sample(i, rng)
            w.write({k: s[k] for k in cols})
    return str(path)


def equal(a, b) -> bool:
    if isinstance(a, PIL.Image):
        return isinstance(b, PIL.Image) and a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, np.generic):
        return type(a) is type(b) and (a == b or (np.isnan(a) and np.isnan(b)))
    return type(a) is type(b) and a == b


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)


def reference(path, split=None) -> list[dict]:
    _, LocalDataset = peer()
    ds = LocalDataset(local=str(path), split=split)
    return [ds[i] for i in range(len(ds))]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write(tmp_path_factory.mktemp("mds") / "plain")


# -- what mosaic reads, lazyseq reads ----------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "zstd", "gz", "bz2:5"])
def test_every_encoding_reads_as_localdataset_reads_it(tmp_path, compression):
    path = write(tmp_path / "ds", compression=compression)
    ref = reference(write(tmp_path / "raw"))  # (LocalDataset reads only raw shards: the same samples, uncompressed)
    v = lazyseq.mds(path, cache_dir=tmp_path / "cache" if compression == "zstd" else None)
    assert len(v) == len(ref) == 37 and len(v.cuts) >= 2, "a small size_limit makes several shards"
    for i in range(len(v)):
        assert same(v[i], ref[i]), i
    assert all(same(a, b) for a, b in zip(v[::-1], ref[::-1]))


def test_a_split_is_its_subfolder(tmp_path):
    write(tmp_path / "ds" / "train", n=9)
    write(tmp_path / "ds" / "val", n=4, seed=1)
    for split, n in (("train", 9), ("val", 4)):
        v = lazyseq.mds(tmp_path / "ds", split=split)
        ref = reference(tmp_path / "ds", split=split)
        assert len(v) == n and all(same(v[i], ref[i]) for i in range(n))
    with pytest.raises(ValueError, match="split"):
        lazyseq.mds(tmp_path / "ds", split="../ds")
    with pytest.raises(FileNotFoundError, match=r"index\.json"):
        lazyseq.mds(tmp_path / "ds", split="test")


def test_compressed_shards_are_decompressed_once_into_cache_dir(tmp_path):
    path = write(tmp_path / "ds", compression="zstd", columns={"s": "str", "a": "ndarray"})
    for name in os.listdir(path):  # the raw shards mosaic keeps beside the zstd ones are not read
        if name.endswith(".mds"):
            os.unlink(os.path.join(path, name))
    ref = [{k: v for k, v in s.items()} for s in lazyseq.mds(path)]  # in memory
    v = lazyseq.mds(path, cache_dir=tmp_path / "cache")
    assert all(same(a, b) for a, b in zip(v, ref))
    copies = sorted(n for n in os.listdir(tmp_path / "cache") if n.endswith(".mds"))
    assert len(copies) == len(v.cuts) + 1
    stamps = [os.stat(tmp_path / "cache" / n).st_mtime_ns for n in copies]
    w = lazyseq.mds(path, cache_dir=tmp_path / "cache")
    assert all(same(a, b) for a, b in zip(w, ref))
    assert [os.stat(tmp_path / "cache" / n).st_mtime_ns for n in copies] == stamps, "a verified copy is reused"
    with open(tmp_path / "cache" / copies[0], "r+b") as f:  # a copy changed behind lazyseq's back is made again
        f.seek(20)
        f.write(b"\xff")
    assert all(same(a, b) for a, b in zip(lazyseq.mds(path, cache_dir=tmp_path / "cache"), ref))


def test_pickled_columns_are_refused_unless_allowed(tmp_path):
    MDSWriter, _ = peer()
    with MDSWriter(out=str(tmp_path / "ds"), columns={"s": "str", "p": "pkl"}) as w:
        for i in range(5):
            w.write({"s": str(i), "p": {"i": i, "t": (i, "x")}})
    path = str(tmp_path / "ds")
    with pytest.raises(ValueError, match="'p'.*allow_pickle"):
        lazyseq.mds(path)
    v = lazyseq.mds(path, allow_pickle=True)
    assert [x["p"] for x in v] == [{"i": i, "t": (i, "x")} for i in range(5)]


# -- a view like any other ---------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_indexing_follows_list_semantics(plain, data):
    v, ref = lazyseq.mds(plain), reference(plain)
    n = len(ref)
    i = data.draw(st.integers(-n, n - 1))
    assert same(v[i], ref[i])
    sl = slice(data.draw(st.none() | st.integers(-n - 2, n + 2)), data.draw(st.none() | st.integers(-n - 2, n + 2)),
               data.draw(st.none() | st.integers(-5, 5).filter(bool)))
    assert len(v[sl]) == len(ref[sl]) and all(same(a, b) for a, b in zip(v[sl], ref[sl]))
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=12))
    got = v[np.array(idx, dtype=np.int64)]
    assert all(same(a, ref[k]) for a, k in zip(got, idx))
    with pytest.raises(IndexError):
        v[n]


def test_pickles_without_data_and_fingerprints_by_identity(plain, tmp_path):
    v = lazyseq.mds(plain)
    blob = pickle.dumps(v)
    assert len(blob) < 20_000
    w = pickle.loads(blob)
    assert all(same(a, b) for a, b in zip(w, reference(plain)))
    assert lazyseq.fingerprint(v) == lazyseq.fingerprint(lazyseq.mds(plain))
    other = write(tmp_path / "other", seed=3)
    assert lazyseq.fingerprint(lazyseq.mds(other)) != lazyseq.fingerprint(v)
    fp = v.fingerprint_identity()
    assert fp["samples"] == list(v.shard_samples) and fp["stamps"] is not None
    assert lazyseq.mds(plain, strict=False).fingerprint_identity()["stamps"] is None
    assert v.nbytes() == sum(fp["bytes"])


@pytest.mark.parametrize("method", ["thread", "process"])
def test_workers_read_the_same(plain, method):
    v, ref = lazyseq.mds(plain), reference(plain)
    with lazyseq.prefetch(lazyseq.smap(lambda s: s["s"], v), nworkers=2, method=method) as p:
        assert list(p) == [s["s"] for s in ref]


def test_dataloader_and_block_shuffle_over_cuts(plain):
    v, ref = lazyseq.mds(plain), reference(plain)
    order = lazyseq.block_shuffle(v, v.cuts, seed=3)
    with lazyseq.DataLoader(lazyseq.smap(lambda s: s["u16"], order), batch_size=5, num_workers=2,
                            to_tensor=False) as dl:
        got = [int(x) for b in dl for x in b]
    assert sorted(got) == list(range(len(ref))) and got != list(range(len(ref)))


def test_save_then_load_gives_the_same_samples(plain, tmp_path):
    v = lazyseq.smap(lambda s: {"s": s["s"], "a32": s["a32"]}, lazyseq.mds(plain))
    lazyseq.save(v, tmp_path / "saved", nworkers=2, method="thread")
    store = lazyseq.load(tmp_path / "saved")
    assert len(store) == len(v)
    for a, b in zip(store, v):
        assert a["s"] == b["s"] and np.array_equal(a["a32"], b["a32"])


def test_http_reads_the_same(http_files):
    path = write(http_files.root / "ds", n=20, columns={"s": "str", "a": "ndarray", "f32": "float32"})
    ref = reference(path)
    v = lazyseq.mds(f"{http_files.url}/ds")
    assert all(same(v[i], ref[i]) for i in range(len(ref)))
    assert all(same(a, ref[i]) for a, i in zip(v[[3, 19, 0, 4]], [3, 19, 0, 4]))
    w = pickle.loads(pickle.dumps(v))
    assert same(w[7], ref[7])


def test_over_http_a_sample_is_one_ranged_get(http_files):
    path = write(http_files.root / "ds", n=40, columns={"s": "str", "a": "ndarray"}, size_limit=1 << 9)
    ref = reference(path)
    v = lazyseq.mds(f"{http_files.url}/ds")
    assert len(v.cuts) >= 2
    assert same(v[1], ref[1])  # the shard opened: its HEAD, its offset table, the sample
    http_files.reset_counts()
    assert same(v[2], ref[2])
    gets = [r for r in http_files.requests if r.method == "GET"]
    assert len(http_files.requests) == 1 and len(gets) == 1 and gets[0].range
    http_files.reset_counts()
    idx = [3, 5, 4, 6]
    assert all(same(a, ref[i]) for a, i in zip(v[idx], idx))
    assert len(http_files.requests) <= len(idx), "a batch: at most one GET per sample, no HEAD, no table read again"


@pytest.mark.parametrize("cache", [False, True])
def test_http_compressed_shards(http_files, tmp_path, cache):
    path = write(http_files.root / "ds", n=20, compression="zstd", columns={"s": "str", "a": "ndarray"})
    ref = reference(write(tmp_path / "raw", n=20, columns={"s": "str", "a": "ndarray"}))
    v = lazyseq.mds(f"{http_files.url}/ds", cache_dir=tmp_path / "cache" if cache else None)
    assert all(same(v[i], ref[i]) for i in range(20))
    assert os.path.isdir(path)


def test_s3_reads_the_same(s3, tmp_path):
    pytest.importorskip("s3fs")
    path = write(tmp_path / "ds", n=15, columns={"s": "str", "u16": "uint16"})
    for name in os.listdir(path):
        s3.client.upload_file(os.path.join(path, name), s3.bucket, f"ds/train/{name}")
    v = lazyseq.mds(f"s3://{s3.bucket}/ds", split="train", storage_options=s3.storage_options)
    ref = reference(path)
    assert len(v) == 15 and all(same(a, b) for a, b in zip(v, ref))


def test_a_worker_refuses_a_shard_changed_since_the_view_was_made(tmp_path):
    path = write(tmp_path / "ds", n=10, columns={"s": "str"})
    v = lazyseq.mds(path)
    v[0]
    w = pickle.loads(pickle.dumps(v))
    shard = os.path.join(path, "shard.00000.mds")
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(lazyseq.EvaluationError) as e:
        w[0]
    assert isinstance(e.value.__cause__, lazyseq.StoreError) and "changed" in str(e.value.__cause__)
    assert lazyseq.mds(path, strict=False)[0] == v[0]


def test_lists_of_images_and_jpeg_arrays(tmp_path):
    import io

    MDSWriter, _ = peer()
    rng = np.random.default_rng(5)
    images = [PIL.fromarray(rng.integers(0, 255, (4 + i, 3, 3), dtype=np.uint8)) for i in range(6)]

    def jpeg(img):
        out = io.BytesIO()
        img.save(out, format="JPEG")
        return out.getvalue()

    cols = {"lj": "list[jpeg]", "lp": "list[png]", "lpil": "list[pil]", "ja": "jpeg_array"}
    with MDSWriter(out=str(tmp_path / "ds"), columns=cols) as w:
        for i in range(6):
            some = images[:i + 1]
            w.write({"lj": some, "lp": some, "lpil": some, "ja": [jpeg(x) for x in some]})
    ref, v = reference(tmp_path / "ds"), lazyseq.mds(tmp_path / "ds")
    for i in range(6):
        got = v[i]
        assert got.keys() == ref[i].keys()
        for k in cols:
            assert len(got[k]) == len(ref[i][k]) == i + 1
            assert all(equal(a, b) for a, b in zip(got[k], ref[i][k])), (i, k)
