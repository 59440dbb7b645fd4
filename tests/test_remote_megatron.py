"""lazyseq.megatron over URLs (issue #25): a corpus written locally, served by a local Range HTTP
server and uploaded to moto's S3, reads document for document and sample for sample as the local
one; its index cache stays on local disk, keyed by the objects' versions; bad files are still
StoreErrors; secrets are never shown."""

import os
import pickle
import shutil
import time

import numpy as np
import pytest

import lazyseq
from lazyseq import StoreError, megatron
from lazyseq.megatron import access, samples

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> str:
    """A local corpus of 120 documents, some empty, int32 tokens."""
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 200, 120)
    lens[::17] = 0
    prefix = str(tmp_path_factory.mktemp("corpus") / "corpus")
    megatron.write(prefix, [rng.integers(0, 70000, n) for n in lens])
    return prefix


def _http(server, prefix: str, name: str = "corpus") -> str:
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, server.root / (name + ext))
    return f"{server.url}/{name}"


def _s3(s3, prefix: str, name: str = "corpus") -> str:
    for ext in (".bin", ".idx"):
        s3.client.upload_file(prefix + ext, s3.bucket, f"data/{name}{ext}")
    return f"s3://{s3.bucket}/data/{name}"


def _gets(server) -> list:
    return [r for r in server.requests if r.method == "GET"]


def _cache_files(d) -> list[str]:
    return sorted(f for f in os.listdir(d) if ".lazyseq-" in f and f.endswith(".npy")) if os.path.isdir(d) else []


def _same_docs(remote, local) -> None:
    assert len(remote) == len(local) and remote.dtype == local.dtype
    for name in ("sizes", "pointers", "doc_idx"):
        a, b = getattr(remote, name), getattr(local, name)
        assert a.dtype == b.dtype and (a == b).all()
    for i in range(len(local)):
        x = remote[i]
        assert x.dtype == local.dtype and x.ndim == 1 and not x.flags.writeable
        assert (x == local[i]).all()
    idx = np.random.default_rng(1).permutation(len(local))[:50]
    assert all((x == y).all() for x, y in zip(remote[idx], local[idx]))  # a bulk read
    assert remote.nbytes() == local.nbytes()
    assert lazyseq.fingerprint(remote) == lazyseq.fingerprint(local)  # a copy anywhere: the same identity


# -- the same documents and samples --------------------------------------------------------------------
def test_indexed_over_http_equals_local(http_files, local):
    _same_docs(megatron.indexed(_http(http_files, local)), megatron.indexed(local))


def test_indexed_over_s3_equals_local(s3, local):
    docs = megatron.indexed(_s3(s3, local) + ".idx", storage_options=s3.storage_options)  # a suffix is dropped
    _same_docs(docs, megatron.indexed(local))


def test_gpt_and_blend_over_http_equal_local_and_cache_under_cache_dir(http_files, local, tmp_path):
    url = _http(http_files, local)
    before = sorted(os.listdir(http_files.root))
    cache = tmp_path / "index"
    got = megatron.gpt(url, 300, 32, seed=5, cache_dir=cache)
    want = megatron.gpt(local, 300, 32, seed=5, cache=False)
    assert all(x.flags.writeable and x.dtype == y.dtype and (x == y).all() for x, y in zip(got, want))
    assert len(_cache_files(cache)) == 2 and all(f.startswith("corpus.lazyseq-gpt-") for f in _cache_files(cache))
    mixed = megatron.blend([url, local], [2, 1], 200, 16, cache_dir=cache)
    assert all((x == y).all() for x, y in zip(mixed, megatron.blend([local, local], [2, 1], 200, 16, cache=False)))
    assert sorted(os.listdir(http_files.root)) == before  # nothing written beside the data
    assert all(r.method in ("GET", "HEAD") for r in http_files.requests)


def test_gpt_over_s3_caches_under_xdg_cache_home_never_in_the_bucket(s3, local, tmp_path, monkeypatch):
    url = _s3(s3, local)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    got = megatron.gpt(url, 200, 16, seed=1, storage_options=s3.storage_options)
    want = megatron.gpt(local, 200, 16, seed=1, cache=False)
    assert all((x == y).all() for x, y in zip(got, want))
    assert len(_cache_files(tmp_path / "xdg" / "lazyseq")) == 2
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])]
    assert sorted(keys) == ["data/corpus.bin", "data/corpus.idx"]
    monkeypatch.setattr(samples, "build", lambda *a: pytest.fail("rebuilt despite a valid cache"))
    again = megatron.gpt(url, 200, 16, seed=1, storage_options=s3.storage_options)
    assert (again[7] == want[7]).all()


def test_the_default_index_cache_is_under_home_without_xdg(http_files, local, tmp_path, monkeypatch):
    url = _http(http_files, local)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    megatron.gpt(url, 50, 8)[0]
    assert len(_cache_files(tmp_path / "home" / ".cache" / "lazyseq")) == 2


