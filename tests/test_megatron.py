"""lazyseq.megatron: Megatron's bin/idx written and read back, hostile index files, the GPT and blend
views' laziness, pickling, workers, DataLoader and cache (tests/test_megatron_golden.py compares
their samples with tinygrad's and Megatron-core's)."""

from __future__ import annotations

import os
import pathlib
import pickle
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lazyseq
from lazyseq import StoreError, megatron
from lazyseq.megatron import access, samples

FUZZ = int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES", 200))


def corpus(seed: int, n: int = 60, top: int = 60000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = np.minimum(1 + (rng.pareto(1.2, n) * 10).astype(int), 400)
    lens[::7] = 1
    return [rng.integers(0, top, k) for k in lens]


def leftovers(d) -> list[str]:
    return [f for f in os.listdir(d) if "lazyseq-tmp" in f]


# -- write, read ---------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(hnp.arrays(st.sampled_from([np.uint8, np.int16, np.int32, np.int64, np.uint16]),
                                 st.integers(0, 20)), max_size=12))
def test_write_then_read_gives_the_documents_back_in_the_smallest_dtype(tmp_path, docs):
    prefix = tmp_path / "c"
    megatron.write(prefix, docs)
    back = megatron.indexed(prefix)
    values = np.concatenate([d.astype(np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    want = np.uint16 if not values.size or (values.min() >= 0 and values.max() < 2**16) else \
        np.int32 if values.min() >= -2**31 and values.max() < 2**31 else np.int64
    assert back.dtype == want and len(back) == len(docs)
    assert back.doc_idx.tolist() == list(range(len(docs) + 1))
    for a, b in zip(back, docs):
        assert not a.flags.writeable
        np.testing.assert_array_equal(a, b)
    assert not leftovers(tmp_path)


def test_write_widens_as_values_grow_and_keeps_what_came_before(tmp_path):
    docs = [np.arange(5), [65535], [70000, -1], [1], [2**40]]
    megatron.write(tmp_path / "c", iter(docs))  # any iterable, read once
    back = megatron.indexed(tmp_path / "c")
    assert back.dtype == np.int64
    assert [x.tolist() for x in back] == [list(d) if not isinstance(d, np.ndarray) else d.tolist() for d in docs]
    assert (tmp_path / "c.bin").stat().st_size == 10 * 8


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16])
def test_write_with_a_dtype_checks_every_value(tmp_path, dtype):
    info = np.iinfo(dtype)
    megatron.write(tmp_path / "ok", [[info.min, info.max]], dtype=dtype)
    assert megatron.indexed(tmp_path / "ok").dtype == dtype
    with pytest.raises(ValueError, match="document 1"):
        megatron.write(tmp_path / "bad", [[0], [int(info.max) + 1]], dtype=dtype)
    assert not os.path.exists(tmp_path / "bad.idx") and not leftovers(tmp_path)


def test_write_refuses_what_is_not_a_1d_integer_document(tmp_path):
    with pytest.raises(ValueError, match="document 1 has shape"):
        megatron.write(tmp_path / "c", [[1], [[1, 2]]])
    with pytest.raises(TypeError, match="document 0 has dtype float64"):
        megatron.write(tmp_path / "c", [[1.5]])
    with pytest.raises(TypeError, match="not an integer dtype"):
        megatron.write(tmp_path / "c", [[1]], dtype=np.float32)
    assert os.listdir(tmp_path) == []


def test_an_interrupted_write_leaves_the_previous_files(tmp_path):
    megatron.write(tmp_path / "c", [[1, 2, 3]])
    before = [(tmp_path / f"c.{e}").read_bytes() for e in ("bin", "idx")]

    def docs():
        yield np.arange(10)
        yield np.arange(70000, 70010)  # widens the temporary file first
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        megatron.write(tmp_path / "c", docs())
    assert [(tmp_path / f"c.{e}").read_bytes() for e in ("bin", "idx")] == before
    assert not leftovers(tmp_path)


def test_a_crash_between_the_renames_leaves_no_corpus_rather_than_a_mixed_one(tmp_path, monkeypatch):
    from lazyseq.megatron import access

    megatron.write(tmp_path / "c", [[1, 2, 3]])
    real = access.commit

    def commit(f, tmp, path):
        if str(path).endswith(".idx"):
            raise KeyboardInterrupt  # the process dies after the new .bin is in place
        real(f, tmp, path)
    monkeypatch.setattr(access, "commit", commit)
    with pytest.raises(KeyboardInterrupt):
        megatron.write(tmp_path / "c", [np.arange(50)] * 3)
    assert not (tmp_path / "c.idx").exists()  # no corpus, rather than a new .bin read through the old .idx
    with pytest.raises((FileNotFoundError, lazyseq.StoreError)):
        megatron.indexed(tmp_path / "c")


def test_write_from_process_workers(tmp_path):
    docs = lazyseq.smap(lambda i: np.arange(i % 13) * i, range(80))
    with lazyseq.prefetch(docs, nworkers=2, method="process") as p:
        megatron.write(tmp_path / "c", p)
    back = megatron.indexed(tmp_path / "c")
    for i in range(80):
        np.testing.assert_array_equal(back[i], np.arange(i % 13) * i)


def test_indexed_reads_like_a_list_and_pickles_as_its_prefix(tmp_path):
    docs = corpus(0)
    megatron.write(tmp_path / "c", docs)
    v = megatron.indexed(str(tmp_path / "c") + ".idx")  # a suffix given by mistake is dropped
    assert len(pickle.dumps(v)) < 500
    w = pickle.loads(pickle.dumps(v))
    for i in [*np.random.default_rng(0).permutation(len(docs)).tolist(), -1]:
        np.testing.assert_array_equal(w[i], docs[i])
    np.testing.assert_array_equal(v[[3, 1]][1], docs[1])
    with pytest.raises(IndexError):
        v[len(docs)]
    assert "megatron.indexed" in repr(v)


def test_a_missing_file_is_named(tmp_path):
    megatron.write(tmp_path / "c", [[1]])
    os.unlink(tmp_path / "c.bin")
    with pytest.raises(FileNotFoundError, match=r"c\.bin is missing"):
        megatron.indexed(tmp_path / "c")


# -- hostile index files ------------------------------------------------------------------------------
def header(n=1, m=2, code=8, version=1, magic=b"MMIDIDX\x00\x00") -> bytes:
    return struct.pack("<9sQBQQ", magic, version, code, n, m)


@pytest.mark.parametrize("idx, match", [
    (b"", "fewer than the 34"),
    (header(magic=b"MMIDIDX\x00\x01"), "magic"),
    (header(version=2), "version 2"),
    (header(code=9), "dtype code is 9"),
    (header(n=2**63) + bytes(20), "declares 9223372036854775808 sequences"),
    (header(m=2**40) + bytes(20), "document boundaries"),
    (header() + struct.pack("<iqqq", -1, 0, 0, 1), "negative size"),
    (header() + struct.pack("<iqqq", 3, 0, 0, 1), r"lies outside the \.bin file \(4 bytes\)"),
    (header() + struct.pack("<iqqq", 1, 2**63 - 1, 0, 1), "lies outside"),
    (header() + struct.pack("<iqqq", 1, 0, 1, 0), "document index"),
])
def test_bad_index_files_raise_store_errors_naming_the_file(tmp_path, idx, match):
    (tmp_path / "c.bin").write_bytes(bytes(4))
    (tmp_path / "c.idx").write_bytes(idx)
    with pytest.raises(StoreError, match=match) as e:
        megatron.indexed(tmp_path / "c")
    assert str(tmp_path / "c.idx") in str(e.value)


def test_a_fifo_in_place_of_the_bin_is_refused_without_waiting(tmp_path):
    megatron.write(tmp_path / "c", [[1]])
    os.unlink(tmp_path / "c.bin")
    os.mkfifo(tmp_path / "c.bin")
    with pytest.raises(StoreError, match="not a regular file"):
        megatron.indexed(tmp_path / "c")


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    megatron.write(d / "c", corpus(1, n=12, top=300))
    return (d / "c.bin").read_bytes(), (d / "c.idx").read_bytes()


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_index_files_fail_only_with_store_errors(real_files, tmp_path, data):
    bin_bytes, idx = bytearray(real_files[0]), bytearray(real_files[1])
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["field", "byte", "truncate", "append", "bin"]))
        if how == "field" and len(idx) >= 34:  # a header field, a size or a pointer set to a chosen value
            at, fmt = data.draw(st.sampled_from([(9, "<Q"), (17, "<B"), (18, "<Q"), (26, "<Q"), (34, "<i"),
                                                 (38, "<i"), (34 + 4 * 12, "<q"), (34 + 4 * 12 + 8, "<q")]))
            bits = struct.calcsize(fmt) * 8
            lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt[1].islower() else (0, 2**bits - 1)
            value = data.draw(st.one_of(st.integers(lo, hi), st.integers(max(lo, -2), min(hi, 3000))))
            if at + bits // 8 <= len(idx):
                idx[at:at + bits // 8] = struct.pack(fmt, value)
        elif how == "byte" and idx:
            idx[data.draw(st.integers(0, len(idx) - 1))] = data.draw(st.integers(0, 255))
        elif how == "truncate":
            del idx[data.draw(st.integers(0, len(idx))):]
        elif how == "append":
            idx += bytes(data.draw(st.integers(1, 40)))
        else:
            del bin_bytes[data.draw(st.integers(0, len(bin_bytes))):]
    d = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    (d / "c.bin").write_bytes(bytes(bin_bytes))
    (d / "c.idx").write_bytes(bytes(idx))
    try:
        docs = megatron.indexed(d / "c")
    except StoreError as e:
        assert str(d / "c.idx") in str(e)
        return
    for i in range(len(docs)):  # whatever was accepted reads inside the .bin
        doc = docs[i]
        start = int(docs.pointers[i])
        assert start + doc.nbytes <= len(bin_bytes)
        assert doc.tobytes() == bytes(bin_bytes[start:start + doc.nbytes])
    if len(docs) and docs.sizes.sum() > 0:
        s = megatron.gpt(docs, 5, 7, cache=False)
        assert all(len(x) in (7, 8) for x in s)


# -- gpt and blend views ------------------------------------------------------------------------------
@pytest.fixture
def prefix(tmp_path):
    megatron.write(tmp_path / "c", corpus(2, n=80))
    return tmp_path / "c"


def test_building_a_view_reads_nothing_and_the_first_read_builds_the_index_once(prefix, monkeypatch):
    calls = []
    real = samples.build
    monkeypatch.setattr(samples, "build", lambda *a: calls.append(a) or real(*a))
    v = megatron.gpt(prefix, 50, 16, seed=3, cache=False)
    assert len(v) == 50 and v._index is None and not calls
    first = v[7]
    assert len(calls) == 1 and len(first) == 17
    v[8], v[-1], v[[1, 2]]
    w = pickle.loads(pickle.dumps(v))
    assert len(calls) == 1 and w._index is not None
    np.testing.assert_array_equal(w[7], first)


def test_gpt_samples_are_the_corpus_cut_in_overlapping_windows(prefix):
    docs = megatron.indexed(prefix)
    stream = np.concatenate(list(docs))
    v = megatron.gpt(docs, 30, 25, shuffle=False, cache=False)
    for i in range(30):
        np.testing.assert_array_equal(v[i], stream[i * 25: i * 25 + 26])
        assert v[i].flags.writeable and v[i].dtype == docs.dtype
    shuffled = megatron.gpt(docs, 30, 25, seed=1, cache=False)  # the documents' order, then the samples'
    doc_idx, _, shuffle_idx = shuffled.index()
    stream = np.concatenate([docs[k] for k in doc_idx.tolist()])
    assert sorted(shuffle_idx.tolist()) == list(range(30)) and shuffle_idx.tolist() != list(range(30))
    for i, j in enumerate(shuffle_idx.tolist()):
        np.testing.assert_array_equal(shuffled[i], stream[j * 25: j * 25 + 26])


def test_gpt_refuses_bad_arguments(prefix, tmp_path):
    for kwargs in ({"num_samples": -1, "seq_length": 4}, {"num_samples": 4, "seq_length": 0},
                   {"num_samples": 4, "seq_length": 4, "seed": 2**32}, {"num_samples": 2.5, "seq_length": 4}):
        with pytest.raises(ValueError):
            megatron.gpt(prefix, **kwargs)
    megatron.write(tmp_path / "empty", [[], []])
    with pytest.raises(lazyseq.EvaluationError, match="holds no tokens"):
        megatron.gpt(tmp_path / "empty", 3, 4)[0]


def test_gpt_and_blend_in_process_workers_receive_the_index(prefix, tmp_path):
    megatron.write(tmp_path / "d", corpus(3, n=40, top=1000))
    v = megatron.gpt(prefix, 64, 32, seed=5, cache=False)
    b = megatron.blend([prefix, tmp_path / "d"], [2, 1], 60, 32, seed=4, cache=False)
    for view in (v, b):
        probe = lazyseq.smap(lambda i, view=view: (view._index is not None, view[i]), range(len(view)))
        view[0]  # built here, once: the pickled view carries it
        with lazyseq.prefetch(probe, nworkers=2, method="process") as p:
            got = list(p)
        assert all(built for built, _ in got)
        for i, (_, x) in enumerate(got):
            np.testing.assert_array_equal(x, view[i])


def test_dataloader_batches_gpt_samples_as_numpy(prefix):
    v = megatron.gpt(prefix, 40, 16, seed=2, cache=False)
    loader = lazyseq.DataLoader(v, batch_size=8, shuffle=True, seed=0, num_workers=2, to_tensor=False)
    with loader:
        batches = list(loader)
    assert len(batches) == 5 and all(b.shape == (8, 17) and b.dtype == v[0].dtype for b in batches)
    assert sorted(map(bytes, np.concatenate(batches))) == sorted(map(bytes, v))


def test_blend_follows_the_weights_and_refuses_bad_ones(prefix, tmp_path):
    megatron.write(tmp_path / "d", corpus(4, n=30, top=500))
    b = megatron.blend([prefix, megatron.indexed(tmp_path / "d")], [3, 1], 400, 8, cache=False)
    dataset_idx, dataset_sample_idx = b.index()
    assert abs((dataset_idx == 0).sum() - 300) <= 1
    assert b.parts[1].seed == 1 and b.parts[0].num_samples == 302  # ceil(300 * 1.005)
    np.testing.assert_array_equal(b[5], b.parts[int(dataset_idx[5])][int(dataset_sample_idx[5])])
    for weights in ([1], [1, -1], [0, 0], [1, float("nan")]):
        with pytest.raises(ValueError):
            megatron.blend([prefix, prefix], weights, 10, 8)


def test_the_blend_assignment_is_tinygrads_greedy_rule():
    from lazyseq.megatron.blending import assign, weights_and_counts

    def loop(w, n):  # the rule, one sample at a time
        counts, out = [0] * len(w), []
        for i in range(n):
            best, top = 0, 0.0
            for d in range(len(w)):
                e = w[d] * max(i, 1) - counts[d]
                if e > top:
                    best, top = d, e
            out.append(best)
            counts[best] += 1
        return out

    rng = np.random.default_rng(0)
    for weights in ([1, 1], [1, 1, 1], [1, 2], [0.2, 0.3, 0.5], [1, 0, 1], [0, 1], [1e-6, 1], [7] * 5,
                    *(rng.random(rng.integers(1, 6)).tolist() for _ in range(8))):
        w, _ = weights_and_counts(weights, 0)
        for n in (1, 2, 3, 50, 3000, 70000):
            assert assign(w, n)[0].tolist() == loop(w, n), (weights, n)


# -- the cache ---------------------------------------------------------------------------------------
def cache_files(d) -> list[str]:
    return sorted(f for f in os.listdir(d) if ".lazyseq-" in f and f.endswith(".npy"))


def test_the_index_is_cached_beside_the_data_and_reused(prefix, monkeypatch):
    first = megatron.gpt(prefix, 50, 16, seed=3)
    x = first[4]
    assert len(cache_files(prefix.parent)) == 2
    monkeypatch.setattr(samples, "build", lambda *a: pytest.fail("rebuilt despite a valid cache"))
    again = megatron.gpt(prefix, 50, 16, seed=3)
    np.testing.assert_array_equal(again[4], x)
    for i in range(50):
        np.testing.assert_array_equal(again[i], first[i])


def test_a_stale_or_tampered_cache_is_rebuilt_never_trusted(prefix, monkeypatch):
    expected = [x.copy() for x in megatron.gpt(prefix, 50, 16, seed=3, cache=False)]
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    calls = []
    real = samples.build
    monkeypatch.setattr(samples, "build", lambda *a: calls.append(1) or real(*a))
    st_ = os.stat(str(prefix) + ".idx")
    os.utime(str(prefix) + ".idx", ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))  # the data changed: another key
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    assert len(calls) == 1
    newest = max((f for f in cache_files(prefix.parent) if f.endswith("doc_idx.npy")),
                 key=lambda f: os.stat(prefix.parent / f).st_mtime_ns)
    doc_file = prefix.parent / newest
    n = len(np.load(doc_file))
    for bad in (np.zeros(n, "<i4"), np.full(n, 10**6, "<i4"), np.zeros(n, "<i8"), np.array([{}] * n, object)):
        np.save(doc_file, bad, allow_pickle=True)
        v = megatron.gpt(prefix, 50, 16, seed=3)
        assert [x.tolist() for x in v] == [x.tolist() for x in expected]
    with open(doc_file, "wb") as f:  # a header that asks for a huge array: refused, nothing allocated
        np.lib.format.write_array_header_2_0(f, {"descr": "<i4", "fortran_order": False, "shape": (10**11,)})
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    assert len(calls) == 6


