"""lazyseq.chunks(..., as_file=True) (issue #25): read receives an open, seekable binary file for a
local path or a URL alike; chunk files served by a local Range HTTP server and moto's S3 read item
for item as the local ones, in few requests, closed after read, retried on failures."""

import io
import os
import pickle
import shutil

import numpy as np
import pytest

import lazyseq
from lazyseq.files.fileobj import MAX_WINDOW, WINDOW, open_file

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [300, 250, 320]
LENGTHS = [*SIZES, 4096]  # and the 1 MiB file's rows


@pytest.fixture(scope="module")
def npy_files(tmp_path_factory) -> list[str]:
    """Three .npy chunk files of float32 rows (8 columns), and one of ~1 MB."""
    d = tmp_path_factory.mktemp("chunks")
    paths = []
    for k, n in enumerate(SIZES):
        paths.append(str(d / f"part-{k}.npy"))
        np.save(paths[-1], np.random.default_rng(k).random((n, 8), dtype=np.float32))
    paths.append(str(d / "big.npy"))
    np.save(paths[-1], np.arange(2**18, dtype=np.int32).reshape(-1, 64))  # 1 MiB of data
    return paths


def _http(server, paths: list[str]) -> list[str]:
    for p in paths:
        shutil.copy(p, server.root / os.path.basename(p))
    return [f"{server.url}/{os.path.basename(p)}" for p in paths]


def _s3(s3, paths: list[str]) -> list[str]:
    for p in paths:
        s3.client.upload_file(p, s3.bucket, f"chunks/{os.path.basename(p)}")
    return [f"s3://{s3.bucket}/chunks/{os.path.basename(p)}" for p in paths]


def _gets(server) -> list:
    return [r for r in server.requests if r.method == "GET"]


def _equal(a: lazyseq.View, b: lazyseq.View) -> None:
    assert len(a) == len(b) and a.lengths == b.lengths
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and (x == y).all()
    idx = np.random.default_rng(0).permutation(len(a))[:100]
    assert all((x == y).all() for x, y in zip(a[idx], b[idx]))


# -- the same items as the local files ----------------------------------------------------------------
def test_npy_chunks_over_http_equal_local(http_files, npy_files):
    urls = _http(http_files, npy_files)
    _equal(lazyseq.chunks(urls, np.load, as_file=True), lazyseq.chunks(npy_files, np.load))


def test_npy_chunks_over_s3_equal_local(s3, npy_files):
    urls = _s3(s3, npy_files)
    remote = lazyseq.chunks(urls, np.load, as_file=True, storage_options=s3.storage_options, cache=1)
    _equal(remote, lazyseq.chunks(npy_files, np.load))


def test_pickled_chunks_over_http(http_files, tmp_path):
    files = []
    for k in range(3):
        files.append(str(tmp_path / f"c{k}.pkl"))
        with open(files[-1], "wb") as f:
            pickle.dump([{"k": k, "i": i, "x": np.full(4, i)} for i in range(50 + k)], f, protocol=5)
    data = lazyseq.chunks(_http(http_files, files), pickle.load, as_file=True)
    assert data.lengths == (50, 51, 52)
    assert data[120]["k"] == 2 and data[120]["i"] == 19 and (data[120]["x"] == 19).all()


def test_as_file_reads_local_files_too(npy_files):
    seen = []

    def read(f):
        seen.append(f)
        assert isinstance(f, io.IOBase) and f.readable() and f.seekable() and "b" in f.mode
        return np.load(f)

    _equal(lazyseq.chunks(npy_files, read, as_file=True), lazyseq.chunks(npy_files, np.load))
    assert seen and all(f.closed for f in seen)


def test_without_as_file_read_receives_the_url_unchanged(http_files, npy_files):
    urls = _http(http_files, npy_files)
    got = []
    data = lazyseq.chunks(urls, lambda p: got.append(p) or [p], lengths=[1] * len(urls))
    assert data[1] == urls[1] and got == [urls[1]]
    with pytest.raises(ValueError, match="as_file=True"):
        lazyseq.chunks(urls, np.load, timeout=5)


