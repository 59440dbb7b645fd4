"""SPDL's image pipeline (paths -> decode and resize -> batch into one array), and I/O-bound async items.

Decode: JPEGs generated into a temporary directory (256x256, smooth colours and noise; deleted
afterwards) are decoded and resized to 224x224 with Pillow, 32 to a batch stacked into one uint8
array; a few images (one in 200) are 20 times slower than the rest (a sleep of 19 decode times:
a slow disk or a cold cache). Loaders, each with 2 workers: lazyseq ``prefetch`` with threads and
processes (shared memory), read in order and with ``unordered()``; SPDL's ``spdl.pipeline`` with
2 threads and 2 processes, ``output_order`` 'input' and 'completion'; torch's ``DataLoader``
(2 processes, ``in_order`` True and False). Images per second over one epoch, start-up included,
and the ratio to lazyseq with threads in order; plus lazyseq with a transfer stage to tinygrad
(``to_tensor`` in one thread).

Async: 1000 items that each await 10 ms of I/O: lazyseq ``prefetch(method='async', nworkers=64)``
in order and unordered, 64 worker threads (a sync sleep), and SPDL with an async op of
concurrency 64. Peers that are not installed are skipped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable

import numpy as np

SIZE, OUT, BATCH, WORKERS = 256, 224, 32, 2
SLOW_EVERY, SLOWER = 200, 20
ASYNC_ITEMS, ASYNC_SECONDS, ASYNC_WORKERS = 1000, 0.01, 64
KIND = {"thread": "threads", "process": "processes"}


def make_jpegs(root: str, n: int, size: int = SIZE, seed: int = 0) -> list[str]:
    """``n`` JPEG files of ``size`` x ``size`` in ``root``: colour gradients with noise (random
    pixels would not compress like photographs do)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    paths = []
    for k in range(n):
        a, b, c = rng.random(3)
        img = np.stack([x * 255 * a, y * 255 * b, (x + y) * 127 * c], axis=-1)
        img += rng.normal(0, 12, img.shape)
        path = os.path.join(root, f"{k:05d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


class Decode:
    """Path -> RGB uint8 array of ``out`` x ``out``; the paths in ``slow`` take ``extra`` seconds more."""

    def __init__(self, out: int = OUT, slow: Iterable[str] = (), extra: float = 0.0):
        self.out, self.slow, self.extra = out, frozenset(slow), extra

    def __call__(self, path: str) -> np.ndarray:
        from PIL import Image

        with Image.open(path) as im:
            img = np.array(im.convert("RGB").resize((self.out, self.out), Image.BILINEAR))  # (writable)
        if path in self.slow:
            time.sleep(self.extra)
        return img


def stack(images: list[np.ndarray]) -> np.ndarray:
    """One array for a batch, written straight into the job's shared-memory slot in a process worker."""
    import lazyseq as ls

    out = ls.empty((len(images), *images[0].shape), images[0].dtype)
    return np.stack(images, out=out)


# -- loaders: each returns the number of images it delivered --------------------------------------------
def lazyseq_epoch(paths: list[str], decode: Decode, method: str, unordered: bool) -> int:
    import lazyseq as ls

    batches = ls.batch(ls.smap(decode, paths), BATCH, collate_fn=stack)
    shm = 4 * BATCH * OUT * OUT * 3 + (1 << 20) if method == "process" else 0
    with ls.prefetch(batches, WORKERS, method, max_buffered=4, shm_size=shm) as p:
        return sum(len(b) for _, b in p.unordered()) if unordered else sum(len(b) for b in p)


def lazyseq_transfer_epoch(paths: list[str], decode: Decode) -> int:
    """The docs' pipeline: decode in 2 threads, transfer to tinygrad in one thread."""
    import lazyseq as ls

    batches = ls.batch(ls.smap(decode, paths), BATCH, collate_fn=np.stack)
    with ls.prefetch(batches, WORKERS, "thread", max_buffered=4) as decoded, \
            ls.prefetch(ls.smap(lambda b: ls.to_tensor(b, device="CPU"), decoded), 1, max_buffered=2) as on_device:
        return sum(int(t.shape[0]) for t in on_device)


def spdl_epoch(paths: list[str], decode: Decode, method: str, order: str) -> int:
    from concurrent.futures import ProcessPoolExecutor

    from spdl.pipeline import PipelineBuilder

    executor = ProcessPoolExecutor(WORKERS) if method == "process" else None
    try:
        pipeline = (PipelineBuilder().add_source(paths)
                    .pipe(decode, concurrency=WORKERS, executor=executor, output_order=order)
                    .aggregate(BATCH).pipe(np.stack).add_sink(3).build(num_threads=WORKERS))
        with pipeline.auto_stop():
            return sum(len(b) for b in pipeline.get_iterator(timeout=60))
    finally:
        if executor is not None:
            executor.shutdown()


class _Images:  # a torch map-style dataset (a plain class: torch's Dataset adds nothing needed here)
    def __init__(self, paths: list[str], decode: Decode):
        self.paths, self.decode = paths, decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.decode(self.paths[i])


def torch_epoch(paths: list[str], decode: Decode, in_order: bool) -> int:
    from torch.utils.data import DataLoader

    loader = DataLoader(_Images(paths, decode), batch_size=BATCH, num_workers=WORKERS, in_order=in_order,
                        prefetch_factor=2)
    return sum(len(b) for b in loader)


# -- async ---------------------------------------------------------------------------------------
async def fetch(i: int) -> int:
    await asyncio.sleep(ASYNC_SECONDS)
    return i


def wait(i: int) -> int:
    time.sleep(ASYNC_SECONDS)
    return i


def async_runs(n: int, spdl: bool) -> dict[str, Callable[[], int]]:
    import lazyseq as ls

    def lazy(method: str, f: Callable, unordered: bool) -> Callable[[], int]:
        def go() -> int:
            with ls.prefetch(ls.smap(f, range(n)), ASYNC_WORKERS, method) as p:
                return len(list(p.unordered())) if unordered else len(list(p))
        return go

    runs = {"lazyseq async": lazy("async", fetch, False), "lazyseq async unordered": lazy("async", fetch, True),
            "lazyseq 64 threads": lazy("thread", wait, False)}
    if spdl:
        def spdl_async() -> int:
            from spdl.pipeline import PipelineBuilder

            pipeline = (PipelineBuilder().add_source(range(n)).pipe(fetch, concurrency=ASYNC_WORKERS)
                        .add_sink(64).build(num_threads=1))
            with pipeline.auto_stop():
                return sum(1 for _ in pipeline.get_iterator(timeout=60))
        runs["spdl async"] = spdl_async
    return runs


# -- the run -------------------------------------------------------------------------------------
def _installed(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _time(f: Callable[[], int], expected: int) -> float:
    t = time.perf_counter()
    got = f()
    seconds = time.perf_counter() - t
    assert got == expected, (got, expected)
    return seconds


def run(quick: bool = False) -> dict:
    """Run the decode part (needs Pillow) and the async part; a missing peer (spdl, torch) or Pillow
    is said so and skipped, the rest runs. Returns the results."""
    n = 128 if quick else 2000
    peers = {"spdl": _installed("spdl.pipeline"), "torch": _installed("torch")}
    for name, pip in (("spdl", "spdl==0.8.0"), ("torch", "torch==2.13.0")):
        if not peers[name]:
            print(f"({name} is not installed: skipped; pip install 'lazyseq[bench]' (or {pip!r}) to compare with it)")
    res = {"scenario": "spdl", "quick": quick, "peers": [k for k, v in peers.items() if v],
           "skipped": [k for k, v in peers.items() if not v]}
    if _installed("PIL"):
        res.update(decode_part(n, peers))
    else:
        print("(Pillow is not installed: the decode part is skipped; pip install 'lazyseq[bench]' (or pillow))")
        res["decode_skipped"] = "Pillow not installed"

    m = 200 if quick else ASYNC_ITEMS
    async_seconds = {name: _time(f, m) for name, f in async_runs(m, peers["spdl"]).items()}
    print(f"async: {m} items x {ASYNC_SECONDS * 1e3:.0f} ms of awaited I/O, {ASYNC_WORKERS} at once: seconds")
    for name, s in async_seconds.items():
        print(f"  {name:40s} {s:9.3f} s  ({m / s:.0f} items/s)")
    res["async"] = {"items": m, "seconds": async_seconds, "ideal_seconds": m * ASYNC_SECONDS / ASYNC_WORKERS}
    return res


def decode_part(n: int, peers: dict[str, bool]) -> dict:
    """The decode part: ``n`` generated JPEGs read by every installed loader, one epoch each."""
    root = tempfile.mkdtemp(prefix="lazyseq-spdl-")
    try:
        paths = make_jpegs(root, n)
        plain = Decode()
        per_image = statistics.median(_time(lambda p=p: int(plain(p).size > 0), 1) for p in paths[:30])
        decode = Decode(slow=paths[SLOW_EVERY // 2 :: SLOW_EVERY], extra=(SLOWER - 1) * per_image)
        runs: dict[str, Callable[[], int]] = {}
        for method in ("thread", "process"):
            for unordered in (False, True):
                runs[f"lazyseq {KIND[method]}{' unordered' if unordered else ''}"] = \
                    lambda m=method, u=unordered: lazyseq_epoch(paths, decode, m, u)
        if peers["spdl"]:
            for method in ("thread", "process"):
                for order in ("input", "completion"):
                    runs[f"spdl {KIND[method]} {order}"] = lambda m=method, o=order: spdl_epoch(paths, decode, m, o)
        if peers["torch"]:
            for in_order in (True, False):
                runs[f"torch DataLoader{'' if in_order else ' in_order=False'}"] = \
                    lambda o=in_order: torch_epoch(paths, decode, o)
        if _installed("tinygrad"):
            runs["lazyseq threads + to_tensor stage"] = lambda: lazyseq_transfer_epoch(paths, decode)
        else:
            print("(tinygrad is not installed: the to_tensor row is skipped; pip install 'lazyseq[tinygrad]')")
        seconds = {name: _time(f, n) for name, f in runs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    images_per_s = {name: n / s for name, s in seconds.items()}
    base = images_per_s["lazyseq threads"]
    ratio = {name: v / base for name, v in images_per_s.items()}
    print(f"decode {n} JPEGs {SIZE}->{OUT}, batch {BATCH}, {WORKERS} workers, 1 in {SLOW_EVERY} images {SLOWER}x "
          f"slower (decode: {per_image * 1e3:.2f} ms/image): images/s (ratio to lazyseq threads)")
    for name, v in images_per_s.items():
        print(f"  {name:40s} {v:9.0f}  ({ratio[name]:.2f}x)")
    return {"images": n, "decode_ms_per_image": per_image * 1e3, "images_per_s": images_per_s,
            "ratio_to_lazyseq_threads": ratio}
