"""Stores from elsewhere: loading and reading a crafted store never runs code, never reads outside
the store's own files, and fails with a StoreError naming the file (docs/store.md)."""

import collections
import json
import os
import pathlib
import pickle
import sys
import tempfile
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import StoreError
from tests.hostile import manifest_of, raised_within, rewrite


def _mkdir(path):  # what a hostile pickle in a store would run
    os.mkdir(path)


class Boom:
    """Pickles as a call to os.mkdir: unpickling it makes a directory."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_mkdir, (self.path,))






def read_all(store):
    return [store[i] for i in range(len(store))] + store._get_many(range(len(store)))


@pytest.fixture
def simple(tmp_path):
    """A small store: a fixed array, a variable array, a str and an int per item, in 2 shards."""
    path = tmp_path / "s"
    items = [{"img": np.full((2, 3), i, np.uint8), "tok": np.arange(i % 4), "s": f"t{i}", "y": i} for i in range(10)]
    lazyseq.save(items, path, method="thread", shard_bytes=200)
    assert len(manifest_of(path)["shards"]) >= 2
    return path


def test_pickled_fields_are_refused_and_run_nothing(tmp_path):
    marker = tmp_path / "ran"
    lazyseq.save([{"x": Boom(str(marker)), "y": 1}], tmp_path / "p", method="thread", allow_pickle=True)
    with pytest.raises(StoreError, match=r"field \['x'\] of this store is pickled.*allow_pickle=True.*trust"):
        lazyseq.load(tmp_path / "p")
    assert not marker.exists()
    store = lazyseq.load(tmp_path / "p", allow_pickle=True)  # the caller's opt-in: today's behaviour
    assert store.allow_pickle and not marker.exists()
    copy = pickle.loads(pickle.dumps(store))  # the flag travels to workers
    assert copy.allow_pickle
    assert copy[0]["y"] == 1 and marker.exists()


def test_a_module_the_manifest_names_is_never_imported(tmp_path, monkeypatch):
    mod = tmp_path / "lazyseq_evil_mod.py"
    mod.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass Box(dict):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazyseq.save([{"a": 1}], tmp_path / "s", method="thread")
    rewrite(tmp_path / "s", lambda m: m["structure"].update({"dict": "lazyseq_evil_mod:Box"}))
    with pytest.warns(RuntimeWarning, match=r"lazyseq_evil_mod:Box.*not imported.*allow_pickle=True") as w:
        store = lazyseq.load(tmp_path / "s")
    assert len(w) == 1
    assert type(store[0]) is dict and store[0] == {"a": 1}
    assert not (tmp_path / "imported").exists() and "lazyseq_evil_mod" not in sys.modules
    try:
        store = lazyseq.load(tmp_path / "s", allow_pickle=True)  # trusted: imported, as before
        assert type(store[0]).__name__ == "Box" and (tmp_path / "imported").exists()
    finally:
        sys.modules.pop("lazyseq_evil_mod", None)


@pytest.mark.parametrize("kind, cls, expect", [
    ("dict", "collections:OrderedDict", collections.OrderedDict),  # imported and a dict: used
    ("dict", "builtins:str", dict),  # imported, not a dict: refused
    ("list", "os:system", list),  # a function, not a class
    ("list", "collections:OrderedDict", list),  # a class of another kind
    ("dict", "os.path:join.__globals__", dict),  # no attribute walk into a function's globals
])
def test_a_class_is_used_only_if_imported_and_of_the_declared_kind(tmp_path, kind, cls, expect):
    item = {"a": 1} if kind == "dict" else [1, 2]
    lazyseq.save([item], tmp_path / "s", method="thread")
    rewrite(tmp_path / "s", lambda m: m["structure"].update({kind: cls}))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        store = lazyseq.load(tmp_path / "s")
    assert type(store[0]) is expect and store[0] == expect(item)
    assert len(w) == (expect in (dict, list))


def test_namedtuples_and_defaultdicts(tmp_path):
    P = collections.namedtuple("P", "x y")
    items = [{"p": P(1, 2), "d": collections.defaultdict(list, {"k": 3})}]
    lazyseq.save(items, tmp_path / "s", method="thread")
    store = lazyseq.load(tmp_path / "s")  # P lives in this function: made again from its name and fields
    assert store[0]["p"] == (1, 2) and store[0]["p"]._fields == ("x", "y")
    assert type(store[0]["d"]) is collections.defaultdict and store[0]["d"].default_factory is list

    def evil(m):
        m["structure"]["items"][1]["factory"] = "os:getcwd"
        m["structure"]["items"][0]["tuple"] = "collections:OrderedDict"  # not a namedtuple: remade from fields
    rewrite(tmp_path / "s", evil)
    with pytest.warns(RuntimeWarning, match="os:getcwd"):
        store = lazyseq.load(tmp_path / "s")
    assert type(store[0]["d"]) is dict and store[0]["d"] == {"k": 3}
    assert store[0]["p"]._fields == ("x", "y") and type(store[0]["p"]).__name__ == "OrderedDict"


def test_manifest_text_is_never_code(tmp_path):
    marker = tmp_path / "ran"
    lazyseq.save([{"a": 1, "b'] or __import__('os') or v['": 2}], tmp_path / "s", method="thread")
    assert lazyseq.load(tmp_path / "s")[0]["b'] or __import__('os') or v['"] == 2  # a key is only data
    code = f"0] or __import__('os').mkdir({str(marker)!r}) or v[0"
    rewrite(tmp_path / "s", lambda m: m["structure"]["items"][0].update({"leaf": code}))
    with pytest.raises(StoreError, match=r"manifest.json is corrupted: its structure names field"):
        lazyseq.load(tmp_path / "s")
    assert not marker.exists()


@pytest.mark.parametrize("change, message", [
    (lambda m: m["shards"][0]["fields"][0].update(data=[-64, m["shards"][0]["fields"][0]["data"][1]]),
     "data offset is -64"),
    (lambda m: m["shards"][0]["fields"][2].update(data=[-10**6, 10]), "data offset"),
    (lambda m: m["shards"][0]["fields"][0].update(data=[m["shards"][0]["bytes"], 12]), "ends past the end of the file"),
    (lambda m: m["shards"][0]["fields"][3].update(data=[m["shards"][0]["fields"][0]["data"][0], 40]), "overlap"),
    (lambda m: m["fields"][0].update(dtype="|O"), "holds Python objects"),
    (lambda m: m["fields"][0].update(dtype=[["a", "|u1"], ["b", "|O"]]), "holds Python objects"),
    (lambda m: m["fields"][0].update(dtype="not a dtype"), "is not a numpy dtype"),
    (lambda m: m["fields"][1].update(ndim=10**9), "ndim"),
    (lambda m: m["shards"][0]["fields"][0].update(shape=[-2, 3]), "a dimension of its shape"),
    (lambda m: m["shards"][0]["fields"][0].update(shape=[2**40, 2**40]), "elements|holds"),
    (lambda m: m["shards"][0].update(file="../outside.bin"), "not a plain file name"),
    (lambda m: m["shards"][0].update(file="/etc/passwd"), "not a plain file name"),
    (lambda m: m["shards"][1].update(file=m["shards"][0]["file"]), "another shard's file"),
    (lambda m: m.update(length=2**40), "shards"),
    (lambda m: m.update(length=2**70), "length"),
    (lambda m: m.update(per_shard=0), "per_shard"),
    (lambda m: m.update(length=m["length"] - 1), "holds items"),
    (lambda m: m["fields"][0].update(kind="exec"), "kind"),
    (lambda m: m["structure"].update(keys=["img", "img", "s", "y"]), "keys"),
    (lambda m: m["structure"].update(dict=["x"]), "class"),
    (lambda m: m["shards"][0].update(crc32="x"), "crc32"),
], ids=["negative-offset", "very-negative", "past-end", "overlap", "object-dtype", "object-field", "bad-dtype",
        "huge-ndim", "negative-shape", "huge-shape", "dotdot", "absolute", "duplicate-file", "length-2**40",
        "length-2**70", "per-shard-0", "length-disagrees", "kind", "duplicate-keys", "class-not-str", "crc"])
def test_hostile_manifests_are_refused_at_load(simple, change, message):
    rewrite(simple, change)
    with pytest.raises(StoreError, match=rf"manifest.json is corrupted: .*({message})"):
        lazyseq.load(simple)


@pytest.mark.parametrize("key", ["length", "per_shard", "fields", "structure", "shards"])
def test_missing_manifest_keys(simple, key):
    rewrite(simple, lambda m: m.pop(key))
    with pytest.raises(StoreError, match="manifest.json is corrupted"):
        lazyseq.load(simple)


@pytest.mark.parametrize("key", ["start", "stop", "file", "bytes", "crc32", "fields"])
def test_missing_shard_keys(simple, key):
    rewrite(simple, lambda m: m["shards"][1].pop(key))
    with pytest.raises(StoreError, match="manifest.json is corrupted: shard 1"):
        lazyseq.load(simple)


def test_deep_structures_and_non_json(simple):
    deep = {"leaf": 0}
    for _ in range(10000):
        deep = {"list": None, "items": [deep]}
    text = (simple / "manifest.json").read_text()
    m = manifest_of(simple)
    (simple / "manifest.json").write_text(text.replace(json.dumps(m["structure"], separators=(",", ":")),
                                                       '{"list":null,"items":[' * 10000 + '{"leaf":0}' + "]}" * 10000))
    with pytest.raises(StoreError, match=r"manifest.json \(the manifest\) cannot be read: RecursionError"):
        lazyseq.load(simple)
    deep = {"leaf": 0}
    for _ in range(200):
        deep = {"list": None, "items": [deep]}
    m["fields"], m["structure"] = m["fields"][:1], deep
    for rec in m["shards"]:
        rec["fields"] = rec["fields"][:1]
    (simple / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="nested more than 64 deep"):
        lazyseq.load(simple)
    (simple / "manifest.json").write_bytes(b"\xff{not json")
    with pytest.raises(StoreError, match="cannot be read"):
        lazyseq.load(simple)


def test_shard_files_must_be_regular_files_inside_the_store(simple, tmp_path):
    m = manifest_of(simple)
    first = simple / m["shards"][0]["file"]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(first.read_bytes())
    first.unlink()
    first.symlink_to(outside)  # the right size and checksum, outside the store
    with pytest.raises(StoreError, match=r"\(shard 0\) is a symbolic link: .* never through a link"):
        lazyseq.load(simple)
    store = lazyseq.Store._reopen(str(simple), m)  # a worker's copy checks again when it opens the shard
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[0]
    assert isinstance(e.value.__cause__, StoreError)
    first.unlink()
    os.mkfifo(first)
    with pytest.raises(StoreError, match="not a regular file"):
        lazyseq.load(simple)
    done = []

    def read_first():
        try:
            store[0]
        except lazyseq.EvaluationError as e:
            done.append(e)
    t = threading.Thread(target=read_first, daemon=True)
    t.start()
    t.join(10)
    assert done and isinstance(done[0].__cause__, StoreError), "opening a FIFO shard must never hang"
    first.unlink()
    inside = simple / "copy.bin"
    inside.write_bytes(outside.read_bytes())
    first.symlink_to(inside)  # a link is refused even to a file inside the store: no link is followed
    with pytest.raises(StoreError, match="is a symbolic link"):
        lazyseq.load(simple)
    first.unlink()
    os.link(inside, first)  # a hard link is the file itself
    assert lazyseq.load(simple)[0]["y"] == 0


def _special(path, kind):
    """Put a FIFO, a directory or a character device (as /dev/null) at ``path``."""
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        import stat

        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except PermissionError:
            pytest.skip("no device file can be made, or opened, here (not root, or a nodev file system)")




@pytest.mark.parametrize("kind", ["FIFO", "directory", "device"])
def test_a_shard_that_is_not_a_regular_file_is_named(simple, kind):
    m = manifest_of(simple)
    first = simple / m["shards"][0]["file"]
    first.unlink()
    _special(first, kind)
    want = f"{first} (shard 0) is not a regular file (a {kind}): a dataset's files are plain files"
    err = raised_within(10, lambda: lazyseq.load(simple))
    assert isinstance(err, StoreError) and str(err) == want
    store = lazyseq.Store._reopen(str(simple), m)  # a worker's copy: the shard opened (without blocking) at a read
    err = raised_within(10, lambda: store[0])
    assert isinstance(err, lazyseq.EvaluationError) and isinstance(err.__cause__, StoreError) and str(err.__cause__) == want
    assert store[len(store) - 1]["y"] == len(store) - 1  # the other shard reads


@pytest.mark.parametrize("kind", ["FIFO", "directory", "device"])
def test_a_manifest_that_is_not_a_regular_file_is_named(simple, kind):
    manifest = simple / "manifest.json"
    manifest.unlink()
    _special(manifest, kind)
    err = raised_within(10, lambda: lazyseq.load(simple))
    assert isinstance(err, StoreError)
    assert str(err) == f"{manifest} (the manifest) is not a regular file (a {kind}): a dataset's files are plain files"


def test_corrupted_tables_fail_the_item_they_touch(simple):
    m = manifest_of(simple)
    rec = m["shards"][0]
    tok = rec["fields"][1]
    raw = bytearray((simple / rec["file"]).read_bytes())
    shapes = np.frombuffer(raw, "<i8", count=rec["stop"] - rec["start"], offset=tok["shapes"][0]).copy()
    shapes[1] = 2**62  # an overflowing size
    raw[tok["shapes"][0]:tok["shapes"][0] + shapes.nbytes] = shapes.tobytes()
    (simple / rec["file"]).write_bytes(bytes(raw))
    store = lazyseq.load(simple)  # sizes match: the tables are read when the shard opens
    with pytest.raises(lazyseq.EvaluationError, match="offsets or shapes of field"):
        store[0]
    assert store[len(store) - 1]["y"] == len(store) - 1  # the other shard reads
    s_field = m["shards"][-1]["fields"][2]
    last = simple / m["shards"][-1]["file"]
    raw = bytearray(last.read_bytes())
    raw[s_field["data"][0]] = 0xFF  # not UTF-8
    last.write_bytes(bytes(raw))
    with pytest.raises(lazyseq.EvaluationError, match="is not valid UTF-8") as e:
        lazyseq.load(simple)[m["shards"][-1]["start"]]
    assert isinstance(e.value.__cause__, StoreError)


# -- fuzzing: mutations of real stores give a StoreError or a store that reads, never anything else ---
def _stores(root):
    P = collections.namedtuple("P", "a b")
    specs = {
        "mixed": [{"img": np.full((2, 3), i, np.uint8), "tok": np.arange(i % 5, dtype=np.int32), "s": f"s{i}" * (i % 3),
                   "b": bytes([i]) * (i % 4), "y": i, "f": i / 3, "n": None, "p": P(np.int16(i), [True, i])}
                  for i in range(12)],
        "arrays": [np.arange(i * 3, dtype=np.float64).reshape(i, 3) for i in range(9)],
        "plain": [(i, str(i)) for i in range(7)],
    }
    for name, items in specs.items():
        lazyseq.save(items, root / name, method="thread", shard_bytes=150)
    return {name: (root / name, (root / name / "manifest.json").read_text(),
                   {f.name: f.read_bytes() for f in (root / name).glob("*.bin")}) for name in specs}


@pytest.fixture(scope="module")
def real_stores(tmp_path_factory):
    return _stores(tmp_path_factory.mktemp("fuzz"))


def _paths(x, here=()):
    yield here
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, (*here, k))
    elif isinstance(x, list):
        for k, v in enumerate(x):
            yield from _paths(v, (*here, k))


json_values = st.recursive(
    st.none() | st.booleans() | st.sampled_from([0, 1, -1, 2, 7, 64, -64, 2**31, 2**40, 2**63, -(2**63), 10**30])
    | st.integers(-1000, 10**6) | st.floats(allow_nan=False) | st.sampled_from(
        ["", "..", "../x", "/etc/passwd", "|O", "<i8", "|u1", "<f8", "O", "builtins:eval", "os:system", "array", "pickle",
         "str", "none", "int", "x:y", "manifest.json", "shard-00000.json", "V1000000000000", "<U100"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["leaf", "dict", "list", "tuple", "items", "keys", "fields", "data", "offsets", "shapes", "shape", "kind"]),
        inner, max_size=3),
    max_leaves=8)


@st.composite
def mutations(draw, stores):
    name = draw(st.sampled_from(sorted(stores)))
    path, text, shards = stores[name]
    m = json.loads(text)
    files = dict(shards)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):  # a value of the manifest replaced, dropped or added
            where = draw(st.sampled_from(list(_paths(m))[1:]))
            parent = m
            for k in where[:-1]:
                parent = parent[k]
            what = draw(st.sampled_from(["set", "drop", "int"]))
            if what == "drop" and isinstance(parent, dict):
                parent.pop(where[-1])
            elif what == "int" and type(parent[where[-1]]) is int:
                parent[where[-1]] += draw(st.sampled_from([-1, 1, -8, 8, 64, -(2**40), 2**40]))
            else:
                parent[where[-1]] = draw(json_values)
        else:  # bytes of a shard changed, cut off, or added
            f = draw(st.sampled_from(sorted(files)))
            data = bytearray(files[f])
            how = draw(st.sampled_from(["flip", "truncate", "append"]))
            if how == "flip" and data:
                for _ in range(draw(st.integers(1, 8))):
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            elif how == "truncate":
                del data[draw(st.integers(0, len(data))):]
            else:
                data += bytes(draw(st.integers(1, 64)))
            files[f] = bytes(data)
    return path, json.dumps(m), files


@settings(max_examples=int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_stores_fail_only_with_store_errors(real_stores, tmp_path, data):
    _, text, files = data.draw(mutations(real_stores))
    path = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    (path / "manifest.json").write_text(text)
    for f, b in files.items():
        (path / f).write_bytes(b)
    modules = set(sys.modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a class name mutated: a warning, and plain containers
        try:
            store = lazyseq.load(path, verify=data.draw(st.booleans()))
        except StoreError:
            return
        for i in range(len(store)):
            try:
                store[i]
            except lazyseq.EvaluationError as e:
                assert isinstance(e.__cause__, StoreError), repr(e.__cause__)
        try:
            store._get_many(range(len(store)))
        except StoreError:
            pass
        pickle.loads(pickle.dumps(store))
    assert set(sys.modules) <= modules, "loading a store imported a module"
