"""lazyseq.save / lazyseq.load: round trips, layouts, resume, errors, workers, memory."""

import collections
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq.store import SchemaError, StoreError

Pair = collections.namedtuple("Pair", "x y")


class Tokens(list):
    pass


def same(a, b, where="item"):
    """``a`` and ``b`` are equal down to types, dtypes and shapes."""
    assert type(a) is type(b) or (isinstance(a, tuple) and type(a).__name__ == type(b).__name__
                                   and getattr(a, "_fields", 0) == getattr(b, "_fields", 1)), (where, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert a.tobytes() == np.ascontiguousarray(b).tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype, where
        assert a == b if a.dtype == np.longdouble else a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{k}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, (where, a, b)


def roundtrip(items, tmp_path, name="s", **kw):
    kw.setdefault("method", "thread")
    kw.setdefault("nworkers", 2)
    lazyseq.save(items, tmp_path / name, **kw)
    store = lazyseq.load(tmp_path / name, verify=True, allow_pickle=kw.get("allow_pickle", False))
    assert len(store) == len(items)
    for i, x in enumerate(items):
        same(store[i], x, f"item {i}")
    for got, x in zip(store._get_many(range(len(items))), items):  # the bulk path
        same(got, x)
    return store


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", ">i4", "uint32", "int64", "uint64", "float16", "float32",
          ">f8", "longdouble", "complex64", "complex128", "datetime64[ns]", "timedelta64[s]", "S5", "U3",
          [("a", "<f4", (2,)), ("b", [("c", "u1"), ("d", ">i2")])]]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_dtypes(tmp_path, dtype):
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    raw = lambda n: rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    if (dt.kind in "fc" and dt != np.longdouble) or dt.names:  # random bits (not in a longdouble's padding)
        items = [(raw(6).reshape(2, 3), raw(1)[0], raw(i % 4)) for i in range(9)]
    else:
        base = np.arange(60).astype(dt) if dt.kind not in "SU" else np.array(["ab", "c", "xyz"] * 20, dtype=dt)
        items = [(base[i : i + 6].reshape(2, 3), base[i], base[: i % 4]) for i in range(9)]
    store = roundtrip(items, tmp_path, shard_bytes=100)
    assert len(store.records) > 1
    scalar = None if dt.kind in "SU" else []  # an element of a str array is an np.str_: stored as a string
    assert [f["shape"] for f in store.fields] == [[2, 3], scalar, None]


def test_roundtrip_python_values_and_containers(tmp_path):
    Local = collections.namedtuple("Local", ["a", "b"])
    dd = collections.defaultdict(list, {"k": 1})
    items = [{
        "int": -(2**63) + i, "big": 2**63 - 1, "float": float("nan") if i == 2 else i / 3, "complex": 1j * i,
        "bool": i % 2 == 0, "none": None, "str": "héllo \ud800 " * i, "bytes": b"\0\xff" * i,
        "bytearray": bytearray(b"ab" * i), "npstr": np.str_("é" * i), "npbytes": np.bytes_(b"z" * i),
        "np": (np.float32(i), np.int8(-i), np.bool_(i % 2), np.complex64(1 + i * 1j), np.datetime64(i, "D")),
        "pair": Pair(np.zeros(i), Local(i, [Tokens([i, i + 1]), ()])),
        "od": collections.OrderedDict([("z", i), ("a", "x")]), "dd": dd,
        "zero_d": np.array(i * 1.5), "empty": np.empty((0, 3), np.int32), "empty_var": np.empty((i, 0)),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3) + i), "strided": np.arange(20)[::3] + i,
        7: (i,), "nested": [[[np.uint64(i)]]],
    } for i in range(6)]
    store = roundtrip(items, tmp_path, shard_bytes=1)
    assert len(store.records) == 6
    got = store[3]
    assert type(got["pair"].y).__name__ == "Local" and got["pair"].y._fields == ("a", "b")
    assert got["dd"].default_factory is list and type(got["od"]) is collections.OrderedDict
    assert type(got["pair"].y.b[0]) is Tokens
    assert not got["fortran"].flags.writeable and not got["zero_d"].flags.writeable
    # a local namedtuple, remade, pickles by its name and fields
    copy = pickle.loads(pickle.dumps(got["pair"].y))
    assert copy == got["pair"].y and type(copy) is type(got["pair"].y)


