"""torch and JAX as the loader's consumers (issue #34): to_torch over slot memory without a copy,
the slot held while a tensor or a view of it lives; to_jax on a device or split over a sharding."""

import collections
import gc
import json
import os
import subprocess
import sys
import warnings
import weakref

import ml_dtypes
import numpy as np
import pytest

import lazyseq
from lazyseq.evaluation.slots import SlotAnchor
from lazyseq.loader.batching import HostInt
from lazyseq.loader.totorch import PinnedPool

torch = pytest.importorskip("torch")
Pair = collections.namedtuple("Pair", "x y")


def _anchor(a):
    while a is not None and not isinstance(a, SlotAnchor):
        a = a.base
    return a


# -- to_torch -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                   "float16", "float32", "float64", "complex64"])
def test_to_torch_keeps_every_dtype_and_shares_memory(dtype):
    a = (np.arange(12) % 2).astype(dtype).reshape(3, 4)
    t = lazyseq.to_torch(a)
    assert t.dtype == torch.from_numpy(np.empty(0, dtype)).dtype and tuple(t.shape) == (3, 4)
    assert t.data_ptr() == a.ctypes.data  # no copy
    assert np.array_equal(t.numpy(), a)


def test_to_torch_bfloat16_and_numbers_and_structures():
    b = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16)
    out = lazyseq.to_torch({"b": b, "s": "name", "n": None, "p": Pair(np.int16(3), [1, 2.5, True]),
                            "h": HostInt(7), "obj": np.array(["a"], object)})
    assert out["b"].dtype == torch.bfloat16 and out["b"].tolist() == [1.5, -2.0, 3.25]
    assert out["b"].data_ptr() == b.ctypes.data
    assert out["s"] == "name" and out["n"] is None and type(out["h"]) is HostInt and out["obj"].dtype == object
    p = out["p"]
    assert type(p) is Pair and p.x.dtype == torch.int16 and p.x.ndim == 0 and int(p.x) == 3
    assert [v.dtype for v in p.y] == [torch.int64, torch.float32, torch.bool]  # torch's defaults


