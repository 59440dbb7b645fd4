"""lazyseq.mds on a stranger's dataset: an index.json whose sizes, counts, encodings or names lie, shards
missing, truncated or with offset tables that lie, compressed shards that decompress to more or less
than they say: each a StoreError (or, for a setting the caller gives, a ValueError) naming the file,
within a bound of time, never a read outside the file, never an unpickle. Then a bounded fuzz of
mutated index.json fields and offset tables: every outcome an error of those kinds or a correct read."""

import json
import os
import re
import struct
import zlib

import numpy as np
import pytest
from hostile import raised_within as raised_at_all

import lazyseq
from lazyseq import StoreError

STRUCTURE = (StoreError, ValueError, FileNotFoundError)


def raised_within(seconds, fn):
    """What ``fn()`` raises within ``seconds`` (a read's error as the view raised it, unwrapped)."""
    e = raised_at_all(seconds, fn)
    return e.__cause__ if isinstance(e, lazyseq.EvaluationError) else e


def raw_shard(rows: list[bytes]) -> bytes:
    head = 4 * (len(rows) + 2)
    ends = [head + sum(map(len, rows[:k])) for k in range(len(rows) + 1)]
    return struct.pack(f"<{len(ends) + 1}I", len(rows), *ends) + b"".join(rows)


def rows_of(n: int, first: int = 0) -> list[bytes]:
    """Samples of the columns (x int32, s str, a ndarray:int16): the str's size, then x, s, a."""
    out = []
    for i in range(first, first + n):
        s = f"row {i}".encode() * (i % 3)
        out.append(struct.pack("<Ii", len(s), i) + s + np.full(2, i, np.int16).tobytes())
    return out


def info(name: str, data: bytes, samples: int, zip_name=None, zipped=None) -> dict:
    return {"column_encodings": ["int32", "str", "ndarray:int16:2"], "column_names": ["x", "s", "a"],
            "column_sizes": [4, None, 4], "compression": "gz" if zipped is not None else None, "format": "mds",
            "hashes": [], "raw_data": {"basename": name, "bytes": len(data), "hashes": {}}, "samples": samples,
            "size_limit": 1 << 26, "version": 2,
            "zip_data": None if zipped is None else {"basename": zip_name, "bytes": len(zipped), "hashes": {}}}


