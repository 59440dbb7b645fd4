"""``cache_dir`` is a stranger's folder too (issue #31, "a stranger's data, second pass"): an entry is
used only if it proves it is what it claims, whatever was put in the directory (another object's
bytes, a FIFO, a directory, a link, a file of another user, a forged record), the cache never waits on
a planted file, never deletes a file of its user's, and its names never show a URL's query string.

The stores and files are served by the local Range server (tests/servers.py); every read that could
hang runs in a thread joined with a timeout."""

import hashlib
import json
import os
import shutil
import stat
import threading
import time
import urllib.parse

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq.files import diskcache, httpserver
from lazyseq.files.fileobj import open_file

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

N = 60
OTHER_UID = 54321


def _items(n: int = N) -> list:
    return [{"x": np.full(16, i, np.int64), "s": f"item{i}"} for i in range(n)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("cachedir") / "train")
    lazyseq.save(_items(), path, method="thread", shard_bytes=400)
    assert len(lazyseq.load(path).records) >= 4
    return path


def _http(server, saved: str) -> str:
    shutil.copytree(saved, server.root / "train")
    return f"{server.url}/train"


def _entries(cache) -> list[str]:
    """The cache's data files (what it keeps of an object), by name."""
    return sorted(f for f in os.listdir(cache) if f.endswith(".bin") and len(f) == 44)


def _timed(fn, timeout: float = 60.0):
    """``fn()`` in a thread; its value, or its exception raised; a failure if it takes over ``timeout`` s."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        _unblock_fifos()
        t.join(10)
        pytest.fail(f"the read did not finish in {timeout} s (it waits on a planted file)")
    if "error" in out:
        raise out["error"]
    return out["value"]


_FIFOS: list[str] = []


def _mkfifo(path) -> None:
    os.mkfifo(path)
    _FIFOS.append(str(path))


def _unblock_fifos() -> None:
    """Open the read end of every planted FIFO, so that a writer stuck opening one goes on (a failed test
    leaves no thread behind)."""
    for p in _FIFOS:
        try:
            os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass


def _first(url: str, cache, k: int = 0) -> dict:
    """Item ``k`` of the store at ``url``, loaded anew with ``cache_dir=cache``."""
    return lazyseq.load(url, cache_dir=str(cache))[k]


def _ok(item, i: int) -> None:
    assert item["s"] == f"item{i}" and (item["x"] == i).all()


def _shard_gets(server) -> list:
    return [r for r in server.requests if r.method == "GET" and r.range and "shard" in r.path]


# -- 1. the key is the whole URL ------------------------------------------------------------------------------
class _ByQuery(httpserver.RangeHandler):
    """Serves the file named by the query's ``f=`` (``/x?f=a.bin`` is ``a.bin``): objects that differ only
    in their query string, as a presigned or a ``?version=`` URL does."""

    def answer_first(self, req, body):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if "f" in q:
            self.path = "/" + q["f"][0]
        return False


class _QueryServer(httpserver.RangeServer):
    handler = _ByQuery


def test_urls_that_differ_only_in_their_query_have_their_own_entries(tmp_path):
    root, cache = tmp_path / "root", tmp_path / "cache"
    root.mkdir()
    a, b = bytes(range(256)) * 8, bytes(range(255, -1, -1)) * 8
    (root / "a.bin").write_bytes(a)
    (root / "b.bin").write_bytes(b)
    for f in ("a.bin", "b.bin"):  # the same size and time: the same ETag
        os.utime(root / f, ns=(10**18, 10**18))
    with _QueryServer(root) as server:
        got = []
        for f in ("a.bin", "b.bin", "a.bin"):
            with open_file(f"{server.url}/x?f={f}&sig=SECRETSIG", cache_dir=cache) as fh:
                got.append(fh.read())
    assert got == [a, b, a]
    assert len(_entries(cache)) == 2
    for name in os.listdir(cache):  # the query string is in no name, and in no file the cache wrote of its own
        assert "SECRETSIG" not in name and "f=" not in name
        if not name.endswith(".bin"):
            assert b"SECRETSIG" not in (cache / name).read_bytes() and b"f=a.bin" not in (cache / name).read_bytes()


# -- 2. entries are verified before use ---------------------------------------------------------------------
def _plant(path, data: bytes) -> None:
    """Put ``data`` in ``path``'s place (a new file renamed over it)."""
    tmp = f"{path}.planted"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _flipped(data: bytes) -> bytes:
    return bytes(b ^ 0x5A for b in data)