def test_the_cache_goes_to_cache_dir_when_the_data_directory_is_not_writable(prefix, tmp_path, monkeypatch):
    monkeypatch.setattr(access, "writable_dir", lambda d: os.path.abspath(d) != str(prefix.parent))
    megatron.gpt(prefix, 20, 8, cache_dir=tmp_path / "elsewhere")[0]
    assert not cache_files(prefix.parent)
    assert len(cache_files(tmp_path / "elsewhere")) == 2
    megatron.blend([prefix, prefix], [1, 1], 20, 8, cache_dir=tmp_path / "elsewhere")[0]
    assert any("lazyseq-blend" in f for f in cache_files(tmp_path / "elsewhere"))
    assert not cache_files(prefix.parent)


# no-grain: grain made unimportable, as test_bench.py hides a scenario's peers
HIDE_GRAIN = ("import sys; sys.modules['grain'] = None; "
              "from lazyseq.bench.__main__ import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("hide_grain", [pytest.param(False, id="installed-grain"), pytest.param(True, id="no-grain")])
def test_the_tokens_bench_runs_quick_without_tinygrad(tmp_path, hide_grain):
    import importlib.util
    import json
    import subprocess
    import sys

    out = tmp_path / "tokens.json"
    head = ["-c", HIDE_GRAIN] if hide_grain else ["-m", "lazyseq.bench"]
    proc = subprocess.run([sys.executable, *head, "tokens", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no --tinygrad checkout" in proc.stdout
    res = json.loads(out.read_text())
    assert res["index"]["lazyseq_s"] > 0 and res["blend"]["samples"] == 20_000
    assert res["throughput"]["lazyseq_tokens_s"] > 0
    d = res["packing"]
    grain = not hide_grain and importlib.util.find_spec("grain") is not None
    assert d["grain_installed"] == grain and ("(grain is not installed" in proc.stdout) != grain
    assert d["grain_bins"] == [8, 64] and "num_packing_bins 8 and 64" in proc.stdout
    methods = {"concat", "first_fit", "best_fit"}
    peers = {f"grain first_fit, {k} bins" for k in (8, 64)} if grain else set()
    assert set(d["fill"]) == set(d["rows"]) == set(d["rows_per_s"]) == methods | peers
    assert all(0 < f <= 1 for f in d["fill"].values()) and all(v > 0 for v in d["rows_per_s"].values())
    assert all(d["rows"][k] * d["length"] * d["fill"][k] == pytest.approx(d["tokens"]) for k in d["fill"])
    assert d["lazyseq_tokens_s"] > 0 and d["lazyseq_numpy_tokens_s"] > 0 and d["plain_loop_tokens_s"] > 0
    best = res["targets"]["best_fit_fill_vs_grain"]
    assert best is None if not grain else best >= 1.0  # best_fit fills at least as well as Grain


def test_a_fingerprint_names_the_data_and_builds_no_index(prefix):
    v = megatron.gpt(prefix, 50, 16, seed=3, cache=False)
    f = lazyseq.fingerprint(v)
    assert v._index is None
    assert f["of"][0]["prefix"] == "c" and f["params"]["seed"] == 3
    megatron.write(prefix, corpus(9, n=80))  # other data under the same name: another fingerprint
    assert lazyseq.fingerprint(megatron.gpt(prefix, 50, 16, seed=3, cache=False)) != f
