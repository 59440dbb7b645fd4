"""A stranger's data, second pass (issue #31): reads from object storage against servers that stall,
trickle, replace objects under a reader, give no ETag, or answer another range than asked (docs/remote.md:
versions, deadlines). Every wait here is bounded: reads run in a thread joined with a timeout."""

import os
import shutil
import threading
import time

import numpy as np
import pytest

import lazyseq
from lazyseq.files import Remote, redact
from lazyseq.files.fileobj import open_file

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

TIMEOUT = 2.0  # the reads' timeout in the deadline tests: each must raise within TIMEOUT + 1 s
N = 200


def _items(n: int = N) -> list:
    return [{"x": np.full((4,), i, np.int64), "s": f"item{i}"} for i in range(n)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("versions") / "train")
    lazyseq.save(_items(), path, method="thread", shard_bytes=3000)
    assert len(lazyseq.load(path).records) >= 3
    return path


def _http(server, saved: str) -> str:
    shutil.copytree(saved, server.root / "train")
    return f"{server.url}/train"


def _timed(fn, limit: float = 30.0):
    """``fn()`` in a thread joined within ``limit`` s: (seconds it took, its result or the exception it raised)."""
    out: list = []

    def run():
        t = time.monotonic()
        try:
            r = fn()
        except BaseException as e:  # handed back to the test
            r = e
        out.append((time.monotonic() - t, r))

    th = threading.Thread(target=run)
    th.start()
    th.join(limit)
    assert not th.is_alive(), f"the read still runs after {limit} s"
    return out[0]


def _cause(r) -> BaseException:
    return r.__cause__ if isinstance(r, lazyseq.EvaluationError) else r


def _gets(server) -> list:
    return [(r, h) for r, h in zip(server.requests, server.headers) if r.method == "GET"]


def _replace(path, data: bytes) -> None:
    """The object at ``path`` replaced by ``data`` (same size or not), with another mtime: another ETag."""
    st = os.stat(path)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _secret(url: str) -> str:
    return url.replace("http://", "http://me:hunter2@") + "?X-Amz-Signature=topsecret"


# -- 1. deadlines: `timeout` is the whole budget of a read, retries included ------------------------------------
def test_a_trickling_range_raises_within_timeout(http_files):
    data = os.urandom(10_000)
    (http_files.root / "blob").write_bytes(data)
    remote = Remote(_secret(http_files.url), block_cache=0, timeout=TIMEOUT)
    f = remote.open(remote.join("blob"))
    http_files.trickle_next(10**6, 1.5)  # a byte every 1.5 s: no socket timeout ever fires
    took, err = _timed(lambda: f.read(100, 200))
    assert isinstance(err, lazyseq.RemoteReadError), err
    assert took < TIMEOUT + 1, took
    text = str(err)
    assert text.startswith(f"could not read bytes 100-199 of {http_files.url}/blob after 1 try in ")
    assert f"timed out: no answer within {TIMEOUT:g} s" in text and "hunter2" not in text and "topsecret" not in text
    assert err.range == (100, 200) and err.url == f"{http_files.url}/blob"


def test_a_retry_gets_only_what_is_left_of_the_deadline(http_files):
    (http_files.root / "blob").write_bytes(os.urandom(10_000))
    remote = Remote(http_files.url, block_cache=0, timeout=TIMEOUT)
    f = remote.open(remote.join("blob"))
    http_files.fail_next(1, 503)  # the first try fails at once; the second trickles
    http_files.trickle_next(10**6, 1.5)
    took, err = _timed(lambda: f.read(100, 200))
    assert isinstance(err, lazyseq.RemoteReadError) and " after 2 tries in " in str(err) and "timed out" in str(err), err
    assert took < TIMEOUT + 1, took


def test_a_bulk_read_shares_one_deadline(http_files):
    (http_files.root / "blob").write_bytes(os.urandom(1_000_000))
    remote = Remote(http_files.url, block_cache=0, timeout=TIMEOUT)
    f = remote.open(remote.join("blob"))
    http_files.trickle_next(10**6, 1.5)
    took, err = _timed(lambda: remote.read_ranges([f.request(k * 200_000, k * 200_000 + 100) for k in range(5)]))
    assert isinstance(err, lazyseq.RemoteReadError) and "timed out" in str(err), err
    assert took < TIMEOUT + 1, took


def test_a_trickling_manifest_raises_within_timeout(http_files, saved):
    url = _http(http_files, saved)
    http_files.trickle_next(10**6, 1.5)
    took, err = _timed(lambda: lazyseq.load(_secret(url), timeout=TIMEOUT))
    assert isinstance(err, lazyseq.RemoteReadError), err
    assert took < TIMEOUT + 1, took
    assert str(err).startswith("could not read bytes 0-") and f" of {url}/manifest.json after " in str(err)
    assert "timed out" in str(err)
    assert "hunter2" not in str(err) and "topsecret" not in str(err)


