"""The notebooks under notebooks/ are committed *with* their outputs (trees, tables, plots,
thumbnails), so a reader on the web sees them without running anything; here every one of them runs
again, top to bottom, in a fresh python3 kernel, and each cell must give the same *kinds* of output
as the committed one: the same stream names (stdout, stderr), and the same rich outputs in order
(``display_data`` / ``execute_result`` with the same set of mime types: ``image/png``,
``text/html``, ``text/plain``...). The text itself (timings, addresses) may differ.

A cell that prints nothing is committed with no outputs, and must still print nothing.

After changing a notebook or what it shows, execute it again and commit the result:
``python tests/test_notebooks.py`` (all of them) or ``python tests/test_notebooks.py 03`` (those
whose name contains ``03``): it runs each in place, from the notebook's own folder, as the test does.

Each notebook runs with its own folder (notebooks/) as its working directory, as Jupyter runs it:
a path in a notebook is relative to the notebook (``data/...``), never to the repository root.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]
MAX_BYTES = 1_500_000  # a notebook with its outputs (a few plots and thumbnails; no huge images)
CELL_TIMEOUT = 120  # seconds

# Appended to the notebook when the test runs it: the worker processes a notebook started must be
# gone once its cells are done (they use `with` or close()). lazyseq's workers are multiprocessing
# processes named lazyseq-*; other libraries' (tinygrad's compiler pool) may stay.
NO_CHILDREN = r"""
import multiprocessing as _mp, time as _time

def _live_workers():
    return sorted(p.name for p in _mp.active_children() if p.name.startswith("lazyseq"))

_deadline = _time.monotonic() + 10  # workers of a closed prefetch exit in bounded time
while _live_workers() and _time.monotonic() < _deadline:
    _time.sleep(0.1)
print("live lazyseq workers:", _live_workers())
"""


def code_cells(nb) -> list:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def kinds(cell) -> tuple:
    """What a cell shows, as kinds: the names of its streams, and its rich outputs in order."""
    streams, rich = set(), []
    for o in cell.get("outputs", []):
        t = o["output_type"]
        if t == "stream":
            streams.add(o["name"])
        elif t in ("display_data", "execute_result"):
            rich.append((t, tuple(sorted(o.get("data", {})))))
        else:  # error
            rich.append((t, o.get("ename")))
    return tuple(sorted(streams)), tuple(rich)


def execute(nb, folder: Path, record_timing: bool = False):
    """Run ``nb`` (a NotebookNode) in a fresh python3 kernel started in ``folder`` (the notebook's own,
    as Jupyter does), with this checkout on its path (the kernel imports this lazyseq whether or not
    it is installed)."""
    import nbclient

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=False,
                                     record_timing=record_timing, resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)  # raises CellExecutionError on the first failing cell
    return nb


def coalesce_streams(nb) -> None:
    """Merge consecutive outputs of the same stream (the kernel sends them in pieces as they come)."""
    for cell in code_cells(nb):
        merged: list = []
        for o in cell.get("outputs", []):
            if (o["output_type"] == "stream" and merged and merged[-1]["output_type"] == "stream"
                    and merged[-1]["name"] == o["name"]):
                merged[-1]["text"] += o["text"]
            else:
                merged.append(o)
        cell["outputs"] = merged


def test_the_six_notebooks_are_there():
    assert {"01_composition.ipynb", "02_random_access_preprocessing.ipynb", "03_dataloader_tinygrad.ipynb",
            "04_errors_and_debugging.ipynb", "05_tokens.ipynb", "06_data_where_it_lives.ipynb"} <= set(IDS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_committed_with_its_outputs(path):
    nb = json.loads(path.read_text())  # plain JSON: no nbformat needed to check this
    code = code_cells(nb)
    assert code, f"{path.name} has no code cell"
    counts = [c.get("execution_count") for c in code]
    assert all(isinstance(n, int) for n in counts) and counts == sorted(counts) and len(set(counts)) == len(counts), (
        f"{path.name}: execution counts {counts}: every code cell must be committed executed, top to bottom, "
        "in one run: python tests/test_notebooks.py")
    assert any(c.get("outputs") for c in code), f"{path.name}: no outputs committed: python tests/test_notebooks.py"
    errors = [k for k, c in enumerate(code) if any(o["output_type"] == "error" for o in c.get("outputs", []))]
    assert not errors, f"{path.name}: code cells {errors} were committed with an error"
    assert path.stat().st_size <= MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes; keep the outputs small"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_and_shows_what_was_committed(path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    committed = [kinds(c) for c in nb.cells if c.cell_type == "code"]
    nb.cells.append(nbformat.v4.new_code_cell(NO_CHILDREN))
    execute(nb, path.parent)
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in ran)
    check = ran.pop()
    assert "".join(o.get("text", "") for o in check.outputs).strip() == "live lazyseq workers: []", (
        f"{path.name} leaves worker processes running: close them (with ..., or .close())")
    differ = [(k, want, kinds(c)) for k, (want, c) in enumerate(zip(committed, ran)) if kinds(c) != want]
    assert not differ, (
        f"{path.name}: code cells whose outputs changed kind (cell, committed, now): {differ}; if that is "
        "intended, execute the notebook again and commit it: python tests/test_notebooks.py")


def main(args: list[str]) -> None:
    """Execute the notebooks (those whose name contains one of ``args``; all without) in place."""
    import nbformat

    for path in NOTEBOOKS:
        if args and not any(a in path.name for a in args):
            continue
        print("executing", path.relative_to(ROOT), flush=True)
        nb = execute(nbformat.read(path, as_version=4), path.parent)
        coalesce_streams(nb)
        if nb.nbformat_minor < 5:  # cell ids came with 4.5
            for cell in nb.cells:
                cell.pop("id", None)
        nbformat.write(nb, path)


if __name__ == "__main__":
    main(sys.argv[1:])
