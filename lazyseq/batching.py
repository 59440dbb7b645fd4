"""Batching samples: ``default_collate`` (torch's rule, stacking straight into shared memory in a
process worker) and the byte count of a sample, which sizes the DataLoader's slots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import tree
from .evaluation import empty

__all__ = ["default_collate", "buffer_bytes"]


def default_collate(items: Sequence[Any]) -> Any:
    """Stack a list of samples into a batch: arrays and numbers become one array with a leading
    batch axis, recursing into tuples, lists, dicts and namedtuples (the rule of
    :mod:`lazyseq.tree`); strings and other objects stay a list.

    Inside a process worker the stacked arrays are built in the job's shared-memory slot
    (:func:`lazyseq.empty`), so the batch is copied once, straight to where the reader sees it.

    >>> import lazyseq, numpy as np
    >>> b = lazyseq.default_collate([(np.zeros((2, 2)), 1), (np.ones((2, 2)), 0)])
    >>> b[0].shape, b[1]
    ((2, 2, 2), array([1, 0]))
    >>> lazyseq.default_collate([{'x': 1.5, 'name': 'a'}, {'x': 2.5, 'name': 'b'}])
    {'x': array([1.5, 2.5]), 'name': ['a', 'b']}
    """
    try:
        return tree.transpose(_stack, items, "sample")
    except ValueError as e:
        raise ValueError(f"default_collate: {e}; make the samples alike or pass a collate_fn") from None


default_collate.by_columns = True  # a batch of a store is read by columns (views.shape.Batch._columns)


def _stack(xs: list) -> Any:
    first = xs[0]
    if isinstance(first, (str, bytes)):
        return xs
    if isinstance(first, np.ndarray) or (hasattr(first, "__array__") and not np.isscalar(first)):
        a = np.asarray(first)
        for k, x in enumerate(xs):
            if np.shape(x) != a.shape:
                raise ValueError(f"sample 0 has shape {a.shape} but sample {k} has shape {np.shape(x)}")
        out = empty((len(xs), *a.shape), a.dtype)
        np.stack(xs, out=out)
        return out
    if isinstance(first, (bool, int, float, complex, np.generic)):
        return np.array(xs)
    return xs


def buffer_bytes(x: Any) -> tuple[int, int]:
    """Bytes and count of the array buffers in a (nested) sample: a number counts 8 bytes."""
    nbytes = nbuf = 0
    for v in tree.leaves(x):
        if isinstance(v, (bool, int, float, complex, np.generic)):
            nbytes, nbuf = nbytes + 8, nbuf + 1
        elif isinstance(v, np.ndarray) or (hasattr(v, "__array__") and not isinstance(v, (str, bytes))):
            nbytes, nbuf = nbytes + np.asarray(v).nbytes, nbuf + 1
    return nbytes, nbuf
