"""What earlier versions wrote still reads after the package was laid out by layer
(lazyseq.core.moved): views pickled when their classes lived in lazyseq.base, lazyseq.batching,
lazyseq.dataloader_plan ...; fingerprints naming those modules (a loader's state, an interrupted
save's job file); a DataLoader's state_dict; a store. The files in tests/data/legacy were written
by the code before the move (tests/data/legacy/make_legacy.py says how)."""

import importlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import cloudpickle
import numpy as np

import lazyseq
from lazyseq.core.moved import MOVED

LEGACY = Path(__file__).parent / "data" / "legacy"


def test_what_the_earlier_layout_wrote_reads_and_compares_equal():
    """In a fresh interpreter (pickle imports the modules it names, nothing imported before)."""
    p = subprocess.run([sys.executable, str(LEGACY / "make_legacy.py"), "check", str(LEGACY)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["differences"] == []
    assert len(out["checked"]) == 37 and "loader resumed at 8, 4 batches" in out["checked"], out["checked"]


def test_the_legacy_pickle_names_the_earlier_modules():
    """Else the test above would prove nothing about them."""
    blob = (LEGACY / "views.pkl").read_bytes()
    for earlier in ("lazyseq.base", "lazyseq.batching", "lazyseq.seeding", "lazyseq.node", "lazyseq.serialization"):
        assert earlier.encode() in blob and earlier in MOVED


def test_fingerprints_name_a_moved_module_by_its_earlier_name():
    fp = lazyseq.fingerprint(lazyseq.batch([np.zeros(2)] * 4, 2, collate_fn=lazyseq.default_collate))
    assert fp["params"]["collate_fn"] == "lazyseq.batching:default_collate"
    assert lazyseq.default_collate.__module__ == "lazyseq.loader.batching"


def test_earlier_module_names_import_the_moved_modules():
    import lazyseq.core.base

    base = importlib.import_module("lazyseq.base")  # import lazyseq.base, which ruff takes for another package
    plan = importlib.import_module("lazyseq.dataloader_plan")
    assert base is lazyseq.core.base is lazyseq.base and plan.Plan.__module__ == "lazyseq.loader.plan"
    for earlier, now in MOVED.items():
        assert sys.modules[earlier] is sys.modules[now], earlier


def test_views_pickled_now_name_the_new_modules_and_round_trip():
    v = lazyseq.batch(lazyseq.smap(np.sqrt, np.arange(10.0))[1:9], 3, collate_fn=lazyseq.pad_collate)
    blob = cloudpickle.dumps(v)
    assert b"lazyseq.core.base" in blob and b"lazyseq.loader.batching" in blob and b"lazyseq.base\x94" not in blob
    w = pickle.loads(blob)
    assert [x.tolist() for x in w] == [x.tolist() for x in v]
