"""``bench dataloader``'s torch rows: the same JPEG pipeline delivered as torch tensors, with no
tinygrad conversion on either side, and the cost of turning one numpy batch into torch tensors.

(a) Images/s of torch batches (2 workers, batch 64, ``shuffle=True``, ``drop_last=True``, fork):

- ``lazyseq to_tensor='torch'``: ``lazyseq.DataLoader(num_workers=2, to_tensor='torch')``: CPU tensors
  made by ``torch.from_numpy`` over each batch's shared-memory slot (no copy). The row also says
  whether every batch came through the slots: the epoch's ``stats()['last_epoch']['prefetch']``
  ``fallbacks`` (batches sent through the pipe instead) and ``bytes_shm`` / ``bytes_pipe``.
- ``torch``: ``torch.utils.data.DataLoader(num_workers=2)``, its own ``default_collate`` (torch
  tensors in the workers, moved to shared memory, one segment per tensor per batch).

The reader drops each batch after checking its shape (it keeps the labels, to check that the epoch
delivered distinct images). Best round of each, the loaders alternating round by round, as in the
tinygrad rows.

(b) Milliseconds to turn one float32 batch of (64, 3, 192, 192), 28.3 MB, into a torch tensor: the
median of many calls of ``lazyseq.to_torch(arr)`` (``torch.from_numpy``: zero copy), against
``torch.tensor(arr)`` and ``torch.as_tensor(arr).clone()`` (a copy, what a path that does not share
the numpy memory pays per batch).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import lazyseq

from . import images

CONVERT_SHAPE = (64, 3, 192, 192)  # float32: 28.3 MB, one batch of the bench's crops
ROWS = ("lazyseq to_tensor='torch'", "torch")


def open_lazyseq_torch(ds: images.ImageDataset) -> Callable[[], images.Opened]:
    def open_() -> images.Opened:
        loader = lazyseq.DataLoader(ds, batch_size=images.BATCH, shuffle=True, num_workers=images.NWORKERS, drop_last=True,
                                    seed=0, multiprocessing_context="fork", to_tensor="torch")

        def close() -> dict:
            loader.close()
            return {"prefetch": (loader.stats().get("last_epoch") or {}).get("prefetch")}

        return iter(loader), None, close

    return open_


def epoch(open_: Callable[[], images.Opened], n_images: int) -> dict:
    """One epoch of torch batches: each is checked (type, shape, dtype) and dropped, its labels kept."""
    import torch

    cpu = images.cpu_seconds()
    t0 = time.perf_counter()
    it, _, close = open_()
    labels: list[np.ndarray] = []
    t1, mean = t0, None
    try:
        for k, (x, y) in enumerate(it):
            if k == 1:
                t1 = time.perf_counter()
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != (images.BATCH, 3, images.CROP, images.CROP) \
                    or x.dtype != torch.float32:
                raise AssertionError(f"images arrived as {type(x).__name__} {getattr(x, 'shape', None)}")
            if mean is None:
                mean = float(x.mean())
            labels.append(y.numpy().copy())  # a copy: the batch (and its slot) goes now
            del x, y
        t2 = time.perf_counter()
    finally:
        it = None
        stats = close()
    images.no_children("its epoch")
    cpu = images.cpu_seconds() - cpu
    seen = np.concatenate(labels)
    nb = len(labels)
    if nb != n_images // images.BATCH or len(set(seen.tolist())) != nb * images.BATCH:
        raise AssertionError(f"{nb} batches with labels {seen}: not distinct images of the epoch")
    if not -2.5 < mean < 2.5:
        raise AssertionError(f"normalised images have mean {mean}")
    return {"seconds": t2 - t0, "steady_seconds": t2 - t1, "batches": nb, "images": nb * images.BATCH,
            "cpu_seconds": cpu, "stats": stats}


def slots_used(r: dict) -> dict | None:
    """Whether every batch of a lazyseq epoch came through the shared-memory slots."""
    p = (r.get("stats") or {}).get("prefetch")
    if not p:
        return None
    return {"fallbacks": p["fallbacks"], "bytes_shm": p["bytes_shm"], "bytes_pipe": p["bytes_pipe"],
            "all_through_slots": p["fallbacks"] == 0}


def loaders(ds: images.ImageDataset, n: int, rounds: int) -> dict:
    """(a): images/s of torch batches, lazyseq to_tensor='torch' against torch's DataLoader."""
    opened = {ROWS[0]: open_lazyseq_torch(ds), ROWS[1]: images.open_torch(ds, convert=False)}
    runs: dict[str, list[dict]] = {name: [] for name in opened}
    for _ in range(rounds):
        for name, open_ in opened.items():
            runs[name].append(epoch(open_, n))
    rate = {k: max(r["images"] / r["seconds"] for r in v) for k, v in runs.items()}
    steady = {k: max((r["images"] - images.BATCH) / r["steady_seconds"] for r in v) for k, v in runs.items()}
    cpu_ms = {k: min(r["cpu_seconds"] / r["images"] for r in v) * 1e3 for k, v in runs.items()}
    slots = [s for s in (slots_used(r) for r in runs[ROWS[0]]) if s is not None]
    through = {"fallbacks": sum(s["fallbacks"] for s in slots), "bytes_shm": sum(s["bytes_shm"] for s in slots),
               "bytes_pipe": sum(s["bytes_pipe"] for s in slots),
               "all_through_slots": bool(slots) and all(s["all_through_slots"] for s in slots)}
    return {"rounds": rounds, "images_per_s": rate, "steady_images_per_s": steady, "cpu_ms_per_image": cpu_ms,
            "ratio": {k: rate[ROWS[0]] / v for k, v in rate.items()},
            "steady_ratio": {k: steady[ROWS[0]] / v for k, v in steady.items()}, "slots": through,
            "epochs_counted": len(slots), "runs": runs}


