"""``lazyseq.megatron.blend``: several GPT sample sets mixed by weight, item for item those of
tinygrad's MLPerf ``BlendedGPTDataset``.

As tinygrad does: the weights are normalised (``w / sum(weights)``); dataset ``k`` is
``gpt(datasets[k], ceil(ceil(num_samples * w_k) * 1.005), seq_length, seed=seed + k, shuffle)``;
sample ``i`` of the blend goes to the dataset with the largest error ``w_k * max(i, 1) - count_k``
(the first on a tie; dataset 0 when no error is positive), and is that dataset's next sample.

That rule is sequential (each choice depends on all before it), so :func:`assign` runs it as one
short loop written out for the number of datasets (locals only, about 0.5 us a sample), with
tinygrad's float64 operations in its order, so ties and rounding come out the same; the rest
is vectorised. A cached assignment is checked completely and cheaply: the greedy assignment is
the only sequence whose every choice, recomputed from its own running counts (vectorised), is
itself (:func:`is_greedy`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.base import View
from . import cache
from .samples import GPT, check_int

__all__ = ["Blend", "blend", "assign", "is_greedy", "weights_and_counts"]

SURPLUS = 0.005
_BLOCK = 1 << 16


def weights_and_counts(weights: Sequence[float], num_samples: int) -> tuple[list[float], list[int]]:
    """The normalised weights and the samples asked of each dataset, computed as tinygrad does."""
    total = sum(weights)
    w = [x / total for x in weights]
    return w, [math.ceil(math.ceil(num_samples * x) * (1 + SURPLUS)) for x in w]


def _choices(w: np.ndarray, a: np.ndarray, start: int, counts: np.ndarray) -> np.ndarray:
    """The greedy choice at each step ``start + j``, computed from the picks ``a`` before it and the
    ``counts`` at ``start``, vectorised (tinygrad's float64 operations, in its order)."""
    k = len(w)
    running = np.empty((len(a), k), np.int64)
    for d in range(k):
        hit = (a == d).astype(np.int64)
        running[:, d] = np.cumsum(hit) - hit + counts[d]
    x = np.maximum(np.arange(start, start + len(a), dtype=np.int64), 1).astype(np.float64)
    err = w[None, :] * x[:, None] - running.astype(np.float64)
    best = err.argmax(axis=1)  # the first of equal errors
    best[err.max(axis=1) <= 0.0] = 0
    return best


def is_greedy(weights: Sequence[float], dataset_idx: np.ndarray) -> bool:
    """Whether ``dataset_idx`` is the greedy assignment for ``weights``: it is the one sequence whose
    every choice, recomputed from its own running counts, is itself (checked in blocks)."""
    w, k = np.asarray(weights, np.float64), len(weights)
    counts = np.zeros(k, np.int64)
    for i in range(0, len(dataset_idx), _BLOCK):
        a = dataset_idx[i : i + _BLOCK].astype(np.int64)
        if a.min() < 0 or a.max() >= k or not np.array_equal(_choices(w, a, i, counts), a):
            return False
        counts += np.bincount(a, minlength=k)
    return True


def _loop(k: int):
    """The greedy loop for ``k`` datasets, written out (locals, no lists: ~0.5 us a sample)."""
    ws, cs = ", ".join(f"w{d}" for d in range(k)), ", ".join(f"c{d}" for d in range(k))
    lines = [f"def run(n, {ws}, out):", f"    {cs} = {', '.join(['0'] * k)}",
             "    for i in range(n):", "        x = i or 1", "        best, top = 0, 0.0"]
    for d in range(k):
        lines += [f"        e = w{d} * x - c{d}", "        if e > top:", f"            best, top = {d}, e"]
    lines.append("        out[i] = best")
    if k == 1:
        lines.append("        c0 += 1")
    for d in range(k if k > 1 else 0):
        lines += [f"        {'if' if d == 0 else 'elif'} best == {d}:" if d < k - 1 else "        else:",
                  f"            c{d} += 1"]
    scope: dict = {}
    exec("\n".join(lines), scope)  # our own text, made from k alone
    return scope.pop("run")  # (left in its globals, it and they would be a reference cycle)


def assign(weights: Sequence[float], num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_idx, dataset_sample_idx)`` of tinygrad's ``BlendedGPTDataset._build_blend_idx``
    for the normalised ``weights``: the sequential rule, exactly, one short loop a sample; the
    per-dataset sample numbers vectorised."""
    k, n = len(weights), num_samples
    if k > 255:
        raise ValueError(f"lazyseq.megatron.blend: {k} datasets; at most 255 are blended")
    out = bytearray(n)
    _loop(k)(n, *[float(x) for x in weights], out)
    dataset_idx = np.frombuffer(out, np.uint8).astype(np.int16)
    sample = np.zeros(n, np.int64)
    for d in range(k):
        where = np.flatnonzero(dataset_idx == d)
        sample[where] = np.arange(len(where))
    return dataset_idx, sample


def _check(weights: list[float], num_samples: int):
    k = len(weights)

    def check(dataset_idx: np.ndarray, dataset_sample_idx: np.ndarray) -> None:
        if num_samples and not is_greedy(weights, dataset_idx):
            raise ValueError("dataset_idx is not the greedy assignment")
        for d in range(k):
            where = dataset_idx == d
            if not np.array_equal(dataset_sample_idx[where], np.arange(int(where.sum()))):
                raise ValueError("dataset_sample_idx does not count each dataset's samples")
    return check


class Blend(View):
    fingerprint_skip = ("cache", "cache_dir")  # where the index is cached decides no sample
    """GPT samples of several corpora, mixed by weight: see :func:`blend`."""

    checks_keys = False

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float], num_samples: int, seq_length: int, *,
                 seed: int = 0, shuffle: bool = True, cache: bool = True, cache_dir: str | os.PathLike | None = None,
                 **remote: Any):
        if isinstance(datasets, (str, os.PathLike)) or len(datasets) != len(weights) or not len(datasets):
            raise ValueError("lazyseq.megatron.blend: give a list of datasets and a list of as many weights")
        if any(not isinstance(x, (int, float, np.integer, np.floating)) or not math.isfinite(x) or x < 0 for x in weights) \
                or not sum(weights) > 0:
            raise ValueError(f"lazyseq.megatron.blend: weights must be finite, >= 0 and not all 0, got {list(weights)}")
        self.num_samples = check_int(num_samples, "lazyseq.megatron.blend: num_samples", 0)
        seed = check_int(seed, "lazyseq.megatron.blend: seed", 0, 2**32 - len(datasets))
        self.weights, per = weights_and_counts([float(x) for x in weights], self.num_samples)
        self.parts = tuple(GPT(d, per[k], seq_length, seed=seed + k, shuffle=shuffle, cache=cache, cache_dir=cache_dir,
                               **remote) for k, d in enumerate(datasets))
        self.seq_length, self.seed, self.shuffle, self.cache, self.cache_dir = seq_length, seed, bool(shuffle), cache, cache_dir
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()

    def __reduce__(self):  # the indices go with the view (and with each part), built once, here
        return (_restore, (self.__dict__ | {"_lock": None, "_index": self.index()},))

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset_idx, dataset_sample_idx)`` as tinygrad's ``BlendedGPTDataset`` has them."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    for part in self.parts:  # every corpus checked first: a StoreError before anything is built
                        part.plan()
                    params = {"weights": self.weights, "num_samples": self.num_samples}
                    n = self.num_samples
                    spec = [("dataset_idx", "<i2", (n,)), ("dataset_sample_idx", "<i8", (n,))]
                    self._index = tuple(cache.cached("blend", self.parts[0].docs, params, spec,
                                                     lambda: assign(self.weights, n), _check(self.weights, n),
                                                     self.cache_dir, self.cache))
        return self._index

    def _len(self) -> int:
        return self.num_samples

    def _get(self, i: int) -> np.ndarray:
        dataset_idx, sample_idx = self.index()
        part = self.parts[int(dataset_idx[i])]
        j = int(sample_idx[i])
        if j >= part.num_samples:
            raise IndexError(f"sample {i} of the blend is sample {j} of dataset {int(dataset_idx[i])}, "
                             f"which has {part.num_samples}")
        return part._get(j)

    def children(self) -> tuple:
        return self.parts

    def describe(self) -> str:
        w = ", ".join(f"{x:.3g}" for x in self.weights)
        return f"megatron.blend(weights=[{w}], num_samples={self.num_samples}, seed={self.seed}, shuffle={self.shuffle})"


def _restore(state: dict) -> Blend:
    v = object.__new__(Blend)
    v.__dict__.update(state)
    v._lock = threading.Lock()
    return v


def blend(datasets: Sequence[Any], weights: Sequence[float], num_samples: int, seq_length: int, *, seed: int = 0,
          shuffle: bool = True, cache: bool = True, cache_dir: str | os.PathLike | None = None,
          storage_options: dict | None = None, block_cache: int = 64 * 2**20, timeout: float = 30.0) -> Blend:
    """``num_samples`` GPT samples drawn from several corpora by weight, item for item those of
    tinygrad's MLPerf ``BlendedGPTDataset(paths, weights, num_samples, seq_length, seed, shuffle).get(i)``.

    ``datasets`` are :func:`indexed` views or prefixes. Dataset ``k`` gives
    :func:`gpt` samples (``seed + k``) and is asked for its share of ``num_samples`` plus 0.5%;
    sample ``i`` comes from the dataset furthest behind its weight (``w_k * max(i, 1) - count_k``,
    the first on a tie), as in tinygrad. The assignment is exact and built with vectorised
    passes at the first read, then cached like the samples' index (see :func:`gpt`). Prefixes may
    be URLs, opened with ``storage_options``, ``block_cache`` and ``timeout`` (see :func:`gpt`).

    >>> import tempfile, os
    >>> from lazyseq import megatron
    >>> d = tempfile.mkdtemp()
    >>> megatron.write(os.path.join(d, 'a'), [np.arange(50)])
    >>> megatron.write(os.path.join(d, 'b'), [np.arange(1000, 1050)])
    >>> mixed = megatron.blend([os.path.join(d, 'a'), os.path.join(d, 'b')], [3, 1], 8, 4, shuffle=False)
    >>> [int(s[0]) for s in mixed]
    [0, 1000, 4, 8, 12, 1004, 16, 20]
    """
    return Blend(datasets, weights, num_samples, seq_length, seed=seed, shuffle=shuffle, cache=cache,
                 cache_dir=cache_dir, storage_options=storage_options, block_cache=block_cache, timeout=timeout)
