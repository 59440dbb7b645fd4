"""lazyseq.parquet (issue #32) against pyarrow's own reader: files written by pyarrow with every writer
option the issue names (row groups of 1 to 10,000 rows, page index or not, dictionary encoding or not,
snappy and zstd) and every column type it names; each item compared with ``pyarrow.parquet.read_table``'s
row. Then the ways to name files, columns, schemas that disagree, indexing, bulk and concurrent reads
(each row group decoded once), block shuffles, pickling and fingerprints by file identity, workers, the
DataLoader, save/load, URLs (the local HTTP server, moto's S3, an object replaced under a view) and the
import that needs no pyarrow. Every wait is bounded."""

import collections
import datetime
import decimal
import itertools
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from tests.rows import norm

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from lazyseq.formats.parquet import Parquet  # noqa: E402  (after the importorskip of pyarrow)

N = 30  # rows of the tables of the writer-option matrix


# -- helpers ---------------------------------------------------------------------------------------------


def expected(*paths) -> list[dict]:
    """The rows of ``paths`` (one after the other), as pyarrow's own reader gives them."""
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def write(path, table, **options) -> str:
    """``table`` written to ``path`` by pyarrow (a new file, renamed into place: a file a view maps is never
    truncated under it), its mtime a second past the one it replaces (an ETag and stamp that differ)."""
    old = os.stat(path).st_mtime_ns if os.path.exists(path) else None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, f"{path}.tmp", **options)
    os.replace(f"{path}.tmp", path)
    if old is not None:
        os.utime(path, ns=(old + 10**9, old + 10**9))
    return str(path)


def cause(e: BaseException) -> BaseException:
    """The error a read raised: an item's error comes wrapped in an EvaluationError."""
    return e.__cause__ if isinstance(e, lazyseq.EvaluationError) and e.__cause__ is not None else e


def raised(fn) -> BaseException:
    try:
        fn()
    except Exception as e:
        return cause(e)
    raise AssertionError("no error raised")


def simple(n: int, start: int = 0) -> pa.Table:
    """A small table of plain columns: ``id`` (the row's number), a vector and a name."""
    ids = np.arange(start, start + n, dtype=np.int64)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32) / 2), 3)
    return pa.table({"id": ids, "vec": vec, "name": pa.array([f"row{i}" for i in ids], pa.string())})


