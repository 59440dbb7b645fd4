"""lazyseq.megatron.split: train, valid and test views cut as megatron-core cuts a dataset's
elements by its split string (parse_and_normalize_split, convert_split_vector_to_split_matrix and
the builder's rounding), covering the sequence in order; errors naming the string."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import lazyseq
from lazyseq import megatron
from lazyseq.megatron import splits

STRINGS = ["969,30,1", "99,1", "1,0,0", "0,0,1", "3,3,3", "100", "98,2", "1, 1", "0.7,0.2,0.1", "949,50,1", ".5,.25"]
LENGTHS = [0, 1, 2, 7, 10, 1000, 12345, 99999]


def megatron_bounds(spec: str, n: int) -> list[tuple[int, int] | None]:
    """Megatron-core's parts of ``n`` elements: its own parse and split matrix, and the rounding of
    ``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits`` (inline code there, copied)."""
    pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.blended_megatron_dataset_config import (
                convert_split_vector_to_split_matrix,
                parse_and_normalize_split,
            )
    except ImportError as e:
        pytest.skip(f"megatron-core is not installed (pip install --no-deps megatron-core==0.16.1): {e}")
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(spec))
    return [None if m is None else (round(m[0] * float(n)), round(m[1] * float(n))) for m in matrix]


@pytest.mark.parametrize("spec", STRINGS)
def test_the_parts_are_megatron_cores(spec):
    for n in LENGTHS:
        want = megatron_bounds(spec, n)
        got = splits.bounds(spec, n)
        for g, w in zip(got, want):
            assert g == w or (w is None and g[0] == g[1]), (spec, n, got, want)
        parts = megatron.split(range(n), spec)
        assert [len(p) for p in parts] == [0 if w is None else w[1] - w[0] for w in want]
        assert [x for p in parts for x in p] == list(range(n))  # in order, each item once


def test_weights_are_megatron_cores_normalised_ones():
    pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_config")
    for spec in STRINGS:
        assert splits.weights(spec) == mc.parse_and_normalize_split(spec)


def test_rounding_is_half_to_even_as_megatrons():
    # 1:1 of 7 elements: the cut at 3.5 rounds to 4 (half to even), of 5 at 2.5 to 2
    assert splits.bounds("1,1", 7) == [(0, 4), (4, 7), (7, 7)]
    assert splits.bounds("1,1", 5) == [(0, 2), (2, 5), (5, 5)]


def test_views_of_any_sequence_and_of_views(tmp_path):
    megatron.write(tmp_path / "c", [np.arange(k + 1) for k in range(20)])
    docs = megatron.indexed(tmp_path / "c")
    train, valid, test = megatron.split(docs, "90,5,5")
    assert (len(train), len(valid), len(test)) == (18, 1, 1)
    np.testing.assert_array_equal(valid[0], docs[18])
    assert all(isinstance(p, lazyseq.View) for p in (train, valid, test))
    t, v, e = megatron.split(np.arange(10) * 2, [0.8, 0.2])  # numbers, as Megatron's split vector
    assert list(v) == [16, 18] and len(e) == 0
    t, v, e = megatron.split(lazyseq.arange(100), "0,0,1")
    assert (len(t), len(v), list(e[:2])) == (0, 0, [0, 1])


@pytest.mark.parametrize("spec, message", [
    ("-1,2", "'-1' is negative"), ("a,1", "'a' is not a decimal number"), ("99,,1", "'' is not a decimal number"),
    ("1,2,3,4", "4 parts; at most 3"), ("0,0,0", "must not all be 0"), ("0", "must not all be 0"),
    ("1e3", "'1e3' is not a decimal number"), ([1, -1], "finite and >= 0"), ([1, float("nan")], "finite and >= 0"),
    ([1, 2, 3, 4], "4 parts"), (["x"], "must be numbers"),
])
def test_bad_strings_are_refused_naming_them(spec, message):
    with pytest.raises(ValueError, match=f"split {spec!r}".replace("[", r"\[").replace("]", r"\]") + ".*" + message):
        megatron.split(range(10), spec)


def test_a_sequence_without_len_is_refused():
    with pytest.raises(TypeError, match="has no len"):
        megatron.split(lazyseq.cycle([1, 2]), "1,1")