def convert(quick: bool) -> dict:
    """(b): ms to make torch tensors of one 28 MB float32 batch: zero copy against two copying routes."""
    import torch

    arr = np.random.default_rng(0).random(CONVERT_SHAPE, dtype=np.float32)
    routes: dict[str, Callable[[np.ndarray], Any]] = {
        "lazyseq.to_torch(arr)": lazyseq.to_torch,
        "torch.tensor(arr)": torch.tensor,
        "torch.as_tensor(arr).clone()": lambda a: torch.as_tensor(a).clone(),
    }
    calls = 5 if quick else 41
    times: dict[str, list[float]] = {k: [] for k in routes}
    keep: list[Any] = []
    for _ in range(calls):  # the routes alternate call by call
        for name, f in routes.items():
            t = time.perf_counter()
            out = f(arr)
            times[name].append(time.perf_counter() - t)
            keep = [out, *keep[:1]]  # the last two results alive, as a training loop holds them
    del keep
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    mb = arr.nbytes / 1e6
    return {"shape": list(CONVERT_SHAPE), "dtype": "float32", "megabytes": mb, "calls": calls, "median_ms": med}


def run_rows(ds: images.ImageDataset, n: int, rounds: int, quick: bool) -> dict:
    """Both parts, for ``bench dataloader`` (torch is installed: the caller checked); :func:`show` prints them."""
    return {"torch_batches": loaders(ds, n, rounds), "to_torch_convert": convert(quick)}


def show(res: dict) -> None:
    """Print what :func:`run_rows` measured: the torch-batch table, the slots line, the conversion."""
    t, c = res["torch_batches"], res["to_torch_convert"]
    rate, steady, cpu_ms, through = t["images_per_s"], t["steady_images_per_s"], t["cpu_ms_per_image"], t["slots"]
    print(f"\nthe same epochs delivered as torch tensors (no tinygrad on either side); best of {t['rounds']} rounds")
    print(f"{'':28s}{'images/s':>10s}{'lazyseq x':>11s}{'steady/s':>10s}{'lazyseq x':>11s}{'CPU ms/img':>12s}")
    for k in rate:
        print(f"{k:28s}{rate[k]:10.0f}{rate[ROWS[0]] / rate[k]:11.2f}{steady[k]:10.0f}"
              f"{steady[ROWS[0]] / steady[k]:11.2f}{cpu_ms[k]:12.2f}")
    every = "every batch came through the slots" if through["all_through_slots"] else \
        "NOT every batch came through the slots"
    print(f"lazyseq to_tensor='torch': {every} (fallbacks {through['fallbacks']}, bytes_shm {through['bytes_shm']:,}, "
          f"bytes_pipe {through['bytes_pipe']:,}, over its {t['epochs_counted']} epochs)")
    print(f"\none float32 batch {tuple(c['shape'])} ({c['megabytes']:.1f} MB) to a torch tensor: median of "
          f"{c['calls']} calls")
    for k, v in c["median_ms"].items():
        print(f"  {k:32s}{v:10.3f} ms")
