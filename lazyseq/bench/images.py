"""The images of ``python -m lazyseq.bench dataloader``: the JPEG files, the dataset that decodes
and augments them, torch's DataLoader over it, and the reader-side counters (CPU time, children
left), shared by the tinygrad rows (:mod:`lazyseq.bench.dataloader`) and the torch rows
(:mod:`lazyseq.bench.torchrows`)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

NWORKERS = 2
BATCH = 64
SIZE = 224  # the stored images
CROP = 192  # what the augmentation returns
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255
BATCH_BYTES = BATCH * 3 * CROP * CROP * 4  # the images of one batch, float32


def write_images(folder: str, n: int, seed: int = 0) -> list[str]:
    """``n`` JPEG files of 224x224 RGB: a bicubic-upsampled 14x14 random field plus noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        small = Image.fromarray(rng.integers(0, 256, (14, 14, 3), dtype=np.uint8))
        img = np.asarray(small.resize((SIZE, SIZE), Image.BICUBIC), np.int16)
        img = np.clip(img + rng.integers(-12, 13, img.shape, dtype=np.int16), 0, 255).astype(np.uint8)
        path = os.path.join(folder, f"{i:06d}.jpg")
        Image.fromarray(img).save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


class ImageDataset:
    """A map-style dataset: item ``i`` is (file ``i`` decoded and augmented, ``i``)."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self.scale = (1 / STD)[:, None, None]
        self.shift = (MEAN / STD)[:, None, None]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if not 0 <= i < len(self.paths):
            raise IndexError(i)
        from PIL import Image

        with Image.open(self.paths[i]) as f:
            img = np.asarray(f.convert("RGB"))  # HWC uint8
        y, x = np.random.randint(0, SIZE - CROP + 1, 2)
        img = img[y : y + CROP, x : x + CROP]
        if np.random.random() < 0.5:
            img = img[:, ::-1]
        out = img.transpose(2, 0, 1).astype(np.float32)  # CHW
        out *= self.scale
        out -= self.shift
        return out, i


Opened = tuple[Iterator, Callable[[Any], Any] | None, Callable[[], dict]]


def torch_to_tinygrad(b: Any) -> Any:
    from lazyseq.loader.tensor import to_tensor

    x, y = b
    return to_tensor((x.numpy(), y.numpy()), device="CPU")


def open_torch(ds: ImageDataset, convert: Callable | None = None) -> Callable[[], Opened]:
    """torch's DataLoader; its batches turned into tinygrad Tensors by ``convert`` (default) or
    left torch tensors (``convert=False``: the torch rows)."""
    convert = torch_to_tinygrad if convert is None else convert or None

    def open_() -> Opened:
        from torch.utils.data import DataLoader

        it = iter(DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=NWORKERS, drop_last=True,
                             multiprocessing_context="fork"))
        box = [it]

        def close() -> dict:
            shutdown = getattr(box.pop(), "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            gc.collect()
            return {}

        return it, convert, close

    return open_


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have exited and been joined."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def no_children(where: str) -> None:
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:  # joins the ones that exited
        time.sleep(0.01)
    left = multiprocessing.active_children()
    if left:
        raise RuntimeError(f"bench dataloader: {where} left child processes running: {left}")
