import collections
import itertools
import warnings

import numpy as np
import pytest

import lazyseq as ls

Sample = collections.namedtuple("Sample", "image label")


def make_data(n=37):
    return [Sample(np.full((2, 3), i, np.float32), i) for i in range(n)]


def labels(batches):
    return [[int(x) for x in b.label] for b in batches]


def plain(data, bs, drop_last=False):
    out = [data[i : i + bs] for i in range(0, len(data), bs)]
    return [[s.label for s in b] for b in out if len(b) == bs or not drop_last]


@pytest.mark.parametrize("workers", [0, 2])
def test_values_and_order_match_a_plain_loop(workers):
    data = make_data()
    with ls.DataLoader(data, batch_size=5, num_workers=workers, to_tensor=False) as loader:
        batches = list(loader)
    assert labels(batches) == plain(data, 5)
    assert all(isinstance(b, Sample) and b.image.shape == (len(b.label), 2, 3) for b in batches)
    assert all((b.image[:, 0, 0] == b.label).all() for b in batches)


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_is_torchs(drop_last):
    for n, bs in [(37, 5), (40, 5), (3, 5), (0, 4)]:
        loader = ls.DataLoader(list(range(n)), batch_size=bs, drop_last=drop_last, to_tensor=False)
        assert len(loader) == (n // bs if drop_last else -(-n // bs)) == len(list(loader))
    assert len(ls.DataLoader(list(range(7)), batch_size=None, to_tensor=False)) == 7


def test_shuffle_is_deterministic_covers_and_changes_per_epoch():
    data = list(range(50))
    loader = ls.DataLoader(data, batch_size=8, shuffle=True, seed=3, to_tensor=False)
    e0, e1 = [list(b) for b in loader], [list(b) for b in loader]  # iterating again: the next epoch
    assert sorted(itertools.chain(*e0)) == data == sorted(itertools.chain(*e1))
    assert e0 != e1 and loader.epoch == 2
    again = ls.DataLoader(data, batch_size=8, shuffle=True, seed=3, to_tensor=False)
    assert [list(b) for b in again] == e0
    again.set_epoch(1)
    assert [list(b) for b in again] == e1
    assert [list(b) for b in ls.DataLoader(data, batch_size=8, shuffle=True, seed=4, to_tensor=False)] != e0


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_disjoint_and_cover_the_epoch(world_size, drop_last):
    data = list(range(41))
    parts = []
    for rank in range(world_size):
        loader = ls.DataLoader(data, batch_size=4, shuffle=True, seed=1, rank=rank, world_size=world_size,
                               drop_last=drop_last, to_tensor=False)
        loader.set_epoch(5)
        parts.append([int(x) for b in loader for x in b])
    flat = list(itertools.chain(*parts))
    assert len(flat) == len(set(flat))
    if drop_last:
        per_rank = 41 // world_size // 4 * 4
        assert all(len(p) == per_rank for p in parts)
    else:
        assert sorted(flat) == data


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_every_batch_position(workers):
    data = list(range(23))
    ref = ls.DataLoader(data, batch_size=4, shuffle=True, seed=9, to_tensor=False)
    epochs = [[list(b) for b in ref] for _ in range(2)]
    flat = epochs[0] + epochs[1]
    for k in range(len(flat)):
        loader = ls.DataLoader(data, batch_size=4, shuffle=True, seed=9, num_workers=workers, to_tensor=False)
        seen, it = [], iter(loader)
        while len(seen) < k:
            try:
                seen.append(list(next(it)))
            except StopIteration:
                it = iter(loader)
        state = loader.state_dict()
        it.close()
        loader.close()
        resumed = ls.DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, to_tensor=False)
        resumed.load_state_dict(state)
        rest = [list(b) for b in resumed]
        assert seen + rest == flat[: len(seen) + len(rest)] and len(rest) > 0
        resumed.close()
        if workers and k > 3:
            break  # with workers, a few positions are enough


def test_persistent_workers_keep_their_processes():
    data = make_data(30)
    with ls.DataLoader(data, batch_size=4, shuffle=True, seed=0, num_workers=2, persistent_workers=True,
                       to_tensor=False) as loader:
        e0 = labels(loader)
        pids = loader.stats()["worker_pids"]
        e1 = labels(loader)
        assert loader.stats()["worker_pids"] == pids and len(pids) == 2
    ref = ls.DataLoader(data, batch_size=4, shuffle=True, seed=0, to_tensor=False)
    assert [e0, e1] == [labels(ref), labels(ref)]


