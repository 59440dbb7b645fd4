"""chunks (one flat view over chunk files, at most `cache` in memory) and block_shuffle (whole blocks
in random order, items shuffled within groups of `window` blocks)."""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import threading
import time
import weakref

import cloudpickle
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq as ls
from lazyseq.core.node import Failed

SETTINGS = settings(max_examples=int(100 * float(os.environ.get("LAZYSEQ_TEST_SCALE", "1"))), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class Chunk(list):
    """A list that weak references can follow, so a test sees which chunks are still alive."""


class Store:
    """Chunk files in memory: ``read(path)`` builds a fresh Chunk and records it."""

    def __init__(self, lengths: list[int], delay: float = 0.0):
        self.lengths, self.delay = lengths, delay
        starts = np.cumsum([0, *lengths])
        self.files = {f"c{k}": list(range(starts[k], starts[k + 1])) for k in range(len(lengths))}
        self.paths = list(self.files)
        self.reads: collections.Counter = collections.Counter()
        self.live = 0  # chunks made and not yet garbage
        self.most_live = 0  # the most chunks alive when a read starts (the one being read included)
        self.busy: collections.Counter = collections.Counter()  # reads of each path in progress now
        self.overlap = 0  # the most concurrent reads of one path seen
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())

    def read(self, path: str) -> Chunk:
        with self.lock:
            self.most_live = max(self.most_live, self.live + 1)
            self.reads[path] += 1
            self.busy[path] += 1
            self.overlap = max(self.overlap, self.busy[path])
        try:
            if self.delay:
                time.sleep(self.delay)
            c = Chunk(self.files[path])
            with self.lock:
                self.live += 1
            weakref.finalize(c, self._gone)
            return c
        finally:
            with self.lock:
                self.busy[path] -= 1

    def _gone(self) -> None:
        self.live -= 1

    def alive(self) -> int:  # chunks hold no reference cycles: they go when their last reference does
        return self.live

    @property
    def items(self) -> list[int]:
        return [x for p in self.paths for x in self.files[p]]


# -- chunks ----------------------------------------------------------------------------------------
def test_chunks_reads_as_one_flat_sequence():
    s = Store([3, 0, 2, 4])
    data = ls.chunks(s.paths, s.read, cache=2)
    assert len(data) == 9 and list(data) == list(range(9))
    assert data.lengths == (3, 0, 2, 4) and data.cuts == [3, 3, 5]
    assert data[-1] == 8 and data[3] == 3 and list(data[2:7:2]) == [2, 4, 6] and list(data[[8, 0]]) == [8, 0]
    assert "chunks(Store.read, 4 files, cache=2)  len=9" in repr(data)
    with pytest.raises(IndexError):
        data[9]


def test_counting_reads_each_chunk_once_and_lengths_save_it():
    s = Store([4, 4, 4])
    data = ls.chunks(s.paths, s.read, cache=3)
    assert len(data) == 12 and s.reads == {"c0": 1, "c1": 1, "c2": 1}
    assert list(data) == list(range(12)) and s.reads == {"c0": 1, "c1": 1, "c2": 1}  # all three still held

    s = Store([4, 4, 4])
    data = ls.chunks(s.paths, s.read, lengths=[4, 4, 4], cache=1)
    assert len(data) == 12 and data.cuts == [4, 8] and not s.reads  # nothing read to know the layout
    assert data[9] == 9 and s.reads == {"c2": 1}


def test_cache_is_least_recently_used():
    s = Store([2, 2, 2])
    data = ls.chunks(s.paths, s.read, lengths=s.lengths, cache=2)
    data[0], data[2], data[1], data[4]  # c0, c1, c0 again, then c2 evicts c1 (least recently used)
    assert data.held() == [0, 2]
    data[0]
    assert s.reads == {"c0": 1, "c1": 1, "c2": 1}


@pytest.mark.parametrize("cache", [1, 2, 3])
def test_never_more_than_cache_chunks_in_memory(cache):
    s = Store([5] * 8)
    data = ls.chunks(s.paths, s.read, cache=cache)
    rng = np.random.default_rng(cache)
    assert len(data) == 40 and s.alive() <= cache
    for i in rng.integers(0, 40, 300).tolist():
        assert data[i] == i
        assert s.alive() <= cache
    for _ in range(20):
        idx = rng.integers(0, 40, 12).tolist()
        assert data._get_many(idx) == idx
        assert s.alive() <= cache
    assert s.most_live <= cache  # a chunk being decoded counts: room is made before reading


