"""``python -m lazyseq.demo`` (the README's first command) runs and shows its pipeline."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "lazyseq.demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
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
    import re

    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    blocks = re.findall(r"```python\n.*?```", readme, re.S)
    assert blocks
    for block in blocks:
        assert block in index, f"README example not in docs/index.md:\n{block}"
