"""lazyseq.parquet's single reads from the one page that holds a row, where a file has an offset
index: the same values as pyarrow's reader, no row group decoded, fewer bytes over a URL, and a
stranger's offset index checked before it is used."""

import io
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import lazyseq  # noqa: E402
import lazyseq.formats.parquet as P  # noqa: E402
from tests.parquet_footer import patch, read  # noqa: E402
from tests.rows import norm  # noqa: E402


def table(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({
        "i": pa.array([None if k % 13 == 0 else k for k in range(n)], pa.int32()),
        "f": rng.standard_normal(n),
        "b": [k % 3 == 0 for k in range(n)],
        "s": [None if k % 7 == 0 else f"s{k % 50}" for k in range(n)],
        "y": [rng.bytes(int(rng.integers(0, 40))) for _ in range(n)],
        "l": [None if k % 11 == 0 else [float(k)] * (k % 4) for k in range(n)],
        "ln": [[1, None] if k % 9 == 0 else [k] for k in range(n)],
        "fl": pa.array([[k, -k] for k in range(n)], pa.list_(pa.int16(), 2)),
        "ls": [[f"x{k}"] * (k % 3) for k in range(n)],
    })


@pytest.fixture
def pages_always(monkeypatch):
    monkeypatch.setattr(P, "PAGE_READS", 0)  # every row group is large enough to read page by page


@pytest.mark.parametrize("options", [
    {}, {"use_dictionary": False, "compression": "zstd"}, {"data_page_version": "2.0"},
    {"compression": "none", "use_dictionary": ["s"]},
], ids=["dictionary-snappy", "plain-zstd", "v2-pages", "uncompressed"])
def test_single_reads_from_pages_equal_pyarrows(tmp_path, pages_always, options):
    path = str(tmp_path / "p.parquet")
    pq.write_table(table(3000), path, row_group_size=1500, write_page_index=True, data_page_size=512, **options)
    rows = pq.read_table(path).to_pylist()
    v = lazyseq.parquet(path, cache=1)
    order = [*np.random.default_rng(1).permutation(len(rows))[:600].tolist(), 0, 1499, 1500, 2999]
    assert [norm(v[i]) for i in order] == [rows[i] for i in order]
    assert v.held() == []  # no row group was decoded: every read came from pages
    assert v._pages is not None and len(v._pages.pages.held()) > 0
    assert max(len(index[0]) for index in v._pages.indexes.values()) > 3  # several pages per chunk: a read decodes one
    assert [norm(r) for r in v._get_many([5, 2000])] == [rows[5], rows[2000]]  # few rows of each: from pages too
    assert v.held() == []
    many = list(range(1600, 1700))  # 100 rows of 1500, more than one in SPARSE: the row group is decoded
    assert [norm(r) for r in v._get_many(many)] == [rows[i] for i in many]
    assert v.held() == [1]


def test_a_batch_of_rows_scattered_over_row_groups_reads_their_pages(tmp_path, pages_always):
    path = str(tmp_path / "p.parquet")
    pq.write_table(table(3000), path, row_group_size=500, write_page_index=True, data_page_size=512)
    v = lazyseq.parquet(path, columns=["f", "b", "y", "fl"], cache=2)
    order = [7, 2500, 40, 1333, 2999, 501]
    b = lazyseq.batch(lazyseq.gather(v, order), 6, collate_fn=lazyseq.default_collate)[0]
    want = lazyseq.default_collate([lazyseq.parquet(path, columns=["f", "b", "y", "fl"])[i] for i in order])
    assert list(b) == list(want) and b["y"] == want["y"]
    for k in ("f", "b", "fl"):
        assert b[k].dtype == want[k].dtype and np.array_equal(b[k], want[k])
    assert v.held() == []  # one row or two of each row group: pages, no row group decoded


def test_without_an_offset_index_or_for_nested_columns_the_row_group_is_decoded(tmp_path, pages_always):
    plain = str(tmp_path / "plain.parquet")
    pq.write_table(table(100), plain, row_group_size=50)
    v = lazyseq.parquet(plain, cache=1)
    assert norm(v[70]) == pq.read_table(plain).to_pylist()[70]
    assert v.held() == [1] and v._pages is None
    nested = str(tmp_path / "nested.parquet")
    pq.write_table(pa.table({"st": [{"a": k, "b": str(k)} for k in range(100)], "x": list(range(100))}), nested,
                   row_group_size=50, write_page_index=True)
    w = lazyseq.parquet(nested, cache=1)
    assert norm(w[70]) == {"st": {"a": 70, "b": "70"}, "x": 70}
    assert w.held() == [1]  # a struct has two leaves, paged apart: its row group is read
    assert norm(lazyseq.parquet(nested, columns=["x"], cache=1)[70]) == {"x": 70}


def test_small_local_row_groups_are_decoded_whole(tmp_path):
    path = str(tmp_path / "p.parquet")
    pq.write_table(table(200), path, row_group_size=100, write_page_index=True, data_page_size=512)
    v = lazyseq.parquet(path, cache=1)
    v[150]
    assert v.held() == [1] and v._pages is None  # far below PAGE_READS bytes: one decode serves its neighbours


def test_over_http_a_read_fetches_its_pages_not_its_row_group(http_files):
    pytest.importorskip("aiohttp")
    n = 20000
    t = pa.table({"x": np.arange(n, dtype=np.int64), "y": np.random.default_rng(0).standard_normal(n)})
    pq.write_table(t, http_files.root / "t.parquet", row_group_size=n, write_page_index=True, data_page_size=4096,
                   compression="none", use_dictionary=False)
    v = lazyseq.parquet(f"{http_files.url}/t.parquet", block_cache=0)
    remote = v._remotes.of(http_files.url)
    before = remote.bytes_read
    assert norm(v[12345]) == {"x": 12345, "y": t.column("y")[12345].as_py()}
    fetched = remote.bytes_read - before
    assert 0 < fetched < 64 * 1024 < 2 * 8 * n // 4  # two pages and two offset indexes, not two column chunks of 160 KB
    assert v.held() == []


def _offset_index_file(tmp_path, name="p.parquet"):
    buf = io.BytesIO()
    pq.write_table(table(400), buf, row_group_size=400, write_page_index=True, data_page_size=256, use_dictionary=False)
    return buf.getvalue()


@pytest.mark.parametrize("where", ["outside", "inside-the-footer", "zero-length"])
def test_an_offset_index_that_lies_elsewhere_is_refused(tmp_path, pages_always, where):
    data = _offset_index_file(tmp_path)
    off, n = read(data, [4, 0, 1, 0, 4]), read(data, [4, 0, 1, 0, 5])
    assert off > 0 and n > 0
    value = {"outside": (len(data) * 2, n), "inside-the-footer": (len(data) - 20, n), "zero-length": (off, 0)}[where]
    data = patch(patch(data, [4, 0, 1, 0, 4], value[0]), [4, 0, 1, 0, 5], value[1])
    path = tmp_path / "p.parquet"
    path.write_bytes(data)
    v = lazyseq.parquet(str(path))
    with pytest.raises(lazyseq.EvaluationError) as e:
        v[10]
    assert isinstance(e.value.__cause__, lazyseq.StoreError)
    assert "p.parquet" in str(e.value.__cause__) and "offset index" in str(e.value.__cause__)


def test_an_offset_index_pointing_at_other_bytes_is_refused(tmp_path, pages_always):
    """The offset index of column 0 swapped for column 1's: its pages lie outside column 0's chunk."""
    data = _offset_index_file(tmp_path)
    other = read(data, [4, 0, 1, 1, 4]), read(data, [4, 0, 1, 1, 5])
    data = patch(patch(data, [4, 0, 1, 0, 4], other[0]), [4, 0, 1, 0, 5], other[1])
    path = tmp_path / "p.parquet"
    path.write_bytes(data)
    v = lazyseq.parquet(str(path))
    with pytest.raises(lazyseq.EvaluationError) as e:
        v[10]
    assert "offset index" in str(e.value.__cause__) and "inside its column chunk" in str(e.value.__cause__)


def test_pages_are_read_again_in_a_worker(tmp_path, pages_always):
    path = str(tmp_path / "p.parquet")
    pq.write_table(table(600), path, row_group_size=300, write_page_index=True, data_page_size=512)
    rows = pq.read_table(path).to_pylist()
    v = lazyseq.parquet(path)
    with lazyseq.prefetch(v, nworkers=2, method="process") as p:
        assert [norm(p[i]) for i in range(0, 600, 7)] == rows[::7]
    assert os.path.exists(path)
