"""``python -m lazyseq.demo``: train a small tinygrad model on real data through a lazyseq DataLoader.

The data set is scikit-learn's bundled digits (1797 handwritten 8x8 images, no network needed).
Training images are read at random, augmented in worker processes (random shifts and noise; the
DataLoader seeds numpy's generator differently in every worker), stacked into batches inside
shared-memory slots and handed to tinygrad as Tensors. Prints a progress bar per epoch and the
test accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import lazyseq
from lazyseq import cc


class Digits:
    """The digits images (float32 in [0, 1], 1x8x8) and labels, optionally augmented."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool):
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int32]:
        img = self.images[i]
        if self.augment:
            dy, dx = np.random.randint(-1, 2, size=2)
            img = np.roll(img, (dy, dx), axis=(0, 1))  # shift by up to a pixel each way
            img = img + np.random.normal(0, 0.05, img.shape).astype(np.float32)
        return img.reshape(1, 8, 8).astype(np.float32), np.int32(self.labels[i])


def load(seed: int) -> tuple[Digits, Digits]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("the demo needs scikit-learn, tqdm and tinygrad: pip install 'lazyseq[demo]'")
    d = load_digits()
    images, labels = (d.images / 16.0).astype(np.float32), d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    test, train = order[:360], order[360:]
    return Digits(images[train], labels[train], augment=True), Digits(images[test], labels[test], augment=False)


def model():
    from tinygrad import nn

    class Net:
        def __init__(self):
            self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
            self.l1 = nn.Linear(32 * 4 * 4, 10)

        def __call__(self, x):
            x = self.c1(x).relu()
            x = self.c2(x).relu().max_pool2d(2)
            return self.l1(x.flatten(1))

    return Net()


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(prog="python -m lazyseq.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="worker processes (0: load in the main process)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    try:  # clang, or pip's ziglang through lazyseq's shim, before tinygrad compiles anything
        cc.check_device("python -m lazyseq.demo")
    except ImportError:
        sys.exit("the demo needs scikit-learn, tqdm and tinygrad: pip install 'lazyseq[demo]'")
    except cc.CompilerNotFound as e:
        sys.exit(str(e))
    from tinygrad import Context, Tensor, TinyJit, nn
    from tqdm import tqdm

    Tensor.manual_seed(args.seed)
    np.random.seed(args.seed)
    train, test = load(args.seed)
    net = model()
    params = nn.state.get_parameters(net)
    opt = nn.optim.Adam(params, lr=args.lr)

    @TinyJit
    @Context(TRAINING=1)
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = net(x).sparse_categorical_crossentropy(y).backward()
        opt.step()
        return loss

    loader = lazyseq.DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=args.seed,
                                num_workers=args.workers, persistent_workers=args.workers > 0)
    print(f"digits: {len(train)} training images, {len(test)} test images; "
          f"{args.workers} worker processes, batches of {args.batch_size}")
    print(repr(loader.make_sequence()).replace("\n", "\n  "))
    t0 = time.perf_counter()
    with loader:
        for epoch in range(args.epochs):
            bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch", leave=True)
            for x, y in bar:
                loss = step(x, y)
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        stats = loader.stats()
    xs, ys = next(iter(lazyseq.DataLoader(test, batch_size=len(test))))
    accuracy = float((net(xs).argmax(axis=1) == ys).mean().item())
    print(f"test accuracy: {accuracy:.1%} after {args.epochs} epochs in {time.perf_counter() - t0:.1f} s")
    p = stats.get("prefetch", {})
    if p:
        print(f"shared memory {stats['shm']}\n  {p['bytes_shm'] / 2**20:.1f} MiB through slots, "
              f"{p['bytes_pipe'] / 2**20:.2f} MiB through the pipe, {p['fallbacks']} fallbacks")
    return accuracy


if __name__ == "__main__":
    main()
