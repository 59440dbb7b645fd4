"""numpy batch -> realised tinygrad Tensor on tinygrad's default device: ``lazyseq.to_tensor``
against ``Tensor(arr).realize()`` and ``Tensor.from_blob(...).clone().realize()``.

Milliseconds per batch (median over the rounds, the routes alternating round by round; the device
is synchronised after each conversion and the last two results are kept alive, so tinygrad's
allocator recycles buffers as it does in a training loop). ``to_tensor copy=False`` is the
zero-copy view, for reference: it copies nothing and holds the numpy memory instead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

CASES = {  # name: {leaf: (shape, dtype)}
    "64x3x32x32 float32": {"x": ((64, 3, 32, 32), np.float32)},
    "64x3x224x224 uint8": {"x": ((64, 3, 224, 224), np.uint8)},
    "64x3x224x224 float32": {"x": ((64, 3, 224, 224), np.float32)},
    "64 int64 labels": {"y": ((64,), np.int64)},
    "64x10 float32 targets": {"y": ((64, 10), np.float32)},
    "batch: 64x3x32x32 float32 + 64 int64": {"x": ((64, 3, 32, 32), np.float32), "y": ((64,), np.int64)},
}
BASE = "Tensor(arr).realize()"


def _aligned(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random data on a 64-byte boundary, as a prefetch slot would hold it."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(n + 64, np.uint8)
    off = -raw.ctypes.data % 64
    out = raw[off : off + n].view(dt).reshape(shape)
    out[...] = rng.integers(0, 255, shape) if dt.kind in "iu" else rng.random(shape)
    return out


def run(quick: bool = False) -> dict:
    try:
        from tinygrad import Device, Tensor, dtypes
    except ImportError:
        print("(tinygrad is not installed: pip install 'lazyseq[tinygrad]')")
        return {"scenario": "tensor", "quick": quick, "skipped": "tinygrad is not installed"}
    from lazyseq.loader.tensor import to_tensor

    dev = Device.canonicalize(None)

    def blob_clone(batch: dict) -> dict:
        return {k: Tensor.from_blob(a.ctypes.data, a.shape, dtype=getattr(dtypes, a.dtype.name), device="CPU")
                .clone(dev).realize() for k, a in batch.items()}

    routes: dict[str, Callable[[dict], dict]] = {
        BASE: lambda b: {k: Tensor(a).realize() for k, a in b.items()},
        "from_blob().clone().realize()": blob_clone,
        "to_tensor": to_tensor,
        "to_tensor copy=False": lambda b: to_tensor(b, copy=False),
    }
    rng = np.random.default_rng(0)
    rounds = 3 if quick else 15
    ms: dict[str, dict[str, float]] = {}
    for case, leaves in CASES.items():
        batch = {k: _aligned(shape, dt, rng) for k, (shape, dt) in leaves.items()}
        for name, f in routes.items():  # same answers (and warm caches) before timing
            out = f(batch)
            assert all((out[k].numpy() == a).all() for k, a in batch.items()), (case, name)
        times: dict[str, list[float]] = {name: [] for name in routes}
        kept: dict[str, list] = {name: [] for name in routes}
        for _ in range(rounds):
            for name, f in routes.items():
                t = time.perf_counter()
                out = f(batch)
                Device[dev].synchronize()
                times[name].append(time.perf_counter() - t)
                kept[name] = [*kept[name][-1:], out]
        ms[case] = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        del kept
    print(f"numpy batch -> realised tinygrad Tensor on {dev}: ms per batch (x: speed-up over {BASE})")
    width = max(map(len, CASES)) + 2
    print(f"{'':{width}s}" + "".join(f"{name:>32s}" for name in routes))
    for case, row in ms.items():
        cells = (f"{t:8.3f} ms" + (f" ({row[BASE] / t:5.1f}x)" if name != BASE else " " * 9) for name, t in row.items())
        print(f"{case:{width}s}" + "".join(f"{c:>32s}" for c in cells))
    return {"scenario": "tensor", "quick": quick, "device": dev, "ms_per_batch": ms,
            "speedup": {case: {name: row[BASE] / t for name, t in row.items()} for case, row in ms.items()}}
