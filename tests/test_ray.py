"""prefetch(method='ray') against a real local Ray instance (two CPUs, started once for this module)."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import lazyseq
from lazyseq.evaluation import actors

ray = pytest.importorskip("ray")


def alive_actors() -> list[str]:
    """Ids of this job's live actors (Ray's actor table; the state API needs the dashboard)."""
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    return [a for a, info in state.actors().items() if info["State"] != "DEAD" and info["JobID"] == job]


def wait_no_actors(seconds: float = 10) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := alive_actors()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    # The actors import this module's functions by name: they need the tests directory on their path.
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_actors_left():
    yield
    assert not wait_no_actors(), "Ray actors left alive"


def image(i):
    return {"x": np.full((4, 5), i, dtype=np.int32), "y": i}


def test_items_keys_and_order_match_the_source():
    seq = lazyseq.smap(image, range(300))
    with lazyseq.prefetch(seq, 2, method="ray") as p:
        got = list(p)
        assert [int(x["y"]) for x in got] == list(range(300))
        assert all((x["x"] == i).all() for i, x in enumerate(got))
        assert p[-1]["y"] == 299 and [x["y"] for x in p[10:20:3]] == [10, 13, 16, 19]
        order = np.random.default_rng(0).permutation(300)[:60]
        assert [p[int(i)]["y"] for i in order] == order.tolist()  # jumps
        assert [p[i]["y"] for i in range(299, 200, -9)] == list(range(299, 200, -9))
        s = p.stats()
        assert s["method"] == "ray" and s["actors"] == 2 and s["nodes"] == 1 and s["jumps"] > 50
        assert "2 Ray actors" in repr(p)


def test_chunks_grow_to_amortise_the_call():
    with lazyseq.prefetch(lazyseq.smap(lambda x: x + 1, range(20_000)), 2, method="ray") as p:
        assert list(p) == list(range(1, 20_001))
        assert p.stats()["chunk"] >= 256  # ~50 ms of work per job: tiny items come in big chunks


def test_errors_name_the_item_with_the_remote_traceback():
    def f(x):
        if x == 7:
            raise KeyError(f"no {x}")
        return x

    with lazyseq.prefetch(lazyseq.smap(f, range(40)), 2, method="ray") as p:
        with pytest.raises(lazyseq.EvaluationError, match="7") as info:
            p[7]
        chain, e = [], info.value
        while e is not None:
            chain.append(e)
            e = e.__cause__
        assert any(isinstance(c, KeyError) for c in chain)
        assert any("Traceback" in str(c) and "no 7" in str(c) for c in chain)  # the actor's traceback
        assert [p[i] for i in range(8, 40)] == list(range(8, 40))
        lazyseq.seterr("passthrough")
        with pytest.raises(KeyError):
            p[7]


def test_timeout_names_the_item_and_the_rest_goes_on():
    def f(x):
        if x == 3:
            time.sleep(4)
        return x

    with lazyseq.prefetch(lazyseq.smap(f, range(100)), 2, method="ray", timeout=0.5) as p:
        assert [p[i] for i in range(3)] == [0, 1, 2]
        with pytest.raises(lazyseq.PrefetchTimeout, match="item 3"):
            p[3]
        t = time.monotonic()
        assert [p[i] for i in range(4, 100)] == list(range(4, 100))  # from the other actor, and parts
        assert time.monotonic() - t < 3.5


def test_a_slow_item_holds_up_only_itself():
    def f(x):
        if x == 10:
            time.sleep(2)
        return x

    with lazyseq.prefetch(lazyseq.smap(f, range(2000)), 2, method="ray", timeout=30) as p:
        assert [p[i] for i in range(10)] == list(range(10))
        assert p[10] == 10
        assert list(p[11:2000]) == list(range(11, 2000))
        assert p.stats()["progress_calls"] >= 1


def test_a_killed_actor_raises_worker_crashed_naming_it():
    with lazyseq.prefetch(lazyseq.smap(lambda x: time.sleep(0.02) or x, range(10_000)), 2, method="ray") as p:
        assert p[0] == 0
        victim = p._m.backend.actors[0]
        ray.kill(victim, no_restart=True)
        t = time.monotonic()
        with pytest.raises(lazyseq.WorkerCrashed, match="Ray actor 0 .*node .*pid") as info:
            for _ in range(10_000):
                next(iter(p[p.stats()["items"]:]))  # keep reading: the killed actor's job never comes
        assert time.monotonic() - t < 10
        assert "ray.kill" in str(info.value)
        with pytest.raises(lazyseq.WorkerCrashed):
            p[5]  # the prefetch is closed with the crash


def test_close_with_and_del_kill_the_actors():
    p = lazyseq.prefetch(lazyseq.smap(lambda x: time.sleep(30) or x, range(10)), 2, method="ray", timeout=0.3)
    with pytest.raises(lazyseq.PrefetchTimeout):
        p[0]
    assert len(alive_actors()) == 2
    t = time.monotonic()
    p.close()
    assert time.monotonic() - t < 6 and not wait_no_actors(1)
    with lazyseq.prefetch(range(10), 2, method="ray") as p:
        assert p[3] == 3
    assert not wait_no_actors()
    p = lazyseq.prefetch(range(10), 2, method="ray")
    assert p[4] == 4
    del p
    assert not wait_no_actors()


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_while_reading_kills_the_actors():
    p = lazyseq.prefetch(lazyseq.smap(lambda x: time.sleep(0.2) or x, range(100)), 2, method="ray")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in p:
            pass
    timer.join()
    assert p._m.backend is None and not wait_no_actors()
    with pytest.raises(RuntimeError, match="KeyboardInterrupt"):
        p[0]


def test_start_hook_runs_in_each_actor_and_its_failure_is_a_start_error(tmp_path):
    def hook(k):
        (tmp_path / f"hook{k}").write_text(str(os.getpid()))

    with lazyseq.prefetch(range(50), 2, method="ray", start_hook=hook) as p:
        assert list(p) == list(range(50))
        locations = p._m.backend.actor_locations()
    assert sorted(int((tmp_path / f"hook{k}").read_text()) for k in range(2)) == sorted(loc[2] for loc in locations)

    def bad(k):
        raise OSError("no dataset here")

    with pytest.raises(lazyseq.WorkerStartError, match="Ray actor .* failed to start: OSError: no dataset here"):
        with lazyseq.prefetch(range(50), 2, method="ray", start_hook=bad) as p:
            p[0]


def test_arrays_come_back_through_the_object_store_read_only():
    seq = lazyseq.smap(lambda i: np.full(1 << 18, i, dtype=np.float32), range(12))  # 1 MiB each
    with lazyseq.prefetch(seq, 2, method="ray") as p:
        got = [p[i] for i in range(12)]
    assert [float(a[0]) for a in got] == list(range(12))
    assert not got[0].flags.writeable  # a view of the object store: copy it to write


def test_ray_options_and_address_are_checked():
    with pytest.raises(ValueError, match="only apply to method='ray'"):
        lazyseq.prefetch(range(3), 1, method="thread", ray_options={"num_cpus": 1})
    with pytest.raises(ValueError, match="ray_options must be a dict"):
        lazyseq.prefetch(range(3), 1, method="ray", ray_options=2)
    with lazyseq.prefetch(range(30), 1, method="ray", ray_options={"num_cpus": 2}) as p:
        assert list(p) == list(range(30))
    assert lazyseq.prefetch(range(3), 0, method="ray", lazy_start=True).nworkers == 2  # the cluster's CPUs


def test_missing_ray_says_what_to_install(monkeypatch):
    monkeypatch.setattr(actors.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install 'lazyseq\[ray\]'"):
        lazyseq.prefetch(range(3), 1, method="ray")


def test_import_lazyseq_does_not_import_ray():
    code = "import sys, lazyseq; lazyseq.smap(abs, range(3))[1]; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_nested_view_pickles_once_per_actor_and_save_writes_from_actors(tmp_path):
    path = tmp_path / "store"
    seq = lazyseq.smap(image, range(500))
    lazyseq.save(seq, path, method="ray", nworkers=2, shard_bytes=4096)
    store = lazyseq.load(path)
    assert len(store) == 500 and (store[123]["x"] == 123).all() and store[499]["y"] == 499


def test_lazyseq_started_ray_is_shut_down_by_shutdown_ray():
    code = ("import lazyseq, ray\n"
            "p = lazyseq.prefetch(range(10), 1, method='ray')\n"
            "assert list(p) == list(range(10)) and ray.is_initialized()\n"
            "p.close()\n"
            "assert lazyseq.shutdown_ray() and not ray.is_initialized()\n"
            "assert not lazyseq.shutdown_ray()\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180, env=env)


def test_actors_that_cannot_be_scheduled_fail_to_start_clearly(monkeypatch):
    monkeypatch.setattr(actors, "_START_TIMEOUT", 2.0)
    t = time.monotonic()
    with pytest.raises(lazyseq.WorkerStartError, match=r"2 of 2 Ray actors did not start within 2 s.*num_gpus"):
        lazyseq.prefetch(range(10), 2, method="ray", ray_options={"num_gpus": 1})
    assert time.monotonic() - t < 10


def test_a_frozen_actor_does_not_stall_the_reader():
    # A node cut off the network is declared dead by Ray only after about a minute: meanwhile the
    # silent actor's jobs go to the others.
    p = lazyseq.prefetch(lazyseq.smap(lambda x: time.sleep(0.005) or x, range(10**6)), 2, method="ray", timeout=30)
    pid = None
    try:
        assert p[0] == 0
        pid = p._m.backend.actor_locations()[0][2]
        os.kill(pid, signal.SIGSTOP)
        t = time.monotonic()
        assert [p[i] for i in range(1, 400)] == list(range(1, 400))
        assert time.monotonic() - t < 25
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        p.close()


class Augmented:
    """A torch-style dataset drawing its augmentation from the global generators."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return np.array([i, np.random.random(), np.random.randint(1 << 30)])


