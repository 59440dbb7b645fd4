"""A DataLoader over JPEG images decoded and augmented per item, delivered as tinygrad Tensors on the
CPU: ``lazyseq.DataLoader`` against PyTorch's ``DataLoader`` and seqtools' DataLoader recipe.

The dataset: ``N`` 224x224 RGB JPEG files (quality 90, ~20 kB each: a smooth random field plus
noise, so that compression and decoding cost what photos cost), written once into a temporary
directory. Item ``i`` decodes file ``i`` with Pillow, crops a random 192x192 window, flips it at
random, and returns it as float32 CHW normalised with ImageNet's mean and std, with the label ``i``
(the label names the file, so the bench can check that every epoch delivers distinct images).

Every loader: batch 64, ``shuffle=True``, ``drop_last=True``, 2 worker processes, fork; the reader
gets ``(images, labels)`` as realised tinygrad Tensors on the CPU and does nothing else with them.

- ``lazyseq``: ``lazyseq.DataLoader(num_workers=2, to_tensor=True, device='CPU')``; the shared
  memory is sized from the first sample (``shm_size=None``).
- ``torch``: ``torch.utils.data.DataLoader(num_workers=2)`` delivers torch tensors; the reader turns
  them into tinygrad Tensors with ``lazyseq.to_tensor((x.numpy(), y.numpy()), 'CPU')``.
- ``seqtools``: the DataLoader example of seqtools' documentation (rebuilt below from its recipe:
  ``gather -> batch(collate) -> prefetch(process, shm) -> smap(into_tensors)``, torch tensors
  pickled as numpy arrays so that they travel through seqtools' shared memory), then the same
  conversion as torch's.

The conversion is timed inside the reader loop (the ``convert`` column, for the two peers; lazyseq's
happens inside its iterator). Figures: images/s over the whole epoch (from ``iter()``, worker
start-up included) and in the steady state (from the second batch to the last); the best round of
each, the loaders alternating round by round. CPU: the reader's and the workers' CPU time per image
over the whole epoch (workers are counted once they have exited and been joined). seqtools, torch,
tinygrad and Pillow are optional: a missing one skips its loader (or the bench) with a message.

With torch installed, the bench then runs the same epochs delivered as torch tensors (lazyseq's
``to_tensor='torch'`` against torch's DataLoader, no tinygrad on either side) and times one 28 MB
batch's conversion to torch (``lazyseq.to_torch``, zero copy, against copying routes):
:mod:`lazyseq.bench.torchrows`; its results are the ``torch_rows`` key of the JSON.
"""

from __future__ import annotations

import copyreg
import gc
import importlib.util
import numbers
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import lazyseq

from .images import (
    BATCH,
    BATCH_BYTES,
    CROP,
    NWORKERS,
    SIZE,
    ImageDataset,
    Opened,
    cpu_seconds,
    no_children,
    open_torch,
    torch_to_tinygrad,
    write_images,
)

# -- the data -----------------------------------------------------------------------------------------




# -- seqtools' DataLoader recipe (its documentation's example, as written there) ----------------------
def _pickle_tensor(t: Any) -> tuple:
    """torch.Tensor pickles as the numpy array it wraps, to benefit from zero copy on buffers."""
    import torch

    return torch.from_numpy, (t.numpy(),)