def test_an_entry_whose_bytes_were_replaced_is_fetched_again_not_served(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    good = (cache / entry).read_bytes()
    _plant(cache / entry, _flipped(good))  # the same size: today only the size is checked
    http_files.reset_counts()
    _ok(_first(url, cache, 3), 3)
    assert _shard_gets(http_files)  # downloaded again
    assert (cache / entry).read_bytes() == good  # and the planted entry replaced


def test_a_forged_record_does_not_pass_the_manifests_checksum(http_files, saved, tmp_path):
    """An entry and a record that agree with each other (the record's digest is the planted bytes'):
    a store's shard is also checked against the manifest's CRC-32."""
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    good = (cache / entry).read_bytes()
    bad = _flipped(good)
    _plant(cache / entry, bad)
    record = cache / (entry[:-4] + ".json")
    forged = json.loads(record.read_text())
    forged["blake2b"] = hashlib.blake2b(bad).hexdigest()
    _plant(record, json.dumps(forged).encode())
    diskcache.forget_verified()  # another process: it has never seen this entry
    http_files.reset_counts()
    _ok(_first(url, cache, 3), 3)
    assert _shard_gets(http_files) and (cache / entry).read_bytes() == good


def test_an_entry_is_hashed_once_per_process(http_files, saved, tmp_path, monkeypatch):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)  # downloaded: hashed as it was written
    calls = []
    digest = diskcache._digest
    monkeypatch.setattr(diskcache, "_digest", lambda fd: calls.append(fd) or digest(fd))
    _ok(_first(url, cache, 3), 3)
    assert calls == []  # this process wrote it
    diskcache.forget_verified()  # another process
    http_files.reset_counts()
    for _ in range(3):
        _ok(_first(url, cache, 3), 3)
    assert len(calls) == 1 and _shard_gets(http_files) == []  # hashed on its first use only, read from disk


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making another user's file needs root")
def test_an_entry_of_another_user_is_never_used(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    for name in os.listdir(cache):  # the entry, its record, its lock: all another user's, as they were
        os.chown(cache / name, OTHER_UID, OTHER_UID)
    diskcache.forget_verified()
    http_files.reset_counts()
    _ok(_first(url, cache, 3), 3)
    assert _shard_gets(http_files)  # fetched again
    assert os.stat(cache / entry).st_uid == os.getuid()  # into a fresh entry of its own


# -- 3. part files, FIFOs, directories ----------------------------------------------------------------------
def test_a_fifo_in_place_of_an_entry_or_its_part_file_is_not_waited_on(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    os.unlink(cache / entry)
    for name in (entry, entry + ".part", entry[:-4] + ".part"):
        _mkfifo(cache / name)
    _ok(_timed(lambda: _first(url, cache, 3)), 3)
    assert stat.S_ISREG(os.lstat(cache / entry).st_mode)


def test_a_directory_in_place_of_an_entry_or_its_lock_is_refused_not_raised(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    locks = [f for f in os.listdir(cache) if f.endswith(".lock")]
    assert locks
    for name in [entry, *locks]:
        os.unlink(cache / name)
        (cache / name).mkdir()
        (cache / name / "users-file.txt").write_text("mine")  # a directory that is not empty: left alone
    for i in (3, 4):
        _ok(_timed(lambda i=i: _first(url, cache, i)), i)
    for name in [entry, *locks]:
        assert (cache / name / "users-file.txt").read_text() == "mine"
    assert not [f for f in os.listdir(cache) if f.endswith(".part")]


def test_a_link_in_place_of_an_entry_is_not_followed(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    good = (cache / entry).read_bytes()
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(_flipped(good))
    os.unlink(cache / entry)
    os.symlink(target, cache / entry)
    diskcache.forget_verified()
    _ok(_first(url, cache, 3), 3)
    assert target.read_bytes() == _flipped(good)  # never written through
    assert not os.path.islink(cache / entry) and (cache / entry).read_bytes() == good


def test_a_chunk_file_of_the_cache_is_checked_too(http_files, tmp_path):
    """``open_file`` (``chunks(as_file=True)``) opens the entry it verified: a planted FIFO is not waited
    on, planted bytes are not served."""
    data = bytes(range(256)) * 64
    (http_files.root / "a.bin").write_bytes(data)
    url, cache = f"{http_files.url}/a.bin", tmp_path / "cache"
    with open_file(url, cache_dir=cache) as f:
        assert f.read() == data
    [entry] = _entries(cache)
    _plant(cache / entry, _flipped(data))
    with _timed(lambda: open_file(url, cache_dir=cache)) as f:
        assert f.read() == data
    os.unlink(cache / entry)
    _mkfifo(cache / entry)
    with _timed(lambda: open_file(url, cache_dir=cache)) as f:
        assert f.read() == data


# -- 4. eviction deletes only the cache's own entries ------------------------------------------------------------
def test_cache_dir_bytes_evicts_only_the_caches_own_entries(http_files, saved, tmp_path):
    url, cache = _http(http_files, saved), tmp_path / "cache"
    cache.mkdir()
    users = {"my-corpus.bin": b"c" * 5000, "0" * 40 + ".bin": b"h" * 5000, "notes.txt": b"n"}
    for name, data in users.items():
        (cache / name).write_bytes(data)
        os.utime(cache / name, (time.time() - 86400,) * 2)  # older than any entry: the first to go, today
    store = lazyseq.load(url, cache_dir=str(cache), cache_dir_bytes=max(r["bytes"] for r in store_records(saved)) + 1)
    for k in range(len(store.records)):
        _ok(store[k * store.per_shard], k * store.per_shard)
    for name, data in users.items():
        assert (cache / name).read_bytes() == data, name
    assert len([e for e in _entries(cache) if e != "0" * 40 + ".bin"]) == 1  # its own entries did go


def store_records(path: str) -> list:
    return lazyseq.load(path).records


# -- 7. fuzzing: whatever is planted, the right items or a documented error, never a hang --------------------------
PLANTS = ["random", "same-size", "flipped", "empty", "fifo", "dir", "link", "other-user", "record-json", "record-bytes",
          "record-forged", "missing"]


@st.composite
def plantings(draw):
    return [(draw(st.sampled_from(["entry", "record", "lock"])), draw(st.sampled_from(PLANTS)),
             draw(st.binary(max_size=600)), draw(st.integers(0, 2**31)),
             draw(st.dictionaries(st.sampled_from(["format", "version", "key", "url", "etag", "size", "blake2b"]),
                                  st.none() | st.integers(-5, 2**40) | st.text(max_size=70), max_size=7)))
            for _ in range(draw(st.integers(1, 3)))]


def _do_plant(cache, entry: str, good: bytes, record: dict, plant: tuple) -> None:
    """One planting: the entry's data file, its record or its lock replaced by ``how``."""
    where, how, data, seed, fields = plant
    path = cache / {"entry": entry, "record": entry[:-4] + ".json", "lock": entry[:-4] + ".lock"}[where]
    current = cache / entry
    entry_bytes = current.read_bytes() if current.is_file() and not current.is_symlink() else b""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if how == "fifo":
        _mkfifo(path)
    elif how == "dir":
        path.mkdir()
    elif how == "link":
        os.symlink(cache.parent / "secret", path)
    elif how != "missing":
        if how in ("record-json", "record-forged"):
            rec = {**record, **fields}
            if how == "record-forged":
                rec["blake2b"] = hashlib.blake2b(entry_bytes).hexdigest()
            data = json.dumps(rec).encode()
        elif how in ("same-size", "other-user"):
            data = good if how == "other-user" else np.random.default_rng(seed).bytes(len(good))
        elif how == "flipped":
            data = _flipped(good)
        elif how == "empty":
            data = b""
        path.write_bytes(data)
        if how == "other-user" and hasattr(os, "geteuid") and os.geteuid() == 0:
            os.chown(path, OTHER_UID, OTHER_UID)


@settings(max_examples=int(os.environ.get("LAZYSEQ_FUZZ_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plants=plantings())
def test_fuzz_whatever_is_planted_in_cache_dir_the_right_items_come_back(http_files, saved, tmp_path, plants):
    if not (http_files.root / "train").exists():  # one server for all examples
        _http(http_files, saved)
    url, cache = f"{http_files.url}/train", tmp_path / f"cache-{time.monotonic_ns()}"
    (tmp_path / "secret").write_bytes(b"secret" * 100)
    _ok(_first(url, cache, 3), 3)
    [entry] = _entries(cache)
    good, record = (cache / entry).read_bytes(), json.loads((cache / (entry[:-4] + ".json")).read_text())
    for plant in plants:
        _do_plant(cache, entry, good, record, plant)
    diskcache.forget_verified()  # another process, as well as this one
    for i in (3, 4):
        _ok(_timed(lambda i=i: _first(url, cache, i)), i)
    shutil.rmtree(cache, ignore_errors=True)
