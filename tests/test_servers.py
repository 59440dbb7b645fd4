"""The local servers of the object-storage tests (tests/servers.py, issue #25) do what the tests built on
them assume: exact ranged bytes, the statuses and headers of an object store, each injected fault, and the
clients lazyseq uses (fsspec's HTTPFileSystem, s3fs) working against them. The fsspec tests also pin how
fsspec reports each fault (the exception types the retry logic tells apart)."""

import http.client
import os
import socket
import threading
import time

import pytest

from tests.servers import RangeServer

DATA = bytes(range(256)) * 40  # 10240 bytes, every offset's value known


def _get(server: RangeServer, path: str, method: str = "GET", headers: dict[str, str] | None = None,
         timeout: float = 10) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request on its own connection (http.client follows no redirect): status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


@pytest.fixture
def served(http_files: RangeServer) -> RangeServer:
    (http_files.root / "a.bin").write_bytes(DATA)
    return http_files


@pytest.mark.parametrize(("rng", "a", "b"), [("bytes=0-0", 0, 0), ("bytes=10-19", 10, 19), ("bytes=100-", 100, 10239),
                                             ("bytes=-7", 10233, 10239), ("bytes=-99999", 0, 10239),
                                             ("bytes=10000-99999", 10000, 10239)])
def test_ranged_get_gives_the_exact_bytes(served, rng, a, b):
    status, headers, body = _get(served, "/a.bin", headers={"Range": rng})
    assert (status, body) == (206, DATA[a:b + 1])
    assert headers["Content-Range"] == f"bytes {a}-{b}/{len(DATA)}"
    assert headers["Content-Length"] == str(b - a + 1)


def test_get_without_range_and_ranges_ignored(served):
    for headers in ({}, {"Range": "bytes=0-1,5-6"}, {"Range": "bytes=9-2"}, {"Range": "items=0-1"}):
        status, h, body = _get(served, "/a.bin", headers=headers)
        assert (status, body, h["Content-Length"], h["Accept-Ranges"]) == (200, DATA, str(len(DATA)), "bytes")


def test_unsatisfiable_ranges_get_416(served):
    (served.root / "empty").write_bytes(b"")
    cases = [("/a.bin", "bytes=10240-"), ("/a.bin", "bytes=20000-20001"), ("/a.bin", "bytes=-0"), ("/empty", "bytes=0-0")]
    for path, rng in cases:
        status, headers, body = _get(served, path, headers={"Range": rng})
        size = len(DATA) if path == "/a.bin" else 0
        assert (status, headers["Content-Range"], body) == (416, f"bytes */{size}", b"")


def test_head_gives_size_and_an_etag_that_changes_with_the_file(served):
    path = served.root / "a.bin"
    status, headers, body = _get(served, "/a.bin", "HEAD")
    assert (status, body, headers["Content-Length"], headers["Accept-Ranges"]) == (200, b"", str(len(DATA)), "bytes")
    etag = headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and headers["Last-Modified"].endswith("GMT")
    assert _get(served, "/a.bin")[1]["ETag"] == etag  # GET and HEAD agree
    path.write_bytes(DATA + b"x")  # a new size
    _, headers, _ = _get(served, "/a.bin", "HEAD")
    assert headers["Content-Length"] == str(len(DATA) + 1) and headers["ETag"] != etag
    etag = headers["ETag"]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # same size, another mtime
    assert _get(served, "/a.bin", "HEAD")[1]["ETag"] != etag


def test_keep_alive_serves_requests_on_one_connection(served):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        bodies, socks = [], []
        for rng in ("bytes=0-9", "bytes=20-29"):
            conn.request("GET", "/a.bin", headers={"Range": rng})
            bodies.append(conn.getresponse().read())
            socks.append(conn.sock)
        assert bodies == [DATA[0:10], DATA[20:30]] and socks[0] is socks[1] is not None
    finally:
        conn.close()