def test_a_changed_bin_gets_a_new_index_and_is_fetched_again(http_files, local, tmp_path, monkeypatch):
    url, cache = _http(http_files, local), tmp_path / "cache"
    calls = []
    real = samples.build
    monkeypatch.setattr(samples, "build", lambda *a: calls.append(1) or real(*a))
    first = megatron.gpt(megatron.indexed(url, cache_dir=cache), 100, 16)  # the files kept in cache too
    x = first[3]
    assert len(calls) == 1 and len(_cache_files(cache)) == 2
    assert len([f for f in os.listdir(cache) if f.endswith(".bin") and ".lazyseq-" not in f]) == 2  # .bin, .idx
    http_files.reset_counts()
    assert (megatron.gpt(megatron.indexed(url, cache_dir=cache), 100, 16)[3] == x).all()
    assert len(calls) == 1 and _gets(http_files) == []  # HEADs only: index and files from disk
    bin_file = http_files.root / "corpus.bin"
    data = bin_file.read_bytes()
    bin_file.write_bytes(data)  # the same bytes, a new object: a new ETag
    os.utime(bin_file, ns=(time.time_ns(), time.time_ns() + 10**9))
    http_files.reset_counts()
    assert (megatron.gpt(megatron.indexed(url, cache_dir=cache), 100, 16)[3] == x).all()
    assert len(calls) == 2  # another key: rebuilt
    assert sum(1 for r in _gets(http_files) if r.path.endswith(".bin")) >= 1  # downloaded again


# -- requests -------------------------------------------------------------------------------------------
def test_reads_cost_few_requests(http_files, local):
    url = _http(http_files, local)
    http_files.reset_counts()
    docs = megatron.indexed(url, block_cache=0)
    assert len(http_files.requests) == 3  # HEAD .idx, HEAD .bin, GET .idx
    http_files.reset_counts()
    docs[5]
    assert len(_gets(http_files)) == 1
    http_files.reset_counts()
    docs[10:60]
    assert (lazyseq.batch(docs[10:60], 50)[0][3] == megatron.indexed(local)[13]).all()
    assert len(_gets(http_files)) == 1  # consecutive documents: one joined request
    http_files.reset_counts()
    samples_ = megatron.gpt(docs, 50, 400, shuffle=False, cache=False)
    samples_[1]
    assert len(_gets(http_files)) == 1  # a sample spanning documents: its ranges at once


def test_failures_are_retried_and_persistent_ones_named(http_files, local):
    url = _http(http_files, local)
    docs = megatron.indexed(url, block_cache=0, timeout=1.0)
    want = megatron.indexed(local)
    http_files.fail_next(2, status=503)
    assert (docs[7] == want[7]).all()
    http_files.fail_next(10**6, status=503)
    with pytest.raises(lazyseq.EvaluationError) as e:
        docs[8]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and "corpus.bin" in str(err) and "document 8" in str(err)


def test_secrets_never_shown(http_files, local):
    url = _http(http_files, local).replace("http://", "http://me:hunter2@") + "?X-Amz-Signature=topsecret"
    docs = megatron.indexed(url, storage_options={"headers": {"X-Api-Key": "opensesame"}}, timeout=1.0)
    assert (docs[3] == megatron.indexed(local)[3]).all()
    shown = repr(docs) + docs.describe() + repr(lazyseq.fingerprint(megatron.gpt(docs, 10, 8, cache=False)))
    http_files.fail_next(10**6)
    with pytest.raises(lazyseq.EvaluationError) as e:
        docs[4]
    shown += str(e.value) + str(e.value.__cause__)
    for secret in ("hunter2", "topsecret", "opensesame"):
        assert secret not in shown


# -- bad files -------------------------------------------------------------------------------------------
def test_a_bad_index_over_a_url_is_a_store_error(http_files, local, monkeypatch):
    url = _http(http_files, local)
    idx = http_files.root / "corpus.idx"
    good = idx.read_bytes()
    idx.write_bytes(good[:-8])
    with pytest.raises(StoreError, match="not a valid Megatron index") as e:
        megatron.indexed(url)
    assert f"{url}.idx" in str(e.value)
    idx.write_bytes(good)
    (http_files.root / "corpus.bin").write_bytes(b"\0" * 10)  # the .idx points outside it
    with pytest.raises(StoreError, match=r"lies outside the \.bin file \(10 bytes\)"):
        megatron.indexed(url)
    monkeypatch.setattr(access, "IDX_LIMIT", 100)
    with pytest.raises(StoreError, match="larger than any index"):
        megatron.indexed(url)


def test_a_missing_file_is_named(http_files, local):
    url = _http(http_files, local)
    os.unlink(http_files.root / "corpus.bin")
    with pytest.raises(FileNotFoundError, match=r"corpus\.bin is missing"):
        megatron.indexed(url, timeout=2)


def test_writing_to_a_url_is_refused():
    with pytest.raises(ValueError, match="writes local files"):
        megatron.write("s3://bucket/corpus", [[1, 2]])


def test_remote_settings_with_an_indexed_view_are_refused(local):
    with pytest.raises(ValueError, match="already an indexed view"):
        megatron.gpt(megatron.indexed(local), 10, 4, timeout=3)


# -- pickling and workers --------------------------------------------------------------------------------
def test_pickles_as_url_and_settings_and_reads_in_process_workers(http_files, local, tmp_path):
    url = _http(http_files, local)
    docs = megatron.indexed(url, timeout=7)
    blob = pickle.dumps(docs)
    assert len(blob) < 1000
    again = pickle.loads(blob)
    assert again.remote.timeout == 7 and (again[9] == docs[9]).all()
    s = megatron.gpt(docs, 64, 16, cache_dir=tmp_path)
    with lazyseq.prefetch(s, nworkers=2, method="process") as p:
        got = list(p)
    assert all((x == y).all() for x, y in zip(got, megatron.gpt(local, 64, 16, cache=False)))
