"""Every notebook under notebooks/ runs top to bottom in a fresh python3 kernel without errors, and
is committed without outputs (run it, then strip it: ``jupyter nbconvert --clear-output --inplace``)."""

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]


def test_the_four_notebooks_are_there():
    assert {"01_composition.ipynb", "02_random_access_preprocessing.ipynb", "03_dataloader_tinygrad.ipynb",
            "04_errors_and_debugging.ipynb"} <= set(IDS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_stripped(path):
    nb = json.loads(path.read_text())  # plain JSON: no nbformat needed to check this
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cell"
    with_outputs = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("outputs")]
    counted = [k for k, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is not None]
    assert not with_outputs and not counted, (
        f"{path.name}: cells {sorted(set(with_outputs) | set(counted))} hold outputs or execution counts; "
        "strip them before committing: jupyter nbconvert --clear-output --inplace notebooks/*.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # The kernel is a child process: it inherits this environment and starts in the repo root,
    # so it imports this checkout's lazyseq whether or not the package is installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert ran and all(c.get("execution_count") for c in ran)
    errors = [o for c in ran for o in c.outputs if o.output_type == "error"]
    assert not errors
