"""lazyseq.worker_info() in every backend and inside worker_init_fn (issue #34; Ray's in test_ray.py),
and a DataLoader's rank and world_size from torch.distributed or the launcher's environment."""

import os

import numpy as np
import pytest

import lazyseq


class Tagged:
    """A dataset whose items say which copy of it read them: worker_init_fn tags the worker's copy."""

    def __init__(self, n):
        self.n, self.tag = n, "reader"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, hash(self.tag) % 1000, os.getpid()])


def tag_copy(worker):
    info = lazyseq.worker_info()
    assert info is not None and info.id == worker
    info.dataset.tag = f"worker {worker}"


def _info(i):
    info = lazyseq.worker_info()
    return None if info is None else (info.id, info.num_workers, info.seed)


def test_worker_info_is_none_in_the_reader():
    assert lazyseq.worker_info() is None
    assert [_info(i) for i in range(2)] == [None, None]


@pytest.mark.parametrize("method", ["thread", "process", "async"])
def test_worker_info_in_each_backend_of_a_prefetch(method):
    seq = lazyseq.smap(_info, range(64))
    n = 1 if method == "async" else 3
    with lazyseq.prefetch(seq, n if method != "async" else 4, method) as p:
        got = list(p)
    workers = 4 if method == "async" else 3
    assert all(g is not None and g[1] == workers and g[2] is None for g in got)
    ids = {g[0] for g in got}
    assert ids <= set(range(workers)) and (method == "async" or len(ids) >= 1)
    assert lazyseq.worker_info() is None  # the reader's thread is no worker, after thread workers ran either


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_loaders_worker_init_fn_sees_worker_info_and_its_dataset_is_the_copy_read(method):
    data = Tagged(24)
    with lazyseq.DataLoader(data, batch_size=4, num_workers=2, method=method, worker_init_fn=tag_copy,
                            to_tensor=False, seed=3) as loader:
        rows = np.concatenate(list(loader))
    tags = {hash(f"worker {w}") % 1000 for w in range(2)}
    if method == "process":  # each worker tagged its own copy, and read its items from that copy
        assert set(rows[:, 1]) <= tags and data.tag == "reader"
        assert len(set(rows[:, 2])) <= 2 and os.getpid() not in set(rows[:, 2])
    else:  # threads share the reader's dataset: the last worker's tag is everyone's
        assert data.tag in {f"worker {w}" for w in range(2)}
    assert sorted(rows[:, 0]) == list(range(24))


def _seed_of(i):
    info = lazyseq.worker_info()
    return -1 if info is None else info.seed  # None: the reader, sizing the shared memory from item 0


def test_a_loaders_worker_seed_follows_seed_rank_epoch_and_worker():
    def seeds(seed, rank):
        with lazyseq.DataLoader(lazyseq.smap(_seed_of, range(16)), batch_size=4, num_workers=2, seed=seed, rank=rank,
                                world_size=2, to_tensor=False) as loader:
            return {int(s) for b in loader for s in b} - {-1}
    a, b, c = seeds(1, 0), seeds(1, 1), seeds(2, 0)
    assert len(a) == 2 and a != b and a != c and seeds(1, 0) == a  # per worker, reproducible


# -- rank and world_size --------------------------------------------------------------------------------
@pytest.fixture
def no_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def parts(**kw):
    loader = lazyseq.DataLoader(list(range(12)), batch_size=2, to_tensor=False, drop_last=True, **kw)
    return loader, [list(b) for b in loader]


def test_ranks_from_torchrun_slurm_given_or_default(no_launcher):
    loader, got = parts()
    assert (loader.rank, loader.world_size, loader.ranks_from) == (0, 1, "the default") and len(got) == 6
    no_launcher.setenv("SLURM_PROCID", "2")
    no_launcher.setenv("SLURM_NTASKS", "3")
    loader, got = parts()
    assert (loader.rank, loader.world_size) == (2, 3) and got == [[2, 5], [8, 11]]
    assert "rank=2, world_size=3 (from SLURM_PROCID/SLURM_NTASKS in the environment)" in repr(loader)
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")  # torchrun's names first
    loader, got = parts()
    assert (loader.rank, loader.world_size, loader.ranks_from) == (1, 2, "RANK/WORLD_SIZE in the environment")
    assert got == [[1, 3], [5, 7], [9, 11]]
    loader, _ = parts(rank=0, world_size=4)
    assert (loader.rank, loader.world_size, loader.ranks_from) == (0, 4, "given") and "(from" not in repr(loader)
    no_launcher.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two', WORLD_SIZE='2' are not integers"):
        parts()
    no_launcher.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"rank=5, world_size=2 \(from RANK/WORLD_SIZE in the environment\)"):
        parts()


def test_ranks_from_an_initialised_torch_distributed(no_launcher, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")  # torch.distributed, initialised, wins over the environment
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        loader, got = parts()
    finally:
        dist.destroy_process_group()
    assert (loader.rank, loader.world_size, loader.ranks_from) == (0, 1, "torch.distributed") and len(got) == 6
