"""A stranger's Megatron corpus, second pass (docs/megatron.md): sizes read from an ``.idx`` or
implied by its data are checked before anything is allocated for them, index caches prove what
they are before they are served, a view sent to a worker refuses files that changed since it was
built, and whatever a hostile file holds ends in a StoreError naming it, never a MemoryError, a
hang or a read outside the ``.bin``."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import struct
import tempfile
import threading
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq import StoreError, megatron
from lazyseq.megatron import cache, samples

FUZZ = int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES", 200))
MiB = 2**20


def _within(seconds: float, fn):
    """``(value, None)`` or ``(None, exception)`` of ``fn()``, failing if it runs past ``seconds``: no hang."""
    out: list = []

    def run():
        try:
            out.append((fn(), None))
        except BaseException as e:  # reported to the test
            out.append((None, e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0]


def _peak(fn) -> tuple[object, int]:
    """``(what fn() returned or raised, the peak bytes traced while it ran)``: numpy's buffers are traced."""
    tracemalloc.start()
    try:
        value, err = _within(60, fn)
        return (err if err is not None else value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def header(n: int, m: int, code: int = 8) -> bytes:
    return struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, code, n, m)


def sparse_idx(path: pathlib.Path, n: int, m: int, tail: dict[int, bytes] | None = None) -> None:
    """An .idx of ``n`` sequences and ``m`` boundaries whose tables are holes (zeros), but ``tail``'s bytes."""
    with open(path, "wb") as f:
        f.write(header(n, m))
        f.truncate(34 + 12 * n + 8 * m)
        for at, blob in (tail or {}).items():
            f.seek(at)
            f.write(blob)


def corpus(seed: int, n: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 60000, k) for k in rng.integers(1, 120, n)]


@pytest.fixture
def prefix(tmp_path) -> pathlib.Path:
    megatron.write(tmp_path / "c", corpus(1))
    return tmp_path / "c"


# -- 1: sizes read from the .idx ---------------------------------------------------------------------
def test_an_idx_claiming_3_5_gib_of_entries_is_refused_without_allocating_them(tmp_path):
    n = (int(3.5 * 2**30) - 34) // 20  # sequences and boundaries filling 3.5 GiB, a sparse file of holes
    sparse_idx(tmp_path / "c.idx", n, n)
    (tmp_path / "c.bin").write_bytes(bytes(2))
    t = time.perf_counter()
    err, peak = _peak(lambda: megatron.indexed(tmp_path / "c"))
    assert isinstance(err, StoreError), err
    assert str(tmp_path / "c.idx") in str(err) and f"runs from 0 to 0, not from 0 to its {n} sequences" in str(err)
    assert peak < 4 * MiB and time.perf_counter() - t < 10, (peak, time.perf_counter() - t)


def test_the_checks_of_a_large_idx_take_memory_by_blocks_not_by_its_counts(tmp_path):
    n = 1 << 22  # 4M sequences (84 MB of tables, holes): checked in blocks, the last one is outside the .bin
    last_pointer = 34 + 4 * n + 8 * (n - 1)
    sparse_idx(tmp_path / "c.idx", n, n + 1, {last_pointer: struct.pack("<q", 3), 34 + 12 * n + 8 * n: struct.pack("<q", n)})
    (tmp_path / "c.bin").write_bytes(bytes(2))
    err, peak = _peak(lambda: megatron.indexed(tmp_path / "c"))
    assert isinstance(err, StoreError) and f"sequence {n - 1} (0 tokens at byte 3) lies outside the .bin" in str(err), err
    assert peak < 32 * MiB, peak  # the checks of 4M entries at once took 8 bytes an entry, several times


def test_a_url_idx_with_a_bad_header_is_refused_before_the_rest_is_read(http_files):
    pytest.importorskip("aiohttp")
    with open(http_files.root / "c.idx", "wb") as f:  # 40 MB, a header claiming more than the object holds
        f.write(header(2**40, 1))
        f.truncate(40 * MiB)
    (http_files.root / "c.bin").write_bytes(bytes(2))
    http_files.reset_counts()
    err, peak = _peak(lambda: megatron.indexed(f"{http_files.url}/c", block_cache=0))
    assert isinstance(err, StoreError) and "c.idx is not a valid Megatron index: it declares 1099511627776" in str(err), err
    ranges = [r.range for r in http_files.requests if r.method == "GET"]
    asked = sum(int(b) + 1 - int(a) for a, b in (r.removeprefix("bytes=").split("-") for r in ranges))
    assert asked <= 2 * MiB and peak < 12 * MiB, (ranges, peak)  # its first part, not its 40 MB


