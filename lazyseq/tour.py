"""``python -m lazyseq.tour``: compose a lazy input pipeline over synthetic images and use it.

Builds 100,000 synthetic 32x32 RGB "images" that exist only as a function of their index, then
augments, shuffles per epoch, shards, batches and collates them, reading items at random along the
way. Needs only numpy; runs in a second or two.
"""

from __future__ import annotations

import time

import numpy as np

import lazyseq

N_ITEMS = 100_000
SIZE = 32
BATCH = 256
RANKS = 4

_YY, _XX = np.mgrid[0:SIZE, 0:SIZE]
MEAN = np.array([0.5, 0.5, 0.5], dtype=np.float32)
STD = np.array([0.25, 0.25, 0.25], dtype=np.float32)


def render(i: int) -> np.ndarray:
    """Synthetic image ``i``: a stripe pattern whose frequency is its label, ``(32, 32, 3) uint8``."""
    label = i % 10
    plane = ((_XX * (label + 1) + _YY * (i % 7) + i) % 256).astype(np.uint8)
    return np.stack([plane, plane.T, 255 - plane], axis=-1)


def label_of(i: int) -> int:
    return i % 10


def augment(sample: tuple[np.ndarray, int]) -> tuple[np.ndarray, int]:
    """Normalise to float32, channels first, and mirror odd labels."""
    img, label = sample
    x = (img.astype(np.float32) / 255 - MEAN) / STD
    if label % 2:
        x = x[:, ::-1]
    return np.ascontiguousarray(x.transpose(2, 0, 1)), label


def stack(samples: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Collate a list of ``(image, label)`` into ``(images[B, 3, 32, 32], labels[B])``."""
    xs, ys = zip(*samples)
    return np.stack(xs), np.array(ys, dtype=np.int64)


def epoch_batches(samples, epoch: int, rank: int, world: int, seed: int = 0):
    """One rank's batches for one epoch: a fresh order every epoch, then a disjoint shard."""
    shuffled = lazyseq.shuffle(samples, seed=seed, epoch=epoch)
    mine = lazyseq.shard(shuffled, rank, world, drop_remainder=True)
    return shuffled, lazyseq.batch(mine, BATCH, drop_last=True, collate_fn=stack)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} us"


def main() -> None:
    print(f"lazyseq {lazyseq.__version__} demo: a lazy pipeline over {N_ITEMS:,} synthetic {SIZE}x{SIZE} RGB images\n")

    t = time.perf_counter()
    ids = lazyseq.arange(N_ITEMS)
    images = lazyseq.smap(render, ids)
    labels = lazyseq.smap(label_of, ids)
    samples = lazyseq.smap(augment, lazyseq.collate([images, labels]))
    built = time.perf_counter() - t
    print(f"1. built sources and augmentation in {_us(built)}: nothing is rendered until it is read")

    i = 12345
    t = time.perf_counter()
    img = images[i]
    took = time.perf_counter() - t
    print(f"2. random access: images[{i}] -> {img.shape} {img.dtype}, label {labels[i]}, rendered in {_us(took)}")
    x, y = samples[i]
    print(f"   item {i} at every stage: ids -> {ids[i]}, images -> {img.shape} {img.dtype}, "
          f"samples -> {x.shape} {x.dtype} label {y}, mean {x.mean():+.3f}")
    print(f"   negative keys and slices are lazy too: samples[-1] label {samples[-1][1]}, "
          f"len(samples[::1000]) = {len(samples[::1000])}")

    print(f"\n3. per-epoch shuffle, shard for rank 0 of {RANKS}, batches of {BATCH} collated with np.stack")
    for epoch in range(3):
        shuffled, batches = epoch_batches(samples, epoch, rank=0, world=RANKS)
        print(f"   epoch {epoch}: reads source items {shuffled.order()[:5]}...  -> {len(batches)} batches")
    xb, yb = batches[40]
    print(f"   batches[40] without reading batches 0-39: images {xb.shape} {xb.dtype}, labels {yb[:8]}...")

    print("\n4. the pipeline, as repr shows it:")
    print("   " + repr(batches).replace("\n", "\n   "))

    monitored = lazyseq.instrument.monitor_throughput(batches)
    t = time.perf_counter()
    counts = np.zeros(10, dtype=np.int64)
    for _images, yb in monitored:
        counts += np.bincount(yb, minlength=10)
    took = time.perf_counter() - t
    n = int(counts.sum())
    print(f"\n5. a full pass over rank 0's epoch: {len(batches)} batches, {n:,} images in {took:.2f} s "
          f"({n / took:,.0f} images/s, {monitored.read_delay() * 1e3:.2f} ms per batch)")
    print(f"   images per label: {counts.min():,} to {counts.max():,} (the shuffle mixes the classes evenly)")
    print("\ndone.")


if __name__ == "__main__":
    main()
