"""The oracle of lazyseq.megatron: tinygrad's MLPerf loader run on generated corpora.

    python tools/megatron_golden.py /path/to/tinygrad [--out tests/data/megatron]

takes a checkout of tinygrad (its wheel does not ship ``examples/``), imports
``examples/mlperf/dataloader.py`` from it (``BinIdxDataset``, ``GPTDataset``, ``BlendedGPTDataset``),
runs them on the corpora :func:`corpus` generates (written with ``lazyseq.megatron.write``), and
writes what they give under ``--out``: one compressed ``.npz`` per case (arrays only, read back with
``allow_pickle=False``) and ``golden.json`` with tinygrad's commit and every generating parameter.
tests/test_megatron_golden.py compares lazyseq's views with them, sample for sample. Nothing of
tinygrad is copied into lazyseq: this script only calls it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# name -> (seed, documents, dtype, largest token): lengths heavy-tailed (Pareto), with 1-token and
# empty documents and documents far longer than any seq_length below
CORPORA = {
    "u16": (11, 300, "uint16", 65535),
    "i32": (12, 200, "int32", 1_000_000),
    "u16b": (13, 120, "uint16", 50_000),
    "exact": (14, 40, "uint16", 1000),
}
# (name, corpus, num_samples, seq_length, seed, shuffle)
GPT_CASES = [
    ("u16_s0", "u16", 700, 64, 0, True), ("u16_s1", "u16", 700, 64, 1, True), ("u16_noshuffle", "u16", 700, 64, 0, False),
    ("u16_long", "u16", 150, 600, 1234, True), ("i32_s5", "i32", 400, 96, 5, True), ("i32_noshuffle", "i32", 400, 96, 7, False),
    ("exact_shuffle", "exact", None, 16, 3, True), ("exact_noshuffle", "exact", None, 16, 3, False),
]
# (name, corpora, weights, num_samples, seq_length, seed, shuffle)
BLEND_CASES = [
    ("two", ["u16", "i32"], [0.7, 0.3], 500, 48, 0, True),
    ("three", ["u16", "i32", "u16b"], [1.0, 2.0, 5.0], 600, 32, 9, True),
    ("three_ties", ["u16", "i32", "u16b"], [1.0, 1.0, 1.0], 300, 32, 2, False),
]


def corpus(name: str) -> list[np.ndarray]:
    """The documents of corpus ``name``, the same on every machine (numpy's PCG64)."""
    seed, n, dtype, top = CORPORA[name]
    rng = np.random.Generator(np.random.PCG64(seed))
    lens = np.minimum(1 + np.floor(rng.pareto(1.1, n) * 12).astype(np.int64), 1500)
    lens[rng.choice(n, n // 10, replace=False)] = 1
    lens[rng.choice(n, 3, replace=False)] = 0
    if name == "exact":
        lens[:] = np.where(lens == 0, 0, 8 + lens % 5)
        lens[np.flatnonzero(lens)[0]] += -lens.sum() % 8  # 2 epochs: a multiple of 16 tokens
    return [rng.integers(0, top + 1, int(k)).astype(dtype) for k in lens]


def exact_samples(seq_length: int) -> int:
    """A sample count whose epochs hold exactly ``num_samples * seq_length`` tokens (2 epochs)."""
    tokens = 2 * sum(len(d) for d in corpus("exact"))
    assert tokens % seq_length == 0, "the exact corpus must hold a multiple of seq_length tokens"
    return tokens // seq_length


def _tinygrad(root: Path):
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("tinygrad_mlperf_dataloader", root / "examples/mlperf/dataloader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quiet(make, *args):
    """``make(*args)`` without tinygrad's prints, and without its caches: its pickled ``.index_cache``
    and ``.blend_cache`` files are keyed by the sample count, length, seed and shuffle only (not
    the weights or the other paths), so each case starts without them."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        out = make(*args)
    for d in {p.parent for p in _WORK}:
        for f in list(d.glob("*.index_cache")) + list(d.glob("*.blend_cache")):
            f.unlink()
    return out


_WORK: list[Path] = []


def _flat(samples: list[np.ndarray]) -> dict:
    return {"tokens": np.concatenate(samples) if samples else np.zeros(0),
            "lengths": np.array([len(s) for s in samples], np.int64)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tinygrad", type=Path, help="a checkout of tinygrad's repository")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "data" / "megatron")
    args = ap.parse_args(argv)
    from lazyseq import megatron

    tg = _tinygrad(args.tinygrad.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="megatron-golden-"))
    prefixes = {}
    for name in CORPORA:
        prefixes[name] = work / name
        _WORK.append(prefixes[name])
        megatron.write(prefixes[name], corpus(name))
        ds = _quiet(tg.BinIdxDataset, prefixes[name])
        np.savez_compressed(args.out / f"read_{name}.npz", sizes=ds.sizes, pointers=ds.pointers, doc_idx=ds.doc_idx,
                            **_flat([ds.get(i) for i in range(ds.count)]))
    meta = {"tinygrad_commit": _commit(args.tinygrad), "numpy": np.__version__, "corpora": CORPORA, "gpt": [], "blend": []}
    for name, cname, n, seq, seed, shuffle in GPT_CASES:
        n = exact_samples(seq) if n is None else n
        g = _quiet(tg.GPTDataset, prefixes[cname], n, seq, seed, shuffle)
        np.savez_compressed(args.out / f"gpt_{name}.npz", doc_idx=g.doc_idx, sample_idx=g.sample_idx,
                            shuffle_idx=g.shuffle_idx, **_flat([g[i] for i in range(n)]))
        meta["gpt"].append({"name": name, "corpus": cname, "num_samples": n, "seq_length": seq, "seed": seed,
                            "shuffle": shuffle})
    for name, cnames, weights, n, seq, seed, shuffle in BLEND_CASES:
        b = _quiet(tg.BlendedGPTDataset, [prefixes[c] for c in cnames], weights, n, seq, seed, shuffle)
        np.savez_compressed(args.out / f"blend_{name}.npz", dataset_idx=b.dataset_idx,
                            dataset_sample_idx=b.dataset_sample_idx, **_flat([b.get(i) for i in range(n)]))
        meta["blend"].append({"name": name, "corpora": cnames, "weights": weights, "num_samples": n, "seq_length": seq,
                              "seed": seed, "shuffle": shuffle})
    (args.out / "golden.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {args.out} from tinygrad {meta['tinygrad_commit']}")
    return 0


def _commit(root: Path) -> str:
    """The checkout's commit: from git, else from a COMMIT file (a ``git archive`` export)."""
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        f = root / "COMMIT"
        return f.read_text().strip() if f.exists() else os.environ.get("TINYGRAD_COMMIT", "unknown")


if __name__ == "__main__":
    sys.exit(main())