# -- 2: sizes implied by the data ----------------------------------------------------------------------
@pytest.fixture
def mostly_empty(tmp_path) -> pathlib.Path:
    """One token, then 100,000 empty documents."""
    megatron.write(tmp_path / "empty", [[7]] + [[]] * 100_000)
    return tmp_path / "empty"


def test_gpt_over_one_token_and_100000_empty_documents_is_refused_before_allocating(mostly_empty):
    v = megatron.gpt(mostly_empty, 1000, 2048, cache=False)
    err, peak = _peak(v.index)
    assert isinstance(err, StoreError), err
    for words in (str(mostly_empty) + ".idx", "holds 1 tokens in 100001 sequences", "need 2048000 epochs",
                  "204802048000 document entries", f"more than {100_001 + 1000 * 2049}", "mostly empty"):
        assert words in str(err), (words, str(err))
    assert peak < 16 * MiB, peak
    with pytest.raises(lazyseq.EvaluationError) as e:  # a read says the same, as its cause
        v[0]
    assert isinstance(e.value.__cause__, StoreError)


def test_the_bound_leaves_a_corpus_of_real_documents_alone(mostly_empty, tmp_path):
    megatron.write(tmp_path / "one", [[1, 2, 3]])  # one short document: many epochs, one entry each
    assert len(megatron.gpt(tmp_path / "one", 50, 16, cache=False)[49]) == 17
    small = megatron.gpt(mostly_empty, 1, 1, cache=False, shuffle=False)  # one epoch of it: its own size
    assert small[0].tolist() == [7]


def test_a_corpus_without_tokens_is_a_store_error(tmp_path):
    megatron.write(tmp_path / "none", [[], [], []])
    with pytest.raises(StoreError, match=r"none\.idx holds no tokens \(3 sequences, all empty\)"):
        megatron.gpt(tmp_path / "none", 3, 4).index()


def test_a_blend_checks_every_corpus_before_building(mostly_empty, prefix):
    b = megatron.blend([prefix, mostly_empty], [1, 1], 1000, 2048, cache=False)  # sample 0 comes from `prefix`
    err, peak = _peak(lambda: b[0])
    assert isinstance(err, lazyseq.EvaluationError) and isinstance(err.__cause__, StoreError), err
    assert "empty.idx holds 1 tokens in 100001 sequences" in str(err.__cause__) and peak < 16 * MiB


# -- 3: index caches prove what they are -----------------------------------------------------------------
def entry(d: pathlib.Path, kind: str = "gpt") -> dict[str, pathlib.Path]:
    files = sorted(p for p in d.iterdir() if f".lazyseq-{kind}-" in p.name)
    return {p.name.split(".")[-2] if p.suffix == ".npy" else "record": p for p in files}


@pytest.fixture
def counted_builds(monkeypatch) -> list:
    calls: list = []
    real = samples.build
    monkeypatch.setattr(samples, "build", lambda *a: calls.append(1) or real(*a))
    return calls


def test_a_cache_entry_replaced_by_another_valid_permutation_is_not_served(prefix, counted_builds):
    want = [x.tolist() for x in megatron.gpt(prefix, 50, 16, seed=3, cache=False)]
    assert [x.tolist() for x in megatron.gpt(prefix, 50, 16, seed=3)] == want
    files = entry(prefix.parent)
    assert sorted(files) == ["doc_idx", "record", "shuffle_idx"]
    good_shuffle, good_docs = np.load(files["shuffle_idx"]), np.load(files["doc_idx"])
    for name, other in (("shuffle_idx", good_shuffle[::-1].copy()), ("doc_idx", np.roll(good_docs, 1))):
        np.save(files[name], other)  # the right shape, dtype and bounds: only the digest tells
        calls = len(counted_builds)
        assert [x.tolist() for x in megatron.gpt(prefix, 50, 16, seed=3)] == want
        assert len(counted_builds) == calls + 1  # rebuilt ...
        assert (np.load(files[name]) == (good_shuffle if name == "shuffle_idx" else good_docs)).all()  # ... and rewritten
    record = json.loads(files["record"].read_text())
    assert record["arrays"] == {"doc_idx": cache.digest(good_docs), "shuffle_idx": cache.digest(good_shuffle)}


