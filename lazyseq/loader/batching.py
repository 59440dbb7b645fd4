"""Batching samples: ``default_collate`` (torch's rule, stacking straight into shared memory in a
process worker), ``pad_collate`` and ``varlen_collate`` for variable-length sequences, and the
byte count of a sample, which sizes the DataLoader's slots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import tree
from ..evaluation import empty

__all__ = ["default_collate", "pad_collate", "varlen_collate", "HostInt", "buffer_bytes"]


# The docstring below is part of default_collate's code digest, which an interrupted save's job
# file records (lazyseq.fingerprint(..., code=True)): it keeps its words of before the layout by
# layer (lazyseq.tree is lazyseq.core.tree), so that such a save resumes.
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
    """Bytes and count of the array buffers in a (nested) sample: a number counts 8 bytes; a
    ``bytes`` value its length (a batch's list of them travels as one buffer in the slot)."""
    nbytes = nbuf = 0
    for v in tree.leaves(x):
        if isinstance(v, (bool, int, float, complex, np.generic)):
            nbytes, nbuf = nbytes + 8, nbuf + 1
        elif isinstance(v, (bytes, bytearray)):
            nbytes, nbuf = nbytes + len(v), nbuf + 1
        elif isinstance(v, np.ndarray) or (hasattr(v, "__array__") and not isinstance(v, (str, bytes))):
            nbytes, nbuf = nbytes + np.asarray(v).nbytes, nbuf + 1
    return nbytes, nbuf


# -- variable-length sequences ----------------------------------------------------------------------
class HostInt(int):
    """A Python ``int`` that :func:`lazyseq.to_tensor` leaves as it is: a kernel argument such as
    ``varlen_collate``'s ``max_seqlen``, not data for the device."""

    __slots__ = ()

    def __reduce__(self):
        return (HostInt, (int(self),))


def _is_seq(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.ndim == 1


def _by_leaf(items: Sequence[Any], fn: Any, what: str) -> Any:
    """``fn`` of the 1-D array leaves of ``items`` (a list of them per leaf), ``default_collate`` of the others."""
    if not len(items):
        raise ValueError(f"{what}: no items")
    return tree.transpose(lambda xs: fn(xs) if all(map(_is_seq, xs)) else _stack(xs), list(items), "item")


def pad_collate(items: Sequence[Any], pad_id: Any = 0, pad_to_multiple: int = 1, length: int | None = None) -> Any:
    """Pad 1-D arrays of different lengths into one batch: ``{'tokens': (B, L), 'mask': (B, L)
    bool, 'lengths': (B,) int32}``, ``L`` the longest (or ``length``) rounded up to
    ``pad_to_multiple``, padding ``pad_id``. Items may be dicts or tuples: each leaf that is a 1-D
    array becomes such a dict, other leaves go through :func:`default_collate`. A ``length``
    shorter than the longest item raises. In a process worker the batch is built in its slot.

    >>> import lazyseq, numpy as np
    >>> b = lazyseq.pad_collate([np.array([1, 2, 3]), np.array([4])], pad_to_multiple=4)
    >>> b['tokens'], b['mask'][1], b['lengths']
    (array([[1, 2, 3, 0],
           [4, 0, 0, 0]]), array([ True, False, False, False]), array([3, 1], dtype=int32))
    >>> lazyseq.pad_collate([(np.array([5, 6]), 1), (np.array([7]), 0)])[1]
    array([1, 0])
    """
    if isinstance(pad_to_multiple, bool) or pad_to_multiple < 1:
        raise ValueError(f"pad_collate: pad_to_multiple must be an int >= 1, got {pad_to_multiple!r}")

    def pad(xs: list) -> dict:
        sizes = np.array([len(x) for x in xs], dtype=np.int32)
        longest = int(sizes.max())
        if length is not None and length < longest:
            k = int(sizes.argmax())
            raise ValueError(f"pad_collate: item {k} has {longest} tokens, more than length={length}")
        n = -(-(longest if length is None else length) // pad_to_multiple) * pad_to_multiple
        tokens = empty((len(xs), n), np.result_type(*xs))
        tokens[...] = pad_id
        for k, x in enumerate(xs):
            tokens[k, : len(x)] = x
        mask = empty((len(xs), n), np.bool_)
        np.less(np.arange(n), sizes[:, None], out=mask)
        out_sizes = empty((len(xs),), np.int32)
        out_sizes[:] = sizes
        return {"tokens": tokens, "mask": mask, "lengths": out_sizes}

    return _by_leaf(items, pad, "pad_collate")


_PACK_ROW = frozenset(("tokens", "segment_ids", "positions"))


def varlen_collate(items: Sequence[Any]) -> Any:
    """Concatenate 1-D arrays into the layout of variable-length attention kernels:
    ``{'tokens': (N,), 'cu_seqlens': (B+1,) int32, 'positions': (N,) int32, 'max_seqlen': int}``
    (sequence ``k`` is ``tokens[cu_seqlens[k]:cu_seqlens[k+1]]``). Rows of :func:`pack` are taken
    apart: their segments become the sequences, padding is dropped. Items may be dicts or tuples:
    each leaf that is a 1-D array becomes such a dict, others go through :func:`default_collate`.
    ``max_seqlen`` is a :class:`HostInt`: ``to_tensor`` leaves it a Python int.

    >>> import lazyseq, numpy as np
    >>> v = lazyseq.varlen_collate([np.array([1, 2, 3]), np.array([4, 5])])
    >>> v['tokens'], v['cu_seqlens'], v['positions'], v['max_seqlen']
    (array([1, 2, 3, 4, 5]), array([0, 3, 5], dtype=int32), array([0, 1, 2, 0, 1], dtype=int32), 3)
    >>> rows = lazyseq.pack([np.arange(1, 4), np.arange(4, 6)], 4, method='concat')
    >>> lazyseq.varlen_collate(list(rows))['cu_seqlens']
    array([0, 3, 4, 5], dtype=int32)
    """
    items = list(items)
    if items and all(isinstance(x, dict) and x.keys() == _PACK_ROW for x in items):
        return _varlen_rows(items)
    return _by_leaf(items, _varlen, "varlen_collate")


def _varlen(xs: list) -> dict:
    sizes = np.array([len(x) for x in xs], dtype=np.int64)
    return _varlen_out(np.concatenate(xs) if xs else np.zeros(0), sizes)


def _varlen_rows(rows: list[dict]) -> dict:
    """The segments of pack rows as sequences: runs of one segment id, padding (0) dropped."""
    tokens, segs = np.concatenate([r["tokens"] for r in rows]), np.concatenate([r["segment_ids"] for r in rows])
    row_of = np.repeat(np.arange(len(rows)), [len(r["segment_ids"]) for r in rows])
    keep = segs != 0
    tokens, segs, row_of = tokens[keep], segs[keep], row_of[keep]
    new = np.ones(len(segs), dtype=bool)  # where a sequence starts: a new segment id, or a new row
    new[1:] = (segs[1:] != segs[:-1]) | (row_of[1:] != row_of[:-1])
    starts = np.flatnonzero(new)
    return _varlen_out(tokens, np.diff(np.append(starts, len(segs))))


def _varlen_out(tokens: np.ndarray, sizes: np.ndarray) -> dict:
    cu = empty((len(sizes) + 1,), np.int32)
    cu[0] = 0
    np.cumsum(sizes, out=cu[1:])
    positions = empty((len(tokens),), np.int32)
    positions[:] = np.arange(len(tokens)) - np.repeat(cu[:-1], sizes)
    out = empty((len(tokens),), tokens.dtype)
    out[:] = tokens
    return {"tokens": out, "cu_seqlens": cu, "positions": positions,
            "max_seqlen": HostInt(int(sizes.max()) if len(sizes) else 0)}
