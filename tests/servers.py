"""Real local servers for the object-storage tests (issue #25): the clients under test (fsspec's
HTTPFileSystem, s3fs) talk to them over real sockets, so nothing of lazyseq's calls is mocked.

- :class:`RangeServer`: files of a directory over HTTP/1.1 (keep-alive, ranged GET, HEAD, latency): the
  package's :class:`lazyseq.files.httpserver.RangeServer`, with knobs that inject error statuses,
  connections dropped mid-body, stalls, bodies trickled byte by byte, wrong ``Content-Range`` answers,
  redirects, and a server without ETags; it honours ``If-Match`` as an object store does (412), and
  records each request's headers.
- :class:`S3Server`: moto's S3 in server mode (the WSGI app of ``moto.server.ThreadedMotoServer``).

Both bind 127.0.0.1 on a free port, run in daemon threads, and on ``close()`` shut down the listener,
close the connections still open (clients keep them alive in their pools) and join every thread they
started, so a test leaves no thread behind (the ``no_leaks`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

import email.utils
import os
import socket
import struct
import threading
import uuid
from typing import Any, BinaryIO

from lazyseq.files import httpserver
from lazyseq.files.httpserver import POLL as _POLL
from lazyseq.files.httpserver import Connections as _Connections
from lazyseq.files.httpserver import RangeHandler, Request

__all__ = ["RangeServer", "Request", "S3Server"]


class _FaultyHandler(RangeHandler):
    """The package's handler, with the faults :meth:`RangeServer._on_request` picked for the request in progress."""

    fault: tuple[int, bool, bool] = (0, False, False)  # status to fail with or 0, drop mid-body, with an RST
    trickle: float = 0.0  # seconds between the bytes of this answer's body (0: sent at once)
    misrange: bool = False  # answer a ranged GET with as many bytes from the file's start (their Content-Range says so)

    def send_header(self, keyword: str, value: str) -> None:
        if keyword == "ETag" and not self.server.owner.etags:  # type: ignore[attr-defined]
            return  # a server that gives Last-Modified only
        super().send_header(keyword, value)

    def _send_file(self, f: BinaryIO, rng: str | None, body: bool) -> None:
        """As the package's, but ``If-Match`` is honoured (412 unless it names the file's ETag, or is ``*``) and
        a ``misrange`` answer is the same number of bytes from the file's start, said so in its Content-Range."""
        owner = self.server.owner  # type: ignore[attr-defined]
        st = os.fstat(f.fileno())
        want = self.headers.get("If-Match")
        if want is not None and owner.if_match and want.strip() != "*" and want.strip() != owner.etag_of(st):
            return self.send(412, {"Content-Type": "text/plain"}, b"412 Precondition Failed\n", body)
        span = httpserver.parse_range(rng, st.st_size)
        if self.misrange and isinstance(span, tuple) and span[0] > 0:
            n = span[1] - span[0] + 1
            meta = {"Content-Range": f"bytes 0-{n - 1}/{st.st_size}", "Content-Length": str(n), "ETag": owner.etag_of(st),
                    "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
            self.send(206, meta, body=False)
            return self.write_body(f, n) if body else None
        return super()._send_file(f, rng, body)

    def answer_first(self, req: Request, body: bool) -> bool:
        status = self.fault[0]
        if status:
            self.send(status, {"Content-Type": "text/plain"}, f"injected {status}\n".encode(), body)
            return True
        target = self.server.owner._redirect_for(self.path)  # type: ignore[attr-defined]
        if target is not None:
            self.send(target[1], {"Location": target[0]}, body=body)
            return True
        return False

    def write_body(self, f: BinaryIO, n: int) -> None:
        _, drop, reset = self.fault
        if self.trickle:  # one byte, then a wait: the connection never goes quiet for as long as a socket timeout
            closing = self.server.owner._closing  # type: ignore[attr-defined]
            for _ in range(n):
                self.wfile.write(f.read(1))
                self.wfile.flush()
                if closing.wait(self.trickle):
                    self.close_connection = True
                    return
            return None
        if not drop:
            return super().write_body(f, n)
        self.wfile.write(f.read(n // 2))  # half the body, then the connection goes: a transfer cut short
        self.wfile.flush()
        if reset:  # SO_LINGER 0: close() sends RST rather than FIN (closing rfile first lets close() be real)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class RangeServer(httpserver.RangeServer):
    """:class:`lazyseq.files.httpserver.RangeServer` (files of ``root`` over HTTP/1.1: ranged GET, HEAD, ETag,
    latency, paths confined to ``root``, ``listing``) with knobs that inject faults; they may be set from the
    test thread while requests are being served."""

    handler = _FaultyHandler

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0, listing: bool = False) -> None:
        self._fail: list[tuple[int, int]] = []  # [remaining, status]
        self._drop = [0, False]  # remaining, reset
        self._hang = [0, 0.0]  # remaining, seconds
        self._trickle = [0, 0.0]  # remaining, seconds between bytes
        self._misrange = 0  # remaining
        self._redirects: dict[str, tuple[str, int]] = {}
        self.etags = True  # False: answers carry Last-Modified but no ETag
        self.if_match = True  # False: If-Match is ignored (as the package's server, and many static servers, do)
        self.headers: list[dict[str, str]] = []  # each request's headers, in arrival order (reset_counts clears them)
        super().__init__(root, latency=latency, listing=listing)

    def trickle_next(self, n: int, every: float) -> None:
        """The next ``n`` GETs of a file send their body one byte every ``every`` seconds: a server that never
        goes quiet for a socket timeout, yet never finishes in time."""
        with self._lock:
            self._trickle = [n, every]

    def misrange_next(self, n: int = 1) -> None:
        """The next ``n`` ranged GETs that do not start at 0 get 206 with as many bytes from the file's start, and
        a Content-Range that says so (``bytes 0-...``): a server or proxy that answers another range than asked."""
        with self._lock:
            self._misrange = n

    def reset_counts(self) -> None:
        with self._lock:
            self._requests.clear()
            self.headers.clear()

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

    def _on_request(self, req: Request, handler: httpserver.RangeHandler) -> float:
        """Records a request and picks its faults (the handler's ``fault``); the seconds it stalls."""
        with self._lock:
            self._requests.append(req)
            self.headers.append(dict(handler.headers.items()))
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
            handler.fault = (int(fail), drop, reset)  # type: ignore[attr-defined]
            handler.trickle = handler.misrange = 0  # type: ignore[attr-defined]
            if req.method == "GET" and self._trickle[0] > 0 and not fail:
                self._trickle[0] -= 1
                handler.trickle = self._trickle[1]  # type: ignore[attr-defined]
            if req.method == "GET" and req.range and not req.range.startswith("bytes=0-") and self._misrange > 0 and not fail:
                self._misrange -= 1
                handler.misrange = True  # type: ignore[attr-defined]
            return stall

    def _redirect_for(self, path: str) -> tuple[str, int] | None:
        with self._lock:
            for prefix, (to, status) in self._redirects.items():
                if path.startswith(prefix):
                    return to + path[len(prefix):], status
        return None


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
