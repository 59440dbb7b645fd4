"""Real local servers for the object-storage tests (issue #25): the clients under test (fsspec's
HTTPFileSystem, s3fs) talk to them over real sockets, so nothing of lazyseq's calls is mocked.

- :class:`RangeServer`: files of a directory over HTTP/1.1 (keep-alive, ranged GET, HEAD), with knobs
  that inject latency, error statuses, connections dropped mid-body, stalls and redirects.
- :class:`S3Server`: moto's S3 in server mode (the WSGI app of ``moto.server.ThreadedMotoServer``).

Both bind 127.0.0.1 on a free port, run in daemon threads, and on ``close()`` shut down the listener,
close the connections still open (clients keep them alive in their pools) and join every thread they
started, so a test leaves no thread behind (the ``no_leaks`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import email.utils
import hashlib
import html
import os
import re
import socket
import socketserver
import struct
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, unquote, urlsplit

__all__ = ["RangeServer", "Request", "S3Server"]

_POLL = 0.05  # seconds between serve_forever's checks for shutdown(): close() takes that long, not its 0.5 s default


class _Connections(socketserver.ThreadingMixIn):
    """A threading server that remembers each open connection and its thread, so that ``drop_all``
    can close them: a keep-alive connection otherwise holds its thread in ``recv`` until the client
    closes it, which outlives the test."""

    daemon_threads = True
    thread_name = "server-conn"  # the connection threads' name, followed by the port

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: dict[threading.Thread, socket.socket] = {}
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name=f"{self.thread_name}:{self.server_address[1]}", daemon=True)
        with self._open_lock:
            self._open[t] = request
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(threading.current_thread(), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that goes away mid-answer is no error here
            super().handle_error(request, client_address)

    def drop_all(self, timeout: float = 5.0) -> None:
        """Closes every open connection (the client sees EOF) and joins the threads serving them."""
        with self._open_lock:
            conns = list(self._open.items())
        for _, sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler
        for t, _ in conns:
            t.join(timeout)


class Request(NamedTuple):
    """One request a :class:`RangeServer` saw: its method, its path (with the query) and its Range header."""

    method: str
    path: str
    range: str | None


class _HTTPServer(_Connections, ThreadingHTTPServer):
    thread_name = "RangeServer-conn"
    owner: RangeServer


def _parse_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """The inclusive span a single ``bytes=`` range asks for; None: no usable Range (answer the whole file:
    RFC 9110 has a server ignore a Range it does not understand, multiple ranges included); False: unsatisfiable."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or not any(m.groups()) or (m[1] and m[2] and int(m[2]) < int(m[1])):
        return None
    if not m[1]:  # a suffix: the last n bytes
        return (max(size - int(m[2]), 0), size - 1) if int(m[2]) and size else False
    a = int(m[1])
    return (a, min(int(m[2] or size - 1), size - 1)) if a < size else False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a test's output stays clean; RangeServer.requests records what came in

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _send(self, status: int, headers: dict[str, str], payload: bytes = b"", body: bool = True) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)

    def _answer(self, body: bool) -> None:
        owner = self.server.owner
        rng = self.headers.get("Range")
        fail, drop, reset, stall = owner._on_request(Request(self.command, self.path, rng))
        if stall and owner._closing.wait(stall):
            self.close_connection = True  # closing: no answer
            return
        if fail:
            return self._send(fail, {"Content-Type": "text/plain"}, f"injected {fail}\n".encode(), body)
        url_path = urlsplit(self.path).path
        target = owner._redirect_for(self.path)
        if target is not None:
            return self._send(target[1], {"Location": target[0]}, body=body)
        path = owner._resolve(unquote(url_path))
        if isinstance(path, int):
            return self._send(path, {"Content-Type": "text/plain"}, f"{path}\n".encode(), body)
        if path.is_dir():
            if not owner.listing:
                return self._send(404, {"Content-Type": "text/plain"}, b"404\n", body)
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
            page = "".join(f'<a href="{quote(n)}">{html.escape(n)}</a>\n' for n in names).encode()
            return self._send(200, {"Content-Type": "text/html"}, page, body)
        try:
            f = open(path, "rb")  # closed by the with below
        except OSError:  # removed since _resolve looked: a test rewriting its files
            return self._send(404, {"Content-Type": "text/plain"}, b"404\n", body)
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size
            span = _parse_range(rng, size)
            meta = {"Accept-Ranges": "bytes", "ETag": RangeServer.etag_of(st), "Content-Type": "application/octet-stream",
                    "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
            if span is False:
                return self._send(416, {**meta, "Content-Range": f"bytes */{size}"}, body=body)
            a, b = span or (0, size - 1)
            status, n = (206, b - a + 1) if span else (200, size)
            if span:
                meta["Content-Range"] = f"bytes {a}-{b}/{size}"
            self._send(status, {**meta, "Content-Length": str(n)}, body=False)
            if not body:
                return
            f.seek(a)
            if drop:  # half the body, then the connection goes: a transfer cut short
                self.wfile.write(f.read(n // 2))
                self.wfile.flush()
                if reset:  # SO_LINGER 0: close() sends RST rather than FIN (closing rfile first lets close() be real)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.rfile.close()
                    self.connection.close()
                else:
                    self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            while n > 0:
                chunk = f.read(min(n, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                n -= len(chunk)


class RangeServer:
    """Serves the files under ``root`` (read-only) at :attr:`url`, as an object store's HTTP endpoint does.

    ``GET`` answers a single ``Range: bytes=a-b`` / ``a-`` / ``-n`` with 206 and ``Content-Range`` (416 when
    unsatisfiable), anything else with the whole file (200); ``HEAD`` gives the same headers: Content-Length,
    ``ETag`` (changes with the file's size or mtime), ``Accept-Ranges: bytes``, ``Last-Modified``. Paths with
    ``..``, absolute paths and symlinks leading out of ``root`` get 403; missing files and directories 404
    (an HTML index of ``<a href>`` links when ``listing`` is true, as fsspec's HTTP ``ls`` reads).

    The knobs below may be set from the test thread while requests are being served."""

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0, listing: bool = False) -> None:
        self.root = Path(root).resolve()
        self.listing = listing  # directories answer an HTML index of their files rather than 404
        self._lock = threading.Lock()
        self._latency = latency
        self._fail: list[tuple[int, int]] = []  # [remaining, status]
        self._drop = [0, False]  # remaining, reset
        self._hang = [0, 0.0]  # remaining, seconds
        self._redirects: dict[str, tuple[str, int]] = {}
        self._requests: list[Request] = []
        self._closing = threading.Event()  # cuts short the stalls and latencies of requests in flight on close()
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(_POLL,), name=f"RangeServer:{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash): a file ``root/a/b`` is ``f"{url}/a/b"``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def latency(self) -> float:
        """Seconds each request waits before it is answered: a far-away store."""
        with self._lock:
            return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latency = seconds

    def fail_next(self, n: int = 1, status: int = 503) -> None:
        """The next ``n`` requests (any method) get ``status`` with a short text body: a throttling or failing store."""
        with self._lock:
            self._fail.append((n, status))

    def drop_next(self, n: int = 1, *, reset: bool = False) -> None:
        """The next ``n`` GETs of a file send their headers and half their body, then the connection is closed
        (FIN; with ``reset`` an RST): a connection lost mid-transfer."""
        with self._lock:
            self._drop = [n, reset]

    def hang_next(self, n: int, seconds: float) -> None:
        """The next ``n`` requests stall ``seconds`` before being answered (normally): a client's timeout fires."""
        with self._lock:
            self._hang = [n, seconds]

    def redirect(self, path_prefix: str, to_url: str | None, status: int = 302) -> None:
        """Requests whose path starts with ``path_prefix`` get ``status`` with ``Location: to_url + rest``, where
        rest is what follows the prefix in the path (and query); ``to_url=None`` removes the redirect."""
        with self._lock:
            if to_url is None:
                self._redirects.pop(path_prefix, None)
            else:
                self._redirects[path_prefix] = (to_url, status)

    @property
    def requests(self) -> list[Request]:
        """The requests seen since the start or the last :meth:`reset_counts`, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def reset_counts(self) -> None:
        with self._lock:
            self._requests.clear()

    @staticmethod
    def etag_of(st: os.stat_result) -> str:
        """The ETag the server gives a file of this stat: a quoted hash of its size and mtime_ns."""
        return '"' + hashlib.sha1(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()[:20] + '"'

    def _on_request(self, req: Request) -> tuple[int, bool, bool, float]:
        """Records a request; the injections it gets: (status to fail with or 0, drop, reset, seconds to stall)."""
        with self._lock:
            self._requests.append(req)
            fail = drop = reset = False
            stall = self._latency
            if self._hang[0] > 0:
                self._hang[0] -= 1
                stall += self._hang[1]
            if self._fail:
                n, fail = self._fail[0]
                self._fail[0:1] = [(n - 1, fail)] if n > 1 else []
            elif req.method == "GET" and self._drop[0] > 0:
                self._drop[0] -= 1
                drop, reset = True, bool(self._drop[1])
            return int(fail), drop, reset, stall

    def _redirect_for(self, path: str) -> tuple[str, int] | None:
        with self._lock:
            for prefix, (to, status) in self._redirects.items():
                if path.startswith(prefix):
                    return to + path[len(prefix):], status
        return None

    def _resolve(self, url_path: str) -> Path | int:
        """The file a URL path names under root, or the status that refuses it (403 outside root, 404 missing)."""
        rel = url_path[1:] if url_path.startswith("/") else url_path
        if rel.startswith("/") or "\\" in rel or "\0" in rel or ".." in rel.split("/"):
            return 403
        path = (self.root / rel).resolve()
        if path != self.root and self.root not in path.parents:
            return 403  # a symlink leading out of root
        return path if path.exists() else 404

    def close(self) -> None:
        """Stops serving, closes the open connections and joins every thread the server started."""
        self._closing.set()
        self._httpd.shutdown()
        self._thread.join()
        self._httpd.drop_all()
        self._httpd.server_close()

    def __enter__(self) -> RangeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class S3Server:
    """moto's S3 in server mode at :attr:`endpoint_url`: a real HTTP endpoint that s3fs and boto3 talk to.

    It runs the WSGI app of ``moto.server.ThreadedMotoServer`` in werkzeug's threaded server, as that class
    does, but on a server that keeps track of its connections: ``ThreadedMotoServer.stop()`` leaves the
    keep-alive connections (and their threads) open. moto keeps its buckets in process-wide state, so each
    test makes its own bucket (:meth:`make_bucket`) and removes it (:meth:`remove_bucket`)."""

    key = secret = "testing"  # moto accepts any credentials
    region = "us-east-1"
    bucket: str | None = None  # the bucket of the test in progress, which the ``s3`` fixture of conftest.py sets

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import ThreadedWSGIServer

        class Quiet(MotoRequestHandler):
            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                pass  # werkzeug would log each request on stderr

        class Server(_Connections, ThreadedWSGIServer):
            thread_name = "S3Server-conn"

        self._httpd = Server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), Quiet)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(_POLL,), name=f"S3Server:{self.port}",
                                        daemon=True)
        self._thread.start()
        self._client: Any = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``"""
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``s3fs.S3FileSystem(**storage_options)`` (or fsspec's ``storage_options=``) needs to reach this server."""
        return {"key": self.key, "secret": self.secret, "anon": False,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region}}

    @property
    def client(self) -> Any:
        """A boto3 S3 client of this server, for a test's setup and checks (made on first use: boto3 is slow to start)."""
        if self._client is None:
            import boto3

            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint_url, region_name=self.region,
                aws_access_key_id=self.key, aws_secret_access_key=self.secret)
        return self._client

    def make_bucket(self, name: str | None = None) -> str:
        """Creates a bucket (a fresh name when ``name`` is None); its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self.client.create_bucket(Bucket=name)
        return name

    def remove_bucket(self, name: str) -> None:
        """Deletes the bucket's objects, its unfinished multipart uploads, then the bucket."""
        c = self.client
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=name):
            if page.get("Contents"):
                c.delete_objects(Bucket=name, Delete={"Objects": [{"Key": o["Key"]} for o in page["Contents"]]})
        for up in c.list_multipart_uploads(Bucket=name).get("Uploads", []):
            c.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
        c.delete_bucket(Bucket=name)

    def drop_connections(self) -> None:
        """Closes the connections clients keep open and joins their threads (the server goes on serving):
        the end of a test, when the server outlives it."""
        self._httpd.drop_all()

    def close(self) -> None:
        """Stops the server, closes its connections and joins its threads."""
        if self._client is not None:
            self._client.close()
        self._httpd.shutdown()  # werkzeug's serve_forever closes the listening socket as it returns
        self._thread.join()
        self._httpd.drop_all()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
