"""Views built with epoch=None follow the DataLoader's epoch (lazyseq.views.epochs): every epoch a
new order and new random numbers, with and without persistent workers, across a resume; views
built with an int keep it; epoch 0 gives the numbers lazyseq gave before epochs existed."""

import collections
import pickle

import cloudpickle
import numpy as np
import pytest

import lazyseq
from lazyseq.views.epochs import at_epoch, follows_epoch


def noisy(x, rng):
    return np.float64(x) + rng.random()


def pair_noise(a, b, rng):
    return a * 1000 + b + rng.random()


# -- at_epoch -----------------------------------------------------------------------------------------
KINDS = {
    "shuffle": lambda epoch=None: lazyseq.shuffle(range(50), 3, epoch=epoch),
    "block_shuffle": lambda epoch=None: lazyseq.block_shuffle(range(50), 5, seed=3, epoch=epoch, window=2),
    "mix": lambda epoch=None: lazyseq.mix([range(100), range(1000, 1100)], [1, 1], seed=3, epoch=epoch),
    "smap": lambda epoch=None: lazyseq.smap(noisy, range(50), seed=3, epoch=epoch),
    "starmap": lambda epoch=None: lazyseq.starmap(pair_noise, [(i, i) for i in range(50)], seed=(3, 4), epoch=epoch),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_view_built_with_epoch_none_follows_the_bound_epoch(kind):
    make = KINDS[kind]
    v = make()
    assert v.epoch is None and follows_epoch(v)
    assert list(v) == list(make(0)), "outside a loader, None is epoch 0"
    assert at_epoch(v, 0) is v
    for e in (1, 2, 7):
        bound = at_epoch(v, e)
        assert list(bound) == list(make(e)) != list(v)
        assert f"epoch={e} (the loader's)" in repr(bound)
        assert list(pickle.loads(cloudpickle.dumps(bound))) == list(bound)
    assert list(v) == list(make(0)) and v._epoch == 0, "binding never changes the view itself"
    fixed = make(4)
    assert not follows_epoch(fixed) and at_epoch(fixed, 1) is fixed and list(at_epoch(fixed, 9)) == list(make(4))


def test_epoch_0_gives_the_numbers_of_earlier_versions():
    """Figures computed with lazyseq at commit 9a710f3, before epochs were bound."""
    assert [int(x) for x in lazyseq.smap(lambda x, rng: rng.integers(1000), range(6), seed=7)] == [1, 561, 90, 687, 566, 354]
    assert [int(x) for x in lazyseq.starmap(lambda a, b, rng: rng.integers(1000), [(1, 2)] * 4, seed=(3, 1))] == \
        [961, 935, 114, 656]
    assert list(lazyseq.shuffle(range(10), 42)) == [3, 4, 1, 6, 0, 7, 8, 2, 5, 9]
    assert list(lazyseq.shuffle(range(10), 42, epoch=2)) == [7, 5, 4, 6, 3, 0, 9, 8, 1, 2]
    assert list(lazyseq.block_shuffle(range(12), 3, seed=0, window=2)) == [11, 6, 9, 7, 10, 8, 3, 4, 0, 1, 2, 5]
    assert "".join(lazyseq.mix(["a" * 40, "B" * 40], [1, 1], seed=5)[:20]) == "BBaBBaaBaBaBBaaaBBBB"
    assert "".join(lazyseq.mix(["a" * 40, "B" * 40], [1, 1], seed=5, epoch=1)[:20]) == "aBBaaBaBaaaBBBBaaBBB"


def test_an_epochs_numbers_are_its_own():
    """(seed, epoch) never collides with another seed's epoch 0: seed=(3, 1) is not seed 3 at epoch 1."""
    a = list(at_epoch(lazyseq.smap(noisy, range(20), seed=3), 1))
    b = list(lazyseq.smap(noisy, range(20), seed=(3, 1)))
    assert a != b and len({round(x % 1, 12) for x in a} & {round(x % 1, 12) for x in b}) == 0


def test_binding_copies_only_the_path_to_following_views_and_evaluates_nothing():
    calls = collections.Counter()

    def count(x):
        calls[x] += 1
        return x

    data = list(range(1000))
    plain = lazyseq.smap(count, data)  # follows nothing: shared as it is
    seeded = lazyseq.smap(noisy, plain, seed=1)
    top = lazyseq.concatenate([lazyseq.batch(seeded, 10), lazyseq.batch(seeded, 10)])  # seeded read twice
    bound = at_epoch(top, 5)
    assert not calls, "binding an epoch evaluates no item"
    left, right = bound.seqs
    assert left is not top.seqs[0] and left.src is right.src, "a view read twice is copied once"
    assert left.src is not seeded and left.src.src is plain and plain.src is data
    assert left.src._rd.__self__ is plain  # the cached readers lead to the same nodes
    assert bound[3][2] == at_epoch(seeded, 5)[32] != seeded[32]


def test_a_cache_above_a_following_view_is_per_epoch():
    cached = lazyseq.add_cache(lazyseq.smap(noisy, range(10), seed=2))
    first = [cached[i] for i in range(10)]
    bound = at_epoch(cached, 1)
    assert [bound[i] for i in range(10)] == list(lazyseq.smap(noisy, range(10), seed=2, epoch=1)) != first
    assert [cached[i] for i in range(10)] == first


def test_epoch_argument_errors():
    with pytest.raises(TypeError, match=r"shuffle: epoch must be None \(follow the DataLoader's epoch\) or an int"):
        lazyseq.shuffle(range(3), 1, epoch=1.5)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        lazyseq.smap(noisy, range(3), seed=1, epoch=-1)
    with pytest.raises(ValueError, match="smap: epoch= only matters with a seed"):
        lazyseq.smap(abs, range(3), epoch=1)


# -- under a DataLoader ----------------------------------------------------------------------------------
def _epochs(loader, n):
    return [[np.asarray(b).tolist() for b in loader] for _ in range(n)]


def _flat(batches):
    return [x for b in batches for x in b]


DATASETS = {
    "smap": lambda: lazyseq.smap(noisy, np.arange(24), seed=0),
    "starmap": lambda: lazyseq.starmap(pair_noise, [(i, 1) for i in range(24)], seed=0),
    "shuffle": lambda: lazyseq.shuffle(np.arange(24), 0),
    "block_shuffle": lambda: lazyseq.block_shuffle(np.arange(24), 4, seed=0, window=2),
    "mix": lambda: lazyseq.mix([np.arange(12), lazyseq.shuffle(np.arange(100, 200), 0)], [1, 1], seed=0),
}


@pytest.mark.parametrize("workers", [(0, False), (2, False), (2, True)], ids=["no-workers", "workers", "persistent"])
@pytest.mark.parametrize("kind", DATASETS)
def test_every_epoch_is_a_new_epoch_under_a_dataloader(kind, workers):
    nw, persistent = workers
    kw = dict(batch_size=4, shuffle=False, num_workers=nw, persistent_workers=persistent, to_tensor=False)
    with lazyseq.DataLoader(DATASETS[kind](), **kw) as loader:
        epochs = _epochs(loader, 3)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    for e, got in enumerate(epochs):  # epoch e reads the dataset bound to e, whoever evaluates it
        want = at_epoch(DATASETS[kind](), e)
        assert _flat(got) == [np.asarray(want[i]).tolist() for i in range(len(want))]
    fixed = DATASETS[kind]()
    for v in [fixed, *getattr(fixed, "seqs", ())]:
        if hasattr(v, "_epoch"):
            v.epoch, v._epoch = 0, 0  # as if built with epoch=0: kept whatever the loader's epoch
    with lazyseq.DataLoader(fixed, **kw) as loader:
        kept = _epochs(loader, 2)
    assert kept[0] == kept[1] == epochs[0]


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
@pytest.mark.parametrize("kind", DATASETS)
def test_a_resume_mid_epoch_2_reads_what_the_run_would_have(kind, persistent):
    kw = dict(batch_size=3, shuffle=True, seed=4, num_workers=2, persistent_workers=persistent, to_tensor=False)
    data = DATASETS[kind]
    with lazyseq.DataLoader(data(), **kw) as loader:
        whole = _epochs(loader, 4)
    with lazyseq.DataLoader(data(), **kw) as loader:
        first = _epochs(loader, 2)
        it = iter(loader)
        part = [np.asarray(next(it)).tolist() for _ in range(4)]
        state = loader.state_dict()
        del it
    with lazyseq.DataLoader(data(), **kw) as resumed:
        resumed.load_state_dict(state)
        rest = [np.asarray(b).tolist() for b in resumed]
        later = _epochs(resumed, 1)
    assert first == whole[:2] and part + rest == whole[2] and later == whole[3:]
    assert whole[2] != whole[1]


def test_set_epoch_and_make_sequence_bind_the_epoch():
    loader = lazyseq.DataLoader(lazyseq.smap(noisy, np.arange(8), seed=1), batch_size=8, to_tensor=False)
    loader.set_epoch(3)
    (b,) = list(loader)
    assert b.tolist() == list(lazyseq.smap(noisy, np.arange(8), seed=1, epoch=3))
    assert loader.make_sequence(5)[0].tolist() == list(lazyseq.smap(noisy, np.arange(8), seed=1, epoch=5))


def test_seed_each_item_and_a_seeded_smap_both_change_every_epoch():
    import random

    def both(x, rng):
        return x + rng.random() + random.random()
    with lazyseq.DataLoader(lazyseq.smap(both, np.arange(12.0), seed=0), batch_size=4, num_workers=2, seed=1,
                            seed_each_item=True, to_tensor=False) as loader:
        e = _epochs(loader, 2)
    assert all(a != b for a, b in zip(_flat(e[0]), _flat(e[1])))


def test_a_mix_reads_another_part_of_a_large_shuffled_source_each_epoch():
    small, large = np.arange(20), np.arange(1000, 2000)
    data = lazyseq.mix([small, lazyseq.shuffle(large, 0)], [0.5, 0.5], seed=0)
    with lazyseq.DataLoader(data, batch_size=10, shuffle=True, seed=0, to_tensor=False) as loader:
        seen = [{int(x) for b in loader for x in b if x >= 1000} for _ in range(3)]
    assert all(len(s) == 20 for s in seen)
    assert len(seen[0] | seen[1] | seen[2]) > 50, "each epoch reads other items of the large source"


def test_a_prefetch_inside_is_left_as_it_is():
    with lazyseq.prefetch(lazyseq.smap(noisy, range(10), seed=1), 2, "thread") as p:
        top = lazyseq.smap(float, p)
        assert at_epoch(top, 3) is top and at_epoch(p, 3) is p
