"""lazyseq.save to a URL (issue #25): the same store as a local save, uploaded by the workers; the
manifest last; an interrupted save resumes; overwrite deletes the old shards only after the new
manifest; a lock object with a lease; nothing left under the URL but the store; no secret in any
message. Against moto's S3 (tests/servers.py) and fsspec's memory:// (docs/remote.md)."""

import collections
import json
import os
import tempfile
import threading
import time
import traceback

import numpy as np
import pytest

import lazyseq
from lazyseq.files import RemoteWriteError
from lazyseq.store import lease, upload

pytest.importorskip("fsspec")
pytest.importorskip("s3fs")


@pytest.fixture(autouse=True)
def _quick_lock(monkeypatch):
    monkeypatch.setattr(lease, "SETTLE", 0.01)  # the read-back pause of a lock: no other save races here


def _items(n: int = 120) -> list:
    return [{"x": np.full((3, 2), i, np.float32), "v": np.arange(i % 5, dtype=np.int16), "s": f"item{i}", "n": i,
             "b": bytes([i % 256]) * (i % 3), "z": None, "t": (i * 0.5, i % 2 == 0)} for i in range(n)]


def same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def keys(s3, prefix: str = "train/") -> list[str]:
    out = []
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        out += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
    return sorted(out)


def check_clean(s3, store) -> None:
    """Nothing under the URL but the manifest and the shards it names."""
    assert keys(s3) == sorted(["manifest.json", *(r["file"] for r in store.records)])


def save(seq, s3, **kw):
    kw.setdefault("method", "thread")
    lazyseq.save(seq, f"s3://{s3.bucket}/train", storage_options=s3.storage_options, **kw)
    return lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options, verify=True)


def check_equal_to_local(store, seq, tmp_path, **kw) -> None:
    """Item for item, and the manifest but for the shards' (random) file names."""
    lazyseq.save(seq, tmp_path / "local", method="thread", **kw)
    local = lazyseq.load(tmp_path / "local")
    assert len(store) == len(local) == len(seq)
    for i in range(len(seq)):
        same(store[i], local[i])
        same(store[i], seq[i])
    a, b = (json.loads(json.dumps(m)) for m in (store.manifest, local.manifest))
    for m in (a, b):
        for r in m["shards"]:
            r.pop("file")
    assert a == b


# -- the same store as locally ---------------------------------------------------------------------------
def test_round_trip_equals_local(s3, tmp_path):
    items = _items()
    store = save(items, s3, shard_bytes=1500, nworkers=2)
    assert len(store.records) >= 4
    check_equal_to_local(store, items, tmp_path, shard_bytes=1500)
    check_clean(s3, store)
    run = {r["file"].split("-")[2] for r in store.records}
    assert len(run) == 1  # one run id in every name: new names per save


def test_process_workers_upload_their_own_shards(s3, tmp_path, monkeypatch):
    # a temporary folder of this test's own: another pytest-xdist worker's saves use the shared one meanwhile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = set(os.listdir(tempfile.gettempdir()))
    seq = lazyseq.smap(lambda i: {"a": np.full(4, i), "pid": os.getpid()}, range(40))
    store = save(seq, s3, method="process", nworkers=2, shard_bytes=200, fingerprint="v1")
    assert [int(x["a"][0]) for x in store] == list(range(40))
    assert os.getpid() not in {int(x["pid"]) for x in store}  # the workers evaluated (and uploaded) them
    check_clean(s3, store)
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("lazyseq-save-")}


def test_memory_url_and_read_only_urls():
    url = f"memory://lazyseq-test-{os.getpid()}/train"
    lazyseq.save(list(range(30)), url, method="thread", shard_bytes=80)
    assert list(lazyseq.load(url)) == list(range(30))
    with pytest.raises(ValueError, match="memory:// lives in this process only; save to it with method='thread'"):
        lazyseq.save([1], url + "2", method="process")
    with pytest.raises(ValueError, match=r"save needs a writable store \(s3://, gs://.*https:// is read-only"):
        lazyseq.save([1], "https://user:pw@example.com/data/train?sig=1", method="thread")
    import fsspec

    fsspec.filesystem("memory").rm(url.split("://")[1].split("/")[0], recursive=True)


# -- crash safety --------------------------------------------------------------------------------------
def test_the_manifest_is_written_last(s3):
    url, seen = f"s3://{s3.bucket}/train", []

    def item(i):
        if i == 35:  # shards 0-2 are uploaded and recorded by now (one worker, 10 items per shard)
            with pytest.raises(FileNotFoundError, match="there is no store"):
                lazyseq.load(url, storage_options=s3.storage_options)
            seen.append(keys(s3))
        return np.full(4, i)
    store = save(lazyseq.smap(item, range(40)), s3, nworkers=1, shard_bytes=320)
    (during,) = seen
    assert "manifest.json" not in during and ".lazyseq-lock.json" in during
    assert {".lazyseq-partial/job.json", ".lazyseq-partial/shard-00002.json"} <= set(during)
    assert sum(n.startswith("shard-") for n in during) == 3
    assert [int(x[0]) for x in store] == list(range(40))
    check_clean(s3, store)