def test_a_cache_entry_without_its_record_or_with_a_forged_one_is_rebuilt(prefix, counted_builds):
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    files = entry(prefix.parent)
    for damage in (lambda p: p.unlink(), lambda p: p.write_text("[]"), lambda p: p.write_bytes(b"\xff" * 10),
                   lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "key": "0" * 64}))):
        if files["record"].exists():
            damage(files["record"])
        else:
            megatron.gpt(prefix, 50, 16, seed=3)[0]
            damage(files["record"])
        calls = len(counted_builds)
        megatron.gpt(prefix, 50, 16, seed=3)[0]
        assert len(counted_builds) == calls + 1 and files["record"].exists()


def test_a_cache_entry_owned_by_another_user_is_not_used(prefix, counted_builds, monkeypatch):
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    files = entry(prefix.parent)
    if os.geteuid() == 0:
        for p in files.values():
            os.chown(p, 4242, -1)
    else:  # only root gives a file away: this process pretends to be another user instead
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 4242)
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    assert len(counted_builds) == 2  # built, then built again rather than read from another user's files
    if os.geteuid() == 0:
        assert all(p.stat().st_uid == 0 for p in files.values())  # written again, this user's


def test_an_entry_is_hashed_once_per_process(prefix, monkeypatch):
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    hashed: list = []
    real = cache.digest
    monkeypatch.setattr(cache, "digest", lambda a: hashed.append(len(a)) or real(a))
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    assert len(hashed) == 2  # its two arrays, the first time this process reads the entry
    megatron.gpt(prefix, 50, 16, seed=3)[0]
    assert len(hashed) == 2


# -- 4: a view sent to a worker after its corpus changed ---------------------------------------------
def test_a_view_pickled_after_its_corpus_was_rewritten_is_refused(prefix):
    v = megatron.gpt(prefix, 20, 8, seed=3, cache=False)
    want = [x.tolist() for x in v]
    megatron.write(prefix, [d[: max(1, len(d) - 3)] for d in corpus(1)])  # other document sizes
    blob = pickle.dumps(v)
    with pytest.raises(StoreError) as e:
        pickle.loads(blob)
    assert f"{prefix}.idx changed since the view was built" in str(e.value) and "build the view again" in str(e.value)
    assert [x.tolist() for x in v] == want  # the view itself still reads the files it mapped
    fresh = pickle.loads(pickle.dumps(megatron.gpt(prefix, 20, 8, seed=3, cache=False)))
    assert len(fresh[0]) == 9


def test_a_worker_mapping_a_rewritten_corpus_refuses_it(prefix):
    v = megatron.gpt(prefix, 20, 8, seed=3, cache=False)
    v[0]
    megatron.write(prefix, [d[: max(1, len(d) - 3)] for d in corpus(1)])

    def read():
        with lazyseq.prefetch(v, nworkers=1, method="process", mp_context="spawn") as p:
            return list(p)

    _, err = _within(120, read)
    chain = [err]
    while chain[-1] is not None and chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    assert any(isinstance(x, StoreError) and "changed since the view was built" in str(x) for x in chain), chain


def test_a_corpus_copied_or_rewritten_with_the_same_sizes_is_accepted(prefix, tmp_path):
    v = megatron.indexed(prefix)
    megatron.write(prefix, [d + 1 for d in corpus(1)])  # the same sizes: the index still fits
    assert pickle.loads(pickle.dumps(v)).sizes.tolist() == v.sizes.tolist()


# -- 5: files that are not files ------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["bin", "idx"])
def test_a_directory_in_place_of_a_corpus_file_is_named(prefix, which):
    path = pathlib.Path(f"{prefix}.{which}")
    path.unlink()
    path.mkdir()
    with pytest.raises(StoreError, match=rf"{path} \(the corpus's \.{which}\) is not a regular file \(a directory\)"):
        megatron.indexed(prefix)


# -- 6: fuzz ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_files(tmp_path_factory) -> tuple[bytes, bytes]:
    d = tmp_path_factory.mktemp("real")
    megatron.write(d / "c", corpus(2, n=10))
    return (d / "c.bin").read_bytes(), (d / "c.idx").read_bytes()


