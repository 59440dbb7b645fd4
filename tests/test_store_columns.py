"""The store's one bulk read (lazyseq.store.gather): a batch of a store under index remaps is read
by columns and equals default_collate of its items exactly; a bulk read of items equals the items
read one by one; whatever the order, the shards and the fields."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import default_collate
from lazyseq.store import read

P = collections.namedtuple("P", "a b")


def same(a, b, where="batch"):
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{k}]")
    else:
        assert a == b or (a != a and b != b), (where, a, b)


def item(i):
    return {"img": np.full((2, 3), i % 251, np.uint8),
            "len": np.arange(4, dtype=np.int16) * i, "y": i, "f": i / 7, "ok": i % 2 == 0, "s": f"s{i}",
            "b": bytes([i % 256]), "n": None, "sc": np.float32(i), "z": np.array(i * 1.5), "p": P(i, [i, -i]),
            "od": collections.OrderedDict(u=i)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cols") / "s"
    lazyseq.save(lazyseq.smap(item, range(200)), path, method="thread", shard_bytes=3000)
    s = lazyseq.load(path)
    assert len(s.records) > 4
    return s


def chains(store):
    """Index remaps over the store that the columnar path goes through."""
    return {
        "store": store,
        "shuffle": lazyseq.shuffle(store, 3),
        "shuffle-epoch": lazyseq.at_epoch(lazyseq.shuffle(store, 3), 2),
        "slice": store[150:10:-3],
        "gather-array": lazyseq.gather(store, np.array([5, -1, 5, 199, 0, 77] * 9)),
        "gather-list": lazyseq.gather(store, [3, 1, 4, 1, 5, 9, 2, 6] * 5),
        "block_shuffle": lazyseq.block_shuffle(store, 16, seed=1),
        "shard-of-shuffle": lazyseq.shard(lazyseq.shuffle(store, 1), 1, 3),
        "loader-like": lazyseq.gather(store, lazyseq.shard(lazyseq.shuffle(lazyseq.arange(200), 4, epoch=1)[7:], 0, 2)),
    }


@pytest.mark.parametrize("name", ["store", "shuffle", "shuffle-epoch", "slice", "gather-array", "gather-list",
                                  "block_shuffle", "shard-of-shuffle", "loader-like"])
def test_a_batch_by_columns_is_default_collate_of_its_items(store, name, monkeypatch):
    seq = chains(store)[name]
    calls = collections.Counter()
    real = read.Store._get
    monkeypatch.setattr(read.Store, "_get", lambda self, i: (calls.update([i]), real(self, i))[1])
    batches = lazyseq.batch(seq, 16, collate_fn=default_collate)
    got = [batches[b] for b in range(len(batches))]
    assert not calls, "a batch by columns builds no item"
    monkeypatch.undo()
    for b, batch in enumerate(got):
        want = default_collate([seq[i] for i in range(b * 16, min(len(seq), b * 16 + 16))])
        same(batch, want, f"batch {b}")
    assert got[0]["img"].flags.writeable and type(got[0]["od"]) is collections.OrderedDict


def test_bulk_reads_of_items_equal_single_reads(store):
    for name, seq in chains(store).items():
        idx = list(range(len(seq)))[::-1][:60]
        bulk = seq._get_many(idx) if hasattr(seq, "_get_many") else None
        for i, x in zip(idx, bulk):
            same(x, seq[i], f"{name}[{i}]")
            assert not x["img"].flags.writeable


@settings(max_examples=60, deadline=None)
@given(idx=st.lists(st.integers(0, 199), min_size=1, max_size=70), k=st.integers(1, 40))
def test_any_indices(store, idx, k):
    seq = lazyseq.gather(store, idx)
    for b in range(len(lazyseq.batch(seq, k))):
        part = idx[b * k:(b + 1) * k]
        same(lazyseq.batch(seq, k, collate_fn=default_collate)[b], default_collate([store[i] for i in part]))
    for x, i in zip(store._get_many(idx), idx):
        same(x, store[i])


def test_variable_fields(tmp_path):
    items = [{"tok": np.arange(1 + i % 2, dtype=np.int32) * i, "s": "x" * (i % 4)} for i in range(60)]
    lazyseq.save(items, tmp_path / "v", method="thread", shard_bytes=300)
    v = lazyseq.load(tmp_path / "v")
    idx = [58, 2, 30, 0, 44, 12, 2]  # even: every tok has shape (1,), so default_collate stacks them
    same(lazyseq.batch(lazyseq.gather(v, idx), 7, collate_fn=default_collate)[0], default_collate([v[i] for i in idx]))
    for i, x in zip(range(59, 0, -3), v._get_many(range(59, 0, -3))):
        same(x, v[i])
        assert not x["tok"].flags.writeable and np.shares_memory(x["tok"], v[i]["tok"].base)


def test_what_columns_cannot_do_takes_the_item_path(tmp_path):
    lazyseq.save([np.arange(i % 3) for i in range(40)], tmp_path / "v", method="thread", shard_bytes=100)
    v = lazyseq.load(tmp_path / "v")  # shapes differ: default_collate's own error, naming the samples
    with pytest.raises(lazyseq.EvaluationError, match="default_collate: sample 0 has shape"):
        lazyseq.batch(lazyseq.shuffle(v, 0), 8, collate_fn=default_collate)[0]
    g = lazyseq.gather(v, [1, 2, 400])  # an index out of range: the gather's IndexError, as before
    with pytest.raises(IndexError, match="index 400 is out of range"):
        lazyseq.batch(g, 3, collate_fn=default_collate)[0]
    lazyseq.save([{"x": {1, i}} for i in range(10)], tmp_path / "p", method="thread", allow_pickle=True)
    p = lazyseq.load(tmp_path / "p", allow_pickle=True)  # pickled fields: items, then collate
    assert lazyseq.batch(lazyseq.shuffle(p, 0), 5, collate_fn=default_collate)[0]["x"][0] in [{1, i} for i in range(10)]
    floats = lazyseq.gather(v, np.array([1.0, 2.0]))  # float indices are refused, never truncated
    with pytest.raises(lazyseq.EvaluationError):
        lazyseq.batch(floats, 2, collate_fn=default_collate)[0]


def test_dataloader_batches_of_a_store(store):
    kw = dict(batch_size=32, shuffle=True, seed=5, to_tensor=False)
    with lazyseq.DataLoader(store, num_workers=2, **kw) as loader:
        got = [b for b in loader]
        order = lazyseq.shuffle(lazyseq.arange(200), 5, epoch=0)
    for b, batch in enumerate(got):
        same(batch, default_collate([store[int(i)] for i in order[b * 32:(b + 1) * 32]]), f"batch {b}")