def test_paths_outside_the_root_are_refused(served, tmp_path):
    (tmp_path / "secret").write_bytes(b"secret")
    (served.root / "sub").mkdir()
    (served.root / "sub" / "b").write_bytes(b"b")
    os.symlink(tmp_path / "secret", served.root / "link")
    for path in ["/../secret", "/%2e%2e/secret", "/sub/../../secret", "/%2Fetc/passwd", "/sub%2F..%2F..%2Fsecret", "/link"]:
        assert _get(served, path)[0] == 403, path
    assert _get(served, "//etc/passwd")[0] == 404  # http.server makes a leading // one /: root/etc/passwd
    assert [_get(served, p)[0] for p in ("/missing", "/sub", "/sub/")] == [404, 404, 404]
    assert _get(served, "/sub/b")[2] == b"b"
    served.listing = True
    status, _, page = _get(served, "/")
    assert status == 200 and b'<a href="a.bin">' in page and b'<a href="sub/">' in page


def test_requests_are_recorded(served):
    _get(served, "/a.bin", headers={"Range": "bytes=1-2"})
    _get(served, "/a.bin?x=1", "HEAD")
    assert [tuple(r) for r in served.requests] == [("GET", "/a.bin", "bytes=1-2"), ("HEAD", "/a.bin?x=1", None)]
    served.reset_counts()
    assert served.requests == []


def test_latency_is_applied(served):
    served.latency = 0.2
    start = time.monotonic()
    assert _get(served, "/a.bin")[0] == 200
    assert time.monotonic() - start >= 0.2  # a lower bound: the sleep happened


def test_fail_next(served):
    served.fail_next(2)
    served.fail_next(1, status=500)
    assert [_get(served, "/a.bin", m)[0] for m in ("GET", "HEAD", "GET", "GET")] == [503, 503, 500, 200]


@pytest.mark.parametrize("reset", [False, True])
def test_drop_next_cuts_the_body_short(served, reset):
    served.drop_next(1, reset=reset)
    assert _get(served, "/a.bin", "HEAD")[0] == 200  # HEADs are not dropped
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        conn.request("GET", "/a.bin")
        r = conn.getresponse()
        assert (r.status, r.headers["Content-Length"]) == (200, str(len(DATA)))
        with pytest.raises((http.client.IncompleteRead, ConnectionResetError)) as e:
            r.read()
        if isinstance(e.value, http.client.IncompleteRead):
            assert e.value.partial == DATA[:len(DATA) // 2]
    finally:
        conn.close()
    assert _get(served, "/a.bin")[2] == DATA  # only the next one


def test_hang_next_stalls_and_close_cuts_it_short(served):
    served.hang_next(1, 0.3)
    start = time.monotonic()
    assert _get(served, "/a.bin")[0] == 200
    assert time.monotonic() - start >= 0.3
    served.hang_next(1, 60)
    with pytest.raises(TimeoutError):
        _get(served, "/a.bin", timeout=0.2)
    # the fixture's close() ends the 60 s stall: no_leaks finds no thread left


def test_redirect(served):
    served.redirect("/old/", f"{served.url}/")
    status, headers, _ = _get(served, "/old/a.bin?v=1")
    assert (status, headers["Location"]) == (302, f"{served.url}/a.bin?v=1")
    served.redirect("/old/", None)
    assert _get(served, "/old/a.bin")[0] == 404


def test_close_ends_kept_alive_connections(tmp_path):
    server = RangeServer(tmp_path)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    f = sock.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 404")
    while f.readline() != b"\r\n":  # the headers
        pass
    server.close()
    assert f.read() == b""  # the server closed it
    f.close()
    sock.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(f"RangeServer-conn:{server.port}")]


def test_fsspec_http_reads_ranges_and_info(served):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    url = f"{served.url}/a.bin"
    assert fs.cat_file(url, 5, 1000) == DATA[5:1000] and fs.cat_file(url) == DATA
    assert [tuple(r) for r in served.requests] == [("GET", "/a.bin", "bytes=5-999"), ("GET", "/a.bin", None)]
    served.reset_counts()
    info = fs.info(url)
    assert (info["size"], info["ETag"]) == (len(DATA), _get(served, "/a.bin", "HEAD")[1]["ETag"])
    assert served.requests[0].method == "HEAD"  # info() asks with HEAD first
    with fs.open(url, block_size=1000) as f:
        f.seek(5000)
        assert f.read(10) == DATA[5000:5010]


