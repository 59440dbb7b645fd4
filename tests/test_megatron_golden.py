"""lazyseq.megatron against its oracles: tinygrad's MLPerf loader (golden data) and Megatron-core.

The golden data under tests/data/megatron/ is what tinygrad's ``BinIdxDataset``, ``GPTDataset`` and
``BlendedGPTDataset`` gave on the corpora of tools/megatron_golden.py, at the commit golden.json
names. To regenerate it (after changing a corpus or a case there):

    git clone https://github.com/tinygrad/tinygrad /tmp/tinygrad   # or any checkout
    python tools/megatron_golden.py /tmp/tinygrad
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from lazyseq import megatron

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "megatron"
META = json.loads((DATA / "golden.json").read_text())


def _tool():
    spec = importlib.util.spec_from_file_location("megatron_golden", ROOT / "tools" / "megatron_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory) -> dict[str, Path]:
    """The corpora of the golden data, written by lazyseq (as the oracle script wrote them)."""
    d = tmp_path_factory.mktemp("corpora")
    out = {}
    for name in TOOL.CORPORA:
        out[name] = d / name
        megatron.write(out[name], TOOL.corpus(name))
    return out


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / f"{name}.npz", allow_pickle=False) as z:
        return dict(z)


def split(g: dict) -> list[np.ndarray]:
    return np.split(g["tokens"], np.cumsum(g["lengths"])[:-1]) if len(g["lengths"]) else []


def test_the_golden_data_names_its_source():
    assert len(META["tinygrad_commit"]) == 40, META["tinygrad_commit"]
    assert {c["name"] for c in META["gpt"]} == {c[0] for c in TOOL.GPT_CASES}
    assert {c["name"] for c in META["blend"]} == {c[0] for c in TOOL.BLEND_CASES}
    assert sum(f.stat().st_size for f in DATA.iterdir()) < 4_000_000


@pytest.mark.parametrize("name", list(TOOL.CORPORA))
def test_what_lazyseq_writes_tinygrad_reads_identically(prefixes, name):
    g = golden(f"read_{name}")
    docs = megatron.indexed(prefixes[name])
    assert docs.dtype == np.dtype(TOOL.CORPORA[name][2])
    np.testing.assert_array_equal(docs.sizes, g["sizes"])
    np.testing.assert_array_equal(docs.pointers, g["pointers"])
    np.testing.assert_array_equal(docs.doc_idx, g["doc_idx"])
    for mine, theirs, written in zip(docs, split(g), TOOL.corpus(name)):
        assert mine.dtype == theirs.dtype
        np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(mine, written)


@pytest.mark.parametrize("case", META["gpt"], ids=lambda c: c["name"])
def test_gpt_samples_equal_tinygrads_sample_for_sample(prefixes, case):
    g = golden(f"gpt_{case['name']}")
    v = megatron.gpt(prefixes[case["corpus"]], case["num_samples"], case["seq_length"], seed=case["seed"],
                     shuffle=case["shuffle"], cache=False)
    doc_idx, sample_idx, shuffle_idx = v.index()
    np.testing.assert_array_equal(doc_idx, g["doc_idx"])
    np.testing.assert_array_equal(sample_idx, g["sample_idx"])
    np.testing.assert_array_equal(shuffle_idx, g["shuffle_idx"])
    expected = split(g)
    assert len(v) == len(expected) == case["num_samples"]
    order = np.random.default_rng(0).permutation(len(v))  # random order: no state carried between reads
    for i in order.tolist():
        assert v[i].dtype == expected[i].dtype
        np.testing.assert_array_equal(v[i], expected[i])
    again = pickle.loads(pickle.dumps(v))
    for i in order[:50].tolist():
        np.testing.assert_array_equal(again[i], expected[i])


def test_the_exact_case_has_tinygrads_short_last_sample(prefixes):
    case = next(c for c in META["gpt"] if c["name"] == "exact_noshuffle")
    g = golden("gpt_exact_noshuffle")
    v = megatron.gpt(prefixes["exact"], case["num_samples"], case["seq_length"], shuffle=False, cache=False)
    assert set(g["lengths"][:-1].tolist()) == {case["seq_length"] + 1}
    assert g["lengths"][-1] == case["seq_length"] == len(v[-1])


@pytest.mark.parametrize("case", META["blend"], ids=lambda c: c["name"])
def test_blends_equal_tinygrads_sample_for_sample(prefixes, case):
    g = golden(f"blend_{case['name']}")
    v = megatron.blend([prefixes[c] for c in case["corpora"]], case["weights"], case["num_samples"],
                       case["seq_length"], seed=case["seed"], shuffle=case["shuffle"], cache=False)
    dataset_idx, dataset_sample_idx = v.index()
    np.testing.assert_array_equal(dataset_idx, g["dataset_idx"])
    assert dataset_idx.dtype == g["dataset_idx"].dtype
    np.testing.assert_array_equal(dataset_sample_idx, g["dataset_sample_idx"])
    expected = split(g)
    order = np.random.default_rng(1).permutation(len(v)).tolist()
    for i in order:
        np.testing.assert_array_equal(v[i], expected[i])
    again = pickle.loads(pickle.dumps(v))
    for i in order[:40]:
        np.testing.assert_array_equal(again[i], expected[i])


# -- Megatron-core reads what lazyseq writes, and lazyseq reads what Megatron-core writes --------------
def _megatron_core():
    """Megatron-core's reader and writer (``megatron-core==0.16.1``, installed with --no-deps by
    .ci/run: its reader needs numpy and torch only)."""
    pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    except ImportError as e:
        pytest.skip(f"megatron-core is not installed (pip install --no-deps megatron-core==0.16.1): {e}")
    return IndexedDataset, IndexedDatasetBuilder


@pytest.mark.parametrize("name", ["u16", "i32"])
def test_megatron_core_reads_what_lazyseq_writes(prefixes, name):
    IndexedDataset, _ = _megatron_core()
    theirs = IndexedDataset(str(prefixes[name]), mmap=True)
    ours = megatron.indexed(prefixes[name])
    assert len(theirs) == len(ours) and theirs.index.dtype == ours.dtype
    np.testing.assert_array_equal(theirs.sequence_lengths, ours.sizes)
    np.testing.assert_array_equal(theirs.document_indices, ours.doc_idx)
    for k in range(len(ours)):
        np.testing.assert_array_equal(theirs[k], ours[k])


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_lazyseq_reads_what_megatron_core_writes(tmp_path, dtype):
    _, IndexedDatasetBuilder = _megatron_core()
    import torch

    docs = TOOL.corpus("u16b")
    builder = IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=dtype)
    for k, d in enumerate(docs):
        builder.add_item(torch.from_numpy((d % 200).astype(np.int64)))
        if k % 3 == 2:
            builder.end_document()
    builder.end_document()
    builder.finalize(str(tmp_path / "m.idx"))
    ours = megatron.indexed(tmp_path / "m")
    assert ours.dtype == np.dtype(dtype) and len(ours) == len(docs)
    assert ours.doc_idx.tolist() == [0] + [k + 1 for k in range(len(docs)) if k % 3 == 2] + [len(docs)]
    for mine, d in zip(ours, docs):
        np.testing.assert_array_equal(mine, d % 200)