def typed(n: int, seed: int = 0) -> pa.Table:
    """A table of every column type of the issue, nulls at every level, empty lists, extremes."""
    rng = np.random.default_rng(seed)
    ints = rng.integers(-100, 100, n)
    null = (np.arange(n) % 5) == 3  # the rows where a nullable column is null

    def some_null(values):
        return [None if null[i] else v for i, v in enumerate(values[:n])]

    def lists(k, make):
        return [None if k % 7 == 2 else [] if k % 7 == 4 else make(k) for k in range(n)]

    cols = {
        "i8": pa.array(some_null(ints.tolist()), pa.int8()),
        "i16": pa.array(ints * 300, pa.int16()),
        "i32": pa.array(ints * 10**7, pa.int32()),
        "i64": pa.array(some_null([-(2**63), *(ints * 10**15).tolist()]), pa.int64()),
        "u8": pa.array(np.abs(ints) + 100, pa.uint8()),
        "u16": pa.array(some_null((np.abs(ints) * 600).tolist()), pa.uint16()),
        "u32": pa.array([2**32 - 1 - i for i in range(n)], pa.uint32()),
        "u64": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
        "f16": pa.array((np.arange(n) / 4 - 2).astype(np.float16), mask=null),
        "f32": pa.array(some_null((ints / 3).astype(np.float32).tolist()), pa.float32()),
        "f64": pa.array(ints / 7, pa.float64()),
        "bool": pa.array(some_null((ints > 0).tolist()), pa.bool_()),
        "str": pa.array(some_null(["", "é∂ß"] + [f"s{i}" * (i % 4) for i in range(2, n)]), pa.string()),
        "lstr": pa.array([f"large{i}" for i in range(n)], pa.large_string()),
        "bin": pa.array(some_null([b"", b"\x00\xff"] + [bytes([i]) * (i % 5) for i in range(2, n)]), pa.binary()),
        "fsb": pa.array(some_null([i.to_bytes(4, "little") for i in range(n)]), pa.binary(4)),
        "list_int": pa.array(lists(0, lambda k: list(range(k % 6))), pa.list_(pa.int32())),
        "list_int_nulls": pa.array(lists(0, lambda k: [k, None, -k][: k % 4]), pa.list_(pa.int64())),
        "large_list_float": pa.array(lists(0, lambda k: [k / 2] * (k % 3)), pa.large_list(pa.float32())),
        "fixed_list_float": pa.array([None if k % 6 == 1 else [k, k + 0.5, -k] for k in range(n)],
                                     pa.list_(pa.float32(), 3)),
        "list_str": pa.array(lists(0, lambda k: [f"w{k}", None, ""][: k % 4]), pa.list_(pa.string())),
        "list_list_int": pa.array(lists(0, lambda k: [[k], None, [], [1, None]][: k % 5]), pa.list_(pa.list_(pa.int32()))),
        "struct": pa.array([None if k % 6 == 5 else
                            {"a": None if k % 4 == 1 else k, "b": f"b{k}" if k % 3 else None,
                             "c": None if k % 5 == 2 else [k / 4] * (k % 3)} for k in range(n)],
                           pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.list_(pa.float64()))])),
        "ts": pa.array(some_null([datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=int(s) * 3601)
                                  for s in ints]), pa.timestamp("us")),
        "ts_utc": pa.array([datetime.datetime(2021, 5, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=k)
                            for k in range(n)], pa.timestamp("ms", tz="UTC")),
        "date": pa.array(some_null([datetime.date(2000, 1, 1) + datetime.timedelta(days=int(d)) for d in ints]), pa.date32()),
        "dec": pa.array(some_null([decimal.Decimal(int(i)).scaleb(-2) for i in ints * 1234]), pa.decimal128(9, 2)),
        "dict": pa.array(some_null([["red", "green", "blue"][k % 3] for k in range(n)])).dictionary_encode(),
        "nulls": pa.nulls(n),
        "all_null_int": pa.nulls(n, pa.int32()),
    }
    return pa.table(cols)