def test_to_torch_copies_only_what_torch_cannot_take():
    rev = np.arange(6, dtype=np.float32)[::-1]
    ro = np.arange(4, dtype=np.int32)
    ro.flags.writeable = False
    swapped = np.arange(3, dtype=">i4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on read-only arrays: copied first, no warning
        out = lazyseq.to_torch([rev, ro, swapped])
    assert out[0].tolist() == [5, 4, 3, 2, 1, 0] and out[1].tolist() == [0, 1, 2, 3] and out[2].tolist() == [0, 1, 2]
    assert out[1].data_ptr() != ro.ctypes.data


def test_a_tensor_or_a_view_of_it_keeps_its_slot_and_dropping_it_releases_the_slot():
    data = lazyseq.smap(lambda i: np.full((64, 64), i, np.float32), range(40))
    with lazyseq.prefetch(data, 2, "process", max_buffered=3, shm_size=3 * 32768) as p:
        a = p[0]
        anchor = _anchor(a)
        assert anchor is not None  # delivered in a slot
        alive = weakref.ref(anchor)
        del anchor
        view = lazyseq.to_torch(a)[5:9, :3]
        del a
        gc.collect()
        for i in range(1, 40):  # every other slot is reused many times meanwhile
            assert float(p[i][0, 0]) == i
        assert alive() is not None and float(view.sum()) == 0.0  # batch 0's slot was not reused
        del view
        gc.collect()
        assert alive() is None  # the slot is back in the pool
        assert p.stats()["fallbacks"] == 0


def test_a_torch_loader_sends_every_batch_through_slots():
    data = [(np.full((3, 8, 8), i, np.float32), np.int64(i)) for i in range(64)]
    with lazyseq.DataLoader(data, batch_size=8, num_workers=2, to_tensor="torch", seed=0) as loader:
        seen = []
        for x, y in loader:
            assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and tuple(x.shape) == (8, 3, 8, 8)
            assert y.dtype == torch.int64 and x[:, 0, 0, 0].tolist() == y.tolist()
            seen += y.tolist()
        stats = loader.stats()["last_epoch"]["prefetch"]
    assert sorted(seen) == list(range(64))
    assert stats["fallbacks"] == 0 and stats["bytes_shm"] >= 64 * (3 * 8 * 8 * 4 + 8)
    assert stats["bytes_pipe"] < 8 * 400  # headers only: no batch pickled


def test_pin_memory_without_cuda_warns_once_per_loader():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: pinning happens")
    data = [np.zeros(4, np.float32)] * 8
    with pytest.warns(RuntimeWarning, match="CUDA is not available, so batches are not pinned") as got:
        loader = lazyseq.DataLoader(data, batch_size=4, to_tensor="torch", pin_memory=True)
        for _ in range(2):
            assert all(not b.is_pinned() for b in loader)
    assert len([w for w in got if "pinned" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazyseq.DataLoader(data, batch_size=4, to_tensor=False, pin_memory=True)  # not torch's: nothing said


def test_the_pinned_pool_reuses_a_buffer_only_once_its_tensors_are_gone():
    made = []
    pool = PinnedPool(alloc=lambda n: made.append(n) or torch.empty(n, dtype=torch.uint8))
    a = np.arange(1000, dtype=np.float32)
    t1, _ = pool.take(a, torch)
    t2, _ = pool.take(a, torch)  # t1 alive: a second buffer
    assert len(pool) == 2 and t1.tolist() == a.tolist() and t1.data_ptr() != t2.data_ptr()
    ptr = t1.data_ptr()
    del t1
    t3, _ = pool.take(a * 2, torch)
    assert len(pool) == 2 and t3.data_ptr() == ptr and t3[1].item() == 2.0  # t1's buffer again
    view = t3[10:20]
    del t3
    t4, _ = pool.take(a, torch)
    assert t4.data_ptr() != ptr and len(pool) == 3  # the view keeps its buffer taken
    del view, t2, t4


def test_a_missing_framework_is_refused_when_the_loader_is_built(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"DataLoader\(to_tensor='torch'\) needs PyTorch"):
        lazyseq.DataLoader([1, 2], to_tensor="torch")
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ImportError, match=r"DataLoader\(to_tensor='jax'\) needs JAX"):
        lazyseq.DataLoader([1, 2], to_tensor="jax")
    with pytest.raises(ValueError, match="to_tensor must be True or 'tinygrad', 'torch', 'jax'"):
        lazyseq.DataLoader([1, 2], to_tensor="tensorflow")


# -- to_jax ---------------------------------------------------------------------------------------------
_DTYPES = r"""
import collections, doctest, json, numpy as np, ml_dtypes, jax, lazyseq
from lazyseq.loader import tojax
Pair = collections.namedtuple("Pair", "x y")
out = lazyseq.to_jax(Pair({"a": np.ones((2, 2), np.float16), "b": np.array([1, 2], np.uint8), "s": "k"},
                          [np.array([1.0], ml_dtypes.bfloat16), np.float64(2.5), 3, None]))
doc = tojax.to_jax.__doc__.replace("# doctest: +SKIP", "")
failed = doctest.DocTestRunner().run(doctest.DocTestParser().get_doctest(doc, {}, "to_jax", None, 0)).failed
print(json.dumps({"pair": type(out).__name__, "s": out.x["s"], "none": out.y[3] is None,
                  "dtypes": [str(out.x["a"].dtype), str(out.x["b"].dtype), str(out.y[0].dtype), str(out.y[1].dtype)],
                  "values": [float(out.y[1]), int(out.y[2])], "array": isinstance(out.x["a"], jax.Array),
                  "device": str(list(out.x["a"].devices())[0]), "x64": bool(jax.config.jax_enable_x64),
                  "doctest_failed": failed}))
"""


def _run_jax(script, devices=1):
    """JAX's runtime, once started, makes later forks of this process risky: its tests run apart."""
    pytest.importorskip("jax")
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_to_jax_keeps_dtypes_jax_has_and_structures():
    out = _run_jax(_DTYPES)
    assert out["pair"] == "Pair" and out["s"] == "k" and out["none"] and out["array"] and out["device"].endswith("0")
    assert out["dtypes"][:3] == ["float16", "uint8", "bfloat16"]
    assert out["dtypes"][3] == ("float64" if out["x64"] else "float32")  # without x64, the documented cast
    assert out["values"] == [2.5, 3] and out["doctest_failed"] == 0


_SHARDED = r"""
import json, warnings, numpy as np, jax, lazyseq
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
warnings.filterwarnings("error", message="os.fork")  # JAX's runtime runs here: workers must not be forked from it
mesh = Mesh(np.array(jax.devices()), ("data",))
data = [(np.full((3, 4), i, np.float32), np.int32(i)) for i in range(24)]
out = {}
with lazyseq.DataLoader(data, batch_size=8, num_workers=2, drop_last=True, to_tensor="jax",
                        device=NamedSharding(mesh, P("data")), seed=1) as loader:
    batches = []
    for b in loader:
        batches.append(b)
        out["start"] = next(iter(loader._open)).mp_context.get_start_method()
x, y = batches[0]
out["n_devices"] = len(jax.devices())
out["shards"] = [list(s.data.shape) for s in x.addressable_shards]
out["devices"] = len({s.device for s in x.addressable_shards})
out["labels"] = sorted(int(v) for _, y in batches for v in np.asarray(y))
out["rows_match"] = all(bool((np.asarray(x)[:, 0, 0] == np.asarray(y)).all()) for x, y in batches)
try:
    lazyseq.to_jax(np.zeros((3, 2), np.float32), sharding=NamedSharding(mesh, P("data")))
except ValueError as e:
    out["indivisible"] = str(e)
print(json.dumps(out))
"""


def test_jax_batches_split_over_two_host_devices():
    out = _run_jax(_SHARDED, devices=2)
    assert out["start"] == "forkserver"  # JAX's runtime started in the reader: its workers are not forked from it
    assert out["n_devices"] == 2 and out["devices"] == 2 and out["shards"] == [[4, 3, 4], [4, 3, 4]]
    assert out["labels"] == list(range(24)) and out["rows_match"]
    assert "split on their first axis over the sharding's 2 devices" in out["indivisible"]
    assert "drop_last=True" in out["indivisible"]
