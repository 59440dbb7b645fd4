"""``python -m lazyseq.demo`` (the README's first command) trains and learns; ``lazyseq.tour`` runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_module(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", name, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_demo_trains_a_tinygrad_model_that_learns():
    pytest.importorskip("tinygrad")
    pytest.importorskip("sklearn")
    proc = run_module("lazyseq.demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "prefetch(2 processes" in out and "batch(32, drop_last" in out  # the pipeline it runs
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)%", out).group(1))
    assert accuracy > 90, out
    assert "epoch 8/8" in proc.stderr  # tqdm's bars
    assert "0 fallbacks" in out
    # how the shared memory was sized: every term printed, and they add up to the slot the workers used
    m = re.search(r"shared memory sized from the first sample: \(([0-9]+) bytes x batch ([0-9]+) \+ 64 bytes of alignment "
                  r"x ([0-9]+) arrays\) x 1.25 = ([0-9]+) bytes, rounded up to whole 4096-byte pages: ([0-9]+) bytes per "
                  r"slot; x ([0-9]+) slots \(num_workers 2 x prefetch_factor 2 \+ 1\) = shm_size ([0-9]+)", out)
    nbytes, bs, arrays, roomy, slot, slots, shm = map(int, m.groups())
    assert (nbytes * bs + 64 * arrays) * 1.25 == roomy and slot == -(-roomy // 4096) * 4096 and slot * slots == shm
    assert f"shm_size={shm})" in out  # the prefetch the tree shows


def test_tour_runs():
    proc = run_module("lazyseq.tour")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "images[12345]" in out
    assert "shuffle(seed=0, epoch=2)" in out  # the repr tree
    assert "batches of 256" in out
    assert "images/s" in out
    assert out.rstrip().endswith("done.")


def test_readme_examples_are_doctested():
    """pytest collects *.md under docs/ only: every python example of the README must appear
    verbatim in docs/index.md, where it runs as a doctest."""
    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    blocks = re.findall(r"```python\n.*?```", readme, re.S)
    assert blocks
    for block in blocks:
        assert block in index, f"README example not in docs/index.md:\n{block}"