def test_collate_writes_batches_into_shared_memory_and_sizes_it():
    data = [np.full((64, 64), i, np.float32) for i in range(40)]
    with ls.DataLoader(data, batch_size=8, num_workers=2, to_tensor=False) as loader:
        it = iter(loader)
        first = next(it)
        stats = loader.stats()
        rest = list(it)
    assert (first[:, 0, 0] == np.arange(8)).all() and len(rest) == 4
    assert "sized from the first sample" in stats["shm"]
    p = stats["prefetch"]
    assert p["bytes_shm"] >= 8 * 64 * 64 * 4 and p["bytes_pipe"] < 8 * 64 * 64 * 4 / 10 and p["fallbacks"] == 0


def test_default_collate_nests():
    b = ls.default_collate([{"x": (np.zeros(2), 1.0), "s": "a"}, {"x": (np.ones(2), 2.0), "s": "b"}])
    assert b["x"][0].shape == (2, 2) and list(b["x"][1]) == [1.0, 2.0] and b["s"] == ["a", "b"]
    with pytest.raises(ValueError, match="shape"):
        ls.default_collate([np.zeros(2), np.zeros(3)])


def test_sampler_batch_sampler_and_no_batching():
    data = list(range(10))
    assert [list(b) for b in ls.DataLoader(data, batch_size=3, sampler=[9, 8, 7, 1], to_tensor=False)] == [[9, 8, 7], [1]]
    bs = [[0, 1], [5, 6, 7], [2]]
    assert [list(b) for b in ls.DataLoader(data, batch_sampler=bs, to_tensor=False)] == bs
    assert [list(b) for b in ls.DataLoader(data, batch_sampler=bs, num_workers=2, to_tensor=False)] == bs
    assert list(ls.DataLoader(data, batch_size=None, to_tensor=False)) == data
    assert len(ls.DataLoader(data, batch_sampler=bs)) == 3


def test_make_sequence_reads_any_batch():
    data = list(range(100))
    loader = ls.DataLoader(data, batch_size=10, shuffle=True, seed=2, to_tensor=False)
    seq = loader.make_sequence(epoch=3)
    loader.set_epoch(3)
    assert [list(b) for b in loader] == [list(seq[i]) for i in range(10)]
    assert list(seq[-1]) == list(seq[9])


