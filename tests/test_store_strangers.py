"""A stranger's store, second pass (docs/store.md, "Stores from elsewhere"): containers come back as
they were saved, text from the manifest never reaches a message raw, every fault of a crafted
manifest or shard is a StoreError naming the file, and nothing is allocated by a count the files do
not vouch for."""

import collections
import json
import os
import pathlib
import pickle
import shutil
import tempfile
import time
import typing
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import StoreError
from lazyseq.store.format import SchemaError
from tests.hostile import manifest_of, rewrite


def read_every_way(store):
    """Every item by single reads, one bulk read in order and one reversed (gathers), twice (the
    second over the open shards' spans), and by columns where the store allows it."""
    out = [store[i] for i in range(len(store))]
    for _ in range(2):
        assert _same(store._get_many(range(len(store))), out)
        assert _same(store._get_many(list(range(len(store)))[::-1]), out[::-1])
    if store._columnar():
        store._get_columns(np.arange(len(store)))
    return out


def _same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


# -- 1. dict, list and tuple subclasses come back with their keys and values ------------------------
class Tagged(dict):
    """A user's dict subclass, made as dict is (its __init__ passes everything on)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = True


class Plain(dict):
    pass


class Ints(list):
    pass


class Pair(tuple):
    pass


Point = collections.namedtuple("Point", "x y")


class Typed(typing.NamedTuple):
    name: str
    size: int = 0


class MyDefault(collections.defaultdict):
    pass


def _containers(i):
    return {
        "counter": collections.Counter({"a": i, "b": 3, "zero": 0, "neg": -2}),
        "ordered": collections.OrderedDict([("z", i), ("a", [i, "x"])]),
        "default": collections.defaultdict(list, {"k": [i]}),
        "mydefault": MyDefault(int, {"n": i}),
        "tagged": Tagged(t=i, u="v"), "plain": Plain({1: i, "two": 2.0}),
        "ints": Ints([i, i + 1]), "pair": Pair((i, "p")), "point": Point(np.int16(i), [True]),
        "typed": Typed("n", i), "nested": collections.Counter({"c": i}),
    }


def test_dict_list_and_tuple_subclasses_round_trip(tmp_path):
    items = [_containers(i) for i in range(6)]
    lazyseq.save(items, tmp_path / "s", method="thread", shard_bytes=300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every class is imported and of its kind: no warning
        store = lazyseq.load(tmp_path / "s")
    for copy in (store, pickle.loads(pickle.dumps(store))):  # a worker's copy rebuilds the same way
        got = read_every_way(copy)
        assert _same(got, items)
    c = got[2]["counter"]
    assert type(c) is collections.Counter and dict(c) == {"a": 2, "b": 3, "zero": 0, "neg": -2}  # not counted pairs
    assert list(c) == ["a", "b", "zero", "neg"] and c["missing"] == 0
    assert got[2]["default"].default_factory is list and type(got[2]["mydefault"]) is MyDefault
    assert got[2]["mydefault"].default_factory is int and got[2]["mydefault"]["new"] == 0
    assert got[2]["tagged"].seen and got[2]["point"]._fields == ("x", "y") and got[2]["typed"].size == 2
    batch = store._get_columns(np.arange(3))  # by columns: the same classes around the columns
    assert type(batch["counter"]) is collections.Counter and list(batch["counter"]) == ["a", "b", "zero", "neg"]
    assert batch["counter"]["a"].tolist() == [0, 1, 2]


def test_struct_sequences_round_trip(tmp_path):
    items = [time.gmtime(i * 86400) for i in range(3)]
    lazyseq.save(items, tmp_path / "s", method="thread")
    got = lazyseq.load(tmp_path / "s")._get_many(range(3))
    assert all(type(g) is time.struct_time and g == x for g, x in zip(got, items))


# -- 2. text from the manifest never reaches a message raw -------------------------------------------
ESC = "\x1b[2J\x1b[31m\u202e\n\r\x07"  # clear the screen, red, right-to-left, a new line, a carriage return, a bell


def _clean(text):
    """No control or other unprintable character (a repr's lines are split at its own new lines)."""
    bad = [c for line in str(text).split("\n") for c in line if not c.isprintable()]
    assert not bad, f"raw {bad!r} in {text!r}"
    return text


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "s"
    lazyseq.save([{"a": np.arange(i % 3), "b": np.full(2, i), "s": str(i)} for i in range(6)], path, method="thread",
                 shard_bytes=120)
    return path


@pytest.mark.parametrize("change", [
    lambda m: m["fields"][0].update(path=ESC, ndim=-1),
    lambda m: m["fields"][0].update(path=ESC, dtype="|O"),
    lambda m: m["fields"][0].update(path=ESC, dtype=[[ESC, "|O"]]),
    lambda m: m["fields"][0].update(path=ESC, ndim=64),
    lambda m: m["fields"][0].update(path=ESC, kind=ESC),
    lambda m: m["fields"][1].update(path=ESC, shape=[1, 2, 3]),
    lambda m: m["shards"][0]["fields"][1].update(shape=[ESC]) or m["fields"][1].update(path=ESC),
    lambda m: m["shards"][0]["fields"][1].update(data=[0, 10**6]) or m["fields"][1].update(path=ESC),
    lambda m: m["shards"][0]["fields"][1].update(data=[0, 1]) or m["fields"][1].update(path=ESC),
    lambda m: m["shards"][0]["fields"].__setitem__(1, ESC),
    lambda m: m["shards"][0].update(file=ESC),
    lambda m: m["structure"].update(keys=[ESC, ESC, "x"]),
    lambda m: m["structure"].update(dict=ESC),
    lambda m: m["structure"]["items"][0].update(leaf=ESC),
    lambda m: m["structure"].update(tuple=None, fields=[ESC, "b", "s"]),
], ids=["ndim", "object-dtype", "object-field-name", "ndim-64", "kind", "field-shape", "layout-shape",
        "layout-past-end", "layout-size", "layout", "file", "keys", "class", "leaf", "namedtuple-fields"])
def test_control_characters_from_the_manifest_are_escaped_in_errors(small, change):
    rewrite(small, change)
    with pytest.raises(StoreError) as e:
        lazyseq.load(small)
    assert "manifest.json" in _clean(str(e.value)) and "\\x1b" in str(e.value)


def test_control_characters_are_escaped_in_warnings_reprs_and_read_errors(small, tmp_path):
    def hostile(m):
        m["fields"][0]["path"] = m["fields"][2]["path"] = ESC
        m["fields"][1]["dtype"] = [[ESC, "<i8"]]
        m["structure"]["dict"] = f"no_such_module{ESC}:X"
    rewrite(small, hostile)
    with pytest.warns(RuntimeWarning) as w:
        store = lazyseq.load(small)
    assert len(w) == 1 and "no_such_module\\x1b[2J" in _clean(w[0].message.args[0])
    assert "\\x1b[2J" in _clean(repr(store)) and "\\u202e" in repr(store)
    with pytest.raises(ValueError) as e:  # variable shapes cannot be stacked: the field named, escaped
        store._get_columns(np.arange(len(store)))
    assert "sample 0 has shape" in _clean(str(e.value)) and "\\x1b" in str(e.value)
    m = manifest_of(small)  # a shard's shape table corrupted: the error names the field, escaped
    rec = m["shards"][0]
    raw = bytearray((small / rec["file"]).read_bytes())
    raw[rec["fields"][0]["shapes"][0]:rec["fields"][0]["shapes"][0] + 8] = np.int64(2**40).tobytes()
    (small / rec["file"]).write_bytes(bytes(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = lazyseq.load(small)
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[0]
    assert isinstance(e.value.__cause__, StoreError) and "\\x1b" in _clean(str(e.value.__cause__))


def test_pickled_field_paths_are_escaped(tmp_path):
    lazyseq.save([{"x": {1, 2}}], tmp_path / "p", method="thread", allow_pickle=True)
    rewrite(tmp_path / "p", lambda m: m["fields"][0].update(path=ESC))
    with pytest.raises(StoreError, match="pickled") as e:
        lazyseq.load(tmp_path / "p")
    assert "\\x1b" in _clean(str(e.value))


def test_long_manifest_values_are_cut_in_messages(small):
    rewrite(small, lambda m: m["fields"][0].update(path="p" * 10**6, ndim=[["x" * 10**5] * 10] * 10))
    with pytest.raises(StoreError) as e:
        lazyseq.load(small)
    assert len(str(e.value)) < 1000


# -- 3. a class's constructor, numpy's limits, tables changed after the checks: StoreErrors ----------
class Strict(dict):
    """A dict subclass that takes two arguments."""

    def __init__(self, a, b):
        super().__init__(a=a, b=b)


class Picky(list):
    def __init__(self, items):
        if len(items) > 1:
            raise ValueError("at most one item")
        super().__init__(items)


class Odd(collections.namedtuple("Odd", "u v")):
    def __new__(cls, u, v):
        if u == 3:
            raise RuntimeError("not 3")
        return super().__new__(cls, u, v)


def test_a_constructor_that_raises_is_a_store_error_naming_the_class(tmp_path):
    lazyseq.save([{"s": Strict(1, 2)}] * 3, tmp_path / "d", method="thread")
    store = lazyseq.load(tmp_path / "d")
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[0]
    err = e.value.__cause__
    assert isinstance(err, StoreError) and str(err).startswith(str(tmp_path / "d" / "manifest.json"))
    assert "Strict at ['s'] of the item cannot be made from its saved values: TypeError" in str(err)
    with pytest.raises(StoreError, match=r"Strict at \['s'\]"):
        store._get_many(range(3))
    grown = Picky([1])
    grown.append(2)  # made with one item, holds two: its constructor refuses the saved values
    lazyseq.save([[grown]] * 2, tmp_path / "l", method="thread")
    with pytest.raises(lazyseq.EvaluationError) as e:
        lazyseq.load(tmp_path / "l")[0]
    assert "Picky at [0] of the item cannot be made" in str(e.value.__cause__) and "ValueError: at most one" in str(e.value)
    odd = [(Odd(i, "v") if i != 3 else tuple.__new__(Odd, (3, "v")),) for i in range(5)]  # one made around __new__
    lazyseq.save(odd, tmp_path / "n", method="thread")
    store = lazyseq.load(tmp_path / "n")
    assert store[2] == (Odd(2, "v"),) and type(store[2][0]) is Odd
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[3]
    assert "Odd at [0] of the item cannot be made from its saved values: RuntimeError: not 3" in str(e.value.__cause__)


@pytest.mark.parametrize("shape", [[0, 2**62, 2**62], [2**31, 0, 2**31, 2**31], [0, 2**41]])
def test_a_zero_dimension_beside_huge_ones_is_refused_at_load(tmp_path, shape):
    lazyseq.save([np.zeros((0, 2))] * 4, tmp_path / "s", method="thread")

    def huge(m):
        m["fields"][0].update(ndim=len(shape), shape=shape)
        m["shards"][0]["fields"][0]["shape"] = shape
    rewrite(tmp_path / "s", huge)
    with pytest.raises(StoreError, match=r"manifest.json is corrupted: shard 0, field \(item\): its shape .* too large"):
        lazyseq.load(tmp_path / "s")


def _var_store(path):
    lazyseq.save([np.zeros((i % 3, 2), np.uint8) for i in range(6)], path, method="thread")
    rec = manifest_of(path)["shards"][0]
    assert "shapes" in rec["fields"][0]
    return rec


def _set_row(path, rec, row, values):
    f = path / rec["file"]
    raw = bytearray(f.read_bytes())
    at = rec["fields"][0]["shapes"][0] + 16 * row
    raw[at:at + 16] = np.array(values, "<i8").tobytes()
    with open(f, "r+b") as out:  # in place: a memory map of it sees the change
        out.write(bytes(raw))


def test_a_zero_dimension_beside_huge_ones_in_a_shape_table(tmp_path):
    rec = _var_store(tmp_path / "s")
    _set_row(tmp_path / "s", rec, 0, [0, 2**62])
    store = lazyseq.load(tmp_path / "s")
    for read in (lambda: store[1], lambda: store._get_many([1, 2, 3, 4, 5])):
        with pytest.raises((StoreError, lazyseq.EvaluationError)) as e:
            read()
        err = e.value if isinstance(e.value, StoreError) else e.value.__cause__
        assert isinstance(err, StoreError) and rec["file"] in str(err)
        assert "shape table of field (item) is too large for an array" in str(err)


def test_a_zero_dimension_beside_huge_ones_in_a_remote_shape_table(http_files):
    rec = _var_store(http_files.root / "s")
    _set_row(http_files.root / "s", rec, 1, [2**41, 0])
    store = lazyseq.load(f"{http_files.url}/s")
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[0]
    err = e.value.__cause__
    assert isinstance(err, StoreError) and f"{http_files.url}/s/{rec['file']}" in str(err) and "too large" in str(err)


def test_tables_changed_after_they_were_checked(tmp_path):
    rec = _var_store(tmp_path / "s")
    store = lazyseq.load(tmp_path / "s")
    assert store[2].shape == (2, 2)  # the shard is open: its tables checked
    _set_row(tmp_path / "s", rec, 2, [2**20, 2])  # a writer changes the file under the memory map
    for read in (lambda: store[2], lambda: store._get_many([2, 4, 5, 1])):
        with pytest.raises((StoreError, lazyseq.EvaluationError)) as e:
            read()
        err = e.value if isinstance(e.value, StoreError) else e.value.__cause__
        assert isinstance(err, StoreError) and rec["file"] in str(err) and "field (item)" in str(err)
        assert "changed after it was opened" in str(err)


def test_dimensions_past_numpys_limit(tmp_path):
    lazyseq.save([np.zeros((1,) * 3)] * 2, tmp_path / "s", method="thread")

    def deep(m):
        m["fields"][0].update(ndim=64, shape=[1] * 64)
        m["shards"][0]["fields"][0]["shape"] = [1] * 64
    rewrite(tmp_path / "s", deep)
    with pytest.raises(StoreError, match=r"field \(item\) has 64 dimensions: a store's arrays have at most 63"):
        lazyseq.load(tmp_path / "s")
    with pytest.raises(SchemaError, match="an array of 64 dimensions: a store holds arrays of at most 63"):
        lazyseq.save([np.zeros((1,) * 64)], tmp_path / "t", method="thread")
    lazyseq.save([np.ones((1,) * 63)], tmp_path / "u", method="thread")
    assert lazyseq.load(tmp_path / "u")[0].ndim == 63


@pytest.mark.parametrize("dtype", ["|V0", "|S0", "<U0", []])
def test_values_of_zero_bytes_are_refused(tmp_path, dtype):
    lazyseq.save([np.zeros(2, np.uint8)] * 3, tmp_path / "s", method="thread")
    rewrite(tmp_path / "s", lambda m: m["fields"][0].update(dtype=dtype))
    with pytest.raises(StoreError, match="of 0 bytes"):
        lazyseq.load(tmp_path / "s")
    with pytest.raises(SchemaError, match="values of 0 bytes"):
        lazyseq.save([np.zeros(2, "V0")], tmp_path / "t", method="thread")


def test_a_field_fixed_in_some_shards_and_variable_in_others_reads_right(tmp_path):
    items = [np.full((1 + i % 2, 2), i, np.int64) for i in range(4)] + [np.full((2, 2), 10 + i, np.int64) for i in range(4)]
    lazyseq.save(items, tmp_path / "s", method="thread", shard_bytes=100)
    store = lazyseq.load(tmp_path / "s")
    assert ["shapes" in r["fields"][0] for r in store.records] == [True, False]
    for _ in range(3):  # the first bulk read opens the shards, the next ones read through their spans
        assert _same(store._get_many([1, 2, 5, 6, 7]), [items[i] for i in (1, 2, 5, 6, 7)])


# -- 4. nothing allocated by a count the files do not vouch for ---------------------------------------
def test_a_length_the_files_do_not_vouch_for(tmp_path):
    lazyseq.save([np.zeros(0)] * 3, tmp_path / "s", method="thread")
    n = 2**24 + 1  # items of no bytes: past the limit (2**40 would make .sizes allocate 8 TB)
    rewrite(tmp_path / "s", lambda m: m.update(length=n, per_shard=n) or m["shards"][0].update(stop=n))
    with pytest.raises(StoreError, match=rf"it lists {n} items, and its shard files hold 0 bytes"):
        lazyseq.load(tmp_path / "s")
    lazyseq.save([None] * 1000, tmp_path / "n", method="thread")  # items of no bytes, a few: a store
    assert lazyseq.load(tmp_path / "n")[999] is None
    lazyseq.save([np.zeros(1, np.uint8)] * 10, tmp_path / "b", method="thread")
    rewrite(tmp_path / "b", lambda m: m.update(length=11, per_shard=11) or m["shards"][0].update(stop=11))
    with pytest.raises(StoreError, match="holds 10 bytes, where 11 items need 11"):
        lazyseq.load(tmp_path / "b")


# -- fuzzing: numbers and names at the manifest's hard places ------------------------------------------
def _stores(root):
    P = collections.namedtuple("P", "a b")
    specs = {
        "var": [np.arange(i * 3, dtype=np.float32).reshape(i, 3) for i in range(7)],
        "fixed": [{"img": np.full((2, 3), i, np.uint8), "y": i, "p": P(np.int16(i), b"b" * i)} for i in range(7)],
        "classes": [(collections.Counter(a=i), collections.OrderedDict(z=str(i)), [np.bool_(i % 2)]) for i in range(7)],
    }
    for name, items in specs.items():
        lazyseq.save(items, root / name, method="thread", shard_bytes=120)
    return {name: ((root / name / "manifest.json").read_text(), {f.name: f.read_bytes() for f in (root / name).glob("*.bin")})
            for name in specs}


@pytest.fixture(scope="module")
def fuzz_stores(tmp_path_factory):
    return _stores(tmp_path_factory.mktemp("strangers"))


NUMBERS = [0, 1, 2, 3, 31, 32, 63, 64, 65, 2**31, 2**32, 2**40, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1, -1, -(2**63)]
hard = st.sampled_from(NUMBERS) | st.lists(st.sampled_from([0, 1, 2, 2**31, 2**40, 2**62]), max_size=66) | st.sampled_from(
    ["|V0", "<U0", "|S0", "V1000000000000", "<M8[s]", ">f2", "|b1", "(2,3)<i4", ESC, "collections:Counter",
     "http.cookies:SimpleCookie", "builtins:object", "os:getcwd", "a:b"]) | st.sampled_from(
    [[["a", "<u1", [0, 2**40, 2**40]]], [["a", "<u1", [1] * 40]], [["", "<u1"]], [["a", "<u1"], ["a", "<u1"]], []])


def _places(x, here=()):
    yield here
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _places(v, (*here, k))
    elif isinstance(x, list):
        for k, v in enumerate(x):
            yield from _places(v, (*here, k))


@settings(max_examples=int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_hard_values_fail_only_with_clean_store_errors(fuzz_stores, tmp_path, data):
    text, files = fuzz_stores[data.draw(st.sampled_from(sorted(fuzz_stores)))]
    m, files = json.loads(text), dict(files)
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            where = data.draw(st.sampled_from(list(_places(m))[1:]))
            parent = m
            for k in where[:-1]:
                parent = parent[k]
            parent[where[-1]] = json.loads(json.dumps(data.draw(hard)))  # a copy: a sampled list is shared
        else:  # an int64 of a shard (its tables) set to a hard number
            f = data.draw(st.sampled_from(sorted(files)))
            raw = bytearray(files[f])
            if len(raw) >= 8:
                at = data.draw(st.integers(0, len(raw) // 8 - 1)) * 8
                raw[at:at + 8] = np.int64(data.draw(st.sampled_from(NUMBERS))).tobytes()
            files[f] = bytes(raw)
    path = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    (path / "manifest.json").write_text(json.dumps(m))
    for f, b in files.items():
        (path / f).write_bytes(b)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            store = lazyseq.load(path)
            _clean(repr(store))
            sizes = store.sizes
            assert sizes is None or len(sizes) == len(store)
            for i in range(len(store)):
                try:
                    store[i]
                except lazyseq.EvaluationError as e:
                    assert isinstance(e.__cause__, StoreError), repr(e.__cause__)
                    _clean(e.__cause__)
            store._get_many(range(len(store)))
            store._get_many(list(range(len(store)))[::-1])
            pickle.loads(pickle.dumps(store))
        except StoreError as e:
            _clean(e)
    for x in w:
        _clean(x.message)
    shutil.rmtree(path)