def test_fsspec_http_faults_and_their_exceptions(served):
    """What the retry logic sees: each fault's exception type from fsspec's HTTPFileSystem."""
    fsspec = pytest.importorskip("fsspec")
    aiohttp = pytest.importorskip("aiohttp")
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    url = f"{served.url}/a.bin"
    served.fail_next(1, 503)
    with pytest.raises(aiohttp.ClientResponseError) as e:
        fs.cat_file(url, 0, 10)
    assert e.value.status == 503
    served.drop_next(1)
    with pytest.raises(aiohttp.ClientPayloadError):
        fs.cat_file(url, 0, 1000)
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{served.url}/missing")
    served.fail_next(1, 503)  # info(): a failed HEAD is retried as a GET ...
    assert fs.info(url)["size"] == len(DATA)
    served.fail_next(2, 503)  # ... and when both fail, any failure reads as FileNotFoundError
    with pytest.raises(FileNotFoundError) as e:
        fs.info(url)
    assert isinstance(e.value.__cause__, aiohttp.ClientResponseError) and e.value.__cause__.status == 503
    slow = fsspec.filesystem("http", skip_instance_cache=True, client_kwargs={"timeout": aiohttp.ClientTimeout(sock_read=0.2)})
    served.hang_next(1, 60)
    with pytest.raises(fsspec.exceptions.FSTimeoutError):  # a subclass of TimeoutError
        slow.cat_file(url, 0, 10)
    served.redirect("/r/", f"{served.url}/")
    assert fs.cat_file(f"{served.url}/r/a.bin", 0, 10) == DATA[:10]  # followed by default
    # not followed: the 302 is no error (raise_for_status is for >= 400), its empty body reads as the data
    assert fs.cat_file(f"{served.url}/r/a.bin", 0, 10, allow_redirects=False) == b""
    assert fs.info(f"{served.url}/r/a.bin", allow_redirects=False)["size"] == 0


def test_s3fs_against_moto(s3):
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options)
    path = f"{s3.bucket}/dir/a.bin"
    assert fs.ls(s3.bucket) == []  # a fresh bucket
    fs.pipe(path, DATA)
    assert fs.cat_file(path, start=10, end=20) == DATA[10:20]  # keywords: the third positional is version_id
    with fs.open(path, block_size=1000) as f:
        f.seek(9000)
        assert f.read(100) == DATA[9000:9100]
    info = fs.info(path)
    assert (info["size"], info["ETag"]) == (len(DATA), s3.client.head_object(Bucket=s3.bucket, Key="dir/a.bin")["ETag"])
    fs.pipe(f"{s3.bucket}/b", b"b")
    assert fs.ls(s3.bucket, detail=False) == [f"{s3.bucket}/b", f"{s3.bucket}/dir"]
    assert fs.find(s3.bucket) == [f"{s3.bucket}/b", path]
    fs.rm(path)
    fs.invalidate_cache()
    assert not fs.exists(path) and fs.find(s3.bucket) == [f"{s3.bucket}/b"]
    with pytest.raises(FileNotFoundError):
        fs.cat_file(path)


def test_s3_storage_options_through_fsspec(s3):
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("s3fs")
    s3.client.put_object(Bucket=s3.bucket, Key="k", Body=b"hello")
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options)
    assert fs.ls(s3.bucket, detail=False) == [f"{s3.bucket}/k"]
    with fsspec.open(f"s3://{s3.bucket}/k", "rb", **s3.storage_options) as f:
        assert f.read() == b"hello"


def test_anything_but_a_regular_file_gets_403_without_waiting(served, tmp_path):
    """A FIFO in the root (or a link to one) is not opened for a read that waits for a writer (issue #31):
    403 at once, and the server goes on serving."""
    os.mkfifo(served.root / "fifo")
    os.symlink(served.root / "fifo", served.root / "to-fifo")
    out: dict = {}

    def ask():
        out["statuses"] = [_get(served, p, method=m, timeout=5)[0] for p in ("/fifo", "/to-fifo") for m in ("GET", "HEAD")]

    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # a server thread waits in open(): give it a writer, so that the test leaves none behind
        for _ in range(2):
            try:
                os.close(os.open(served.root / "fifo", os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
    assert out.get("statuses") == [403, 403, 403, 403]
    assert _get(served, "/a.bin")[2] == DATA
