"""Key normalisation a view does once, at the top: index arrays and masks checked against a
length, and range arithmetic that holds for views longer than ``sys.maxsize``. A leaf module."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["index_array", "compose", "span"]


def index_array(key: Any, n: int | None, what: str, mask_len: Callable[[], int] | None = None) -> list[int]:
    """The valid non-negative indices a list or array ``key`` (or a boolean mask) selects from the
    view ``what`` of length ``n`` (None: no len; ``mask_len`` then raises as ``len`` does)."""
    if isinstance(key, (str, bytes, tuple, dict)) or not hasattr(key, "__len__"):
        raise TypeError(f"{what} indices must be integers, slices, or lists/arrays of integers, "
                        f"not {type(key).__name__}")
    arr = np.asarray(key)
    if arr.ndim != 1:
        raise TypeError(f"{what}: index arrays must be 1-D, got shape {arr.shape}")
    if arr.dtype == bool:
        size = n if n is not None else mask_len()  # no len: TypeError (len() would overflow on a huge view)
        if len(arr) != size:
            raise IndexError(f"boolean mask of length {len(arr)} for {what} of length {size}")
        return np.flatnonzero(arr).tolist()
    if arr.size == 0:
        return []
    if arr.dtype == np.uint64 and arr.max() < 2**63:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu" or arr.dtype == np.uint64 or (n is not None and n >= 2**62):
        # ints numpy holds as floats, objects or uint64 (huge, or mixed with negative ones), or a
        # view too long for int64 arithmetic: checked as Python ints (an int64 cast would wrap)
        return _index_list(key, arr, n, what)
    arr = arr.astype(np.int64, copy=False)
    if n is not None:
        bad = (arr < -n) | (arr >= n)
        if bad.any():
            raise IndexError(f"index {arr[bad][0]} out of range for {what} of length {n}")
        arr = np.where(arr < 0, arr + n, arr)
    elif (arr < 0).any():
        raise IndexError(f"negative index {arr[arr < 0][0]} on {what}, which has no len()")
    return arr.tolist()


def _index_list(key: Any, arr: np.ndarray, n: int | None, what: str) -> list[int]:
    """:func:`index_array` for entries that are checked one by one, as Python ints."""
    idx = []
    for k in arr.tolist() if isinstance(key, np.ndarray) else key:
        try:
            idx.append(operator.index(k))
        except TypeError:
            raise TypeError(f"{what} index arrays must hold integers, not {type(k).__name__} ({k!r})") from None
    for k in idx:
        if n is None and k < 0:
            raise IndexError(f"negative index {k} on {what}, which has no len()")
        if n is not None and not -n <= k < n:
            raise IndexError(f"index {k} out of range for {what} of length {n}")
    return idx if n is None else [k + n if k < 0 else k for k in idx]


def compose(start: int, step: int, r: range) -> range:
    """The indices ``start + k * step`` for ``k`` in ``r``, as a range (a slice of a slice)."""
    first, st = start + r.start * step, step * r.step
    return range(first, first + span(r) * st, st)


def span(r: range) -> int:
    """``len(r)``, also for a range longer than ``sys.maxsize`` (``len`` raises OverflowError):
    a slice of an infinite view, ``arange(10**30)``."""
    try:
        return len(r)
    except OverflowError:
        return max(0, -((r.start - r.stop) // r.step))