def test_top_level_leaf_and_empty_structures(tmp_path):
    roundtrip(list(range(10)), tmp_path, "ints", shard_bytes=16)
    roundtrip([()] * 3 + [()], tmp_path, "empty_tuples")
    roundtrip([{"a": []}] * 3, tmp_path, "empty_list")
    store = roundtrip([], tmp_path, "nothing")
    assert len(store) == 0 and list(store) == [] and "len=0" in repr(store)


def test_fixed_fields_are_zero_copy_views_of_the_map(tmp_path):
    items = [{"img": np.full((4, 4), i, np.uint8), "tok": np.arange(i + 1)} for i in range(20)]
    store = roundtrip(items, tmp_path, shard_bytes=600)
    assert 2 <= store.per_shard < 20
    a, b = store[0]["img"], store[1]["img"]
    assert not a.flags.writeable and not a.flags.owndata
    assert a.__array_interface__["data"][0] + 16 == b.__array_interface__["data"][0]  # one fixed-stride array
    with pytest.raises(ValueError):
        a[0, 0] = 1
    assert isinstance(store[5:9], lazyseq.View) and [x["tok"].size for x in store[5:9]] == [6, 7, 8, 9]
    assert [int(x["img"][0, 0]) for x in store[[3, -1]]] == [3, 19]
    batches = lazyseq.batch(store, 7, collate_fn=lambda xs: np.stack([x["img"] for x in xs]))
    assert [int(b[0, 0, 0]) for b in batches] == [0, 7, 14]


