"""lazyseq.load over URLs (issue #25): the same items as locally, against real local servers (an
HTTP server with Range support, moto's S3), with the request counts, caches and failures the docs
promise (docs/remote.md)."""

import os
import pickle
import shutil
import threading
import time

import numpy as np
import pytest

import lazyseq
from lazyseq.files import redact

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

N = 300


def _items(n: int = N) -> list:
    return [{"x": np.full((3, 2), i, np.float32), "v": np.arange(i % 5, dtype=np.int16), "s": f"item{i}", "n": i,
             "b": bytes([i % 256]) * (i % 3), "z": None} for i in range(n)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A local store of N mixed items in several shards."""
    path = str(tmp_path_factory.mktemp("remote") / "train")
    lazyseq.save(_items(), path, method="thread", shard_bytes=4000)
    assert len(lazyseq.load(path).records) >= 4
    return path


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
                and not b.flags.writeable)
    return type(a) is type(b) and a == b


def _http(server, saved: str, name: str = "train") -> str:
    shutil.copytree(saved, server.root / name)
    return f"{server.url}/{name}"


def _s3(s3, saved: str, name: str = "train") -> str:
    for f in os.listdir(saved):
        if os.path.isfile(os.path.join(saved, f)):
            s3.client.upload_file(os.path.join(saved, f), s3.bucket, f"{name}/{f}")
    return f"s3://{s3.bucket}/{name}"


def _gets(server) -> list:
    return [r for r in server.requests if r.method == "GET"]


# -- the same items as locally --------------------------------------------------------------------------
def test_items_equal_local_http(http_files, saved):
    _check_equal(saved, lazyseq.load(_http(http_files, saved)))


def test_items_equal_local_s3(s3, saved):
    _check_equal(saved, lazyseq.load(_s3(s3, saved), storage_options=s3.storage_options))


def _check_equal(saved: str, remote) -> None:
    local = lazyseq.load(saved)
    assert len(remote) == N and len(remote.records) == len(local.records)
    for i in (0, 1, 77, N - 1, -1):
        assert _same(local[i], remote[i]), i
    idx = np.random.default_rng(0).permutation(N)[:120]
    assert all(_same(a, b) for a, b in zip(local[idx], remote[idx]))  # a bulk read over several shards
    assert all(_same(a, b) for a, b in zip(local[10:90], remote[10:90]))
    assert lazyseq.fingerprint(remote) == lazyseq.fingerprint(local)  # its identity: the manifest's digest


def test_batches_by_columns_equal_local(http_files, tmp_path):
    path = str(tmp_path / "fixed")
    lazyseq.save([{"x": np.full((4,), i, np.int32), "n": i, "s": str(i)} for i in range(500)], path, method="thread",
                 shard_bytes=3000)
    local = lazyseq.load(path)
    remote = lazyseq.load(_http(http_files, path, "fixed"))
    got = list(lazyseq.batch(lazyseq.shuffle(remote, seed=3), 64, collate_fn=lazyseq.default_collate))
    want = list(lazyseq.batch(lazyseq.shuffle(local, seed=3), 64, collate_fn=lazyseq.default_collate))
    for g, w in zip(got, want):
        assert (g["x"] == w["x"]).all() and (g["n"] == w["n"]).all() and g["s"] == w["s"] and g["x"].dtype == w["x"].dtype
    with lazyseq.DataLoader(remote, batch_size=50, shuffle=True, seed=1, num_workers=2, to_tensor=False) as loader:
        seen = np.concatenate([np.array(b["n"]) for b in loader])
    assert sorted(seen.tolist()) == list(range(500))


def test_bulk_read_joins_neighbours_and_single_reads_cost_one_request(http_files, saved):
    url = _http(http_files, saved)
    store = lazyseq.load(url, block_cache=0)
    store[0]  # opens shard 0 (HEAD + its small tables)
    http_files.reset_counts()
    store[1]
    # the fields' ranges sent at once, neighbours joined: here all in 4 kB, one request
    assert len(_gets(http_files)) == 1
    for k in range(len(store.records)):  # open every shard first
        store[k * store.per_shard]
    http_files.reset_counts()
    items = lazyseq.batch(store[np.arange(2, 40)], 38)[0]  # one bulk read of the 38 items
    assert all(_same(a, b) for a, b in zip(items, lazyseq.load(saved)[2:40]))
    # one shard's consecutive items (small shards: every field's ranges are neighbours): one request
    assert len(_gets(http_files)) == 1
    http_files.reset_counts()
    store[7]
    assert len(_gets(http_files)) >= 1  # block_cache=0: every read goes out


def test_block_cache_keeps_repeated_reads(http_files, saved):
    store = lazyseq.load(_http(http_files, saved))
    want = store[5]
    http_files.reset_counts()
    for _ in range(3):
        assert _same(want, store[5])
    assert _gets(http_files) == []


def test_pickled_store_reads_in_process_workers(http_files, saved):
    url = _http(http_files, saved)
    store = lazyseq.load(url)
    again = pickle.loads(pickle.dumps(store))
    assert _same(again[3], lazyseq.load(saved)[3])
    with lazyseq.prefetch(store, nworkers=2, method="process", shm_size=2**20) as p:
        got = list(p[:50])
    assert all(_same(a, b) for a, b in zip(got, lazyseq.load(saved)[:50]))


def test_thread_workers_hide_latency(http_files, saved):
    """32 threads keep 32 requests in flight: far faster than a loop (the bench measures the ratio)."""
    store = lazyseq.load(_http(http_files, saved), block_cache=0)
    store[0]
    http_files.latency = 0.05
    with lazyseq.prefetch(store, nworkers=32, method="thread") as p:
        assert p.max_buffered >= 32
        got = list(p[:96])
    assert all(_same(a, b) for a, b in zip(got, lazyseq.load(saved)[:96]))


# -- the local shard cache --------------------------------------------------------------------------
def test_cache_dir_keeps_shards_and_refetches_changed_ones(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), str(tmp_path / "cache")
    first = lazyseq.load(url, cache_dir=cache)
    assert _same(first[3], lazyseq.load(saved)[3])
    http_files.reset_counts()
    second = lazyseq.load(url, cache_dir=cache)  # another process would do the same
    assert _same(second[3], first[3])
    assert [r for r in http_files.requests if r.range and "shard" in r.path] == []  # the shard came from disk
    assert len([f for f in os.listdir(cache) if f.endswith(".bin")]) == 1
    # the object changes (a new ETag): never served stale
    shard = http_files.root / "train" / first.records[0]["file"]
    data = bytearray(shard.read_bytes())
    os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))
    shard.write_bytes(bytes(data))
    http_files.reset_counts()
    third = lazyseq.load(url, cache_dir=cache)
    assert _same(third[3], first[3])
    assert any(r.range for r in http_files.requests)  # downloaded again
    assert len([f for f in os.listdir(cache) if f.endswith(".bin")]) == 2


def test_cache_dir_bytes_evicts_least_recently_used(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), str(tmp_path / "cache")
    store = lazyseq.load(url, cache_dir=cache, cache_dir_bytes=max(r["bytes"] for r in lazyseq.load(saved).records) + 1)
    for k in range(len(store.records)):
        store[k * store.per_shard]
    entries = [f for f in os.listdir(cache) if f.endswith(".bin")]
    assert len(entries) == 1  # each new shard pushed the older one out
    assert not [f for f in os.listdir(cache) if f.endswith(".part")]


def test_cache_dir_downloads_once_for_concurrent_readers(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), str(tmp_path / "cache")
    http_files.latency = 0.02
    stores = [lazyseq.load(url, cache_dir=cache) for _ in range(4)]
    http_files.reset_counts()
    threads = [threading.Thread(target=s.__getitem__, args=(0,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    size = lazyseq.load(saved).records[0]["bytes"]
    ranged = [r for r in http_files.requests if r.range]
    assert sum(_range_len(r.range) for r in ranged) == size  # the shard's bytes went out once


def _range_len(header: str) -> int:
    a, b = header.split("=")[1].split("-")
    return int(b) - int(a) + 1


# -- failures ---------------------------------------------------------------------------------------------
def test_retries_then_succeeds(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0)
    store[0]
    http_files.fail_next(2, status=503)
    assert _same(store[4], lazyseq.load(saved)[4])
    http_files.drop_next(1)  # a connection lost mid-transfer: retried, never half an item
    assert _same(store[5], lazyseq.load(saved)[5])


def test_persistent_failure_names_url_range_and_item(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0, timeout=1.0)
    store[0]
    http_files.fail_next(10**6, status=503)
    t = time.monotonic()
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[6]
    assert time.monotonic() - t < 10  # bounded by timeout (a generous bound: not a speed test)
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError)
    assert err.url.startswith(http_files.url) and err.range is not None
    assert "item 6" in str(err) and "bytes" in str(err) and "tries" in str(err)


def test_hung_request_times_out(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0, timeout=1.0)
    store[0]
    http_files.hang_next(10**6, 30.0)
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[8]
    assert isinstance(e.value.__cause__, lazyseq.RemoteReadError)


def test_missing_store_and_missing_shard(http_files, saved):
    with pytest.raises(FileNotFoundError, match="no store at"):
        lazyseq.load(f"{http_files.url}/nothing", timeout=2)
    url = _http(http_files, saved)
    store = lazyseq.load(url)
    os.unlink(http_files.root / "train" / store.records[1]["file"])
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[store.per_shard]
    assert store.records[1]["file"] in str(e.value.__cause__)


def test_a_missing_bucket_is_named_not_taken_for_a_missing_manifest(s3):
    import uuid

    bucket = f"no-such-bucket-{uuid.uuid4().hex[:12]}"
    with pytest.raises(FileNotFoundError) as e:
        lazyseq.load(f"s3://{bucket}/train", storage_options=s3.storage_options, timeout=5)
    assert str(e.value) == (f"lazyseq.load: there is no store at s3://{bucket}/train: the bucket s3://{bucket} does not "
                            "exist, or cannot be listed with these credentials; check the URL and storage_options")
    with pytest.raises(FileNotFoundError) as e:  # the bucket exists: no manifest in it, as before
        lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options, timeout=5)
    assert str(e.value) == f"lazyseq.load: there is no store at s3://{s3.bucket}/train: it has no manifest.json"


def test_an_unreachable_host_is_named(http_files):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(lazyseq.RemoteReadError) as e:
        lazyseq.load(f"http://me:hunter2@127.0.0.1:{port}/x?X-Amz-Signature=topsecret", timeout=1.0)
    assert time.monotonic() - t < 10  # retried within timeout (a generous bound: not a speed test)
    text = str(e.value)
    assert text.startswith(f"could not read http://127.0.0.1:{port}/x/manifest.json after ")
    assert f": cannot reach the host 127.0.0.1:{port} (ClientConnectorError: " in text
    assert text.endswith("check the URL, and that the server is up and reachable from here")
    assert "hunter2" not in text and "topsecret" not in text and e.value.url == f"http://127.0.0.1:{port}/x/manifest.json"
    with pytest.raises(FileNotFoundError, match="it has no manifest.json"):  # a host that answers: no store there
        lazyseq.load(f"{http_files.url}/x", timeout=1.0)


def test_a_timeout_says_so_and_after_how_long(http_files, saved):
    import re

    url = _http(http_files, saved) + "?X-Amz-Signature=topsecret"
    shown = re.escape(f"{http_files.url}/train")
    http_files.hang_next(10**6, 30.0)  # every request stalls: the manifest's HEAD gets no answer
    with pytest.raises(lazyseq.RemoteReadError) as e:
        lazyseq.load(url, timeout=0.5)
    assert re.fullmatch(rf"could not read {shown}/manifest.json after \d+ tr(y|ies) in [\d.]+ s: timed out: "
                        r"no answer within 0.5 s \(FSTimeoutError\)", str(e.value)), str(e.value)
    http_files.hang_next(0, 0.0)
    store = lazyseq.load(url, block_cache=0, timeout=0.5)
    store[0]  # shard 0 open: what follows is one range of it
    http_files.hang_next(10**6, 30.0)
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[1]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and err.range is not None
    assert re.fullmatch(rf"could not read bytes \d+-\d+ of {shown}/shard-[0-9a-f-]+\.bin after \d+ tr(y|ies) in [\d.]+ s: "
                        rf"timed out: no answer within 0.5 s \(\w+: [^)]+\) \(reading item 1 of store\('{shown}'\)\)",
                        str(err)), str(err)
    assert "topsecret" not in str(e.value) + str(err)


def test_redirect_to_another_host_refused(http_files, saved, tmp_path):
    from tests.servers import RangeServer

    url = _http(http_files, saved)
    with RangeServer(tmp_path) as elsewhere:
        http_files.redirect("/train/", elsewhere.url + "/train/")
        with pytest.raises((OSError, lazyseq.EvaluationError)) as e:
            lazyseq.load(url, timeout=2)[0]
        assert "another host" in str(e.value) + str(e.value.__cause__)
        assert elsewhere.requests == []


def test_changed_size_refused_before_any_read(http_files, saved):
    store = lazyseq.load(_http(http_files, saved))
    shard = http_files.root / "train" / store.records[2]["file"]
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[2 * store.per_shard]
    assert "truncated or was replaced" in str(e.value.__cause__)


# -- secrets ---------------------------------------------------------------------------------------------
def test_secrets_never_shown(http_files, saved):
    url = _http(http_files, saved).replace("http://", "http://me:hunter2@") + "?X-Amz-Signature=topsecret"
    opts = {"headers": {"X-Api-Key": "opensesame"}}
    store = lazyseq.load(url, storage_options=opts, timeout=1.0)
    shown = repr(store) + store.describe() + repr(lazyseq.fingerprint(store)) + repr(store.remote)
    for secret in ("hunter2", "topsecret", "opensesame"):
        assert secret not in shown
    http_files.fail_next(10**6)
    with pytest.raises(lazyseq.EvaluationError) as e:
        store[40]
    text = str(e.value) + str(e.value.__cause__) + repr(e.value.__cause__)
    for secret in ("hunter2", "topsecret", "opensesame"):
        assert secret not in text
    assert redact(url) in text


def test_hostile_shard_name_refused(http_files, saved):
    import json

    url = _http(http_files, saved)
    man = http_files.root / "train" / "manifest.json"
    m = json.loads(man.read_text())
    m["shards"][0]["file"] = "../../etc/passwd"
    man.write_text(json.dumps(m))
    with pytest.raises(lazyseq.StoreError):
        lazyseq.load(url)


def test_bulk_read_failure_names_items(http_files, saved):
    store = lazyseq.load(_http(http_files, saved), block_cache=0, timeout=0.5)
    store[0]
    http_files.fail_next(10**6)
    with pytest.raises(lazyseq.EvaluationError) as e:
        lazyseq.batch(store, 10)[0]
    err = e.value.__cause__
    assert isinstance(err, lazyseq.RemoteReadError) and "items 0, 1, 2, 3, ... (10 items)" in str(err)


def test_verify_reads_every_shard_and_checks_its_checksum(http_files, saved):
    url = _http(http_files, saved)
    lazyseq.load(url, verify=True)
    shard = http_files.root / "train" / lazyseq.load(saved).records[1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    lazyseq.load(url)  # no shard read
    with pytest.raises(lazyseq.StoreError, match="checksum"):
        lazyseq.load(url, verify=True)


def test_reopened_object_with_a_new_etag_is_not_served_from_the_block_cache(http_files):
    from lazyseq.files import Remote

    (http_files.root / "blob").write_bytes(b"a" * 100)
    remote = Remote(http_files.url)
    url = remote.join("blob")
    assert remote.open(url).read(10, 20) == b"a" * 10
    (http_files.root / "blob").write_bytes(b"b" * 100)  # same size, new mtime: a new ETag
    os.utime(http_files.root / "blob", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert remote.open(url).read(10, 20) == b"b" * 10


def test_forked_child_reads_with_its_own_connections(http_files, saved):
    import multiprocessing

    store = lazyseq.load(_http(http_files, saved))
    want = store[3]  # the parent's session and cache are in use
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(_same(want, store[3]) and _same(lazyseq.load(saved)[200], store[200]))

    p = ctx.Process(target=child)
    p.start()
    ok = q.get(timeout=30)
    p.join(10)
    assert ok and p.exitcode == 0


# -- what the review of the first version found ---------------------------------------------------------
def test_a_server_that_ignores_ranges_fails_at_once_without_reading_the_object(saved, tmp_path):
    from lazyseq.files.httpserver import RangeHandler, RangeServer

    class Whole(RangeHandler):
        def _send_file(self, f, rng, body):  # answers every GET with the whole file (200)
            return super()._send_file(f, None, body)

    class Ignoring(RangeServer):
        handler = Whole

    shutil.copytree(saved, tmp_path / "www" / "train")
    with Ignoring(tmp_path / "www") as server:
        with pytest.raises(lazyseq.RemoteReadError, match="ignores Range requests") as e:
            lazyseq.load(f"{server.url}/train", timeout=5)
        assert "tries" not in str(e.value)  # not retried: each try would bring the whole object again
        assert len([r for r in server.requests if r.method == "GET"]) == 1


def test_errors_no_retry_can_mend_fail_at_once(tmp_path):
    for url in ("zzz://bucket/train", "s3://"):
        with pytest.raises((OSError, ValueError)) as e:
            lazyseq.load(url, timeout=30)
        assert "tries" not in str(e.value)


def test_secrets_not_kept_in_exception_chains_nor_logged(http_files, caplog):
    import logging

    url = http_files.url.replace("http://", "http://alice:SECRETPW@") + "/nope?X-Amz-Signature=SECRETSIG"
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(FileNotFoundError) as e:
            lazyseq.load(url, timeout=2)
    chain, err = [], e.value
    while err is not None and len(chain) < 20:
        chain.append(err)
        err = err.__cause__ or err.__context__
    text = "".join(repr(x) + str(x) + repr(getattr(x, "request_info", "")) for x in chain)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("SECRETPW", "SECRETSIG"):
        assert secret not in text and secret not in logged


def test_fork_while_the_parent_holds_the_stores_locks(http_files, saved):
    import multiprocessing

    store = lazyseq.load(_http(http_files, saved))
    want = lazyseq.load(saved)[2 * store.per_shard + 1]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(_same(want, store[2 * store.per_shard + 1]))

    with store._lock, store.remote._lock, store.remote.cache._lock:  # as a thread of the parent may at a fork
        p = ctx.Process(target=child)
        p.start()
    ok = q.get(timeout=30)
    p.join(10)
    assert ok and p.exitcode == 0


def test_timeout_bounds_each_request_not_a_whole_bulk_read(http_files):
    from lazyseq.files import Remote

    data = np.random.default_rng(0).integers(0, 256, 300 * 100_000, dtype=np.uint8).tobytes()
    (http_files.root / "big").write_bytes(data)
    remote = Remote(http_files.url, block_cache=0, timeout=0.5)
    url = remote.join("big")
    http_files.latency = 0.2  # 300 far-apart ranges: several rounds of the connection pool, > 0.5 s in all
    got = remote.read_ranges([(url, k * 100_000, k * 100_000 + 10) for k in range(300)])
    assert got == [data[k * 100_000 : k * 100_000 + 10] for k in range(300)]
