"""A batch of a format's view read by columns (one Arrow ``take`` per block, no item built) equals
``default_collate`` of its items, value for value and dtype for dtype; where the items would not
stack so (nulls, structs, lists of unequal lengths) the batch is built from the items."""

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import lazyseq  # noqa: E402


def same(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    else:
        assert a == b


def table(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({
        "img": [rng.bytes(30) for _ in range(n)], "label": pa.array(rng.integers(0, 10, n), pa.int16()),
        "text": [f"t{i}" for i in range(n)], "ok": [i % 2 == 0 for i in range(n)],
        "emb": pa.array([list(rng.standard_normal(4)) for _ in range(n)], pa.list_(pa.float32(), 4)),
        "pair": [[i, -i] for i in range(n)], "code": pa.array([f"c{i % 3}" for i in range(n)]).dictionary_encode(),
    })


@pytest.mark.filterwarnings("ignore:block_shuffle:RuntimeWarning")  # cache=2 < window on purpose: batches across blocks
@pytest.mark.parametrize("source", ["parquet", "arrow"])
def test_a_batch_by_columns_equals_default_collate_of_its_items(tmp_path, source):
    t = table(300)
    if source == "parquet":
        pq.write_table(t, tmp_path / "a.parquet", row_group_size=70)
        v = lazyseq.parquet(tmp_path / "a.parquet", cache=2)
    else:
        with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
            for b in t.to_batches(max_chunksize=70):
                w.write_batch(b)
        v = lazyseq.arrow(str(tmp_path / "a.arrow"), cache=2)
    s = lazyseq.block_shuffle(v, v.cuts, seed=3)
    b = lazyseq.batch(s, 64, collate_fn=lazyseq.default_collate)
    for i in range(len(b)):
        got = b[i]
        same(got, lazyseq.default_collate([s[j] for j in range(i * 64, min(len(s), (i + 1) * 64))]))
    assert b._by_columns is True
    rows = v._get_columns(np.array([299, 0, 150, 0], dtype=np.int64))  # any order, repeats, across blocks
    same(rows, lazyseq.default_collate([v[299], v[0], v[150], v[0]]))


@pytest.mark.parametrize("column", [
    pa.array([1, None, 3] * 20), pa.array([[1], [2, 3], [4]] * 20), pa.array([{"a": 1}] * 60),
    pa.array([[1.0, None]] * 60),
], ids=["nulls", "unequal-lists", "structs", "null-inside-lists"])
def test_columns_that_would_not_stack_so_are_collated_from_items(tmp_path, column):
    pq.write_table(pa.table({"c": column, "x": list(range(60))}), tmp_path / "a.parquet", row_group_size=25)
    v = lazyseq.parquet(tmp_path / "a.parquet")
    assert v._get_columns(np.arange(10, dtype=np.int64)) is NotImplemented
    b = lazyseq.batch(v, 10, collate_fn=lambda items: items)  # the items, as default_collate would receive them
    assert [row["x"] for row in b[1]] == list(range(10, 20))
    if column.type != pa.list_(pa.int64()):  # lists of unequal lengths do not stack: default_collate says so
        got = lazyseq.batch(v, 10, collate_fn=lazyseq.default_collate)[1]
        assert got["x"].tolist() == list(range(10, 20))


def test_a_lance_batch_by_columns_is_one_take(tmp_path):
    lance = pytest.importorskip("lance")
    lance.write_dataset(table(200).drop_columns(["code"]), str(tmp_path / "ds"), max_rows_per_file=60)
    v = lazyseq.lance(str(tmp_path / "ds"))
    b = lazyseq.batch(lazyseq.block_shuffle(v, v.cuts, seed=1), 32, collate_fn=lazyseq.default_collate)
    for i in range(len(b)):
        same(b[i], lazyseq.default_collate(list(b.src[i * 32 : (i + 1) * 32])))
    assert b._by_columns is True


@pytest.mark.parametrize("by_columns", [True, False], ids=["by-columns", "by-items"])
def test_a_block_shuffled_epoch_decodes_each_block_once_when_the_cache_holds_a_window(tmp_path, monkeypatch, by_columns):
    # blocks of 70 and 20 rows, so the shuffle's windows and the batches fall across each other: a
    # batch across two windows reads the blocks it holds first, and evicts none it still needs
    t = table(700)
    pq.write_table(t.slice(0, 350), tmp_path / "a.parquet", row_group_size=70)
    pq.write_table(t.slice(350), tmp_path / "b.parquet", row_group_size=20)
    v = lazyseq.parquet(tmp_path, cache=4)
    decoded = []
    real = type(v)._decode
    monkeypatch.setattr(type(v), "_decode", lambda self, b: decoded.append(b) or real(self, b))
    s = lazyseq.block_shuffle(v, v.cuts, seed=5, window=4)
    collate = lazyseq.default_collate if by_columns else list
    b = lazyseq.batch(s, 48, collate_fn=collate)
    seen = []
    for i in range(len(b)):
        seen.extend(b[i]["label"].tolist() if by_columns else [int(x["label"]) for x in b[i]])
    assert sorted(decoded) == list(range(v.blocks))
    assert seen == [int(s[i]["label"]) for i in range(len(s))]


def test_block_shuffle_says_when_the_window_is_larger_than_the_cache(tmp_path):
    import warnings

    pq.write_table(table(300), tmp_path / "a.parquet", row_group_size=30)
    small = lazyseq.parquet(tmp_path / "a.parquet", cache=2)
    with pytest.warns(RuntimeWarning, match=r"keeps 2 decoded blocks.*cache=8 or more, or pass window=2") as got:
        lazyseq.block_shuffle(small, small.cuts, seed=0)
    assert got[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazyseq.block_shuffle(small, small.cuts, seed=0, window=2)
        big = lazyseq.parquet(tmp_path / "a.parquet", cache=8)
        lazyseq.block_shuffle(big, big.cuts, seed=0)
        lazyseq.block_shuffle(range(300), small.cuts, seed=0)
