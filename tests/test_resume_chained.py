"""Three chained interruptions at random steps, each resume with other workers, method, persistent
workers or world size: the items read equal the uninterrupted run's (tests/resume_harness.py).
A few examples per pipeline in CI (the same ones each run); the slow variant (`pytest --slow`) draws 60
random ones per pipeline."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq
from tests.resume_harness import check_chained

EXAMPLES = int(os.environ.get("LAZYSEQ_RESUME_EXAMPLES", 3))
SETTINGS = st.sampled_from([
    {"num_workers": 0},
    {"num_workers": 1, "method": "thread"},
    {"num_workers": 2, "method": "process"},
    {"num_workers": 2, "method": "process", "persistent_workers": True},
    {"num_workers": 2, "method": "thread", "persistent_workers": True},
])
WORLDS = [1, 2, 4, 1]  # world_size 1 -> 2 -> 4 -> 1, positions counted in the global order


def noisy(x, rng):
    return float(x) + rng.random()


def jitter(x):
    import random
    return float(x) + random.random()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume") / "s"
    lazyseq.save([np.int64(i) for i in range(61)], path, method="thread", shard_bytes=200)
    return path


@pytest.fixture(scope="module")
def chunk_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunks")
    paths = []
    for k, n in enumerate([13, 9, 17, 11, 10]):
        paths.append(str(root / f"part-{k}.npy"))
        np.save(paths[-1], np.arange(n) + 100 * k)
    return paths


def docs():
    rng = np.random.default_rng(0)
    return [np.arange(n, dtype=np.int32) + 1000 * k for k, n in enumerate(rng.integers(1, 12, 70))]


def pipelines(store, chunk_files):
    sched = lazyseq.schedule([(0, [0.8, 0.2]), (30, [0.3, 0.7])], interpolate="linear")
    return {
        "pack": (lambda: lazyseq.pack(docs(), 16, method="best_fit"), {"shuffle": True}),
        "bucket": (lambda: lazyseq.bucket(docs(), 40, collate_fn=lazyseq.pad_collate), {"shuffle": True, "batch_size": None}),
        "store+shuffle": (lambda: lazyseq.load(store), {"shuffle": True}),
        "mix+seed": (lambda: lazyseq.mix([np.arange(40), lazyseq.shuffle(np.arange(100, 160), 2)], [2, 1], seed=3),
                     {"shuffle": True}),
        "chunks+block_shuffle": (lambda: lazyseq.block_shuffle(data := lazyseq.chunks(chunk_files, np.load, cache=2),
                                                               data.cuts, seed=1, window=2), {"shuffle": False}),
        "smap(seed)": (lambda: lazyseq.smap(noisy, np.arange(50), seed=5), {"shuffle": True}),
        "seed_each_item": (lambda: lazyseq.smap(jitter, np.arange(50)), {"shuffle": True, "seed_each_item": True}),
        "schedule": (lambda: lazyseq.mix([np.arange(100), np.arange(1000, 1100)], sched, stop=60), {"shuffle": False}),
    }


NAMES = ["store+shuffle", "mix+seed", "chunks+block_shuffle", "smap(seed)", "seed_each_item", "schedule", "pack", "bucket"]
STRATEGY = dict(cuts=st.lists(st.integers(1, 9), min_size=3, max_size=3), chosen=st.lists(SETTINGS, min_size=4, max_size=4),
                worlds=st.booleans())
HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=HEALTH)
@given(**STRATEGY)
def test_chained_resumes_read_what_the_run_would_have(store, chunk_files, name, cuts, chosen, worlds):
    run(store, chunk_files, name, cuts, chosen, worlds)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(**STRATEGY)
def test_chained_resumes_many_random_interruptions(store, chunk_files, name, cuts, chosen, worlds):
    run(store, chunk_files, name, cuts, chosen, worlds)


def run(store, chunk_files, name, cuts, chosen, worlds):
    make, kw = pipelines(store, chunk_files)[name]
    if kw.get("seed_each_item"):
        chosen = [{**s, "method": "process"} if s.get("num_workers") else s for s in chosen]  # (threads share globals)
    if worlds:
        chosen = [{**s, "world_size": w} for s, w in zip(chosen, WORLDS)]
    check_chained(make, cuts, chosen, epochs=2, **{"batch_size": 3, "seed": 11, "drop_last": worlds, **kw})