def test_bulk_reads_read_each_chunk_once_per_call():
    s = Store([3, 3, 3])
    data = ls.chunks(s.paths, s.read, lengths=s.lengths, cache=1)
    idx = [0, 4, 1, 7, 5, 2, 8]
    assert data._get_many(idx) == idx
    assert s.reads == {"c0": 1, "c1": 1, "c2": 1}
    assert ls.batch(data, 9)[0] == list(range(9)) and s.reads == {"c0": 2, "c1": 2, "c2": 1}  # c2 was held


def test_threads_share_the_cache_and_never_decode_one_chunk_twice_at_once():
    s = Store([50] * 6, delay=0.02)
    data = ls.chunks(s.paths, s.read, lengths=s.lengths, cache=6)
    with ls.prefetch(data, nworkers=4, max_buffered=8) as p:
        assert list(p) == list(range(300))
    assert s.overlap == 1 and max(s.reads.values()) == 1
    errors: list = []

    def reader(seed: int) -> None:
        try:
            for i in np.random.default_rng(seed).integers(0, 300, 200).tolist():
                assert data[i] == i
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    s2 = Store([50] * 6, delay=0.005)
    data = ls.chunks(s2.paths, s2.read, lengths=s2.lengths, cache=2)
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and s2.overlap == 1
    assert s2.alive() <= 2


def test_a_read_that_fails_fails_its_items_only():
    def read(path):
        if path == "bad":
            raise OSError("disk error")
        return list(range(3))

    data = ls.chunks(["ok", "bad", "ok"], read, lengths=[3, 3, 3])
    assert data[7] == 1
    with pytest.raises(ls.EvaluationError) as e:
        data[4]
    assert isinstance(e.value.__cause__, OSError) and "'bad'" in str(e.value.__cause__.__notes__)
    got = data._get_each([0, 4, 8])
    assert got[0] == 0 and got[2] == 2 and type(got[1]) is Failed
    with ls.prefetch(data, nworkers=2) as p:
        assert p[8] == 2
        with pytest.raises(ls.EvaluationError):
            p[3]


def test_a_chunk_of_another_length_than_given_names_its_path():
    s = Store([3, 4])
    data = ls.chunks(s.paths, s.read, lengths=[3, 3])
    assert data[2] == 2
    with pytest.raises(ls.EvaluationError) as e:
        data[4]
    cause = e.value.__cause__
    assert isinstance(cause, ValueError) and "read('c1') returned 4 samples but lengths[1] is 3" in str(cause)


def test_chunks_argument_errors():
    s = Store([2])
    with pytest.raises(ValueError, match="cache must be >= 1"):
        ls.chunks(s.paths, s.read, cache=0)
    with pytest.raises(ValueError, match="one count >= 0 per path"):
        ls.chunks(s.paths, s.read, lengths=[1, 2])
    with pytest.raises(ValueError, match="some negative"):
        ls.chunks(s.paths, s.read, lengths=[-1])
    with pytest.raises(TypeError, match="single path"):
        ls.chunks("data/chunk0.npy", s.read)
    with pytest.raises(TypeError, match="read must be callable"):
        ls.chunks(s.paths, "np.load")
    with pytest.raises(TypeError, match="not a sequence of samples"):
        len(ls.chunks(s.paths, lambda p: iter([1, 2])))


def thousand(path: str) -> list[int]:
    k = int(path[1:])
    return list(range(1000 * k, 1000 * k + 1000))


def test_chunks_pickle_small_and_start_empty():
    data = ls.chunks(["c0", "c1", "c2"], thousand, cache=2)
    assert len(data) == 3000 and data[5] == 5 and len(data.held()) == 2
    blob = pickle.dumps(data)
    copy = pickle.loads(blob)
    assert len(blob) < 400  # paths, read, lengths: no samples
    assert copy.held() == [] and copy.lengths == (1000, 1000, 1000)
    assert copy[2999] == 2999 and copy.held() == [2]
    assert pickle.loads(cloudpickle.dumps(ls.chunks(["c1"], lambda p: thousand(p))))[0] == 1000
    empty = ls.chunks([], thousand)
    assert len(empty) == 0 and empty.cuts == [] and list(empty) == []