def test_a_trickling_item_raises_within_timeout(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0, timeout=TIMEOUT)
    store[0]  # shard 0 open: item 1 is one range of it
    http_files.trickle_next(10**6, 1.5)
    took, err = _timed(lambda: store[1])
    err = _cause(err)
    assert isinstance(err, lazyseq.RemoteReadError) and err.range is not None, err
    assert "timed out" in str(err) and "item 1" in str(err)
    assert took < TIMEOUT + 1, took


def test_prefetch_over_a_stalled_server_raises_within_timeout(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), timeout=TIMEOUT)
    http_files.hang_next(10**6, 3600)  # accepts every connection, never answers
    with lazyseq.prefetch(store, nworkers=4, method="thread") as p:
        took, err = _timed(lambda: p[0])
    assert isinstance(err, lazyseq.EvaluationError) and isinstance(err.__cause__, lazyseq.RemoteReadError), err
    assert took < TIMEOUT + 1, took
    assert "timed out" in str(err.__cause__) or "not tried" in str(err.__cause__)


def test_a_loop_over_a_stalled_server_waits_one_timeout_not_one_per_item(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), timeout=TIMEOUT)
    http_files.hang_next(10**6, 3600)

    def loop():
        errors = []
        for i in range(0, N, N // 8):  # items of every shard
            try:
                store[i]
            except lazyseq.EvaluationError as e:
                errors.append(e.__cause__)
        return errors

    took, errors = _timed(loop)
    assert took < TIMEOUT + 1, took
    assert len(errors) == 8 and all(isinstance(e, lazyseq.RemoteReadError) for e in errors)
    assert "timed out" in str(errors[0])
    assert all(f"not tried: a read of {http_files.url}/train got no answer within {TIMEOUT:g} s, " in str(e) for e in errors[1:])
    http_files.hang_next(0, 0.0)  # the server answers again: once `timeout` has passed, reads go out again
    time.sleep(TIMEOUT)
    assert store[5]["s"] == "item5"


# -- 2. versions: every ranged GET carries the version opened ---------------------------------------------------
@pytest.mark.parametrize("if_match", [True, False], ids=["server-honours-if-match", "server-ignores-if-match"])
def test_an_object_replaced_after_its_shard_opened_is_never_mixed(http_files, saved, if_match):
    http_files.if_match = if_match  # ignored: the answer's ETag still tells
    url = _http(http_files, saved)
    store = lazyseq.load(_secret(url), block_cache=0)
    assert store[0]["s"] == "item0"  # shard 0 open
    http_files.reset_counts()
    shard = http_files.root / "train" / store.records[0]["file"]
    _replace(shard, bytes(reversed(shard.read_bytes())))  # same size, other bytes
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[1]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and err.url == redact(f"{url}/{store.records[0]['file']}")
    text = str(err)
    assert "changed since it was opened" in text and "load the store" in text and "item 1" in text
    assert "hunter2" not in text and "topsecret" not in text
    gets = _gets(http_files)
    assert gets and all(h.get("If-Match", "").startswith('"') for _, h in gets)  # the ETag of the HEAD, on each GET
    _replace(shard, bytes(reversed(shard.read_bytes())))  # the shard as saved, under a third ETag
    assert lazyseq.load(url)[1]["s"] == "item1"  # what the message says to do: load the store again


def test_the_package_server_that_ignores_if_match_still_tells_a_change(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "www" / "train")
    with lazyseq.files.serve(tmp_path / "www") as server:
        store = lazyseq.load(f"{server.url}/train", block_cache=0)
        store[0]
        shard = tmp_path / "www" / "train" / store.records[0]["file"]
        _replace(shard, bytes(reversed(shard.read_bytes())))
        with pytest.raises(lazyseq.EvaluationError, match="changed since it was opened"):
            store[1]


def test_the_block_cache_never_serves_an_old_version_for_a_new_one(http_files):
    path = http_files.root / "blob"
    path.write_bytes(b"a" * 100)
    remote = Remote(http_files.url)
    old = remote.open(remote.join("blob"))
    assert old.read(10, 20) == b"a" * 10  # cached
    _replace(path, b"b" * 100)
    new = remote.open(remote.join("blob"))
    assert new.read(10, 20) == b"b" * 10  # not the old version's cached range
    for a in (10, 30):  # never a byte of the new version for the old one (its cached ranges went with it)
        with pytest.raises(lazyseq.RemoteReadError, match="changed since it was opened"):
            old.read(a, a + 10)
    assert new.read(30, 40) == b"b" * 10


def test_a_remote_file_object_tells_a_change(http_files):
    data = os.urandom(5 * 2**20)  # past the first read-ahead (4 MiB): a later read is a new GET
    path = http_files.root / "blob.bin"
    path.write_bytes(data)
    with open_file(f"{http_files.url}/blob.bin", block_cache=0) as f:
        assert f.read(10) == data[:10]
        _replace(path, os.urandom(len(data)))
        f.seek(4_500_000)
        with pytest.raises(lazyseq.RemoteReadError, match="changed since it was opened"):
            f.read(10)


def _s3(s3, saved: str) -> str:
    for f in os.listdir(saved):
        s3.client.upload_file(os.path.join(saved, f), s3.bucket, f"train/{f}")
    return f"s3://{s3.bucket}/train"


def test_s3_object_replaced_after_its_shard_opened(s3, saved):
    store = lazyseq.load(_s3(s3, saved), storage_options=s3.storage_options, block_cache=0)
    assert store[0]["s"] == "item0"
    key = f"train/{store.records[0]['file']}"
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(reversed(body)))  # same size, new ETag
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[1]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and "changed since it was opened" in str(err)
    assert "IfMatch" in str(err) and err.url == f"s3://{s3.bucket}/{key}"


