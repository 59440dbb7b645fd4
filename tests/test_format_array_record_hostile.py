"""lazyseq.array_record over files from strangers: cut short at several points, garbage, empty, not
ArrayRecord at all (another format, a wrong extension), an index out of range: a StoreError naming
the file (an IndexError for the index), never a crash of the process. Then a bounded fuzz of mutated
bytes, run in a child process (a C++ CHECK failure would abort it, not the test run): every outcome a
StoreError naming the file or the records as written."""

import json
import os
import subprocess
import sys

import pytest

import lazyseq
from lazyseq import StoreError

arm = pytest.importorskip("array_record.python.array_record_module")


def write(path, recs, options="group_size:2") -> str:
    w = arm.ArrayRecordWriter(str(path), options)
    for r in recs:
        w.write(r)
    w.close()
    return str(path)


RECS = [b"record %d " % i * (i % 5) for i in range(40)]


def refused(path) -> StoreError:
    with pytest.raises(StoreError) as e:
        v = lazyseq.array_record(path)
        list(v)
    assert os.path.basename(str(path)) in str(e.value)
    return e.value


def test_a_file_cut_short_is_a_store_error_naming_it(tmp_path):
    data = open(write(tmp_path / "whole.array_record", RECS), "rb").read()
    nonzero = max(i for i, x in enumerate(data) if x)
    for k, n in enumerate(sorted({0, 1, 7, 8, 40, 100, nonzero // 2, nonzero, nonzero + 1, len(data) - 64,
                                  len(data) - 8, len(data) - 1})):
        path = tmp_path / f"cut{k}.array_record"
        path.write_bytes(data[:n])
        refused(path)


def test_garbage_empty_and_other_formats(tmp_path):
    (tmp_path / "empty.array_record").write_bytes(b"")
    (tmp_path / "garbage.array_record").write_bytes(os.urandom(70_000))
    (tmp_path / "text.array_record").write_bytes(b"hello\n" * 1000)
    (tmp_path / "table.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    for name in ("empty", "garbage", "text"):
        refused(tmp_path / f"{name}.array_record")
    refused(tmp_path / "table.parquet")
    write(tmp_path / "good.bin", RECS)
    assert list(lazyseq.array_record(tmp_path / "good.bin")) == RECS  # (a file named is read, whatever its name)
    with pytest.raises(FileNotFoundError):
        lazyseq.array_record(tmp_path / "none.array_record")
    os.symlink(tmp_path / "garbage.array_record", tmp_path / "link.array_record")
    refused(tmp_path / "link.array_record")


def test_an_index_out_of_range(tmp_path):
    v = lazyseq.array_record(write(tmp_path / "a.array_record", RECS))
    for i in (40, -41, 10**12):
        with pytest.raises(IndexError):
            v[i]
    with pytest.raises(IndexError):
        v[[0, 40]]


def test_a_missing_extra_is_an_import_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "array_record.python.array_record_module", None)
    with pytest.raises(ImportError, match=r"lazyseq\[array_record\]"):
        lazyseq.array_record(tmp_path)


CHILD = r"""
import json, os, sys
import numpy as np
import lazyseq
src, root, cases, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = open(src, "rb").read()
want = json.loads(sys.argv[5])
nonzero = np.flatnonzero(np.frombuffer(data, np.uint8))
rng = np.random.default_rng(seed)
out = {"store_error": 0, "same": 0, "other": []}
for c in range(cases):
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        at = int(rng.choice(nonzero)) if rng.random() < 0.85 else int(rng.integers(len(b)))
        b[at] = int(rng.integers(256))
    if rng.random() < 0.15:
        b = b[:int(rng.integers(len(b)))]
    path = os.path.join(root, f"m{c}.array_record")
    with open(path, "wb") as f:
        f.write(b)
    try:
        got = [r.hex() for r in lazyseq.array_record(path)]
        if got == want:
            out["same"] += 1
        else:
            out["other"].append((c, "wrong records"))
    except (lazyseq.StoreError, lazyseq.EvaluationError) as e:
        if isinstance(e, lazyseq.EvaluationError):  # (a read's error, as the view raises it)
            e = e.__cause__
        if not isinstance(e, lazyseq.StoreError):
            out["other"].append((c, type(e).__name__ + ": " + str(e)[:200]))
            continue
        out["store_error"] += 1
        if f"m{c}.array_record" not in str(e):
            out["other"].append((c, "unnamed: " + str(e)[:200]))
    except Exception as e:
        out["other"].append((c, type(e).__name__ + ": " + str(e)[:200]))
    os.unlink(path)
print(json.dumps(out))
"""


@pytest.mark.parametrize(("options", "seed"), [("group_size:1", "7"), ("zstd", "8")])
def test_fuzz_mutated_bytes_in_a_child_process(tmp_path, options, seed):
    src = write(tmp_path / "src.array_record", RECS, options)
    want = json.dumps([r.hex() for r in RECS])
    p = subprocess.run([sys.executable, "-c", CHILD, src, str(tmp_path), "300", seed, want], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert p.returncode == 0, f"the child process died ({p.returncode}): {p.stderr[-2000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["other"] == [] and out["store_error"] > 50, out