def test_bulk_range_reads_slice_once_per_field(tmp_path, monkeypatch):
    items = [(np.arange(3) + i, "s" * i, i) for i in range(40)]
    store = roundtrip(items, tmp_path, shard_bytes=300)
    from lazyseq.store import shard

    calls = []
    real = shard.Shard.__init__
    monkeypatch.setattr(shard.Shard, "__init__", lambda self, *a: (calls.append(a[0]), real(self, *a))[1])
    store._open.clear()
    got = store._get_many(range(5, 33))
    assert len(calls) == len({(i // store.per_shard) for i in range(5, 33)})
    for g, x in zip(got, items[5:33]):
        same(g, x)


def test_field_varying_only_late(tmp_path):
    items = [np.zeros(4 if i < 45 else 5, np.float32) + i for i in range(50)]
    store = roundtrip(items, tmp_path, shard_bytes=160)
    layouts = [r["fields"][0] for r in store.records]
    assert layouts[0] == {"shape": [4], "data": layouts[0]["data"]}  # fixed stride while the shape holds
    assert "offsets" in layouts[-1] and "shapes" in layouts[-1]
    assert store.fields[0]["shape"] is None
    assert "variable" in repr(store)


def test_repr(tmp_path):
    items = [{"image": np.zeros((2, 2), np.uint8), "text": "ab"[: i % 3], "label": i} for i in range(10)]
    lazyseq.save(items, tmp_path / "r", method="thread", shard_bytes=50)
    text = repr(lazyseq.load(tmp_path / "r"))
    head, *fields = text.splitlines()
    assert "len=10" in head and "shards" in head and "B on disk" in head
    assert fields == ["├─ ['image']  uint8  (2, 2)", "├─ ['text']  str  variable", "└─ ['label']  int"]


# -- errors ------------------------------------------------------------------------------------------
def test_unsupported_objects_name_item_and_field(tmp_path):
    items = [{"a": [1, object()]}]
    with pytest.raises(SchemaError, match=r"item 0, field \['a'\]\[1\]: cannot store a builtins.object.*allow_pickle"):
        lazyseq.save(items, tmp_path / "x", method="thread")
    with pytest.raises(SchemaError, match=r"field \['o'\]: cannot store an array of dtype object"):
        lazyseq.save([{"o": np.array([None])}], tmp_path / "y", method="thread")
    with pytest.raises(SchemaError, match="dict keys must be str or int"):
        lazyseq.save([{(1, 2): 3}], tmp_path / "z", method="thread")
    with pytest.raises(SchemaError, match=r"item 3, field \[0\]: the int .* does not fit in 64 bits"):
        lazyseq.save([(i,) for i in (1, 2, 3, 2**70)], tmp_path / "w", method="thread", shard_bytes=1000)
    assert os.listdir(tmp_path) == [".w.lazyseq-partial"]  # x, y, z failed at item 0: nothing to resume
    store = roundtrip([{"a": [1, {1, i}], "o": np.array([None, i])} for i in range(4)], tmp_path, "p", allow_pickle=True)
    assert store[2]["a"][1] == {1, 2}


@pytest.mark.parametrize("change, message", [
    (lambda x: {"a": x["a"]}, r"items 0 and 33 have different structures: the containers differ: "
     r"dict\('a': x, 'b': tuple\(x, x\)\) in the first, dict\('a': x\) in the second"),
    (lambda x: {"a": x["a"], "b": x["b"][:1]}, "items 0 and 33 .* containers differ"),
    (lambda x: {"a": x["a"].astype(np.float32), "b": x["b"]}, r"items 0 and 33 .*field \['a'\]: dtype <f8 in the first, <f4"),
    (lambda x: {"a": x["a"][None], "b": x["b"]}, r"field \['a'\]: ndim 1 in the first, 2 in the second"),
    (lambda x: {"a": x["a"], "b": (x["b"][0], "1")}, r"field \['b'\]\[1\]: kind int in the first, str in the second"),
], ids=["key", "length", "dtype", "ndim", "kind"])
def test_changing_structure_names_both_items(tmp_path, change, message):
    def item(i):
        x = {"a": np.arange(3.0), "b": (i, i)}
        return change(x) if i == 33 else x
    with pytest.raises(SchemaError, match=message):
        lazyseq.save(lazyseq.smap(item, range(40)), tmp_path / "x", method="thread", shard_bytes=200)


def boom_at(k):
    def f(i):
        if i == k:
            raise KeyError(f"bad {i}")
        return np.full(8, i)
    return f


def test_item_that_raises_stops_keeps_shards_and_resumes(tmp_path):
    path = tmp_path / "s"
    with pytest.raises(lazyseq.EvaluationError, match="item 70") as info:
        lazyseq.save(lazyseq.smap(boom_at(70), range(100)), path, method="thread", nworkers=1, shard_bytes=160)
    assert info.value.item == 70 and isinstance(info.value.__cause__, KeyError)
    partial = tmp_path / ".s.lazyseq-partial"
    kept = sorted(n for n in os.listdir(partial / ".progress") if n.startswith("shard"))
    assert kept and "shard-00000.json" in kept and not path.exists()
    with pytest.raises(FileNotFoundError, match="interrupted save.*run the same lazyseq.save again"):
        lazyseq.load(path)
    stamps = {n: os.stat(partial / n).st_mtime_ns for n in os.listdir(partial) if n.endswith(".bin")}
    lazyseq.save(lazyseq.smap(boom_at(-1), range(100)), path, method="thread", shard_bytes=160)
    store = lazyseq.load(path, verify=True)
    assert [int(x[0]) for x in store] == list(range(100))
    assert all(os.stat(path / n).st_mtime_ns == t for n, t in stamps.items())
    assert not partial.exists() and not (path / ".progress").exists()


def test_resume_refuses_another_job(tmp_path):
    path = tmp_path / "s"
    with pytest.raises(lazyseq.EvaluationError):
        lazyseq.save(lazyseq.smap(boom_at(60), range(100)), path, method="thread", shard_bytes=160, fingerprint="v1")
    with pytest.raises(FileExistsError, match="another job .*length differs.*overwrite=True"):
        lazyseq.save(lazyseq.smap(boom_at(-1), range(90)), path, method="thread", shard_bytes=160, fingerprint="v1")
    with pytest.raises(FileExistsError, match="fingerprint differs"):
        lazyseq.save(lazyseq.smap(boom_at(-1), range(100)), path, method="thread", fingerprint="v2")
    with pytest.raises(FileExistsError, match="fields differ"):
        lazyseq.save(lazyseq.smap(lambda i: np.full(8, i, np.int8), range(100)), path, method="thread", fingerprint="v1")
    lazyseq.save(lazyseq.smap(boom_at(-1), range(90)), path, method="thread", overwrite=True)  # starts afresh
    assert [int(x[0]) for x in lazyseq.load(path, verify=True)] == list(range(90))


def test_a_resumed_save_evaluates_only_the_unfinished_shards(tmp_path):
    """The plan (item 0's schema, items per shard) comes from the job file: the items sampled to
    make it (0, n/4, n/2, 3n/4) are not evaluated again."""
    calls, fail_at = collections.Counter(), [35]

    def item(i):
        calls[i] += 1
        if i in fail_at:
            raise ValueError("not yet")
        return np.full(4, i)
    path = tmp_path / "s"
    with pytest.raises(lazyseq.EvaluationError, match="item 35"):
        lazyseq.save(lazyseq.smap(item, range(40)), path, method="thread", nworkers=1, shard_bytes=320)
    assert json.loads((tmp_path / ".s.lazyseq-partial/.progress/job.json").read_text())["per_shard"] == 10
    calls.clear()
    fail_at.clear()  # the same pipeline, the same code: it resumes
    lazyseq.save(lazyseq.smap(item, range(40)), path, method="thread", nworkers=1, shard_bytes=320)
    assert sorted(calls) == list(range(30, 40)) and set(calls.values()) == {1}
    assert [int(x[0]) for x in lazyseq.load(path, verify=True)] == list(range(40))


def test_an_unstorable_object_names_its_item_and_field(tmp_path):
    items = lazyseq.smap(lambda i: {"a": {1} if i == 13 else 1}, range(40))  # 13 is not a sampled item
    with pytest.raises(SchemaError, match=r"item 13, field \['a'\]: cannot store a builtins.set"):
        lazyseq.save(items, tmp_path / "x", method="thread", shard_bytes=100)


JOB = """
import os, sys, time
import numpy as np
import lazyseq

def item(i):
    if os.environ.get("SLOW"):
        time.sleep(0.02)
    if os.environ.get("KILL_AT") == str(i):
        os.kill(os.getpid(), 9)
    return {"x": np.full(100, i, np.int32), "s": str(i) * (i % 5)}

def run(path, method="thread", nworkers=1):
    lazyseq.save(lazyseq.smap(item, range(300)), path, method=method, nworkers=nworkers, shard_bytes=4000,
                 progress=False)

if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops the save, however this was started
    run(sys.argv[1])
"""


def _job_module(tmp_path):
    (tmp_path / "savejob.py").write_text(textwrap.dedent(JOB))
    sys.path.insert(0, str(tmp_path))
    import importlib

    import savejob
    return importlib.reload(savejob)


def _check_job(path):
    store = lazyseq.load(path, verify=True)
    assert len(store) == 300
    for i, x in enumerate(store):
        assert x["x"].tolist() == [i] * 100 and x["s"] == str(i) * (i % 5)


def _records(progress):
    return [n for n in os.listdir(progress) if n.startswith("shard") and n.endswith(".json")]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_resume_after_kill_9_or_ctrl_c(tmp_path, sig):
    job = _job_module(tmp_path)
    try:
        path = tmp_path / "s"
        progress = tmp_path / ".s.lazyseq-partial" / ".progress"
        proc = subprocess.Popen([sys.executable, str(tmp_path / "savejob.py"), str(path)], env={**os.environ, "SLOW": "1"})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if progress.exists() and len(_records(progress)) >= 3:
                    break
                assert proc.poll() is None, "the save ended before it was killed"
                time.sleep(0.01)
            proc.send_signal(sig)
            assert proc.wait(10) != 0
        finally:
            proc.kill()
            proc.wait(10)
        done = [json.loads((progress / n).read_text())["file"] for n in _records(progress)]
        assert 3 <= len(done) < 20
        before = {n: (os.stat(progress.parent / n).st_ino, os.stat(progress.parent / n).st_mtime_ns) for n in done}
        job.run(path)
        _check_job(path)
        assert {n: (os.stat(path / n).st_ino, os.stat(path / n).st_mtime_ns) for n in done} == before
    finally:
        sys.path.remove(str(tmp_path))


def test_resume_after_a_worker_is_killed(tmp_path, monkeypatch):
    job = _job_module(tmp_path)
    try:
        monkeypatch.setenv("KILL_AT", "200")  # not a sample item: save evaluates those itself
        with pytest.raises(lazyseq.WorkerCrashed) as info:
            job.run(tmp_path / "s", method="process", nworkers=2)
        e = info.value  # in save's words: the shard and its items, and what to do
        message = str(e)
        assert message.startswith("lazyseq.save: worker ") and f"(pid {e.pid}) was killed by signal SIGKILL" in message
        shards = re.search(r"while writing shards? ([0-9]+)(?:-([0-9]+))? \(items ([0-9]+)-([0-9]+)\)", message)
        per_shard = json.loads((tmp_path / ".s.lazyseq-partial/.progress/job.json").read_text())["per_shard"]
        first, last = int(shards[1]), int(shards[2] or shards[1])
        assert first <= 200 // per_shard <= last and int(shards[3]) <= 200 <= int(shards[4]), message
        assert "run the same save again to resume" in message and "create a new one" not in message
        assert e.exitcode == -signal.SIGKILL and 200 // per_shard in e.items
        assert not (tmp_path / "s").exists()
        assert _records(tmp_path / ".s.lazyseq-partial" / ".progress")  # shards kept for the rerun
        monkeypatch.delenv("KILL_AT")
        job.run(tmp_path / "s", method="process", nworkers=2)
        _check_job(tmp_path / "s")
    finally:
        sys.path.remove(str(tmp_path))


def test_overwrite(tmp_path):
    path = tmp_path / "s"
    lazyseq.save([1, 2, 3], path, method="thread")
    with pytest.raises(FileExistsError, match="is a finished store; pass overwrite=True"):
        lazyseq.save([4, 5], path, method="thread")
    with pytest.raises(lazyseq.EvaluationError):  # a failed replacement leaves the old store whole
        lazyseq.save(lazyseq.smap(boom_at(1), range(3)), path, method="thread", overwrite=True)
    assert list(lazyseq.load(path, verify=True)) == [1, 2, 3]
    lazyseq.save([4, 5], path, method="thread", overwrite=True)
    assert list(lazyseq.load(path, verify=True)) == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["s"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a lazyseq store; refusing"):
        lazyseq.save([1], tmp_path / "other", method="thread", overwrite=True)
    (tmp_path / "empty").mkdir()
    lazyseq.save([1], tmp_path / "empty", method="thread")
    assert list(lazyseq.load(tmp_path / "empty")) == [1]
    with pytest.raises(TypeError, match="finite"):
        lazyseq.save(lazyseq.cycle([1]), tmp_path / "inf")


def test_missing_truncated_and_corrupted_files(tmp_path):
    path = tmp_path / "s"
    lazyseq.save([(np.arange(10) * i, "t" * i) for i in range(30)], path, method="thread", shard_bytes=300)
    name = json.loads((path / "manifest.json").read_text())["shards"][1]["file"]
    shard = path / name
    data = bytearray(shard.read_bytes())
    data[3] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert len(lazyseq.load(path)) == 30  # sizes match: only verify reads every byte
    with pytest.raises(StoreError, match=rf"{name} \(shard 1\) is corrupted: its checksum"):
        lazyseq.load(path, verify=True)
    shard.write_bytes(bytes(data[:-5]))
    with pytest.raises(StoreError, match=rf"{name} \(shard 1\) is truncated"):
        lazyseq.load(path)
    store = lazyseq.Store._reopen(str(path), lazyseq.load.__globals__["_manifest"](str(path)))
    with pytest.raises(lazyseq.EvaluationError, match=rf"{name} \(shard 1\) is truncated"):
        store[store.per_shard]
    shard.unlink()
    with pytest.raises(StoreError, match=rf"{name} \(shard 1\) is missing"):
        lazyseq.load(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"manifest.json \(the manifest\) cannot be read"):
        lazyseq.load(path)
    (path / "manifest.json").unlink()
    with pytest.raises(StoreError, match="is not a lazyseq store"):
        lazyseq.load(path)
    with pytest.raises(FileNotFoundError, match="there is no store at"):
        lazyseq.load(tmp_path / "nowhere")


def test_corrupted_offsets_are_caught_when_a_shard_opens(tmp_path):
    path = tmp_path / "s"
    lazyseq.save([np.arange(i) for i in range(8)], path, method="thread")
    m = json.loads((path / "manifest.json").read_text())
    off, _ = m["shards"][0]["fields"][0]["offsets"]
    with open(path / m["shards"][0]["file"], "r+b") as f:
        f.seek(off + 8 * 3)
        f.write(np.int64(10**9).tobytes())
    with pytest.raises(lazyseq.EvaluationError, match=r"shard-00000-\w+.bin is corrupted: the offsets"):
        lazyseq.load(path)[0]


# -- workers, memory -----------------------------------------------------------------------------------
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_store_in_process_workers(tmp_path, context):
    Local = collections.namedtuple("Local", "img n")
    items = [Local(np.full((16, 16), i, np.uint8), i) for i in range(64)]
    lazyseq.save(items, tmp_path / "s", method="thread", shard_bytes=2000)
    store = lazyseq.load(tmp_path / "s")
    assert len(pickle.dumps(store)) < 10_000  # the path and the manifest, no data
    with lazyseq.prefetch(store, nworkers=2, method="process", mp_context=context) as p:
        got = list(p)
    for g, x in zip(got, items):
        same(g, x)
    assert type(got[0]).__name__ == "Local"


def test_save_with_process_workers(tmp_path):
    items = lazyseq.smap(lambda i: {"a": np.arange(i % 7), "b": np.full(3, i)}, range(200))
    lazyseq.save(items, tmp_path / "s", nworkers=2, method="process", shard_bytes=500)
    store = lazyseq.load(tmp_path / "s", verify=True)
    assert len(store.records) > 4
    for i, x in enumerate(store):
        same(x, items[i])


def _rss_anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_reading_everything_keeps_anonymous_memory_flat(tmp_path):
    mb = 2**20
    items = lazyseq.smap(lambda i: (np.full(mb // 8, i, np.int64), np.arange(i % 1000, dtype=np.int32)), range(200))
    lazyseq.save(items, tmp_path / "s", method="thread", nworkers=1, shard_bytes=16 * mb)
    store = lazyseq.load(tmp_path / "s")
    assert store.nbytes() > 200 * mb
    store[0], store[-1]
    before = _rss_anon()
    total = 0
    for x, _ in store:
        total += int(x[-1])
    for b in lazyseq.batch(store, 10, collate_fn=lambda xs: xs):
        total += int(b[0][0][0])
    assert total == sum(range(200)) + sum(range(0, 200, 10))
    assert _rss_anon() - before < 16 * mb


# -- indexing semantics --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "s"
    lazyseq.save([(i, str(i)) for i in range(23)], path, method="thread", nworkers=1, shard_bytes=80)
    return lazyseq.load(path)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(-30, 30), st.slices(30), st.lists(st.integers(-23, 22), max_size=8)))
def test_keys_behave_as_on_a_list(small_store, key):
    ref = [(i, str(i)) for i in range(23)]
    try:
        want = ref[key] if not isinstance(key, list) else [ref[k] for k in key]
    except IndexError:
        with pytest.raises(IndexError):
            small_store[key]
        return
    got = small_store[key]
    assert (list(got) if isinstance(got, lazyseq.View) else got) == want


def test_one_save_at_a_time_and_progress_bar(tmp_path, capsys):
    from lazyseq.store import write

    with write._locked(str(tmp_path / ".s.lazyseq-partial")):
        with pytest.raises(RuntimeError, match="another save is writing"):
            lazyseq.save([1, 2], tmp_path / "s", method="thread")
    lazyseq.save(list(range(50)), tmp_path / "s", method="thread", progress=True, shard_bytes=80)
    assert "save s: 100%" in capsys.readouterr().err
    assert list(lazyseq.load(tmp_path / "s")) == list(range(50))


def test_a_resumed_save_says_so_and_its_bar_starts_where_it_resumes(tmp_path, capsys):
    path = tmp_path / "s"
    with pytest.raises(lazyseq.EvaluationError, match="item 45"):  # in the last shard: the others are written
        lazyseq.save(lazyseq.smap(boom_at(45), range(50)), path, method="thread", nworkers=1, shard_bytes=640,
                     progress=False)
    assert capsys.readouterr().err == ""  # progress=False: silent
    lazyseq.save(lazyseq.smap(boom_at(-1), range(50)), path, method="thread", nworkers=1, progress=True)
    err = capsys.readouterr().err
    line = err.splitlines()[0]  # 10 items per shard: shards 0-3 (items 0-39) were finished
    assert line == f"lazyseq.save: resuming {path}: kept 4 of 5 shards finished before (items 0-39: 40 of 50); writing the rest"
    assert "save s (resumed):  80%" in err and " 40/50 " in err and "100%" in err and " 50/50 " in err
    assert " 0/50 " not in err and "/50 [" in err
    assert [int(x[0]) for x in lazyseq.load(path, verify=True)] == list(range(50))


def test_a_shard_written_twice_stays_consistent(tmp_path, monkeypatch):
    # prefetch may hand a job that looks stuck to a second worker: both attempts write shard 1
    from lazyseq.store import write

    real = write.ShardWriter._get

    def twice(self, k):
        if k == 1:
            real(self, k)
        return real(self, k)
    monkeypatch.setattr(write.ShardWriter, "_get", twice)
    rng = np.random.default_rng()
    items = lazyseq.smap(lambda i: rng.random(16), range(40))  # not the same twice
    lazyseq.save(items, tmp_path / "s", method="thread", nworkers=1, shard_bytes=600)
    store = lazyseq.load(tmp_path / "s", verify=True)
    assert sorted(os.listdir(tmp_path / "s")) == sorted(["manifest.json", *(r["file"] for r in store.records)])
    assert len(list(store)) == 40


def test_bulk_reads_through_a_slice(tmp_path):
    store = roundtrip([(np.full(3, i), str(i)) for i in range(30)], tmp_path, shard_bytes=200)
    got = list(lazyseq.batch(store[5:25], 10, collate_fn=lambda xs: xs))
    assert [[x[1] for x in b] for b in got] == [[str(i) for i in range(5, 15)], [str(i) for i in range(15, 25)]]
    first = got[0]  # a run through one shard: zero-copy views of its memory map, read-only
    assert all(np.shares_memory(first[0][0].base, x[0]) for x in first[:2]) and not first[0][0].flags.writeable
    scattered = store._get_many([7, 2, 29, 2, 11])  # any order, any shards, repeats: rows of a read-only copy
    assert [int(x[0][0]) for x in scattered] == [7, 2, 29, 2, 11] and [x[1] for x in scattered] == ["7", "2", "29", "2", "11"]
    assert not scattered[0][0].flags.writeable