def _into_tensors(value: Any) -> Any:
    """Convert arrays inside an object into tensors."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    elif isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    elif isinstance(value, (tuple, list)):
        return value.__class__(_into_tensors(v) for v in value)
    elif isinstance(value, dict):
        return value.__class__((k, _into_tensors(v)) for k, v in value.items())
    else:
        return torch.tensor(value)


def _seqtools_collate(values: Any) -> Any:
    """Stack samples together into a minibatch."""
    import torch

    if not isinstance(values, list):  # force evaluation if not done already
        values = list(values)
    sample = values[0]
    if isinstance(sample, torch.Tensor):
        return torch.stack(values)
    elif isinstance(sample, np.ndarray):
        return np.stack(values)
    elif isinstance(sample, numbers.Integral):
        return torch.tensor(values)
    elif isinstance(sample, (tuple, list)):
        return sample.__class__(_seqtools_collate(row) for row in zip(*values))
    elif isinstance(sample, dict):
        return sample.__class__((k, _seqtools_collate([v[k] for v in values])) for k in sample.keys())


class SeqtoolsDataLoader:
    """seqtools' re-implementation of PyTorch's DataLoader (the parts this bench uses: shuffle,
    batch, process workers with shared memory; no sampler, no pin_memory)."""

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, num_workers: int = 0,
                 collate_fn: Callable | None = None, drop_last: bool = False, worker_init_fn: Callable | None = None,
                 prefetch_factor: int = 2, shm_size: int | None = None):
        self.dataset, self.batch_size, self.shuffle, self.num_workers = dataset, batch_size, shuffle, num_workers
        self.collate_fn = collate_fn or _seqtools_collate
        self.drop_last, self.worker_init_fn = drop_last, worker_init_fn
        self.prefetch_factor, self.shm_size = prefetch_factor, shm_size

    def make_sequence(self) -> Any:
        import seqtools

        out: Any = self.dataset
        if self.shuffle:
            out = seqtools.gather(self.dataset, np.random.permutation(len(self.dataset)))
        if self.batch_size is not None:
            out = seqtools.batch(out, k=self.batch_size, drop_last=self.drop_last, collate_fn=self.collate_fn)
        if self.num_workers > 0:
            out = seqtools.prefetch(out, max_buffered=self.num_workers * self.prefetch_factor, nworkers=self.num_workers,
                                    method="process", start_hook=self.worker_init_fn, shm_size=self.shm_size)
        return seqtools.smap(_into_tensors, out)

    def __iter__(self) -> Iterator:
        return iter(self.make_sequence())


# -- the loaders: open() -> (iterator of batches, convert or None, close) -------------------------------




def open_lazyseq(ds: ImageDataset) -> Callable[[], Opened]:
    def open_() -> Opened:
        loader = lazyseq.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=NWORKERS, drop_last=True,
                                    seed=0, multiprocessing_context="fork", device="CPU", to_tensor=True)

        seen: dict = {}

        def batches() -> Iterator:
            last = len(loader) - 1
            for k, b in enumerate(loader):
                if k == last:  # the counters of the epoch's prefetch, before it closes
                    seen.update(loader.stats())
                yield b

        def close() -> dict:
            loader.close()
            return {k: seen.get(k) for k in ("shm", "shm_size", "prefetch")}

        return batches(), None, close

    return open_




def open_seqtools(ds: ImageDataset) -> Callable[[], Opened]:
    shm_size = NWORKERS * 2 * (BATCH_BYTES + 2**16)  # max_buffered slots of one batch each

    def open_() -> Opened:
        box = [iter(SeqtoolsDataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=NWORKERS, drop_last=True,
                                       shm_size=shm_size))]

        def close() -> dict:  # its workers stop when the prefetch is collected
            box.clear()
            gc.collect()
            return {"shm_size": shm_size}

        return box[0], torch_to_tinygrad, close

    return open_


# -- measuring ------------------------------------------------------------------------------------------




def epoch(open_: Callable[[], Opened], n_images: int) -> dict:
    """One epoch: the reader realises every batch and keeps only the labels (checked afterwards)."""
    cpu = cpu_seconds()
    t0 = time.perf_counter()
    it, convert, close = open_()
    labels, first, shape, convert_s, t1 = [], None, None, 0.0, t0
    try:
        for k, b in enumerate(it):
            if k == 1:
                t1 = time.perf_counter()
            if convert is not None:
                tc = time.perf_counter()
                b = convert(b)
                convert_s += time.perf_counter() - tc
            x, y = b
            x.realize(), y.realize()
            labels.append(y)
            if first is None:
                first, shape = x, (x.shape, x.dtype, x.device)
            del b, x, y
        t2 = time.perf_counter()
    finally:
        it = None
        stats = close()
    no_children("its epoch")
    cpu = cpu_seconds() - cpu
    seen = np.concatenate([y.numpy() for y in labels])
    nb = len(labels)
    if nb != n_images // BATCH or len(set(seen.tolist())) != nb * BATCH or not 0 <= seen.min() <= seen.max() < n_images:
        raise AssertionError(f"{nb} batches with labels {seen}: not distinct images of the epoch")
    from tinygrad import dtypes

    if shape[0] != (BATCH, 3, CROP, CROP) or shape[1] != dtypes.float32 or not str(shape[2]).startswith("CPU"):
        raise AssertionError(f"images arrived as {shape}")
    m = float(first.numpy().mean())  # numpy: a tinygrad reduction would start its compiler pool
    if not -2.5 < m < 2.5:
        raise AssertionError(f"normalised images have mean {m}")
    return {"seconds": t2 - t0, "steady_seconds": t2 - t1, "batches": nb, "images": nb * BATCH,
            "convert_seconds": convert_s, "cpu_seconds": cpu, "stats": stats}


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run(quick: bool = False) -> dict:
    n, rounds = (300, 2) if quick else (2000, 3)
    res: dict[str, Any] = {"scenario": "dataloader", "quick": quick, "images": n, "batch_size": BATCH,
                           "nworkers": NWORKERS, "image": f"{SIZE}x{SIZE} RGB JPEG", "crop": CROP}
    missing = [name for name, pip in (("tinygrad", "tinygrad"), ("PIL", "pillow")) if not have(name)]
    if missing:
        print(f"(the dataloader bench needs {' and '.join(missing)}: pip install 'lazyseq[bench,tinygrad]' pillow)")
        return {**res, "skipped": f"{', '.join(missing)} not installed"}
    peers = [name for name in ("torch", "seqtools") if have(name)]
    if "torch" not in peers:
        print("(torch is not installed: torch's DataLoader and the seqtools recipe (which uses torch) are skipped; "
              "pip install 'lazyseq[bench]')")
        peers = []
    elif "seqtools" not in peers:
        print("(seqtools is not installed: its recipe is skipped; pip install 'lazyseq[bench]')")
    res["peers"] = peers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    res["cores"] = cores
    folder = tempfile.mkdtemp(prefix="lazyseq-bench-images-")
    undo_pickling, torch_rows = None, None
    try:
        t = time.perf_counter()
        ds = ImageDataset(write_images(folder, n))
        kb = sum(os.path.getsize(p) for p in ds.paths) / n / 1e3
        print(f"{n} images {SIZE}x{SIZE} RGB JPEG, {kb:.1f} kB each on average, written in {time.perf_counter() - t:.1f} s "
              f"({cores} cores)")
        loaders: dict[str, Callable[[], Opened]] = {"lazyseq": open_lazyseq(ds)}
        if "torch" in peers:
            import torch

            torch.set_num_threads(1)  # the reader converts on one core; torch's workers use 1 anyway
            loaders["torch"] = open_torch(ds)
        if "seqtools" in peers:
            import torch

            had = copyreg.dispatch_table.get(torch.Tensor)
            copyreg.pickle(torch.Tensor, _pickle_tensor)  # as the recipe does, at import

            def undo_pickling() -> None:
                if had is None:
                    copyreg.dispatch_table.pop(torch.Tensor, None)
                else:
                    copyreg.dispatch_table[torch.Tensor] = had

            loaders["seqtools"] = open_seqtools(ds)
        runs: dict[str, list[dict]] = {name: [] for name in loaders}
        for _ in range(rounds):  # alternate the loaders round by round
            for name, open_ in loaders.items():
                runs[name].append(epoch(open_, n))
        if undo_pickling is not None:  # torch's own pickling again for the torch rows
            undo_pickling()
            undo_pickling = None
        if "torch" in peers:
            from . import torchrows

            torch_rows = torchrows.run_rows(ds, n, rounds, quick)
    finally:
        if undo_pickling is not None:
            undo_pickling()
        shutil.rmtree(folder, ignore_errors=True)
    rate = {k: max(r["images"] / r["seconds"] for r in v) for k, v in runs.items()}
    steady = {k: max((r["images"] - BATCH) / r["steady_seconds"] for r in v) for k, v in runs.items()}
    cpu_ms = {k: min(r["cpu_seconds"] / r["images"] for r in v) * 1e3 for k, v in runs.items()}
    best = {k: max(v, key=lambda r: r["images"] / r["seconds"]) for k, v in runs.items()}  # each loader's best round
    cores_busy = {k: r["cpu_seconds"] / (r["seconds"] * cores) for k, r in best.items()}
    conv_ms = {k: min(r["convert_seconds"] / r["batches"] for r in v) * 1e3 for k, v in runs.items()}
    imgs = runs["lazyseq"][0]["images"]
    print(f"\n{imgs} images per epoch ({imgs // BATCH} batches of {BATCH}, drop_last), decode + random crop {CROP} + flip "
          f"+ normalise,\n{NWORKERS} workers, delivered as tinygrad Tensors on the CPU; best of {rounds} rounds")
    print(f"{'':10s}{'images/s':>10s}{'lazyseq x':>11s}{'steady/s':>10s}{'lazyseq x':>11s}{'convert ms':>12s}"
          f"{'CPU ms/img':>12s}{'cores busy':>12s}")
    for k in runs:
        conv = "(inside)" if k == "lazyseq" else f"{conv_ms[k]:.2f}"
        print(f"{k:10s}{rate[k]:10.0f}{rate['lazyseq'] / rate[k]:11.2f}{steady[k]:10.0f}"
              f"{steady['lazyseq'] / steady[k]:11.2f}{conv:>12s}{cpu_ms[k]:12.2f}{cores_busy[k]:12.0%}")
    print("images/s: the whole epoch from iter(), worker start-up included; steady/s: from the second batch on;\n"
          "lazyseq x: lazyseq's figure over the row's; convert: numpy/torch batch -> tinygrad per batch in the reader;\n"
          f"CPU: reader + workers per image over the epoch; cores busy: their CPU time over {cores} cores x the epoch")
    where = where_time(best["lazyseq"])
    if where:
        print(where)
    if torch_rows is not None:
        from . import torchrows

        torchrows.show(torch_rows)
        res["torch_rows"] = torch_rows
    return {**res, "rounds": rounds, "images_per_epoch": imgs, "images_per_s": rate, "steady_images_per_s": steady,
            "ratio": {k: rate["lazyseq"] / v for k, v in rate.items()},
            "steady_ratio": {k: steady["lazyseq"] / v for k, v in steady.items()},
            "convert_ms_per_batch": {k: v for k, v in conv_ms.items() if k != "lazyseq"},
            "cpu_ms_per_image": cpu_ms, "cores_busy": cores_busy, "runs": runs}


def where_time(r: dict) -> str | None:
    """Where lazyseq's epoch went: the reader's waits and its workers' time in jobs (stats()['prefetch'])."""
    p = (r.get("stats") or {}).get("prefetch") or {}
    if "busy_seconds" not in p:
        return None
    return (f"lazyseq's best round: the reader waited for batches {p['wait_seconds']:.2f} s of the {r['seconds']:.2f} s epoch;\n"
            f"  its {NWORKERS} workers were inside jobs {p['busy_seconds']:.2f} s, "
            f"{p['busy_seconds'] / (r['seconds'] * NWORKERS):.0%} of {NWORKERS} x the epoch "
            "(the rest: start-up, the epoch's tail, waiting for a job or a free slot)")


if __name__ == "__main__":  # python -m lazyseq.bench dataloader is the entry point; this also works
    run()