@SETTINGS
@given(st.lists(st.integers(0, 6), max_size=8), st.integers(1, 3), st.data())
def test_chunks_random_access_property(lengths, cache, data):
    s = Store(lengths)
    view = ls.chunks(s.paths, s.read, lengths=lengths if data.draw(st.booleans()) else None, cache=cache)
    ref = s.items
    assert len(view) == len(ref) and list(view) == ref
    if ref:
        idx = data.draw(st.lists(st.integers(-len(ref), len(ref) - 1), max_size=20))
        assert [view[i] for i in idx] == [ref[i] for i in idx]
        assert list(view[idx]) == [ref[i] for i in idx]
    assert s.alive() <= cache


# -- block_shuffle ---------------------------------------------------------------------------------
def blocks_of(n: int, block) -> list[range]:
    bounds = sorted({0, n, *(range(block, n, block) if isinstance(block, int) else block)})
    return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def check_groups(order: list[int], blocks: list[range], window: int) -> int:
    """Assert that reading ``order`` goes through whole groups of ``window`` blocks one at a time;
    return the number of groups."""
    block_of = {i: b for b, r in enumerate(blocks) for i in r}
    group: set[int] = set()
    seen = need = groups = 0
    for i in order:
        b = block_of[i]
        if seen == need and len(group) == window:  # this group is complete: the next one starts
            group, seen, need = set(), 0, 0
        if b not in group:
            assert len(group) < window, f"block {b} starts before the group {sorted(group)} is complete"
            if not group:
                groups += 1
            group.add(b)
            need += len(blocks[b])
        seen += 1
    assert seen == need
    return groups


cut_points = st.integers(0, 120).flatmap(
    lambda n: st.tuples(st.just(n), st.one_of(st.integers(1, 25), st.lists(st.integers(0, n), max_size=12).map(sorted))))