def test_dataloader_on_ray_actors_gives_the_batches_of_the_main_process():
    def epochs(**kw):
        kw = dict(batch_size=6, shuffle=True, seed=3, seed_each_item=True, to_tensor=False, **kw)
        with lazyseq.DataLoader(Augmented(), **kw) as loader:
            out = [[b.copy() for b in loader] for _ in range(2)]
            state = loader.state_dict()
        return out, state

    here, _ = epochs(num_workers=0)
    there, state = epochs(num_workers=2, method="ray")
    assert [[b.tobytes() for b in e] for e in there] == [[b.tobytes() for b in e] for e in here]
    assert sorted(np.concatenate(there[0])[:, 0].astype(int).tolist()) == list(range(40))
    assert state["epoch"] >= 1


def test_unordered_on_ray_actors_yields_every_item_once_slow_one_last():
    def f(x):
        if x == 2:
            time.sleep(1.5)
        return x * 10

    with lazyseq.prefetch(lazyseq.smap(f, range(300)), 2, method="ray", timeout=30) as p:
        pairs = list(p.unordered())
        assert sorted(pairs) == [(i, i * 10) for i in range(300)]
        assert pairs[-1] == (2, 20)  # one slow item holds up only itself
        assert p[150] == 1500  # random access goes on afterwards


def _info_of(i):
    info = lazyseq.worker_info()
    return (info.id, info.num_workers, info.seed, type(info.dataset).__name__, os.getpid())


def test_worker_info_in_ray_actors_and_in_a_loaders_worker_init_fn():
    with lazyseq.prefetch(lazyseq.smap(_info_of, range(40)), 2, method="ray") as p:
        got = list(p)
    assert {g[:4] for g in got} <= {(0, 2, None, "Map"), (1, 2, None, "Map")} and len({g[4] for g in got}) >= 1
    assert lazyseq.worker_info() is None
    with lazyseq.DataLoader(lazyseq.smap(_info_of, range(8)), batch_size=2, num_workers=2, method="ray",
                            to_tensor=False, seed=5) as loader:
        rows = [tuple(r) for b in loader for r in zip(*b)]
    assert {int(r[0]) for r in rows} <= {0, 1} and all(r[1] == 2 and 0 <= int(r[2]) < 2**63 for r in rows)
    assert len({int(r[2]) for r in rows}) == len({int(r[0]) for r in rows})  # a seed per actor