# -- the file ------------------------------------------------------------------------------------------
def test_the_file_is_closed_after_read_and_when_read_raises(http_files, npy_files):
    urls = _http(http_files, npy_files)
    files = []

    def fails(f):
        files.append(f)
        f.read(10)
        raise RuntimeError("bad chunk")

    data = lazyseq.chunks(urls, fails, as_file=True, lengths=LENGTHS)
    with pytest.raises(lazyseq.EvaluationError) as e:
        data[0]
    assert isinstance(e.value.__cause__, RuntimeError) and "part-0.npy" in str(e.value.__cause__.__notes__)
    assert len(files) == 1 and files[0].closed
    with pytest.raises(ValueError, match="closed"):
        files[0].read(1)


def test_one_chunk_costs_one_head_and_one_get(http_files, npy_files):
    urls = _http(http_files, npy_files)
    data = lazyseq.chunks(urls, np.load, as_file=True, lengths=LENGTHS, block_cache=0)
    http_files.reset_counts()
    assert (data[len(data) - 1] == np.arange(2**18 - 64, 2**18)).all()  # the 1 MiB file
    assert len(_gets(http_files)) == 1 and len(http_files.requests) == 2


def test_seeks_and_read_ahead(http_files, tmp_path):
    blob = np.random.default_rng(1).integers(0, 256, 3 * MAX_WINDOW // 2, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    (url,) = _http(http_files, [str(tmp_path / "blob")])
    http_files.reset_counts()
    with open_file(url, block_cache=0) as f:
        assert f.name == url and f.seekable() and f.read(5) == blob[:5]
        assert f.seek(-7, io.SEEK_END) == len(blob) - 7 and f.read() == blob[-7:] and f.read(3) == b""
        f.seek(100)
        assert f.read(WINDOW) == blob[100 : 100 + WINDOW] and f.tell() == 100 + WINDOW
        assert f.read() == blob[100 + WINDOW :]  # the rest at once, in concurrent parts
        with pytest.raises(ValueError):
            f.seek(-1)
        with pytest.raises(io.UnsupportedOperation):
            f.fileno()
    assert len(_gets(http_files)) < 20


def test_failures_are_retried(http_files, npy_files):
    urls = _http(http_files, npy_files)
    data = lazyseq.chunks(urls, np.load, as_file=True, lengths=LENGTHS, block_cache=0)
    http_files.fail_next(2, status=503)
    assert (data[0] == np.load(npy_files[0])[0]).all()
    http_files.drop_next(1)  # a connection lost mid-transfer
    assert (data[SIZES[0]] == np.load(npy_files[1])[0]).all()


def test_persistent_failure_names_the_url_not_its_secrets(http_files, npy_files):
    urls = [u.replace("http://", "http://me:hunter2@") + "?sig=topsecret" for u in _http(http_files, npy_files)]
    data = lazyseq.chunks(urls, np.load, as_file=True, lengths=LENGTHS, timeout=1.0)
    http_files.fail_next(10**6, status=503)
    with pytest.raises(lazyseq.EvaluationError) as e:
        data[0]
    cause = e.value.__cause__
    text = str(e.value) + str(cause) + repr(cause) + "".join(getattr(cause, "__notes__", []))
    assert isinstance(cause, lazyseq.RemoteReadError) and "part-0.npy" in text
    assert "hunter2" not in text and "topsecret" not in text
    assert "topsecret" not in repr(lazyseq.fingerprint(data))


def test_cache_dir_keeps_whole_files(http_files, npy_files, tmp_path):
    urls = _http(http_files, npy_files)
    first = lazyseq.chunks(urls, np.load, as_file=True, cache_dir=tmp_path / "cache")
    _equal(first, lazyseq.chunks(npy_files, np.load))
    http_files.reset_counts()
    again = lazyseq.chunks(urls, np.load, as_file=True, cache_dir=tmp_path / "cache", cache=1)
    _equal(again, first)
    assert _gets(http_files) == []  # HEADs only: the files came from disk


def test_pickles_light_and_reads_in_process_workers(http_files, npy_files):
    urls = _http(http_files, npy_files)
    data = lazyseq.chunks(urls, np.load, as_file=True, lengths=LENGTHS, timeout=10)
    data[0]
    assert len(pickle.dumps(data)) < 2000
    copy = pickle.loads(pickle.dumps(data))
    assert copy.held() == [] and copy.settings == {"timeout": 10}
    with lazyseq.prefetch(data, nworkers=2, method="process") as p:
        got = list(p[250:350])
    assert all((x == y).all() for x, y in zip(got, lazyseq.chunks(npy_files, np.load)[250:350]))