# -- values: every row equals pyarrow's, for every writer option ---------------------------------------------
@pytest.mark.parametrize("compression", ["snappy", "zstd"])
@pytest.mark.parametrize("dictionary", [True, False], ids=["dict", "plain"])
@pytest.mark.parametrize("page_index", [True, False], ids=["page-index", "no-page-index"])
@pytest.mark.parametrize("row_group_size", [1, 7, 10_000])
def test_every_row_equals_pyarrows(tmp_path, row_group_size, page_index, dictionary, compression):
    path = write(tmp_path / "t.parquet", typed(N, seed=row_group_size), row_group_size=row_group_size,
                 write_page_index=page_index, use_dictionary=dictionary, compression=compression,
                 data_page_size=256)  # several pages per column chunk
    want = expected(path)
    v = lazyseq.parquet(path)
    assert len(v) == N and v.blocks == -(-N // row_group_size)
    assert v.columns == typed(1).column_names
    for i in range(N):
        row = v[i]
        assert list(row) == v.columns
        assert norm(row) == want[i], i
    assert [norm(r) for r in v[list(range(N))[::-1]]] == want[::-1]  # one bulk read


def test_row_groups_of_10000_rows_with_many_pages(tmp_path):
    n = 25_000
    path = write(tmp_path / "big.parquet", simple(n), row_group_size=10_000, write_page_index=True, data_page_size=4096)
    v = lazyseq.parquet(path, cache=1)
    assert v.block_rows == (10_000, 10_000, 5_000)
    want = expected(path)
    got = [norm(r) for b in lazyseq.batch(v, 4096) for r in b]
    assert got == want
    assert [norm(v[i]) for i in (0, 9_999, 10_000, 19_999, 20_000, n - 1, -n)] == [want[i] for i in (0, 9_999, 10_000, 19_999,
                                                                                                      20_000, n - 1, 0)]


def test_the_type_rules(tmp_path):
    path = write(tmp_path / "t.parquet", typed(N), row_group_size=10)
    v = lazyseq.parquet(path)
    row = v[0]
    numbers = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16,
               "u32": np.uint32, "u64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64, "bool": np.bool_}
    for name, kind in numbers.items():
        assert type(row[name]) is kind, name
    assert row["u64"] == np.uint64(2**64 - 1) and row["i64"] == np.int64(-(2**63))
    arrays = {"list_int": np.int32, "large_list_float": np.float32}
    for name, dtype in arrays.items():
        for r in v:
            a = r[name]
            if a is not None:
                assert isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype == dtype and not a.flags.writeable, name
    with pytest.raises(ValueError):
        v[1]["list_int"][:1] = 0  # a view of the decoded row group that other reads share
    assert row["list_int"].shape == (0,)
    assert type(row["str"]) is str and type(row["lstr"]) is str and type(row["dict"]) is str
    assert type(row["bin"]) is bytes and row["fsb"] == bytes(4)
    assert isinstance(row["list_str"], list) and isinstance(row["struct"], dict) and list(row["struct"]) == ["a", "b", "c"]
    assert isinstance(row["ts"], datetime.datetime) and isinstance(row["date"], datetime.date)
    assert isinstance(row["dec"], decimal.Decimal)
    assert row["nulls"] is None and row["all_null_int"] is None
    vec = lazyseq.parquet(write(tmp_path / "v.parquet", simple(4)))[3]["vec"]  # a fixed-size list without null rows
    assert isinstance(vec, np.ndarray) and vec.dtype == np.float32 and vec.shape == (3,) and not vec.flags.writeable


def test_a_fixed_size_list_beside_a_null_row_is_an_array(tmp_path):
    path = write(tmp_path / "f.parquet", pa.table({"v": pa.array([[1, 2], None, [3, 4]], pa.list_(pa.float32(), 2))}))
    v = lazyseq.parquet(path)
    assert [norm(r) for r in v] == expected(path)
    for i in (0, 2):
        a = v[i]["v"]
        assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (2,), type(a)


def test_a_list_without_nulls_is_an_array_whatever_its_neighbours(tmp_path):
    path = write(tmp_path / "l.parquet", pa.table({"x": pa.array([[1, 2], [3, None], [5, 6], [7, 8]], pa.list_(pa.int64()))}),
                 row_group_size=2)
    v = lazyseq.parquet(path)
    assert [norm(r) for r in v] == expected(path)
    assert isinstance(v[2]["x"], np.ndarray)  # its row group has no null
    assert v[1]["x"] == [3, None]
    assert isinstance(v[0]["x"], np.ndarray)  # the same column, a row without nulls


def test_empty_files_and_files_without_row_groups_among_others(tmp_path):
    first = write(tmp_path / "0.parquet", simple(0))  # an empty block first: a cut at 0
    a = write(tmp_path / "a.parquet", simple(5), row_group_size=2)
    b = write(tmp_path / "b.parquet", simple(0))  # one row group of 0 rows
    c = str(tmp_path / "c.parquet")
    pq.ParquetWriter(c, simple(0).schema).close()  # no row group at all
    d = write(tmp_path / "d.parquet", simple(4, start=5), row_group_size=3)
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in (b, c)] == [1, 0]
    v = lazyseq.parquet(tmp_path)
    assert v.block_rows == (0, 2, 2, 1, 0, 3, 1) and len(v) == 9 and v.cuts == [0, 2, 4, 5, 5, 8]
    assert [norm(v[i]) for i in range(9)] == expected(first, a, b, c, d)
    assert [norm(r) for r in v[[8, 5, 4, 0]]] == [expected(a, d)[i] for i in (8, 5, 4, 0)]
    for window in (1, 8):
        s = lazyseq.block_shuffle(v, v.cuts, seed=0, window=window)
        assert sorted(int(r["id"]) for r in s) == list(range(9))
    empty = lazyseq.parquet([b, c])
    assert len(empty) == 0 and list(empty) == [] and empty.cuts == []