def dataset(root, counts=(5, 4), gz=False) -> list[dict]:
    """A dataset of shards of ``counts`` samples (``gz``: the second gzip-compressed); its index's shards."""
    os.makedirs(root, exist_ok=True)
    shards, first = [], 0
    for k, n in enumerate(counts):
        data, name = raw_shard(rows_of(n, first)), f"shard.{k:05d}.mds"
        if gz and k == 1:
            c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            zipped = c.compress(data) + c.flush()
            (root / (name + ".gz")).write_bytes(zipped)
            shards.append(info(name, data, n, name + ".gz", zipped))
        else:
            (root / name).write_bytes(data)
            shards.append(info(name, data, n))
        first += n
    (root / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    return shards


def expect(i: int) -> dict:
    return {"x": np.int32(i), "s": f"row {i}" * (i % 3), "a": np.full(2, i, np.int16)}


def correct(v, rows=None) -> bool:
    rows = range(len(v)) if rows is None else rows
    return len(v) == len(rows) and all(s["x"] == e["x"] and s["s"] == e["s"] and np.array_equal(s["a"], e["a"])
                                       for s, e in zip(v, map(expect, rows)))


def change_index(root, change) -> None:
    index = json.loads((root / "index.json").read_text())
    change(index)
    (root / "index.json").write_text(json.dumps(index))


def read_all(root, **kw):
    v = lazyseq.mds(root, **kw)
    return [v[i] for i in range(len(v))]


def test_a_valid_hand_made_dataset_reads(tmp_path):
    dataset(tmp_path, gz=True)
    v = lazyseq.mds(tmp_path)
    assert len(v) == 9 and v.cuts == [5] and correct(v)


@pytest.mark.parametrize("change, match", [
    (lambda ix: ix["shards"][0]["raw_data"].update(bytes=ix["shards"][0]["raw_data"]["bytes"] + 1), "bytes"),
    (lambda ix: ix["shards"][0].update(samples=6), "samples|bytes"),
    (lambda ix: ix["shards"][1].update(samples=3), "samples"),
    (lambda ix: ix["shards"][0].update(samples=2**40), "samples"),
    (lambda ix: ix["shards"][0].update(samples=-1), "samples"),
    (lambda ix: ix["shards"][0].update(column_encodings=["int32", "str", "exe"]), "'a'.*exe"),
    (lambda ix: ix["shards"][0].update(column_encodings=["int32", "str", "ndarray:int16:2,x"]), "'a'"),
    (lambda ix: ix["shards"][0].update(column_sizes=[4, 7, 4]), "'s'"),
    (lambda ix: ix["shards"][0].update(column_names=["x", "x", "a"]), "distinct"),
    (lambda ix: ix["shards"][0]["raw_data"].update(basename="../shard.00000.mds"), r"\.\."),
    (lambda ix: ix["shards"][0]["raw_data"].update(basename="/etc/passwd"), "passwd"),
    (lambda ix: ix["shards"][0]["raw_data"].update(basename="a\x1b[2Jb.mds"), r"\\x1b"),
    (lambda ix: ix["shards"][1]["raw_data"].update(basename="shard.00000.mds"), "two shards"),
    (lambda ix: ix["shards"][0].update(compression="lz4"), "lz4"),
    (lambda ix: ix.update(version=3), "version 2"),
    (lambda ix: ix["shards"][0].update(format="json"), "mds"),
    (lambda ix: ix["shards"].append({"oops": 1}), "shard 2"),
])
def test_an_index_that_lies_is_a_store_error_naming_it(tmp_path, change, match):
    dataset(tmp_path)
    change_index(tmp_path, change)
    e = raised_within(10, lambda: read_all(tmp_path))
    assert isinstance(e, StoreError), repr(e)
    assert "index.json" in str(e) or "shard." in str(e), str(e)
    assert re.search(match, str(e)), str(e)
    assert str(e).isprintable(), "no control character from a file in a message"


def test_an_index_not_json_or_too_large(tmp_path):
    dataset(tmp_path)
    (tmp_path / "index.json").write_bytes(b"{\"version\": 2, \"shards\": [")
    assert isinstance(raised_within(10, lambda: lazyseq.mds(tmp_path)), StoreError)
    (tmp_path / "index.json").write_bytes(b"[" * 100_000)
    assert isinstance(raised_within(10, lambda: lazyseq.mds(tmp_path)), StoreError)
    with open(tmp_path / "index.json", "wb") as f:
        f.truncate(65 * 2**20)  # (sparse)
    e = raised_within(10, lambda: lazyseq.mds(tmp_path))
    assert isinstance(e, StoreError) and "more than" in str(e)


def test_missing_truncated_and_grown_shards(tmp_path):
    dataset(tmp_path)
    shard = tmp_path / "shard.00001.mds"
    data = shard.read_bytes()
    v = lazyseq.mds(tmp_path)
    assert correct(v[:5])
    shard.write_bytes(data[:-3])
    e = raised_within(10, lambda: v[6])
    assert isinstance(e, StoreError) and "shard.00001.mds" in str(e) and "bytes" in str(e)
    os.unlink(shard)
    e = raised_within(10, lambda: lazyseq.mds(tmp_path)[6])
    assert isinstance(e, StoreError) and "missing" in str(e)
    shard.write_bytes(data + b"\0")
    assert isinstance(raised_within(10, lambda: lazyseq.mds(tmp_path)[6]), StoreError)


@pytest.mark.parametrize("offsets", ["backwards", "past the end", "before the table", "count"])
def test_offset_tables_that_lie(tmp_path, offsets):
    dataset(tmp_path)
    shard = tmp_path / "shard.00000.mds"
    b = bytearray(shard.read_bytes())
    table = list(struct.unpack_from("<7I", b))
    if offsets == "backwards":
        table[3], table[4] = table[4], table[3]
    elif offsets == "past the end":
        table[6] = len(b) + 100
    elif offsets == "before the table":
        table[1] = 0
    else:
        table[0] = 4
    struct.pack_into("<7I", b, 0, *table)
    shard.write_bytes(bytes(b))
    e = raised_within(10, lambda: lazyseq.mds(tmp_path)[2])
    assert isinstance(e, StoreError) and "shard.00000.mds" in str(e), repr(e)


def test_a_sample_whose_column_sizes_lie_names_the_sample(tmp_path):
    dataset(tmp_path)
    shard = tmp_path / "shard.00000.mds"
    b = bytearray(shard.read_bytes())
    start = struct.unpack_from("<I", b, 4 * 3)[0]  # sample 2
    struct.pack_into("<I", b, start, 10_000)
    shard.write_bytes(bytes(b))
    v = lazyseq.mds(tmp_path)
    assert correct(v[:2])
    e = raised_within(10, lambda: v[2])
    assert isinstance(e, StoreError) and "sample 2" in str(e) and "shard.00000.mds" in str(e)


def test_compressed_shards_that_lie(tmp_path):
    shards = dataset(tmp_path, gz=True)
    zipped = tmp_path / "shard.00001.mds.gz"
    good = zipped.read_bytes()
    change_index(tmp_path, lambda ix: ix["shards"][1]["raw_data"].update(bytes=shards[1]["raw_data"]["bytes"] - 5))
    e = raised_within(10, lambda: lazyseq.mds(tmp_path)[6])
    assert isinstance(e, StoreError) and "more than" in str(e)
    dataset(tmp_path, gz=True)
    zipped.write_bytes(good[:-20] + b"\0" * 20)  # a broken stream, of the size index.json says
    for kw in ({}, {"cache_dir": tmp_path / "cache"}):
        e = raised_within(10, lambda kw=kw: lazyseq.mds(tmp_path, **kw)[6])
        assert isinstance(e, StoreError) and "shard.00001.mds.gz" in str(e), repr(e)
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".mds")], "no copy of a broken shard is kept"


