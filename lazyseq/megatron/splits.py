"""``lazyseq.megatron.split``: train, valid and test views cut by Megatron's split string.

Megatron-core (0.16.1) reads ``"969,30,1"`` as weights, pads them with zeros to three
(``parse_and_normalize_split``), divides them by their float64 sum (``utils.normalize``), adds
them up from 0 in order into book-ends (``convert_split_vector_to_split_matrix``: a zero weight
gives no split) and cuts ``n`` elements at ``int(round(bookend * float(n)))``
(``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits``). The same arithmetic here:
Python's ``round`` (half to even) of float64 products; a zero weight gives an empty view.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ..core.base import Slice, View
from ..core.node import length

__all__ = ["split", "weights", "bounds"]

_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")  # what Megatron's [.0-9]+ reads as one float


def weights(spec: str | Sequence[float]) -> list[float]:
    """The three normalised weights of a split string (``"969,30,1"``: comma-separated decimal
    numbers, at most three, missing ones 0) or of a sequence of up to three numbers, as Megatron
    normalises them (each divided by their float64 sum). A ValueError, naming ``spec``, for a part
    that is not a number, a negative or non-finite one, more than three parts, or all zero.

    >>> weights('969,30,1'), weights('99,1'), weights([1, 1])
    ([0.969, 0.03, 0.001], [0.99, 0.01, 0.0], [0.5, 0.5, 0.0])
    """
    where = f"lazyseq.megatron.split: split {spec!r}"
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        bad = [p for p in parts if not _NUMBER.fullmatch(p)]
        if bad:
            neg = [p for p in bad if p.startswith("-") and _NUMBER.fullmatch(p[1:])]
            why = f"{neg[0]!r} is negative" if neg else f"{bad[0]!r} is not a decimal number"
            raise ValueError(f"{where}: {why} (weights like '969,30,1': train, valid, test)")
        w = [float(p) for p in parts]
    else:
        try:
            w = [float(x) for x in spec]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: the weights must be numbers") from None
        if any(not math.isfinite(x) or x < 0 for x in w):
            raise ValueError(f"{where}: the weights must be finite and >= 0")
    if len(w) > 3:
        raise ValueError(f"{where}: {len(w)} parts; at most 3 (train, valid, test)")
    w += [0.0] * (3 - len(w))
    total = 0.0
    for x in w:  # numpy's float64 sum of three, in order
        total += x
    if not total > 0 or not math.isfinite(total):
        raise ValueError(f"{where}: the weights must not all be 0" if total == 0 else f"{where}: the weights overflow")
    return [x / total for x in w]


def bounds(spec: str | Sequence[float], n: int) -> list[tuple[int, int]]:
    """``(begin, end)`` of the train, valid and test parts of ``n`` elements, rounded as Megatron
    rounds them (``int(round(bookend * float(n)))``); a part of weight 0 is empty, at its place.

    >>> bounds('969,30,1', 1000), bounds('99,1', 7), bounds('0,0,1', 5)
    ([(0, 969), (969, 999), (999, 1000)], [(0, 7), (7, 7), (7, 7)], [(0, 0), (0, 0), (0, 5)])
    """
    ends = [0.0]
    for x in weights(spec):
        ends.append(ends[-1] + x)  # Megatron's book-ends, added up from 0 in order
    cut = [round(e * float(n)) for e in ends]  # Python's round of a float: an int, half to even
    return [(cut[k], cut[k + 1]) for k in range(3)]  # a zero weight adds 0.0: equal ends, an empty part


def split(seq: Any, spec: str | Sequence[float]) -> tuple[View, View, View]:
    """``(train, valid, test)``: consecutive views of ``seq`` (any sequence with a ``len``: a
    corpus, samples, a list) cut by Megatron's split string ``spec`` (``"969,30,1"``; or up to
    three numbers), with Megatron's normalisation and rounding (see :func:`bounds`): missing
    numbers are 0 and a zero weight gives an empty view. Together they hold every item once, in
    order. Megatron-core cuts a corpus's documents this way before it samples each part.

    >>> from lazyseq import megatron
    >>> train, valid, test = megatron.split(range(1000), '969,30,1')
    >>> len(train), len(valid), len(test), valid[0], test[0]
    (969, 30, 1, 969, 999)
    >>> [len(v) for v in megatron.split(list(range(10)), '99,1')]
    [10, 0, 0]
    """
    n = length(seq)
    if n is None:
        raise TypeError(f"lazyseq.megatron.split: {type(seq).__name__} has no len(): a split needs the length")
    return tuple(seq[b:e] if isinstance(seq, View) else Slice(seq, range(b, e)) for b, e in bounds(spec, n))