# -- paths ---------------------------------------------------------------------------------------------------
def test_one_file_a_list_and_a_folder(tmp_path):
    root = tmp_path / "data"
    files = {"b.parquet": simple(3, 0), "a.parquet": simple(2, 3), "sub/c.parquet": simple(4, 5),
             "sub2/x/d.parquet": simple(1, 9), "sub/a.parquet": simple(2, 10)}
    for name, t in files.items():
        write(root / name, t, row_group_size=2)
    ignored = ["_temporary/0/part.parquet", ".hidden/e.parquet", "_x.parquet", ".y.parquet", "sub/_tmp/z.parquet"]
    for name in ignored:
        write(root / name, simple(1, 100))
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".a.parquet.crc").write_bytes(b"crc")
    pq.write_metadata(simple(0).schema, root / "_metadata")
    pq.write_metadata(simple(0).schema, root / "_common_metadata")
    order = sorted(files)  # by relative path
    assert order == ["a.parquet", "b.parquet", "sub/a.parquet", "sub/c.parquet", "sub2/x/d.parquet"]
    v = lazyseq.parquet(root)
    assert v.names == order
    assert [norm(r) for r in v] == expected(*(root / n for n in order))
    assert [norm(r) for r in lazyseq.parquet(str(root / "sub/c.parquet"))] == expected(root / "sub/c.parquet")
    listed = [root / "sub2/x/d.parquet", str(root / "a.parquet"), root / "sub"]  # a folder in a list is listed too
    assert [norm(r) for r in lazyseq.parquet(listed)] == expected(*listed[:2], root / "sub/a.parquet", root / "sub/c.parquet")


def test_a_folder_without_parquet_and_a_missing_file(tmp_path):
    (tmp_path / "empty" / "_temporary").mkdir(parents=True)
    write(tmp_path / "empty" / "_temporary" / "part.parquet", simple(1))
    (tmp_path / "empty" / "notes.txt").write_text("no data")
    with pytest.raises(FileNotFoundError, match="empty"):
        lazyseq.parquet(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        lazyseq.parquet(tmp_path / "nope.parquet")
    write(tmp_path / "here.parquet", simple(1))
    with pytest.raises(FileNotFoundError, match="gone.parquet"):
        lazyseq.parquet([tmp_path / "here.parquet", tmp_path / "gone.parquet"])


# -- columns and schemas -------------------------------------------------------------------------------------
def test_columns(tmp_path):
    path = write(tmp_path / "t.parquet", typed(N), row_group_size=8)
    v = lazyseq.parquet(path, columns=["struct", "i8", "list_list_int"])
    assert v.columns == ["i8", "list_list_int", "struct"]  # in the schema's order
    want = pq.read_table(path, columns=["i8", "list_list_int", "struct"]).to_pylist()
    assert [list(r) for r in v[:3]] == [v.columns] * 3
    assert [norm(r) for r in v] == want
    with pytest.raises(KeyError) as e:
        lazyseq.parquet(path, columns=["i8", "zz"])
    assert "'zz'" in str(e.value) and "t.parquet" in str(e.value) and all(f"'{c}'" in str(e.value) for c in typed(1).column_names)
    with pytest.raises(TypeError, match="str"):
        lazyseq.parquet(path, columns="i8")


def test_files_whose_schemas_differ(tmp_path):
    a = write(tmp_path / "a.parquet", pa.table({"x": pa.array([1], pa.int32()), "y": ["a"]}))
    b = write(tmp_path / "b.parquet", pa.table({"x": pa.array([2], pa.int64()), "y": ["b"]}))
    c = write(tmp_path / "c.parquet", pa.table({"x": pa.array([3], pa.int32())}))
    err = raised(lambda: lazyseq.parquet([a, b]))
    assert isinstance(err, lazyseq.StoreError) and "b.parquet" in str(err) and "'x'" in str(err)
    assert "int64" in str(err) and "int32" in str(err)
    err = raised(lambda: lazyseq.parquet([a, c]))
    assert isinstance(err, lazyseq.StoreError) and "c.parquet" in str(err) and "'y'" in str(err)
    assert [norm(r) for r in lazyseq.parquet([a, c], columns=["x"])] == [{"x": 1}, {"x": 3}]  # only the columns read


def test_a_file_with_a_duplicated_column_name_is_a_store_error(tmp_path):
    path = str(tmp_path / "dup.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"]), path)
    err = raised(lambda: lazyseq.parquet(path))
    assert isinstance(err, lazyseq.StoreError) and "dup.parquet" in str(err) and "'x'" in str(err)