def test_an_interrupted_save_resumes_evaluating_only_the_missing_shards(s3, tmp_path, capsys):
    calls, fail_at = collections.Counter(), [35]

    def item(i):
        calls[i] += 1
        if i in fail_at:
            raise ValueError("not yet")
        return {"a": np.full(4, i), "s": str(i)}
    seq = lazyseq.smap(item, range(40))
    with pytest.raises(lazyseq.EvaluationError, match="item 35"):
        save(seq, s3, nworkers=1, shard_bytes=420)
    left = keys(s3)
    assert "manifest.json" not in left and ".lazyseq-lock.json" not in left  # the lock is released on failure
    job = json.loads(s3.client.get_object(Bucket=s3.bucket, Key="train/.lazyseq-partial/job.json")["Body"].read())
    assert job["per_shard"] == 10
    with pytest.raises(FileNotFoundError, match="an interrupted save is in .*run the same lazyseq.save again"):
        lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options)
    calls.clear()
    fail_at.clear()
    store = save(seq, s3, nworkers=1, shard_bytes=420, progress=False)
    assert sorted(calls) == list(range(30, 40)) and set(calls.values()) == {1}
    assert capsys.readouterr().err == ""
    check_equal_to_local(store, seq, tmp_path, shard_bytes=420)
    check_clean(s3, store)
    kept = [n for n in left if n.startswith("shard-")]
    assert len(kept) == 3 and set(kept) <= {r["file"] for r in store.records}  # the first run's objects


def test_a_resumed_save_says_so_and_another_job_is_refused(s3, capsys):
    def seq(fail: bool):
        return lazyseq.smap(lambda i: np.full(8, i) if i != 45 or not fail else 1 / 0, range(50))
    with pytest.raises(lazyseq.EvaluationError):
        save(seq(True), s3, nworkers=1, shard_bytes=640, fingerprint="v1")
    with pytest.raises(FileExistsError, match="interrupted save of another job .*fingerprint differs.*overwrite=True"):
        save(seq(False), s3, fingerprint="v2")
    save(seq(False), s3, fingerprint="v1", progress=False)  # resumes, silently
    assert "resuming" not in capsys.readouterr().err
    with pytest.raises(lazyseq.EvaluationError):  # an interrupted replacement
        save(seq(True), s3, nworkers=1, shard_bytes=640, fingerprint="v2", overwrite=True)
    store = save(seq(False), s3, fingerprint="v2", overwrite=True)
    line = capsys.readouterr().err.splitlines()[0]
    assert line == (f"lazyseq.save: resuming s3://{s3.bucket}/train: kept 4 of 5 shards finished before (items 0-39: "
                    "40 of 50); writing the rest")
    assert [int(x[0]) for x in store] == list(range(50))
    check_clean(s3, store)


def test_overwrite_deletes_the_old_shards_only_after_the_new_manifest(s3, monkeypatch):
    old = save([1, 2, 3], s3)
    old_files = {r["file"] for r in old.records}
    with pytest.raises(FileExistsError, match="is a finished store; pass overwrite=True"):
        save([4, 5], s3)
    with pytest.raises(lazyseq.EvaluationError):  # a failed replacement leaves the old store whole
        save(lazyseq.smap(lambda i: [4, 5][i] if i == 0 else 1 / 0, range(2)), s3, overwrite=True)
    assert list(lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options)) == [1, 2, 3]
    seen, real = [], upload.clean

    def stop_before_cleaning(remote, names, keep):
        seen.append((list(lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options)), keys(s3)))
        raise OSError("injected: stopped between the manifest and the clean-up")
    monkeypatch.setattr(upload, "clean", stop_before_cleaning)
    with pytest.raises(OSError, match="injected"):
        save([4, 5], s3, overwrite=True)
    (items, objects), = seen
    assert items == [4, 5] and old_files <= set(objects)  # the new manifest is in place, the old shards still there
    monkeypatch.setattr(upload, "clean", real)
    store = save([4, 5], s3, overwrite=True)  # the next save with overwrite=True removes what was left
    assert list(store) == [4, 5]
    check_clean(s3, store)
    s3.client.put_object(Bucket=s3.bucket, Key="other/notes.txt", Body=b"mine")
    with pytest.raises(FileExistsError, match=r"holds objects that are not a lazyseq store's \('notes.txt'\); refusing"):
        lazyseq.save([1], f"s3://{s3.bucket}/other", storage_options=s3.storage_options, method="thread", overwrite=True)


