import collections
import gc
import subprocess
import sys
import warnings
import weakref

import numpy as np
import pytest

import lazyseq

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Device, Tensor, dtypes  # noqa: E402

from lazyseq.loader.tensor import ALIGN, to_tensor  # noqa: E402

Sample = collections.namedtuple("Sample", "image label")
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


@pytest.fixture(scope="module", autouse=True)
def _device_started():
    """Start tinygrad's CPU device (and any thread it keeps) before the per-test leak check looks."""
    (Tensor(np.ones(4, np.float32)) + 1).realize().numpy()
    Device["CPU"].synchronize()


def aligned(n: int, dtype=np.float32) -> np.ndarray:
    """A writable array of ``n`` items starting on an ``ALIGN``-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(n * itemsize + ALIGN, np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off : off + n * itemsize].view(dtype)


def test_import_lazyseq_does_not_import_tinygrad():
    code = "import sys, lazyseq, lazyseq.loader.tensor; assert 'tinygrad' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_tinygrad_says_how_to_install():
    code = ("import sys; sys.modules['tinygrad'] = None\n"
            "from lazyseq.loader.tensor import to_tensor\n"
            "try:\n    to_tensor(1)\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "pip install 'lazyseq[tinygrad]'" in out


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_shapes_values(dtype):
    a = (np.arange(2 * 3 * 4) % 5).astype(dtype).reshape(2, 3, 4)
    t = to_tensor(a)
    assert isinstance(t, Tensor) and t.shape == a.shape and t.device == Device.DEFAULT
    assert t.dtype == getattr(dtypes, dtype) and t.uop.is_realized
    n = t.numpy()
    assert n.dtype == a.dtype and (n == a).all()


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int64", "float16", "float64"])
def test_zero_d_and_empty_arrays(dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    z = to_tensor(a[1, 2].copy().reshape(()), "CPU")  # a 0-d array
    assert z.shape == () and z.device == "CPU" and z.dtype == getattr(dtypes, dtype) and z.numpy() == a[1, 2]
    s = to_tensor(a[1, 2])  # a numpy scalar
    assert s.shape == () and s.dtype == getattr(dtypes, dtype) and s.numpy() == a[1, 2]  # .item() of half needs 3.12
    e = to_tensor(a[:0])
    assert e.shape == (0, 4) and e.dtype == getattr(dtypes, dtype) and e.numpy().shape == (0, 4)


def test_non_contiguous_and_non_native_arrays():
    a = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    for v in (a[:, ::2, 1:], a.T, a[::-1], np.broadcast_to(a[:1], (3, 5, 6)), np.arange(10)[1:]):
        assert (to_tensor(v).numpy() == v).all()
    big = np.arange(100, dtype=">i4")
    t = to_tensor(big)
    assert t.dtype == dtypes.int32 and (t.numpy() == np.arange(100)).all()


def test_python_numbers_take_tinygrad_defaults():
    i, f, b = to_tensor((3, 2.5, True))
    assert (i.dtype, f.dtype, b.dtype) == (dtypes.default_int, dtypes.default_float, dtypes.bool)
    assert (i.item(), f.item(), b.item()) == (3, 2.5, True) and i.shape == ()
    assert to_tensor(np.float64(0.5)).dtype == dtypes.float64 and to_tensor(np.int8(-3)).item() == -3


def test_strings_and_other_objects_are_left_alone():
    obj = object()
    x = ["name", b"raw", None, obj, np.array(["a", "b"]), np.array([{}], dtype=object), np.datetime64("2024-01-01"), np.str_("s")]
    out = to_tensor(x)
    assert out[:4] == ["name", b"raw", None, obj]
    assert all(o is i for o, i in zip(out[4:], x[4:]))


def test_complex_has_no_tinygrad_dtype():
    with pytest.raises(TypeError, match="complex"):
        to_tensor(np.ones(3, np.complex64))
    with pytest.raises(TypeError, match="complex"):
        to_tensor([1j])


def test_nesting_keeps_container_types():
    class MyList(list):
        pass

    batch = {
        "sample": Sample(np.ones((2, 3), np.float32), np.array([1, 2])),
        "pair": (np.zeros(2, np.uint8), [np.full(3, 7, np.int16), "tag"]),
        "ordered": collections.OrderedDict(b=np.arange(2), a=np.arange(3)),
        "default": collections.defaultdict(list, k=np.ones(1)),
        "mine": MyList([np.ones(2)]),
        "empty": (),
    }
    out = to_tensor(batch)
    assert type(out) is dict and list(out) == list(batch)
    assert type(out["sample"]) is Sample and out["sample"].label.tolist() == [1, 2]
    assert out["sample"].image.shape == (2, 3) and out["sample"].image.dtype == dtypes.float32
    assert type(out["pair"]) is tuple and type(out["pair"][1]) is list and out["pair"][1][1] == "tag"
    assert out["pair"][1][0].tolist() == [7, 7, 7]
    assert type(out["ordered"]) is collections.OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert type(out["default"]) is collections.defaultdict and out["default"].default_factory is list
    assert type(out["mine"]) is MyList and out["empty"] == ()
    assert isinstance(batch["sample"].image, np.ndarray)  # the input is not modified


def test_copy_survives_overwriting_the_source():
    a = np.arange(64 * 3 * 8 * 8, dtype=np.float32).reshape(64, 3, 8, 8)
    labels = np.arange(64)
    expect_a, expect_l = a.copy(), labels.copy()
    out = to_tensor({"x": a, "y": labels})
    a[:] = -1
    labels[:] = 99
    del a, labels
    gc.collect()
    assert (out["x"].numpy() == expect_a).all() and (out["y"].numpy() == expect_l).all()
    assert ((out["x"] * 2).numpy() == expect_a * 2).all()


def test_copy_false_views_aligned_cpu_memory_and_keeps_it_alive():
    a = aligned(256)
    a[:] = np.arange(256)
    owner = weakref.ref(a.base)
    t = to_tensor(a, "CPU", copy=False)
    a[0] = 42  # a zero-copy Tensor sees writes to the array
    assert t.numpy()[0] == 42 and (t * 2).numpy()[1] == 2
    view = t.reshape(16, 16)
    del a, t
    gc.collect()
    assert owner() is not None  # the Tensor keeps the numpy memory alive ...
    assert view.numpy()[0, 0] == 42
    del view
    gc.collect()
    assert owner() is None  # ... and only as long as it lives


def test_copy_false_copies_when_a_view_is_not_safe():
    a = aligned(65)
    a[:] = 1
    src = {
        "unaligned": a[1:],
        "strided": a[::2],
        "readonly": np.frombuffer(a[:64].tobytes(), np.float32),
        "zero_d": np.array(1.0, np.float32),
    }
    out = to_tensor(src, "CPU", copy=False)
    a[:] = 5
    for k, t in out.items():
        assert (t.numpy() == 1).all(), k


def test_device_argument_and_tensors_given():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = to_tensor(a, "CPU")
    assert t.device == "CPU"
    assert to_tensor(t) is t and to_tensor(t, "CPU") is t  # already there: as is
    moved = to_tensor({"t": t, "a": a}, "PYTHON")  # another device: tinygrad's own copy, realised
    assert moved["t"].device == "PYTHON" and moved["a"].device == "PYTHON" and moved["t"].uop.is_realized
    assert (moved["t"].numpy() == a).all() and (moved["a"].numpy() == a).all()
    z = to_tensor(np.array(2.5), "PYTHON")
    assert z.device == "PYTHON" and z.shape == () and z.item() == 2.5


def test_copy_false_on_another_device_still_copies():
    a = aligned(64)
    a[:] = 3
    t = to_tensor(a, "PYTHON", copy=False)
    a[:] = 0
    assert t.device == "PYTHON" and (t.numpy() == 3).all()


def make_batch(i: int) -> dict:
    return {"image": np.full((8, 3, 16, 16), i, np.float32), "label": np.arange(8) + i, "index": i}


SHM = 4 * (8 * 3 * 16 * 16 * 4 + 4096)  # room for 4 slots of one batch each


def test_tensors_stay_correct_after_prefetch_slots_are_reused():
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the pipe: the slots really are reused
        with lazyseq.prefetch(lazyseq.smap(make_batch, range(30)), 2, "process", max_buffered=4, shm_size=SHM) as p:
            for item in p:
                kept.append(to_tensor(item))
            stats = p.stats()
    assert stats["fallbacks"] == 0 and stats["bytes_shm"] >= 30 * 8 * 3 * 16 * 16 * 4
    for i, b in enumerate(kept):
        assert b["index"].item() == i  # a Python int became a 0-d Tensor
        assert (b["image"].numpy() == i).all() and b["label"].tolist() == list(range(i, i + 8))


def test_copy_false_holds_the_slot_until_the_tensor_goes():
    with lazyseq.prefetch(lazyseq.smap(make_batch, range(30)), 2, "process", max_buffered=4, shm_size=SHM) as p:
        first = to_tensor(p[0]["image"], "CPU", copy=False)
        for i in range(1, 30):  # the three other slots carry the rest
            assert (to_tensor(p[i])["image"].numpy() == i).all()
        assert (first.numpy() == 0).all()  # its slot was never handed out again
        gc.collect()
        held = p.stats()["slots_free"]
        assert p.stats()["fallbacks"] == 0 and held < 4
        del first
        gc.collect()
        assert p.stats()["slots_free"] == held + 1


def test_bench_quick_run():
    from lazyseq.bench import tensor as bench

    res = bench.run(quick=True)
    assert res["scenario"] == "tensor" and res["quick"] is True
    for case in res["ms_per_batch"].values():
        assert {"Tensor(arr).realize()", "to_tensor"} <= set(case)