def test_fuzz_mutated_index_and_offset_tables(tmp_path):
    """Random mutations of index.json's fields and of the shards' first bytes: a StoreError, a
    ValueError or a correct read, each within a bound, never another exception."""
    rng = np.random.default_rng(33)
    fields = [("samples",), ("raw_data", "bytes"), ("raw_data", "basename"), ("column_sizes",), ("column_encodings",),
              ("column_names",), ("compression",), ("zip_data",), ("format",), ("version",)]
    values = [0, 1, -1, 2**31, 2**64, None, "", "..", "x/y", [], [None], ["str"], {}, 3.5, True, "ndarray:int8"]
    for trial in range(300):
        root = tmp_path / f"t{trial}"
        shards = dataset(root, gz=bool(trial % 2))
        if trial % 3:
            k = int(rng.integers(len(shards)))
            path = list(fields[int(rng.integers(len(fields)))])
            value = values[int(rng.integers(len(values)))]
            change_index(root, lambda ix, k=k, path=path, value=value: _set(ix["shards"][k], path, value))
        else:
            shard = root / "shard.00000.mds"
            b = bytearray(shard.read_bytes())
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, 28))] = int(rng.integers(256))
            shard.write_bytes(bytes(b))
        out = []
        e = raised_within(10, lambda root=root, out=out: out.append(read_all(root)))
        assert e is None or isinstance(e, STRUCTURE), f"trial {trial}: {e!r}"
        if e is None:  # (a shard the index says is empty is never opened: its samples are not there)
            said = [s["samples"] for s in json.loads((root / "index.json").read_text())["shards"]]
            rows = [i for i in range(9) if said[0 if i < 5 else 1] != 0]
            assert correct(out[0], rows), f"trial {trial}: a mutation read wrong values"


