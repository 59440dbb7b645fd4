"""prefetch(method='ray') and save(method='ray') on a two-node Ray cluster run on this machine."""

import os
import time

import numpy as np
import pytest

import lazyseq

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

NODE = dict(num_cpus=1, object_store_memory=80 << 20)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    c.add_node(**NODE)
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=c.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": here}})
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def record(i):
    return {"x": np.arange(6, dtype=np.int64) + i, "node": ray.get_runtime_context().get_node_id()}


def test_work_is_spread_over_both_nodes(cluster):
    with lazyseq.prefetch(lazyseq.smap(record, range(400)), 2, method="ray") as p:
        got = list(p)
        assert p.stats()["nodes"] == 2
        assert len({loc[0] for loc in p._m.backend.actor_locations()}) == 2
        assert [p[i]["x"][0] for i in range(399, 0, -37)] == list(range(399, 0, -37))
    assert [int(r["x"][0]) for r in got] == list(range(400))
    assert len({r["node"] for r in got}) == 2  # items computed on each node


def test_a_save_from_actors_on_both_nodes(cluster, tmp_path):
    seq = lazyseq.smap(lambda i: {"x": np.full(32, i, dtype=np.int16), "node": ray.get_runtime_context().get_node_id()},
                       range(600))
    lazyseq.save(seq, tmp_path / "s", method="ray", nworkers=2, shard_bytes=4096)
    store = lazyseq.load(tmp_path / "s")
    assert len(store) == 600 and int(store[599]["x"][0]) == 599
    assert len({store[i]["node"] for i in range(0, 600, 7)}) == 2  # shards written by actors on each node


def test_a_lost_node_raises_worker_crashed(cluster):
    worker = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    p = lazyseq.prefetch(lazyseq.smap(lambda x: time.sleep(0.01) or x, range(100_000)), 3, method="ray")
    try:
        assert p[0] == 0 and p.stats()["nodes"] == 3
        cluster.remove_node(worker)
        t = time.monotonic()
        with pytest.raises(lazyseq.WorkerCrashed, match="Ray actor"):
            for i in range(1, 100_000):
                p[i]
        assert time.monotonic() - t < 60
    finally:
        p.close()
