"""DataLoader(seed_each_item=True) (issue #11) and DataLoader(method=...) (issue #10): a torch-style
dataset drawing from the global generators gets the same numbers for item i whoever reads it."""

import os
import random

import numpy as np
import pytest

import lazyseq as ls
from lazyseq.loader.seeding import WorkerInit


class Augmented:
    """A torch-style map-style dataset: its augmentation draws from random and numpy.random."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, random.random(), np.random.random(), np.random.randint(1 << 30), random.getrandbits(30)])


def batches(**kw):
    kw = dict(batch_size=5, shuffle=True, seed=11, seed_each_item=True, to_tensor=False, **kw)
    with ls.DataLoader(Augmented(33), **kw) as loader:
        return [[b.copy() for b in loader] for _ in range(2)]  # two epochs


def same(a, b):
    return len(a) == len(b) and all(
        len(x) == len(y) and all(u.shape == v.shape and u.tobytes() == v.tobytes() for u, v in zip(x, y))
        for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference():
    return batches()


@pytest.mark.parametrize("workers,context,persistent", [(1, "fork", False), (2, "forkserver", False),
                                                        (3, "fork", False), (2, "spawn", False), (2, "fork", True)])
def test_batches_are_identical_bit_for_bit_with_any_number_of_process_workers(reference, workers, context, persistent):
    got = batches(num_workers=workers, multiprocessing_context=context, persistent_workers=persistent)
    assert same(got, reference)
    e0, e1 = reference
    rows = np.concatenate(e0)
    assert sorted(rows[:, 0].astype(int).tolist()) == list(range(33))  # shuffled, every item once
    assert [b[:, 0].tolist() for b in e0] != sorted(b[:, 0].tolist() for b in e0)
    assert len(set(rows[:, 2].tolist())) == 33  # the items drew different numbers
    assert not np.array_equal(np.concatenate(e1)[np.argsort(np.concatenate(e1)[:, 0])],
                              rows[np.argsort(rows[:, 0])])  # and draw anew next epoch


def test_without_seed_each_item_workers_draw_other_numbers(reference):
    kw = dict(batch_size=5, shuffle=True, seed=11, to_tensor=False)
    with ls.DataLoader(Augmented(33), num_workers=2, **kw) as loader:
        two = [b.copy() for b in loader]
    assert not same([two], reference[:1])


def test_item_values_depend_on_seed_epoch_and_index_only():
    """The same numbers for dataset item i, whatever the batch size, ranks, sampler or batch_sampler."""

    def rows(**kw):
        with ls.DataLoader(Augmented(20), seed_each_item=True, to_tensor=False, **{"seed": 4, **kw}) as loader:
            return {int(r[0]): r.tobytes() for b in loader for r in np.atleast_2d(b)}

    want = rows(batch_size=3, shuffle=True)
    assert len(want) == 20
    assert rows(batch_size=7) == want
    assert rows(batch_size=None) == want
    assert rows(sampler=[19, 3, 3, 7], batch_size=2) == {i: want[i] for i in (19, 3, 7)}
    assert rows(batch_sampler=[[5, 6], [0]]) == {i: want[i] for i in (5, 6, 0)}
    for rank in range(3):
        got = rows(batch_size=2, shuffle=True, rank=rank, world_size=3, drop_last=True)
        assert got == {i: want[i] for i in got}
    other = rows(batch_size=3, shuffle=True, seed=5)
    assert all(other[i] != want[i] for i in range(20))


@pytest.mark.parametrize("before,after", [(0, 2), (2, 0), (1, 3)])
def test_resume_mid_epoch_with_another_num_workers_gives_the_same_batches(before, after):
    kw = dict(batch_size=4, shuffle=True, seed=2, seed_each_item=True, to_tensor=False)
    with ls.DataLoader(Augmented(30), **kw) as loader:
        uninterrupted = [b.copy() for b in loader]
    with ls.DataLoader(Augmented(30), num_workers=before, **kw) as loader:
        it = iter(loader)
        head = [next(it).copy() for _ in range(3)]
        state = loader.state_dict()
        it.close()
    with ls.DataLoader(Augmented(30), num_workers=after, **{**kw, "seed": None}) as resumed:
        resumed.load_state_dict(state)
        tail = [b.copy() for b in resumed]
    assert same([head + tail], [uninterrupted])


def test_the_main_process_generators_are_put_back_after_each_batch():
    def draws():
        return random.random(), np.random.random()

    random.seed(1)
    np.random.seed(1)
    want = [draws() for _ in range(4)]
    random.seed(1)
    np.random.seed(1)
    got = []
    loader = ls.DataLoader(Augmented(8), batch_size=2, shuffle=True, seed=0, seed_each_item=True, to_tensor=False)
    for _ in loader:  # batches read in this process, between the training loop's own draws
        got.append(draws())
    assert got == want


def test_torch_generator_is_seeded_when_torch_is_imported():
    torch = pytest.importorskip("torch")

    def load(i):
        return np.array([i, float(torch.rand(()))], np.float64)

    kw = dict(batch_size=3, shuffle=True, seed=1, seed_each_item=True, to_tensor=False)
    data = ls.smap(load, range(12))
    before = torch.get_rng_state()
    with ls.DataLoader(data, **kw) as loader:
        ref = [b.copy() for b in loader]
    assert torch.equal(before, torch.get_rng_state())  # put back
    with ls.DataLoader(data, num_workers=2, multiprocessing_context="fork", **kw) as loader:
        assert same([[b.copy() for b in loader]], [ref])
    assert len({r[1] for b in ref for r in b}) == 12


def test_thread_workers_are_refused_with_a_pointer_to_smap_seed():
    with pytest.raises(ValueError, match=r"method='thread' run in the reader's process and share them.*"
                                         r"lazyseq\.smap\(f, dataset, seed="):
        ls.DataLoader(Augmented(4), num_workers=2, method="thread", seed_each_item=True)
    from lazyseq.evaluation.view import BACKENDS

    if "async" in BACKENDS:  # the event loop's workers too
        with pytest.raises(ValueError, match="method='async' run in the reader's process"):
            ls.DataLoader(Augmented(4), num_workers=2, method="async", seed_each_item=True)
    loader = ls.DataLoader(Augmented(4), method="thread", seed_each_item=True, to_tensor=False)  # no workers: fine
    assert len(list(loader)) == 4


def test_a_worker_in_the_readers_process_refuses_to_seed_each_item():
    """Whatever backend runs a worker in the reader's process (threads, an event loop) shares its
    generators: the worker start refuses, and without seed_each_item it leaves them alone."""
    with pytest.raises(ValueError, match="seed_each_item"):
        WorkerInit(0, 0, 0, None, True, "some-backend")(0)
    calls = []
    np.random.seed(3)
    state = np.random.get_state()[1].copy()
    WorkerInit(0, 0, 0, calls.append, False, "thread")(5)
    assert calls == [5] and np.array_equal(np.random.get_state()[1], state)


# -- method= -------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["thread", "process"])
def test_method_runs_the_workers_that_way(method):
    data = [np.full(3, i, np.float32) for i in range(23)]
    kw = dict(batch_size=4, shuffle=True, seed=8, to_tensor=False)
    want = [b.tolist() for b in ls.DataLoader(data, **kw)]
    with ls.DataLoader(data, num_workers=2, method=method, persistent_workers=True, **kw) as loader:
        got = [[b.tolist() for b in loader] for _ in range(2)]
        stats = loader.stats()
        tree = str(loader.make_sequence())
    assert got[0] == want and got[1] != want
    assert sorted(int(b[0]) for batch in got[1] for b in batch) == list(range(23))
    assert stats["prefetch"]["method"] == method
    assert (len(stats["worker_pids"]) == 2) == (method == "process")
    assert stats["shm"].startswith("sized from the first sample" if method == "process" else "no process workers")
    assert f"prefetch(2 {method}" in tree


def test_thread_workers_leave_the_readers_generators_alone():
    np.random.seed(9)
    random.seed(9)
    want = (random.random(), np.random.random())
    np.random.seed(9)
    random.seed(9)
    with ls.DataLoader(ls.smap(lambda i: i, range(10)), batch_size=2, num_workers=2, method="thread",
                       to_tensor=False) as loader:
        assert sum(len(b) for b in loader) == 10
    assert (random.random(), np.random.random()) == want


def test_an_unknown_method_fails_at_construction_naming_the_argument():
    with pytest.raises(ValueError, match=r"^DataLoader\(method='nope'\): prefetch: method must be one of \[.*\], "
                                         r"got 'nope'$"):
        ls.DataLoader(list(range(4)), num_workers=2, method="nope")


@pytest.mark.parametrize("kwargs,message", [
    (dict(shm_size=1 << 20), "shm_size sizes the shared memory of worker processes, which method='thread'"),
    (dict(multiprocessing_context="spawn"), "multiprocessing_context starts worker processes, which method='thread'"),
])
def test_process_only_arguments_are_refused_with_other_methods(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ls.DataLoader(list(range(4)), num_workers=2, method="thread", **kwargs)


def test_worker_seeding_differs_per_worker_process_and_not_in_the_reader():
    pid = os.getpid()
    data = ls.smap(lambda i: (os.getpid(), np.random.randint(1 << 30)), range(8))
    with ls.DataLoader(data, batch_size=1, num_workers=2, seed=0, to_tensor=False,
                       collate_fn=lambda items: items[0]) as loader:
        got = list(loader)
    assert pid not in {p for p, _ in got} and len({v for _, v in got}) == 8