def _set(d: dict, path: list, value) -> None:
    for p in path[:-1]:
        d = d[p]
        if not isinstance(d, dict):  # (zip_data of a raw shard is None: nothing to change)
            return
    d[path[-1]] = value


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_shard_or_index_that_is_a_link_or_a_fifo_is_refused(tmp_path, kind):
    dataset(tmp_path / "ds")
    for name in ("shard.00000.mds", "index.json"):
        target = tmp_path / "ds" / name
        os.replace(target, tmp_path / name)
        if kind == "symlink":
            os.symlink(tmp_path / name, target)
        else:
            os.mkfifo(target)
        e = raised_within(10, lambda: lazyseq.mds(tmp_path / "ds")[0])
        assert isinstance(e, StoreError) and name in str(e), repr(e)
        os.unlink(target)
        os.replace(tmp_path / name, target)


def test_fuzz_mutated_sample_bytes(tmp_path):
    """Random bytes of the samples themselves changed (sizes, values, dynamic ndarray headers): each
    read a StoreError or a value, never another exception, never a read past the sample."""
    rng = np.random.default_rng(7)
    root = tmp_path / "ds"
    dataset(root)
    index = json.loads((root / "index.json").read_text())
    for s in index["shards"]:  # the ndarray column with its dtype and shape in each sample
        s["column_encodings"][2], s["column_sizes"][2] = "ndarray", None
    shard0 = root / "shard.00000.mds"
    rows = [struct.pack("<IIi", 3, 7, i) + b"abc" + bytes([17, (1 << 2) | 0, 2]) + np.full(2, i, np.int16).tobytes()
            for i in range(5)]
    good = raw_shard(rows)
    index["shards"][0]["raw_data"]["bytes"] = len(good)
    (root / "index.json").write_text(json.dumps(index))
    shard0.write_bytes(good)
    assert [int(s["x"]) for s in lazyseq.mds(root)[:5]] == list(range(5))
    head = 4 * 7
    for trial in range(300):
        b = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(head, len(b)))] = int(rng.integers(256))
        shard0.write_bytes(bytes(b))
        v = lazyseq.mds(root)
        for i in range(5):
            e = raised_within(10, lambda v=v, i=i: v[i])
            assert e is None or isinstance(e, StoreError), f"trial {trial}, sample {i}: {e!r}"


def test_an_empty_sample_over_http_is_a_store_error(http_files):
    """Offsets may say a sample is empty (two equal offsets): no zero-length request, a StoreError."""
    root = http_files.root / "ds"
    dataset(root, counts=(3,))
    shard = root / "shard.00000.mds"
    b = bytearray(shard.read_bytes())
    table = list(struct.unpack_from("<5I", b))
    table[2] = table[1]  # sample 0 empty, sample 1 takes its bytes too
    struct.pack_into("<5I", b, 0, *table)
    shard.write_bytes(bytes(b))
    v = lazyseq.mds(f"{http_files.url}/ds")
    for key in (0, [0, 1]):
        e = raised_within(10, lambda key=key: v[key] if isinstance(key, int) else list(v[key]))
        assert isinstance(e, StoreError) and "sample 0" in str(e), repr(e)


def test_sizes_inside_a_value_allocate_nothing_the_bytes_do_not_back():
    """A pil value saying 65535x65535 pixels, an image list or ndarray saying 2**32 elements: a
    StoreError naming the sample and column, before any allocation of that size."""
    pytest.importorskip("PIL")
    from lazyseq.formats.mdscodec import Columns

    cases = [("pil", struct.pack("<III", 65535, 65535, 4) + b"RGBA" + b"\0" * 10),
             ("list[png]", struct.pack("<II", 0, 2**32 - 1) + b"\0" * 8),
             ("jpeg_array", struct.pack("<I", 2**32 - 1) + b"\0" * 8),
             ("ndarray", bytes([65, (1 << 2) | 2]) + struct.pack("<I", 2**32 - 1) + b"\0" * 8)]
    for enc, value in cases:
        cols = Columns(["v"], [enc], [None], "x.mds", allow_pickle=False)
        e = raised_within(10, lambda cols=cols, value=value: cols.decode(struct.pack("<I", len(value)) + value, 3))
        assert isinstance(e, StoreError) and "sample 3" in str(e) and "'v'" in str(e), repr(e)