def test_s3_versioned_bucket_reads_the_version_opened(s3, saved):
    s3.client.put_bucket_versioning(Bucket=s3.bucket, VersioningConfiguration={"Status": "Enabled"})
    try:
        store = lazyseq.load(_s3(s3, saved), storage_options=s3.storage_options, block_cache=0)
        assert store[0]["s"] == "item0"
        key = f"train/{store.records[0]['file']}"
        first = s3.client.head_object(Bucket=s3.bucket, Key=key)["VersionId"]
        body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(reversed(body)))
        assert store[1]["s"] == "item1" and (store[2]["x"] == 2).all()  # the version opened, by its VersionId
        s3.client.delete_object(Bucket=s3.bucket, Key=key, VersionId=first)
        with pytest.raises(lazyseq.EvaluationError) as e:
            store[3]
        assert "changed since it was opened" in str(e.value.__cause__) and "is gone" in str(e.value.__cause__)
    finally:  # the fixture's remove_bucket deletes keys, not versions
        for v in s3.client.list_object_versions(Bucket=s3.bucket).get("Versions", []):
            s3.client.delete_object(Bucket=s3.bucket, Key=v["Key"], VersionId=v["VersionId"])
        for m in s3.client.list_object_versions(Bucket=s3.bucket).get("DeleteMarkers", []):
            s3.client.delete_object(Bucket=s3.bucket, Key=m["Key"], VersionId=m["VersionId"])


# -- 3. a server that gives Last-Modified but no ETag: unversioned ----------------------------------------------
def test_last_modified_is_no_version(http_files, tmp_path):
    http_files.etags = False
    path = http_files.root / "a.bin"
    path.write_bytes(b"a" * 1000)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    remote = Remote(http_files.url)
    d = remote.info(remote.join("a.bin"))
    assert d["etag"] is None and d["modified"] == "Tue, 14 Nov 2023 22:13:20 GMT"
    with open_file(f"{http_files.url}/a.bin", cache_dir=tmp_path / "cache") as f:
        assert f.read() == b"a" * 1000
    path.write_bytes(b"b" * 1000)  # same size, same Last-Modified (a second is coarse): no version can tell
    os.utime(path, (1_700_000_000, 1_700_000_000))
    with open_file(f"{http_files.url}/a.bin", cache_dir=tmp_path / "cache") as f:
        assert f.read() == b"b" * 1000  # cache_dir does not take the date for a version
    assert all("If-Match" not in h for _, h in _gets(http_files))


def test_without_etag_a_change_of_size_is_still_caught(http_files):
    http_files.etags = False
    path = http_files.root / "a.bin"
    path.write_bytes(b"a" * 1000)
    remote = Remote(http_files.url, block_cache=0)
    f = remote.open(remote.join("a.bin"))
    assert f.read(0, 10) == b"a" * 10
    path.write_bytes(b"b" * 2000)
    with pytest.raises(lazyseq.RemoteReadError, match=r"changed since it was opened \(it is 2000 bytes now, 1000 when"):
        f.read(10, 20)


# -- 4. a 206 answer's Content-Range is checked -----------------------------------------------------------------
def test_an_answer_of_another_range_is_refused(http_files):
    data = os.urandom(10_000)
    (http_files.root / "blob").write_bytes(data)
    remote = Remote(_secret(http_files.url), block_cache=0)
    f = remote.open(remote.join("blob"))
    http_files.reset_counts()
    http_files.misrange_next(1)  # answers bytes 0-99 (and says so) for bytes 100-199
    with pytest.raises(lazyseq.RemoteReadError) as e:
        f.read(100, 200)
    text = str(e.value)
    assert text.startswith(f"could not read bytes 100-199 of {http_files.url}/blob: ")
    assert "answered bytes 0-99 (Content-Range 'bytes 0-99/10000') for bytes 100-199" in text
    assert "hunter2" not in text and "topsecret" not in text and e.value.range == (100, 200)
    assert len(_gets(http_files)) == 1  # not retried
    assert f.read(100, 200) == data[100:200]


def test_an_item_read_from_another_range_is_refused(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0)
    store[0]
    http_files.misrange_next(10**6)
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[3]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and "for bytes" in str(err) and "answered bytes 0-" in str(err)