@SETTINGS
@given(cut_points, st.integers(1, 5), st.integers(-5, 2**70), st.integers(0, 3))
def test_block_shuffle_covers_every_item_once_a_group_at_a_time(nb, window, seed, epoch):
    n, block = nb
    s = ls.block_shuffle(range(n), block, seed, epoch, window)
    order = list(s)
    assert sorted(order) == list(range(n)) and len(s) == n
    blocks = blocks_of(n, block)
    assert s.blocks == len(blocks)
    assert check_groups(order, blocks, window) == -(-len(blocks) // window)
    assert s.order() == order and list(s[::-1]) == order[::-1]  # bulk and single reads agree
    idx = list(range(0, n, 3))
    assert s._map_many(idx) == [order[i] for i in idx]
    assert order == list(ls.block_shuffle(range(n), block, seed, epoch, window))  # deterministic


def test_block_shuffle_differs_per_epoch_and_seed():
    orders = {tuple(ls.block_shuffle(range(100), 10, seed=s, epoch=e, window=3)) for s in (1, 2) for e in range(4)}
    assert len(orders) == 8
    a = ls.block_shuffle(range(100), 10, seed=None)
    assert list(a) == list(ls.block_shuffle(range(100), 10, seed=a.seed))
    one = [list(ls.block_shuffle(range(10), 10, seed=0, epoch=e)) for e in range(3)]  # one block: items still move
    assert len({tuple(o) for o in one}) == 3


def test_block_shuffle_reads_touch_one_group_at_a_time():
    s = ls.block_shuffle(range(10_000), 100, seed=3, window=4)
    assert s[9_999] in range(10_000) and len(s._recent) == 1 and len(s._recent[0][1]) == 400
    for i in range(0, 10_000, 50):
        s[i]
        assert len(s._recent) <= 2  # per-group orders: computed when a group is first read, two kept
    first = set(list(s[:400]))
    assert len({i // 100 for i in first}) == 4  # the first 400 items: four whole blocks


def test_block_shuffle_with_chunk_cuts_and_pickling():
    s = Store([7, 0, 3, 12, 5, 1])
    data = ls.chunks(s.paths, s.read, cache=2)
    shuffled = ls.block_shuffle(data, data.cuts, seed=5, window=2)
    order = list(shuffled)
    assert sorted(order) == list(range(28))
    assert check_groups(order, blocks_of(28, data.cuts), 2) == 3
    copy = pickle.loads(cloudpickle.dumps(shuffled))
    assert copy._recent == () and list(copy) == order
    assert "block_shuffle(5 blocks, window=2, seed=5, epoch=None)" in repr(shuffled)


def test_block_shuffle_errors():
    with pytest.raises(ValueError, match="block must be >= 1"):
        ls.block_shuffle(range(10), 0, seed=0)
    with pytest.raises(TypeError, match="an int .items per block. or a sequence of cut points"):
        ls.block_shuffle(range(10), 2.5, seed=0)
    with pytest.raises(TypeError, match="an int .items per block. or a sequence of cut points"):
        ls.block_shuffle(range(10), "3", seed=0)
    with pytest.raises(TypeError, match="cut points must be ints"):
        ls.block_shuffle(range(10), [2.5], seed=0)
    with pytest.raises(ValueError, match="must increase, got 5 then 3"):
        ls.block_shuffle(range(10), [2, 5, 3], seed=0)
    with pytest.raises(ValueError, match="cut point 11 is out of range"):
        ls.block_shuffle(range(10), [2, 11], seed=0)
    with pytest.raises(ValueError, match="cut point -1 is out of range"):
        ls.block_shuffle(range(10), [-1, 4], seed=0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ls.block_shuffle(range(10), 2, seed=0, window=0)
    with pytest.raises(TypeError, match="no len"):
        ls.block_shuffle(ls.cycle([1, 2]), 2, seed=0)
    assert list(ls.block_shuffle(range(0), 3, seed=0)) == []
    assert sorted(ls.block_shuffle(range(10), np.array([3, 3, 7]), seed=0)) == list(range(10))  # empty blocks


# -- together: PyLoader's job ----------------------------------------------------------------------
class LoggedNpy:
    """``np.load`` that appends ``"<pid> <path>"`` to a log file: which process decoded which chunk."""

    def __init__(self, log: str):
        self.log = log

    def __call__(self, path: str) -> np.ndarray:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {path}\n")
        return np.load(path)


def test_an_epoch_decodes_each_chunk_about_once_per_worker(tmp_path):
    paths, lengths, start = [], [], 0
    for k, n in enumerate([20, 35, 17, 40, 26, 30, 22, 31, 18, 25]):
        p = str(tmp_path / f"chunk{k}.npy")
        np.save(p, np.arange(start, start + n, dtype=np.int64)[:, None] * np.ones(4, np.int64))
        paths.append(p)
        lengths.append(n)
        start += n
    log = str(tmp_path / "reads.log")
    data = ls.chunks(paths, LoggedNpy(log), lengths=lengths, cache=3)
    for epoch in range(2):
        open(log, "w").close()
        order = ls.block_shuffle(data, data.cuts, seed=7, epoch=epoch, window=3)
        with ls.prefetch(ls.batch(order, 16, collate_fn=np.stack), nworkers=2, method="process") as p:
            got = np.concatenate(list(p))
        assert sorted(got[:, 0].tolist()) == list(range(start))
        assert got[:, 0].tolist() == [order.order()[i] for i in range(start)]
        with open(log) as f:
            decodes = collections.Counter(tuple(line.split()) for line in f)
        pids = {pid for pid, _ in decodes}
        assert str(os.getpid()) not in pids and 1 <= len(pids) <= 2
        assert max(decodes.values()) == 1, decodes  # no worker decoded a chunk twice in the epoch
        assert len(decodes) <= len(pids) * len(paths)

    open(log, "w").close()
    order = ls.block_shuffle(data, data.cuts, seed=7, epoch=2, window=3)
    loader = ls.DataLoader(order, batch_size=16, num_workers=2, collate_fn=np.stack, to_tensor=False)
    got = np.concatenate([b.copy() for b in loader])  # copies: the batches' slots go back at once
    assert got[:, 0].tolist() == order.order()
    with open(log) as f:
        decodes = collections.Counter(tuple(line.split()) for line in f)
    assert max(decodes.values()) == 1, decodes  # per process: the main one read sample 0 (shm sizing)
    assert sum(n for (pid, _), n in decodes.items() if pid == str(os.getpid())) <= 1


def _held_in_child(data, q) -> None:
    q.put((data.held(), data[2999], data.held()))


def test_a_forked_worker_starts_with_an_empty_cache():
    import multiprocessing

    data = ls.chunks(["c0", "c1", "c2"], thousand, cache=2)
    assert data[5] == 5 and data.held() == [2, 0]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_held_in_child, args=(data, q))
    p.start()
    try:
        assert q.get(timeout=30) == ([], 2999, [2])
    finally:
        p.join(30)
    assert p.exitcode == 0 and data.held() == [2, 0]