# -- indexing ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A view of 23 rows in row groups of 4 over two files, and its rows as pyarrow reads them."""
    root = tmp_path_factory.mktemp("small")
    a = write(root / "a.parquet", typed(13, seed=1), row_group_size=4)
    b = write(root / "b.parquet", typed(10, seed=2), row_group_size=4)
    return lazyseq.parquet(root), expected(a, b)


keys = st.integers(-30, 30)
slices = st.builds(slice, st.none() | keys, st.none() | keys, st.none() | st.integers(-5, 5).filter(bool))


@settings(max_examples=40, deadline=None)
@given(key=st.one_of(keys, slices, st.lists(keys, max_size=12), st.lists(keys, max_size=12).map(np.array)))
def test_indexing_equals_a_list_of_the_rows(small, key):
    v, rows = small
    n = len(rows)
    if isinstance(key, int):
        if -n <= key < n:
            assert norm(v[key]) == rows[key]
        else:
            with pytest.raises(IndexError):
                v[key]
    elif isinstance(key, slice):
        got = v[key]
        assert len(got) == len(rows[key]) and [norm(r) for r in got] == rows[key]
        if len(got):
            assert norm(got[-1]) == rows[key][-1]
    else:
        idx = [int(k) for k in key]
        if all(-n <= k < n for k in idx):
            assert [norm(r) for r in v[key]] == [rows[k] for k in idx]
        else:
            with pytest.raises(IndexError):
                list(v[key])


# -- bulk and concurrent reads: each row group decoded once ------------------------------------------------
@pytest.fixture
def decodes(monkeypatch):
    """The decodes of every Parquet view in this process, by row group (``_decode`` counted on the class)."""
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    real = Parquet._decode

    def counted(self, b):
        with lock:
            counts[b] += 1
        return real(self, b)

    monkeypatch.setattr(Parquet, "_decode", counted)
    return counts