N = 10  # sequences of the fuzzed corpus
FIELDS = {"n": (18, "<Q"), "m": (26, "<Q"), "code": (17, "<B"), "version": (9, "<Q"),
          "size": (34 + 4 * 3, "<i"), "pointer": (34 + 4 * N + 8 * 5, "<q"), "doc": (34 + 12 * N + 8 * 2, "<q"),
          "last size": (34 + 4 * (N - 1), "<i"), "last pointer": (34 + 4 * N + 8 * (N - 1), "<q")}
EXTREMES = [0, 1, -1, 2**31 - 1, -(2**31), 2**32, 2**62, 2**63 - 1, -(2**63), 2**64 - 1, 3 * 2**30]


def _value(data, fmt: str) -> int:
    bits = struct.calcsize(fmt) * 8
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt[1].islower() else (0, 2**bits - 1)
    return data.draw(st.one_of(st.sampled_from([x for x in EXTREMES if lo <= x <= hi]), st.integers(lo, hi),
                               st.integers(max(lo, -3), min(hi, 5000))))


def _mutate(data, idx: bytearray, bin_bytes: bytearray) -> tuple[int, dict] | None:
    """One corruption; a huge count whose tables the file then holds returns the size to give the file
    (holes) and bytes to write at offsets past the end."""
    how = data.draw(st.sampled_from(["field", "flip", "truncate", "append", "bin", "huge"]))
    if how == "field":
        at, fmt = FIELDS[data.draw(st.sampled_from(sorted(FIELDS)))]
        if at + struct.calcsize(fmt) <= len(idx):
            idx[at : at + struct.calcsize(fmt)] = struct.pack(fmt, _value(data, fmt))
    elif how == "flip" and idx:
        idx[data.draw(st.integers(0, len(idx) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "truncate":
        del idx[data.draw(st.integers(0, len(idx))) :]
    elif how == "append":
        idx += bytes(data.draw(st.integers(1, 40)))
    elif how == "bin":
        del bin_bytes[data.draw(st.integers(0, len(bin_bytes))) :]
    elif len(idx) >= 34:  # counts of up to 2**24 sequences, the file made that large (holes) ...
        n, m = data.draw(st.integers(N, 2**24)), data.draw(st.integers(1, 2**24))
        idx[18:34] = struct.pack("<QQ", n, m)
        size = 34 + 12 * n + 8 * m
        if data.draw(st.booleans()):  # ... and its document index ends as it should: every table is read
            del idx[34:]
            return size, {size - 8: struct.pack("<q", n)}
        return size, {}
    return None


@settings(max_examples=FUZZ, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_corrupted_index_files_read_checked_data_or_raise_store_errors(real_files, tmp_path, data):
    bin_bytes, idx = bytearray(real_files[0]), bytearray(real_files[1])
    grow = None
    for _ in range(data.draw(st.integers(1, 4))):
        grow = _mutate(data, idx, bin_bytes) or grow
    d = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    (d / "c.bin").write_bytes(bytes(bin_bytes))
    with open(d / "c.idx", "wb") as f:
        f.write(idx)
        if grow is not None and grow[0] > len(idx):
            f.truncate(grow[0])
            for at, blob in grow[1].items():
                if at >= len(idx):
                    f.seek(at)
                    f.write(blob)

    def use():
        docs = megatron.indexed(d / "c")
        for i in range(len(docs)) if len(docs) <= 4096 else range(0, len(docs), len(docs) // 4096):
            doc, start = docs[i], int(docs.pointers[i])  # whatever was accepted reads inside the .bin
            assert 0 <= start and start + doc.nbytes <= len(bin_bytes), (i, start, doc.nbytes)
            assert doc.tobytes() == bytes(bin_bytes[start : start + doc.nbytes])
        try:
            s = megatron.gpt(docs, 5, 7, cache=False)
            assert all(len(x) in (7, 8) for x in s)
        except lazyseq.EvaluationError as e:
            raise e.__cause__ from None

    t = time.perf_counter()
    err, peak = _peak(use)
    event("accepted" if err is None else f"refused: {str(err).split(': ', 1)[-1][:40]}")
    assert err is None or isinstance(err, StoreError), repr(err)
    if isinstance(err, StoreError):
        assert str(d) in str(err), str(err)
    assert peak < 48 * MiB and time.perf_counter() - t < 30, (peak, time.perf_counter() - t)
    shutil.rmtree(d)