# -- the lock ------------------------------------------------------------------------------------------
def test_a_second_save_is_refused_while_one_runs_and_the_lock_is_renewed(s3, monkeypatch):
    monkeypatch.setattr(lease, "LEASE", 1.5)  # renewed every 0.5 s
    go, errors = threading.Event(), []

    def item(i):
        if i == 8:  # in shard 1, not among the items sampled first (0, 2, 5, 7): after the job file
            assert go.wait(10)
        return i

    def first():
        try:
            save(lazyseq.smap(item, range(10)), s3, nworkers=1, shard_bytes=40, fingerprint="a")
        except BaseException as e:
            errors.append(e)

    def expires() -> float:
        return json.loads(s3.client.get_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json")["Body"].read())["expires"]
    t = threading.Thread(target=first)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while ".lazyseq-partial/job.json" not in keys(s3) and time.monotonic() < deadline:
            time.sleep(0.02)
        before = expires()
        with pytest.raises(lease.SaveLocked, match=rf"another save is writing s3://{s3.bucket}/train: a save on .* "
                                                   rf"\(pid {os.getpid()}, started .*\) holds its lock until .*UTC"):
            save([1, 2], s3, fingerprint="b")
        while expires() == before and time.monotonic() < deadline:  # renewed while it runs
            time.sleep(0.05)
        assert expires() > before
    finally:
        go.set()
        t.join()
    assert not errors
    check_clean(s3, lazyseq.load(f"s3://{s3.bucket}/train", storage_options=s3.storage_options))


def _lock(s3, expires: float) -> None:
    body = {"owner": "x" * 32, "host": "gone-host", "pid": 4242, "started": 0, "expires": expires, "lease": 60}
    s3.client.put_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json", Body=json.dumps(body).encode())


def test_a_held_lock_refuses_and_an_expired_one_is_taken_over(s3, capsys):
    _lock(s3, time.time() + 60)
    with pytest.raises(lease.SaveLocked, match=r"a save on gone-host \(pid 4242, .*holds its lock until .* UTC.*expires 60 s"):
        save([1, 2], s3)
    assert keys(s3) == [".lazyseq-lock.json"]  # nothing written
    _lock(s3, time.time() - 1)
    store = save([1, 2], s3)
    assert "taking over the lock of" in capsys.readouterr().err and list(store) == [1, 2]
    check_clean(s3, store)


_HOLD = """
import json, sys, time
from lazyseq.files import Remote
from lazyseq.store import lease
lease.SETTLE = 0.01
lease.Lease(Remote(sys.argv[1], json.loads(sys.argv[2]))).acquire()
time.sleep(120)  # a save at work, until it is killed
"""


def _lock_body(s3, **change) -> dict:
    """The lock this process would write (its host, boot, pid namespace, pid and start time), with ``change``."""
    from lazyseq.files import Remote

    body = json.loads(lease.Lease(Remote(f"s3://{s3.bucket}/train", s3.storage_options))._body())
    body.update(change)
    s3.client.put_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json", Body=json.dumps(body).encode())
    return body


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(30)
    return p.pid


def test_the_lock_of_a_killed_save_on_this_host_is_taken_over_at_once(s3, capsys):
    import re
    import socket
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(lazyseq.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", _HOLD, f"s3://{s3.bucket}/train", json.dumps(s3.storage_options)], env=env)
    try:
        deadline, held = time.monotonic() + 60, None
        while held is None and p.poll() is None and time.monotonic() < deadline:
            if ".lazyseq-lock.json" in keys(s3):
                held = json.loads(s3.client.get_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json")["Body"].read())
            time.sleep(0.05)
        assert held is not None and held["pid"] == p.pid, "the child process did not take the lock"
    finally:
        p.kill()
        p.wait(30)
    store = save([1, 2], s3)
    assert time.time() < held["expires"] and list(store) == [1, 2]  # taken over well before its lease ran out
    err = capsys.readouterr().err
    host = re.escape(socket.gethostname())
    assert re.search(rf"^lazyseq.save: taking over the lock of s3://{s3.bucket}/train: a save on {host} "
                     rf"\(pid {p.pid}, started .* UTC\) held it until .* UTC \(its process is gone: pid {p.pid} no longer "
                     r"runs on this host\)$", err, re.M), err
    check_clean(s3, store)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times come from Linux's /proc")
def test_a_lock_whose_pid_now_names_another_process_is_taken_over(s3, capsys):
    body = _lock_body(s3)
    _lock_body(s3, pid_start=body["pid_start"] - 1)  # this pid, but a process that started earlier: a reused pid
    store = save([1, 2], s3)
    assert f"(its process is gone: pid {os.getpid()} is now another process, started after the lock was taken)" \
        in capsys.readouterr().err
    check_clean(s3, store)


def test_a_live_holder_or_one_elsewhere_keeps_its_lock_until_it_expires(s3, capsys):
    _lock_body(s3)  # this process, alive
    with pytest.raises(lease.SaveLocked, match=rf"another save is writing .*\(pid {os.getpid()}, started .*holds its lock"):
        save([1, 2], s3)
    dead = _dead_pid()
    body = _lock_body(s3, host="another-host", pid=dead, pid_start=None)  # another machine: its pids are not ours
    with pytest.raises(lease.SaveLocked, match=rf"a save on another-host \(pid {dead}, .*holds its lock"):
        save([1, 2], s3)
    old = {k: body[k] for k in ("owner", "started", "expires", "lease")}  # a lock of an older lazyseq: host and pid only
    s3.client.put_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json",
                         Body=json.dumps({**old, "host": _lock_body(s3)["host"], "pid": dead}).encode())
    with pytest.raises(lease.SaveLocked, match=rf"\(pid {dead}, .*holds its lock"):  # no boot nor namespace: cannot tell
        save([1, 2], s3)
    assert keys(s3) == [".lazyseq-lock.json"] and "taking over" not in capsys.readouterr().err
    _lock_body(s3, host="another-host", pid=dead, expires=time.time() + 1.0)
    time.sleep(1.2)
    store = save([1, 2], s3)  # once its lease ran out
    assert "(it expired)" in capsys.readouterr().err and list(store) == [1, 2]


def test_a_save_that_lost_its_lock_writes_no_manifest(s3):
    def item(i):
        if i == 7:  # another save took the lock over (this one stalled past its lease)
            _lock(s3, time.time() + 60)
        return i
    with pytest.raises(lease.SaveLocked, match="lost the lock of .* to a save on gone-host.*no manifest was written"):
        save(lazyseq.smap(item, range(10)), s3, nworkers=1, shard_bytes=40, fingerprint="a")
    assert "manifest.json" not in keys(s3) and ".lazyseq-lock.json" in keys(s3)  # the other save's lock stays
    s3.client.delete_object(Bucket=s3.bucket, Key="train/.lazyseq-lock.json")
    store = save(lazyseq.smap(lambda i: i, range(10)), s3, fingerprint="a", progress=False)
    assert list(store) == list(range(10))
    check_clean(s3, store)


# -- failures -----------------------------------------------------------------------------------------
def test_a_failed_upload_is_retried(monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    real, failures = MemoryFileSystem.put_file, [2]

    def flaky(self, lpath, rpath, *args, **kw):
        if "shard-00001" in rpath and failures[0]:
            failures[0] -= 1
            raise ConnectionError("connection reset")
        return real(self, lpath, rpath, *args, **kw)
    monkeypatch.setattr(MemoryFileSystem, "put_file", flaky)
    url = f"memory://lazyseq-retry-{os.getpid()}/train"
    lazyseq.save(list(range(30)), url, method="thread", shard_bytes=80)
    assert failures == [0] and list(lazyseq.load(url)) == list(range(30))
    MemoryFileSystem().rm(url.split("://")[1].split("/")[0], recursive=True)


SECRET = "sup3r-s3cret-value-42"


def _no_secret(e: BaseException) -> str:
    text = "".join(traceback.format_exception(e)) + repr(e)
    assert SECRET not in text and "AKIAFAKEKEY" not in text
    return str(e)


def test_no_secret_in_any_message(s3, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {"key": "AKIAFAKEKEY", "secret": SECRET, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    with pytest.raises(OSError) as info:
        lazyseq.save([1, 2], "s3://bucket/train", storage_options=options, timeout=0.5, method="thread")
    assert "s3://bucket/train" in _no_secret(info.value)

    import s3fs

    async def denied(self, lpath, rpath, *args, **kw):  # a library whose error holds a secret
        raise PermissionError(f"access denied for {self.secret} (key {self.key}) at {rpath}?X-Amz-Credential={SECRET}")
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", denied)
    options = {**s3.storage_options, "key": "AKIAFAKEKEY", "secret": SECRET}
    with pytest.raises(RemoteWriteError) as info:
        lazyseq.save(list(range(20)), f"s3://{s3.bucket}/train", storage_options=options, method="thread",
                     shard_bytes=80)
    message = _no_secret(info.value)
    assert message.startswith("lazyseq.save: could not upload shard ")
    assert f"s3://{s3.bucket}/train/shard-0000" in message and "PermissionError: access denied for *** (key ***)" in message
    assert "run the same save again to resume" in message