def test_bulk_reads_decode_each_row_group_once(tmp_path, decodes):
    path = write(tmp_path / "t.parquet", typed(30), row_group_size=5)  # 6 row groups
    want = expected(path)
    v = lazyseq.parquet(path, cache=1)
    perm = [*np.random.default_rng(0).permutation(30).tolist(), 3, 3, 29]
    got = lazyseq.batch(v[perm], len(perm))[0]  # one bulk read over every row group, in a shuffled order
    assert [norm(r) for r in got] == [want[i] for i in perm]
    assert decodes == {b: 1 for b in range(6)} and len(v.held()) == 1
    decodes.clear()
    for k, b in enumerate(lazyseq.batch(v, 7)):
        spanned = {i // 5 for i in range(7 * k, min(30, 7 * k + 7))}
        before = sum(decodes.values())
        assert [norm(r) for r in b] == want[7 * k : 7 * k + 7]
        assert sum(decodes.values()) - before <= len(spanned) and len(v.held()) <= 1
    assert decodes == {b: 1 for b in range(6)}  # the row group held from the last batch is read first
    assert [norm(v[i]) for i in range(30)] == want
    with pytest.raises(ValueError, match="cache"):
        lazyseq.parquet(path, cache=0)
    with pytest.raises(ValueError, match="cache"):
        lazyseq.parquet(path, cache=True)


def test_threads_reading_one_row_group_decode_it_once(tmp_path, monkeypatch):
    path = write(tmp_path / "t.parquet", simple(40), row_group_size=20)
    want = expected(path)
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    real = Parquet._decode

    def slow(self, b):
        with lock:
            counts[b] += 1
        time.sleep(0.1)  # every thread asks while the first decode runs
        return real(self, b)

    monkeypatch.setattr(Parquet, "_decode", slow)
    v = lazyseq.parquet(path, cache=1)
    barrier = threading.Barrier(16, timeout=10)
    out: list = [None] * 16

    def read(k):
        try:
            barrier.wait()
            out[k] = v[k]
        except BaseException as e:  # handed to the test
            out[k] = e

    threads = [threading.Thread(target=read, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert counts == {0: 1}
    assert [norm(r) for r in out] == want[:16]


def test_cuts_and_block_shuffle(tmp_path, decodes):
    paths = [write(tmp_path / "a.parquet", simple(23), row_group_size=5),
             write(tmp_path / "b.parquet", simple(9, 23), row_group_size=4)]
    rows = [pq.ParquetFile(p).metadata.row_group(r).num_rows for p in paths
            for r in range(pq.ParquetFile(p).metadata.num_row_groups)]
    v = lazyseq.parquet(tmp_path, cache=1)
    assert v.block_rows == tuple(rows) == (5, 5, 5, 5, 3, 4, 4, 1)
    starts = list(itertools.accumulate(rows))
    assert v.cuts == starts[:-1] == [5, 10, 15, 20, 23, 27, 31]
    want = expected(*paths)
    s = lazyseq.block_shuffle(v, v.cuts, seed=0, window=1)
    got = [norm(r) for r in s]
    assert sorted(r["id"] for r in got) == list(range(32)) and got != want
    assert all(r == want[r["id"]] for r in got)
    bounds = [0, *starts]
    runs = _runs(got, bounds)  # each run of the order is one whole row group
    assert sorted(b for b, _ in runs) == list(range(len(rows)))
    assert all(sorted(r["id"] for r in run) == list(range(bounds[b], bounds[b + 1])) for b, run in runs)
    assert decodes == {b: 1 for b in range(len(rows))}  # with cache=1: whole row groups, one at a time
    decodes.clear()
    w = lazyseq.parquet(tmp_path, cache=8)
    assert sorted(int(r["id"]) for r in lazyseq.block_shuffle(w, w.cuts, seed=3)) == list(range(32))
    assert decodes == {b: 1 for b in range(len(rows))}


def _runs(rows: list, bounds: list) -> list:
    """``rows`` cut into runs ``(k, rows)`` whose ids fall in one ``[bounds[k], bounds[k + 1])``."""
    out: list = []
    for r in rows:
        k = next(k for k in range(len(bounds) - 1) if bounds[k] <= r["id"] < bounds[k + 1])
        if out and out[-1][0] == k:
            out[-1][1].append(r)
        else:
            out.append((k, [r]))
    return out


# -- pickling and fingerprints: file identity, no data -------------------------------------------------------
def _dataset(root, **options) -> list[str]:
    return [write(root / "a.parquet", typed(12, seed=3), row_group_size=5, **options),
            write(root / "b.parquet", typed(9, seed=4), row_group_size=5, **options)]


def test_a_pickled_view_holds_no_data_and_reads_the_same(tmp_path):
    paths = _dataset(tmp_path)
    v = lazyseq.parquet(tmp_path)
    v[0]  # a decoded row group is not pickled either
    blob = pickle.dumps(v)
    assert len(blob) < 4096
    w = pickle.loads(blob)
    assert w.held() == [] and v.held() == [0]
    assert [norm(r) for r in w] == expected(*paths)
    assert w.cuts == v.cuts and w.columns == v.columns


@pytest.mark.parametrize("change", ["rewritten", "touched", "resized"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])
def test_a_pickled_view_refuses_a_changed_file(tmp_path, strict, change):
    plain = {"compression": "none", "use_dictionary": False}  # a changed int32 leaves the size as it was
    paths = _dataset(tmp_path, **plain)
    v = lazyseq.parquet(tmp_path, strict=strict)
    blob, before = pickle.dumps(v), expected(paths[1])
    if change == "touched":  # the same bytes, another mtime
        st = os.stat(paths[1])
        os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif change == "rewritten":  # the same size and rows, other values
        t = typed(9, seed=4)
        i32 = pa.array(t.column("i32").to_numpy() + 1, pa.int32())
        write(paths[1], t.set_column(t.column_names.index("i32"), "i32", i32), row_group_size=5, **plain)
        assert os.path.getsize(paths[1]) == v.sizes[1] and expected(paths[1]) != before
    else:
        write(paths[1], typed(9, seed=5), row_group_size=5, compression="zstd")
        assert os.path.getsize(paths[1]) != v.sizes[1]
    w = pickle.loads(blob)
    assert [norm(r) for r in w[:12]] == expected(paths[0])  # the file that did not change
    if not strict and change == "touched":
        assert [norm(r) for r in w[12:]] == expected(paths[1])
        return
    if not strict and change == "rewritten":
        return  # same name, size and rows: strict=False cannot tell (documented: mtimes dropped)
    err = raised(lambda: w[12])
    assert isinstance(err, lazyseq.StoreError) and paths[1] in str(err) and "changed" in str(err)
    assert "make the view again" in str(err)


def test_fingerprints_by_file_identity(tmp_path):
    paths = _dataset(tmp_path)
    fp = lazyseq.fingerprint
    strict, loose = fp(lazyseq.parquet(tmp_path)), fp(lazyseq.parquet(tmp_path, strict=False))
    assert fp(lazyseq.parquet(tmp_path)) == strict and strict != loose
    assert fp(lazyseq.parquet(tmp_path, columns=["i8"])) != strict
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fp(lazyseq.parquet(tmp_path)) != strict and fp(lazyseq.parquet(tmp_path, strict=False)) == loose
    write(paths[0], typed(14, seed=3), row_group_size=5)
    assert fp(lazyseq.parquet(tmp_path, strict=False)) != loose


# -- workers, the DataLoader, save --------------------------------------------------------------------------
def test_process_workers_read_the_same(tmp_path):
    paths = _dataset(tmp_path)
    v = lazyseq.parquet(tmp_path, cache=2)
    with lazyseq.prefetch(v, nworkers=2, method="process") as p:
        got = [norm(r) for r in p]
    assert got == expected(*paths)


def test_the_dataloader_reads_every_row_once(tmp_path):
    write(tmp_path / "a.parquet", simple(21), row_group_size=4)
    write(tmp_path / "b.parquet", simple(16, 21), row_group_size=6)
    v = lazyseq.parquet(tmp_path)
    want = {r["id"]: r for r in expected(tmp_path / "a.parquet", tmp_path / "b.parquet")}
    with lazyseq.DataLoader(v, batch_size=8, num_workers=2, shuffle=True, seed=0, to_tensor=False) as loader:
        batches = list(loader)
    assert len(batches) == 5
    seen = []
    for b in batches:
        assert b["id"].dtype == np.int64 and b["vec"].dtype == np.float32 and b["vec"].shape == (len(b["id"]), 3)
        for k, i in enumerate(b["id"].tolist()):
            assert b["vec"][k].tolist() == want[i]["vec"] and b["name"][k] == want[i]["name"]
        seen += b["id"].tolist()
    assert sorted(seen) == list(range(37)) and seen != sorted(seen)


def test_save_then_load_gives_the_same_items(tmp_path):
    def saveable(n: int, seed: int) -> pa.Table:  # what a store holds: numbers, str, bytes, arrays, no nulls
        t = typed(n, seed).select(["i16", "i32", "u8", "u32", "u64", "f64", "lstr"])
        k = np.arange(n)
        more = {"f16": pa.array((k / 8).astype(np.float16)), "bin": pa.array([bytes([i]) * (i % 3) for i in k.tolist()]),
                "list": pa.array([list(range(i % 4)) for i in k.tolist()], pa.list_(pa.int32())),
                "dict": pa.array([["a", "bb"][i % 2] for i in k.tolist()]).dictionary_encode()}
        return t.append_column("f16", more["f16"]).append_column("bin", more["bin"]).append_column(
            "list", more["list"]).append_column("dict", more["dict"]).append_column("vec", simple(n).column("vec"))

    paths = [write(tmp_path / "in" / "a.parquet", saveable(12, 0), row_group_size=5),
             write(tmp_path / "in" / "b.parquet", saveable(9, 1), row_group_size=5)]
    v = lazyseq.parquet(tmp_path / "in")
    lazyseq.save(v, tmp_path / "saved", nworkers=2, method="thread")
    store = lazyseq.load(tmp_path / "saved")
    assert len(store) == len(v) == 21
    assert [norm(r) for r in store] == expected(*paths)


# -- URLs ----------------------------------------------------------------------------------------------------
def test_http_file_urls_read_the_same(http_files):
    paths = _dataset(http_files.root / "ds")
    urls = [f"{http_files.url}/ds/{os.path.basename(p)}" for p in paths]
    v = lazyseq.parquet(urls)
    assert v.names == ["a.parquet", "b.parquet"]
    assert [norm(r) for r in v] == expected(*paths)
    assert [norm(r) for r in pickle.loads(pickle.dumps(v))[::-3]] == expected(*paths)[::-3]


@pytest.mark.parametrize("block_cache", [0, 64 * 2**20], ids=["no-block-cache", "block-cache"])
def test_an_http_file_replaced_under_a_view_is_never_mixed(http_files, block_cache):
    pytest.importorskip("aiohttp")
    path = write(http_files.root / "t.parquet", simple(40), row_group_size=10)
    old = expected(path)
    url = f"{http_files.url}/t.parquet".replace("http://", "http://me:hunter2@")
    v = lazyseq.parquet(url, block_cache=block_cache)
    assert norm(v[0]) == old[0]
    t = simple(40)
    write(path, t.set_column(0, "id", pa.array(np.arange(40) + 1000)), row_group_size=10)  # same size, other values
    try:
        got = [norm(v[i]) for i in range(10, 40)]
    except Exception as e:
        err = cause(e)
        assert isinstance(err, (lazyseq.RemoteReadError, lazyseq.StoreError)), repr(err)
        assert "t.parquet" in str(err) and "hunter2" not in str(err)
    else:  # only possible where the old version's bytes were all cached: then they are all old
        assert block_cache and got == old[10:]
    assert [norm(r) for r in lazyseq.parquet(url)] == expected(path)  # a view made again reads the new file


def _upload(s3, root, prefix: str) -> None:
    for here, _, files in os.walk(root):
        for f in files:
            p = os.path.join(here, f)
            s3.client.upload_file(p, s3.bucket, f"{prefix}/{os.path.relpath(p, root)}")


def test_s3_prefix_lists_and_reads_the_same(s3, tmp_path):
    pytest.importorskip("s3fs")
    paths = _dataset(tmp_path / "ds")
    write(tmp_path / "ds" / "sub" / "c.parquet", typed(3, seed=6), row_group_size=2)
    write(tmp_path / "ds" / "_temporary" / "x.parquet", simple(1))
    (tmp_path / "ds" / "_SUCCESS").write_bytes(b"")
    _upload(s3, tmp_path / "ds", "ds")
    v = lazyseq.parquet(f"s3://{s3.bucket}/ds/", storage_options=s3.storage_options)
    assert v.names == ["a.parquet", "b.parquet", "sub/c.parquet"]
    want = expected(*paths, tmp_path / "ds" / "sub" / "c.parquet")
    assert [norm(r) for r in v] == want
    assert [norm(r) for r in lazyseq.batch(v, 7)[1]] == want[7:14]


def test_an_s3_object_replaced_under_a_view_is_never_mixed(s3, tmp_path):
    pytest.importorskip("s3fs")
    path = write(tmp_path / "ds" / "t.parquet", simple(40), row_group_size=10)
    _upload(s3, tmp_path / "ds", "ds")
    v = lazyseq.parquet(f"s3://{s3.bucket}/ds/t.parquet", storage_options=s3.storage_options, block_cache=0)
    assert norm(v[0]) == expected(path)[0]
    t = simple(40)
    write(path, t.set_column(0, "id", pa.array(np.arange(40) + 1000)), row_group_size=10)
    s3.client.upload_file(path, s3.bucket, "ds/t.parquet")
    err = raised(lambda: v[15])
    assert isinstance(err, (lazyseq.RemoteReadError, lazyseq.StoreError)), repr(err)
    assert f"s3://{s3.bucket}/ds/t.parquet" in str(err)


# -- importing -----------------------------------------------------------------------------------------------
def test_import_lazyseq_imports_no_pyarrow():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import lazyseq, sys; assert 'pyarrow' not in sys.modules; assert callable(lazyseq.parquet)"
    env = {**os.environ, "PYTHONPATH": root}
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
