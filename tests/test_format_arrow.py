"""lazyseq.formats.arrow: Arrow IPC files (file and stream format), save_to_disk folders and
datasets.Dataset objects read at random, compared with pyarrow's and datasets' own readers; a
stranger's files (truncated, garbled, listed wrongly) raise StoreError naming the file."""

import json
import os
import pickle
import shutil

import numpy as np
import pytest

import lazyseq
from lazyseq.errors import EvaluationError, StoreError
from lazyseq.formats.arrow import arrow
from tests.hostile import raised_within

pa = pytest.importorskip("pyarrow")

SCHEMA = pa.schema({"x": pa.int64(), "s": pa.string(), "v": pa.list_(pa.float32()), "b": pa.binary(),
                    "d": pa.dictionary(pa.int8(), pa.string()), "st": pa.struct({"a": pa.int16(), "t": pa.string()})})


def _batch(o, n=3):
    return pa.record_batch({
        "x": [o + j if j != 1 else None for j in range(n)], "s": [f"s{o + j}" if j != 2 else None for j in range(n)],
        "v": [[float(o), 0.5] if j != 1 else [] for j in range(n)], "b": [bytes([j, o % 256]) for j in range(n)],
        "d": pa.array(["p", "q", "p"][:n] * (n // 3 + 1))[:n].dictionary_encode().cast(SCHEMA.field("d").type),
        "st": [{"a": j, "t": "u"} if j != 0 else None for j in range(n)]}, schema=SCHEMA)


def write_ipc(path, fmt="file", batches=3, rows=3):
    with (pa.ipc.new_file if fmt == "file" else pa.ipc.new_stream)(str(path), SCHEMA) as w:
        for k in range(batches):
            w.write_batch(_batch(10 * k, rows))
    return str(path)


def peer(path):
    data = open(path, "rb").read()
    reader = pa.ipc.open_file(pa.py_buffer(data)) if data[:6] == b"ARROW1" else pa.ipc.open_stream(pa.py_buffer(data))
    return reader.read_all().to_pylist()


def norm(x):
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [norm(v) for v in x]
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    return x


def store_error(fn):
    """The StoreError ``fn()`` raises, at construction or as a read's cause (None if it returns)."""
    try:
        fn()
    except StoreError as e:
        return e
    except EvaluationError as e:
        assert isinstance(e.__cause__, StoreError), repr(e.__cause__)
        return e.__cause__
    return None


# -- IPC files -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_ipc_items_equal_pyarrow_rows_cuts_per_batch(tmp_path, fmt):
    path = write_ipc(tmp_path / f"a.{'arrow' if fmt == 'file' else 'ipc'}", fmt, batches=4)
    v = arrow(path)
    assert len(v) == 12 and v.cuts == [3, 6, 9] and v.block_rows == (3, 3, 3, 3)
    assert [norm(v[i]) for i in range(12)] == peer(path) == norm(list(v[list(range(12))]))
    item = v[0]
    assert type(item["x"]) is np.int64 and item["v"].dtype == np.float32 and not item["v"].flags.writeable
    assert v.schema == SCHEMA and v.columns == list(SCHEMA.names)
    sub = arrow(path, columns=["st", "x"])  # schema order kept
    assert sub.columns == ["x", "st"] and [norm(sub[i]) for i in range(12)] == [{"x": r["x"], "st": r["st"]} for r in peer(path)]
    with pytest.raises(KeyError, match="no column 'nope'"):
        arrow(path, columns=["nope"])


def test_files_list_and_folder_in_order_and_schemas_checked(tmp_path):
    a, b = write_ipc(tmp_path / "a.arrow", batches=1), write_ipc(tmp_path / "b.arrow", "stream", batches=2)
    v = arrow(str(tmp_path))
    assert len(v) == 9 and v.cuts == [3, 6] and [norm(x) for x in v] == peer(a) + peer(b)
    assert [norm(x) for x in arrow([b, a])] == peer(b) + peer(a)
    with pa.ipc.new_file(str(tmp_path / "c.arrow"), pa.schema({"x": pa.int32()})) as w:
        w.write_batch(pa.record_batch({"x": pa.array([1], pa.int32())}))
    e = store_error(lambda: arrow([a, str(tmp_path / "c.arrow")]))
    assert "c.arrow (an Arrow IPC file): column 'x' is int32, in " in str(e) and "share their schema" in str(e)
    with pa.ipc.new_file(str(tmp_path / "c.arrow"), pa.schema({"x": pa.int64()})) as w:
        w.write_batch(pa.record_batch({"x": [1]}))
    e = store_error(lambda: arrow([a, str(tmp_path / "c.arrow")]))
    assert "c.arrow (an Arrow IPC file) has no column 's'" in str(e)
    assert len(arrow([a, str(tmp_path / "c.arrow")], columns=["x"])) == 4  # the columns read are those checked


def test_pickle_small_prefetch_block_shuffle(tmp_path):
    path = write_ipc(tmp_path / "a.arrow", batches=5, rows=40)
    v = arrow(path, cache=2)
    want = [norm(x) for x in v]
    blob = pickle.dumps(v)
    assert len(blob) < 4000 and b"s40" not in blob  # names and sizes, no data
    assert [norm(x) for x in pickle.loads(blob)] == want
    with lazyseq.prefetch(v, nworkers=2, method="process") as p:
        assert [norm(x) for x in p] == want
    plain = arrow(path, columns=["v", "b", "d"])  # a store wants one structure: no struct that is sometimes None
    lazyseq.save(plain, str(tmp_path / "saved"))
    assert [norm(x) for x in lazyseq.load(str(tmp_path / "saved"))] == [norm(x) for x in plain]
    order = lazyseq.block_shuffle(v, v.cuts, seed=0)
    got = [norm(x) for x in order]
    assert got != want and sorted(map(repr, got)) == sorted(map(repr, want))
    assert len(v.held()) <= 2


def test_fingerprint_follows_the_files_and_strict(tmp_path):
    path = write_ipc(tmp_path / "a.arrow")
    fp = lazyseq.fingerprint(arrow(path))
    loose = lazyseq.fingerprint(arrow(path, strict=False))
    assert lazyseq.fingerprint(arrow(path)) == fp
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: same bytes
    assert lazyseq.fingerprint(arrow(path)) != fp and lazyseq.fingerprint(arrow(path, strict=False)) == loose
    v = arrow(path)
    blob = pickle.dumps(v)
    write_ipc(path, batches=4)  # changed under a pickled view: a worker refuses it
    assert lazyseq.fingerprint(arrow(path, strict=False)) != loose
    e = store_error(lambda: pickle.loads(blob)[0])
    assert "a.arrow" in str(e) and "changed since this view was made" in str(e)


def test_url_file_format_reads_footer_then_ranges(tmp_path, http_files):
    schema = pa.schema({"i": pa.int64(), "blob": pa.binary()})
    path = http_files.root / "big.arrow"
    with pa.ipc.new_file(str(path), schema) as w:
        for k in range(8):
            w.write_batch(pa.record_batch({"i": np.arange(k * 4, k * 4 + 4), "blob": [os.urandom(2**18)] * 4}, schema=schema))
    write_ipc(http_files.root / "s.arrow", "stream")
    v = arrow(f"{http_files.url}/big.arrow", block_cache=0)
    assert len(v) == 32 and v.cuts == [4 * k for k in range(1, 8)]
    item = v[21]
    assert item["i"] == 21 and item["blob"] == pa.ipc.open_file(str(path)).get_batch(5)["blob"][1].as_py()
    fetched = sum(int(r.range.split("=")[1].split("-")[1]) - int(r.range.split("=")[1].split("-")[0]) + 1
                  for r in http_files.requests if r.method == "GET" and r.range)
    assert fetched < os.path.getsize(path) / 4  # the footer, 8 small metadata messages, one batch
    s = arrow(f"{http_files.url}/s.arrow")  # the stream format over a URL: read whole, once
    assert [norm(x) for x in s] == peer(str(http_files.root / "s.arrow"))


# -- a stranger's IPC files ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_truncated_or_garbled_ipc_is_a_store_error(tmp_path, fmt):
    path = write_ipc(tmp_path / "a.arrow", fmt)
    data = open(path, "rb").read()
    for cut in (len(data) - 8, len(data) // 2, 7):
        open(path, "wb").write(data[:cut])
        e = store_error(lambda: list(arrow(path)))
        assert e is not None and "a.arrow" in str(e), cut
    open(path, "wb").write(b"not arrow at all, not at all")
    assert "a.arrow (an Arrow IPC file) is truncated or not an Arrow IPC file" in str(store_error(lambda: arrow(path)))
    garbled = bytearray(data)
    garbled[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    open(path, "wb").write(bytes(garbled))
    e = raised_within(20, lambda: list(arrow(path)))
    assert isinstance(e, (StoreError, EvaluationError)) and "a.arrow" in str(e)


def test_url_footer_and_messages_garbled(tmp_path, http_files):
    path = write_ipc(http_files.root / "a.arrow", batches=4)
    data = open(path, "rb").read()
    url = f"{http_files.url}/a.arrow"
    rng = np.random.default_rng(0)
    outcomes = set()
    for k in range(40):  # bytes of the footer and of the messages the footer points at, changed
        garbled = bytearray(data)
        for at in rng.integers(len(data) - 400 if k % 2 else 8, len(data), 3):
            garbled[at] = rng.integers(256)
        open(path, "wb").write(bytes(garbled))
        e = raised_within(20, lambda: [x for x in arrow(url, block_cache=0)])
        assert e is None or isinstance(e, StoreError) or isinstance(e.__cause__, StoreError), repr(e)
        assert e is None or "a.arrow" in str(e)
        outcomes.add(e is None)
    assert False in outcomes
    open(path, "wb").write(data[:-12])
    assert "a.arrow (an Arrow IPC file)" in str(store_error(lambda: arrow(url)))


def test_fuzz_mutated_ipc_raises_only_store_error(tmp_path):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    files = {fmt: open(write_ipc(tmp_path / f"{fmt}.arrow", fmt), "rb").read() for fmt in ("file", "stream")}

    @hypothesis.settings(max_examples=60, deadline=None, database=None)
    @hypothesis.given(st.sampled_from(["file", "stream"]), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                                     min_size=1, max_size=4), st.integers(0, 10**6))
    def run(fmt, flips, cut):
        data = bytearray(files[fmt])
        for at, value in flips:
            data[at % len(data)] = value
        if cut % 4 == 0:
            del data[cut % len(data):]
        path = tmp_path / "m.arrow"
        path.write_bytes(bytes(data))
        def read_all():
            v = arrow(str(path))
            return [v[i] for i in range(len(v))], list(v[list(range(len(v)))])

        store_error(read_all)

    run()


# -- Hugging Face datasets -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    root = tmp_path_factory.mktemp("hf")
    n = 3000
    ds = datasets.Dataset.from_dict({"x": list(range(n)), "s": [f"r{i}" for i in range(n)],
                                     "v": [[i, i + 1] for i in range(n)]})
    ds.save_to_disk(str(root / "plain"), max_shard_size="20KB")
    datasets.DatasetDict({"train": ds, "test": ds.select(range(7, 17))}).save_to_disk(str(root / "dict"))
    return datasets, ds, datasets.load_from_disk(str(root / "plain")), root


def _same(v, ds, step=1):
    assert len(v) == len(ds)
    idx = list(range(0, len(ds), step))
    assert [norm(v[i]) for i in idx] == [ds[i] for i in idx]
    assert [norm(x) for x in v[idx]] == [ds[i] for i in idx]


def test_dataset_object_rows_in_ds_order(hf):
    datasets, mem, disk, _ = hf
    assert len(disk.cache_files) > 1
    cases = {"plain": disk, "shuffle.select": disk.shuffle(seed=0).select(range(100, 900)),
             "filter": disk.filter(lambda r: r["x"] % 7 == 3), "split": disk.train_test_split(test_size=0.1, seed=1)["test"],
             "select_columns": disk.select_columns(["s"]), "remove_columns": disk.remove_columns(["x"]),
             "rename": disk.rename_column("x", "y"), "range": disk.select(range(1234, 2345)), "shard": disk.shard(3, 1),
             "concat": datasets.concatenate_datasets([disk.select(range(5, 50)), disk.shuffle(seed=3)]),
             "memory": mem, "memory.shuffle": mem.shuffle(seed=2).select(range(50))}
    for name, ds in cases.items():
        v = arrow(ds)
        _same(v, ds, step=7)
        assert v.columns == ds.column_names, name
    assert arrow(disk).cuts == np.cumsum([sum(b.num_rows for b in pa.ipc.open_stream(f["filename"]))
                                          for f in disk.cache_files])[:-1].tolist()
    shuffled = arrow(disk.shuffle(seed=0))
    assert sorted(norm(x)["x"] for x in lazyseq.block_shuffle(shuffled, shuffled.cuts, seed=0)) == list(range(3000))
    labelled = disk.cast_column("x", datasets.ClassLabel(num_classes=3000))  # the same storage type: followed
    _same(arrow(labelled), labelled, step=101)
    recast = disk.cast_column("x", datasets.Value("int32"))  # written again by datasets: its new file is read
    assert arrow(recast)[5]["x"].dtype == np.int32 and len(arrow(recast)) == 3000
    first = disk.cache_files[0]["filename"]
    table = datasets.table.MemoryMappedTable.from_file(first)
    cast = table.cast(pa.schema([f.with_type(pa.int32()) if f.name == "x" else f for f in table.schema]))  # a cast replay
    for changed, words in [(datasets.Dataset(cast), "has column 'x' cast to another type"),
                           (disk.add_column("w", list(range(3000))), "columns come from several tables")]:
        with pytest.raises(ValueError, match=words):
            arrow(changed)
    numpy = disk.with_format("numpy")
    assert all(np.array_equal(arrow(disk)[i]["v"], numpy[i]["v"]) for i in (0, 2999))


def test_dataset_pickles_small_and_reads_in_process_workers(hf):
    _, mem, disk, _ = hf
    ds = disk.shuffle(seed=5).select(range(40))
    v = arrow(ds)
    blob = pickle.dumps(v)
    assert len(blob) < 20000 and b"r17" not in blob
    with lazyseq.prefetch(v, nworkers=2, method="process") as p:
        assert [norm(x) for x in p] == [ds[i] for i in range(40)]
    m = arrow(mem.select(range(10)))  # a dataset held in memory travels with its data
    assert [norm(x) for x in pickle.loads(pickle.dumps(m))] == [mem[i] for i in range(10)]
    assert lazyseq.fingerprint(arrow(disk.shuffle(seed=5))) != lazyseq.fingerprint(arrow(disk.shuffle(seed=6)))


def test_save_to_disk_folders(hf, tmp_path):
    _, mem, _, root = hf
    _same(arrow(str(root / "plain")), mem, step=11)
    _same(arrow(str(root / "dict"), split="test"), mem.select(range(7, 17)))
    with pytest.raises(ValueError, match=r"give split=, one of \['train', 'test'\]"):
        arrow(str(root / "dict"))
    with pytest.raises(ValueError, match="split='train' is for a DatasetDict folder"):
        arrow(str(root / "plain"), split="train")
    code = (f"import sys; from lazyseq.formats.arrow import arrow; v = arrow({str(root / 'plain')!r}); v[5]; "
            "assert 'datasets' not in sys.modules")
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env={**os.environ, "PYTHONPATH": repo})


def test_save_to_disk_folder_over_a_url(hf, http_files):
    _, mem, _, root = hf
    shutil.copytree(root / "dict", http_files.root / "dict")
    v = arrow(f"{http_files.url}/dict", split="test")
    _same(v, mem.select(range(7, 17)))
    with pytest.raises(ValueError, match=r"one of \['train', 'test'\]"):
        arrow(f"{http_files.url}/dict")
    (http_files.root / "dict" / "test" / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../x.arrow"}]}))
    assert "only plain names" in str(store_error(lambda: arrow(f"{http_files.url}/dict", split="test")))


def test_image_feature_read_as_its_storage(hf, tmp_path):
    datasets = hf[0]
    png = b"\x89PNG\r\n\x1a\n not decoded"
    ds = datasets.Dataset.from_dict({"img": [{"bytes": png, "path": None}], "label": [3]},
                                    features=datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")}))
    ds.save_to_disk(str(tmp_path / "img"))
    for v in (arrow(str(tmp_path / "img")), arrow(datasets.load_from_disk(str(tmp_path / "img")))):
        assert v[0] == {"img": {"bytes": png, "path": None}, "label": 3}


# -- a stranger's save_to_disk folder --------------------------------------------------------------
def _folder(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write_ipc(folder / "data-00000-of-00001.arrow", "stream")
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return folder


def test_folder_listing_a_stranger_wrote(tmp_path):
    folder = _folder(tmp_path)
    (folder / "ignored.arrow").write_bytes(b"unlisted: never read")
    assert [norm(x) for x in arrow(str(folder))] == peer(str(folder / "data-00000-of-00001.arrow"))
    state = folder / "state.json"
    for name in ("../x.arrow", "sub/x.arrow", "..", "", 7):
        state.write_text(json.dumps({"_data_files": [{"filename": name}]}))
        e = store_error(lambda: arrow(str(folder)))
        assert "state.json (a dataset's state) lists a data file" in str(e) and "only plain names" in str(e)
    state.write_text(json.dumps({"_data_files": [{"filename": "gone.arrow"}]}))
    assert "gone.arrow (an Arrow IPC file) is missing: " in str(store_error(lambda: arrow(str(folder))))
    state.write_text("{not json")
    assert "state.json (a dataset's state) is not valid JSON" in str(store_error(lambda: arrow(str(folder))))
    state.write_text(json.dumps({"_data_files": []}))
    assert "lists no data files" in str(store_error(lambda: arrow(str(folder))))


def test_listed_file_truncated_fifo_or_link(tmp_path):
    folder = _folder(tmp_path)
    data = folder / "data-00000-of-00001.arrow"
    full = data.read_bytes()
    data.write_bytes(full[: len(full) - 8])  # cut at a batch's end: only the end-of-stream marker is missing
    e = store_error(lambda: arrow(str(folder)))
    assert "data-00000-of-00001.arrow (an Arrow IPC file) is truncated" in str(e)
    data.unlink()
    os.mkfifo(data)
    e = raised_within(20, lambda: arrow(str(folder)))
    assert isinstance(e, StoreError) and "data-00000-of-00001.arrow" in str(e) and "not a regular file" in str(e)
    data.unlink()
    (tmp_path / "elsewhere.arrow").write_bytes(full)
    data.symlink_to(tmp_path / "elsewhere.arrow")
    e = store_error(lambda: arrow(str(folder)))
    assert "data-00000-of-00001.arrow" in str(e) and "symbolic link" in str(e)