TORCH_ERRORS = [
    (dict(num_workers=-1), "num_workers option should be non-negative"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing"),
    (dict(num_workers=2, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    # batch_size=None with drop_last=True is accepted (a dataset of batches, a bucket: tests/test_packing.py)
    (dict(multiprocessing_context="fork"), "multiprocessing_context can only be used with multi-process loading"),
    (dict(num_workers=1, multiprocessing_context="nope"), "multiprocessing_context option should specify a valid start"),
]


@pytest.mark.parametrize("kwargs,message", TORCH_ERRORS)
def test_wrong_arguments_raise_torchs_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ls.DataLoader(list(range(4)), **kwargs)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        torch.utils.data.DataLoader(list(range(4)), **kwargs)


# -- batches as tinygrad Tensors ------------------------------------------------------------------------
def image_data(n=23):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((3, 4, 5)).astype(np.float32), i * 7) for i in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_tinygrad_batches_match_the_numpy_batches(workers):
    tinygrad = pytest.importorskip("tinygrad")
    data = image_data()
    kw = dict(batch_size=4, shuffle=True, seed=5, num_workers=workers)
    with ls.DataLoader(data, to_tensor=False, **kw) as ref:
        want = [(x.copy(), y.copy()) for x, y in ref]  # copies: the slots go back to the workers
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no slot held by a Tensor: no fallback to the pipe
        with ls.DataLoader(data, **kw) as loader:
            got = list(loader)  # all kept: more batches than slots, each Tensor holds its own copy
    assert len(got) == len(want) == 6
    for (x, y), (wx, wy) in zip(got, want):
        assert isinstance(x, tinygrad.Tensor) and isinstance(y, tinygrad.Tensor)
        assert x.shape == wx.shape == (len(wy), 3, 4, 5) and y.shape == wy.shape
        assert x.dtype == tinygrad.dtypes.float32 and y.dtype == tinygrad.dtypes.int64
        np.testing.assert_array_equal(x.numpy(), wx)
        assert y.numpy().tolist() == wy.tolist()
    assert sorted(v for _, y in got for v in y.tolist()) == [i * 7 for i in range(23)]


@pytest.mark.parametrize("workers", [0, 2])
def test_tinygrad_batches_on_device_cpu(workers):
    tinygrad = pytest.importorskip("tinygrad")
    data = make_data(10)
    with ls.DataLoader(data, batch_size=4, num_workers=workers, device="CPU") as loader:
        batches = list(loader)
        seq = loader.make_sequence(epoch=0)
        last = seq[-1]
        del seq  # with workers: the prefetch inside stops when it is collected
    assert [len(b.label.tolist()) for b in batches] == [4, 4, 2]
    for k, b in enumerate(batches):
        assert isinstance(b, Sample)  # the namedtuple is kept
        assert b.image.device == "CPU" and b.label.device == "CPU"
        assert b.image.dtype == tinygrad.dtypes.float32 and b.image.shape == (len(b.label.tolist()), 2, 3)
        assert (b.image.numpy()[:, 0, 0] == np.arange(4 * k, 4 * k + len(b.label.tolist()))).all()
    assert last.image.device == "CPU" and last.label.tolist() == [8, 9]


def test_workers_draw_different_random_numbers_per_epoch_and_rank():
    data = ls.smap(lambda i: np.random.random(), range(8))
    with ls.DataLoader(data, batch_size=2, num_workers=2, seed=0, to_tensor=False) as loader:
        e0, e1 = [b.tolist() for b in loader], [b.tolist() for b in loader]
    assert e0 != e1 and len(set(np.ravel(e0))) == 8
    ranks = []
    for rank in range(2):
        with ls.DataLoader(data, batch_size=2, num_workers=2, seed=0, rank=rank, world_size=2, to_tensor=False) as loader:
            ranks.append([b.tolist() for b in loader])
    assert ranks[0] != ranks[1]


def test_make_sequence_workers_stop_with_the_loader():
    with ls.DataLoader(list(range(40)), batch_size=4, num_workers=2, to_tensor=False) as loader:
        seq = loader.make_sequence()
        assert list(seq[3]) == [12, 13, 14, 15]
        pids = seq.worker_pids()
        assert len(pids) == 2
    assert loader.stats()["shm"].startswith("sized from the first sample")
    with pytest.raises(ls.PrefetchClosed):
        seq[0]


def test_an_empty_loader_advances_one_epoch_per_pass():
    loader = ls.DataLoader([], batch_size=4, to_tensor=False)
    for _ in range(3):
        assert list(loader) == []
    assert loader.state_dict()["epoch"] == 3


def test_dropped_make_sequence_stops_its_workers():
    import gc

    loader = ls.DataLoader(list(range(40)), batch_size=4, num_workers=2, to_tensor=False)
    seq = loader.make_sequence()
    assert list(seq[2]) == [8, 9, 10, 11]
    pids = seq.worker_pids()
    del seq
    gc.collect()
    assert not loader._open and len(pids) == 2


def test_uneven_ranks_warn():
    with pytest.warns(RuntimeWarning, match="drop_last=True"):
        ls.DataLoader(list(range(41)), batch_size=4, rank=0, world_size=4)


def test_a_batch_of_small_bytes_travels_as_one_buffer_in_the_slot_sized_for_it():
    # images of a few KB each, as a Parquet or WebDataset source gives them: each below a page, so
    # each alone would travel in the pickle; a batch's list of them is one buffer in the slot
    rng = np.random.default_rng(0)
    data = [{"jpg": rng.bytes(3000 + i), "key": f"k{i}", "label": i} for i in range(48)]
    with ls.DataLoader(data, batch_size=16, num_workers=2, to_tensor=False) as loader:
        batches = list(loader)
        stats = loader.stats()
    assert [b["key"] for b in batches] == [[f"k{i}" for i in range(k, k + 16)] for k in (0, 16, 32)]
    assert [x for b in batches for x in b["jpg"]] == [d["jpg"] for d in data]
    assert all(type(x) is bytes for b in batches for x in b["jpg"])
    assert "3008 bytes x batch 16" in stats["shm"]  # the first sample's bytes (3000) and label (8) counted
    p = stats["last_epoch"]["prefetch"]
    assert p["bytes_shm"] >= sum(3000 + i for i in range(48)) and p["fallbacks"] == 0
    assert p["bytes_pipe"] < p["bytes_shm"] / 4
