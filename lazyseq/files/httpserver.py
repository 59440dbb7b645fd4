"""A small local HTTP server of a directory's files, with Range requests and an optional latency:
a small local server for notebooks, benchmarks and tests, **not for production** (no TLS, no
authentication, one thread per connection; it listens on 127.0.0.1 unless told another address).

It answers as an object store's HTTP endpoint does, so that :func:`lazyseq.load` (through fsspec)
reads a saved store from it by byte ranges: ``GET`` with a single ``Range: bytes=a-b`` / ``a-`` /
``-n`` gets 206 and ``Content-Range`` (416 when unsatisfiable), anything else the whole file (200);
``HEAD`` gives the same headers (``Content-Length``, ``ETag``, ``Accept-Ranges: bytes``,
``Last-Modified``). Connections are kept alive (HTTP/1.1), as a client's pool expects. Paths with
``..``, absolute paths and symlinks leading out of the directory get 403, missing files 404. A file
is opened once, never through a link and never waiting (``O_NOFOLLOW | O_NONBLOCK``), and judged
by its descriptor: anything but a regular file (a FIFO, a device, a socket) gets 403, as does a
descriptor that leads out of the directory.
``latency`` seconds pass before each answer: a far-away store on one machine.

``close()`` (or leaving the ``with`` block) stops the listener, closes the connections clients keep
open and joins every thread the server started: nothing is left running.

``python -m lazyseq.files.httpserver DIR [--latency SECONDS] [--host ADDRESS] [--port PORT]`` serves
DIR from a process of its own (a benchmark's server then takes none of the reader's CPU): it prints
its URL, then serves until SIGINT (Ctrl-C) or SIGTERM, and exits with status 0 on either. Its
standard input may be closed, at its end or ``/dev/null`` (``&`` in a script, ``< /dev/null``); when
it is a pipe or a file, each line read on it is answered with the number of requests served so far
(a terminal is not read: a background job reading it would be stopped).
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import html
import os
import re
import signal
import socket
import socketserver
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import quote, unquote, urlsplit

__all__ = ["serve", "RangeServer", "RangeHandler", "Request", "Connections", "main"]

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
POLL = 0.05  # seconds between serve_forever's checks for shutdown(): close() takes that long, not its 0.5 s default


def serve(directory: str | os.PathLike[str], latency: float = 0.0, *, host: str = "127.0.0.1",
          port: int = 0) -> RangeServer:
    """Serve the files under ``directory`` at ``server.url`` (``http://127.0.0.1:PORT``), each answer
    ``latency`` seconds late; use it in a ``with`` block, or call ``close()``. ``host``: the address to
    listen on (another than loopback exposes the files to the network, unauthenticated); ``port``: 0
    for a free one.

    >>> import pathlib, tempfile, urllib.request
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / 'a.bin').write_bytes(bytes(range(10)))
    >>> with serve(root, latency=0.01) as server:
    ...     ask = urllib.request.Request(server.url + '/a.bin', headers={'Range': 'bytes=2-4'})
    ...     with urllib.request.urlopen(ask) as r:
    ...         print(r.status, r.headers['Content-Range'], r.read())
    ...     print(server.requests)
    206 bytes 2-4/10 b'\\x02\\x03\\x04'
    [Request(method='GET', path='/a.bin', range='bytes=2-4')]
    """
    return RangeServer(directory, latency=latency, host=host, port=port)


class Connections(socketserver.ThreadingMixIn):
    """A threading server that remembers each open connection and its thread, so that :meth:`drop_all`
    can close them: a keep-alive connection otherwise holds its thread in ``recv`` until the client
    closes it, which may be never."""

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
            super().handle_error(request, client_address)  # type: ignore[misc]

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


class _HTTPServer(Connections, ThreadingHTTPServer):
    thread_name = "RangeServer-conn"
    # the listen backlog: socketserver's 5 overflows when a client opens dozens of connections at once
    # (32 prefetch threads), and each connection refused that way waits for a SYN retry (1 s)
    request_queue_size = 128
    owner: RangeServer

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET  # an IPv6 address: "::1"
        super().__init__(address, handler)


def parse_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """The inclusive span a single ``bytes=`` range asks for; None: no usable Range (answer the whole file:
    RFC 9110 has a server ignore a Range it does not understand, multiple ranges included); False: unsatisfiable.

    >>> parse_range('bytes=2-4', 10), parse_range('bytes=-3', 10), parse_range('bytes=10-', 10), parse_range('x', 10)
    ((2, 4), (7, 9), False, None)
    """
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or not any(m.groups()) or (m[1] and m[2] and int(m[2]) < int(m[1])):
        return None
    if not m[1]:  # a suffix: the last n bytes
        return (max(size - int(m[2]), 0), size - 1) if int(m[2]) and size else False
    a = int(m[1])
    return (a, min(int(m[2] or size - 1), size - 1)) if a < size else False


class RangeHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests for :class:`RangeServer`. Hooks for a subclass (tests/servers.py
    injects faults through them): :meth:`answer_first` and :meth:`write_body`."""

    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
    # TCP_NODELAY: the headers and the body go out as two writes; with Nagle's algorithm the body
    # waits for the client's delayed ACK of the headers (40 ms on Linux) on every answer
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: RangeServer.requests records what came in

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def send(self, status: int, headers: dict[str, str], payload: bytes = b"", body: bool = True) -> None:
        """An answer: ``status``, ``headers`` (Content-Length: ``payload``'s unless given), ``payload`` if ``body``."""
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)

    def answer_first(self, req: Request, body: bool) -> bool:
        """A hook: answer ``req`` before its file is looked up (true: answered). Here: never."""
        return False

    def write_body(self, f: BinaryIO, n: int) -> None:
        """A hook: send ``n`` bytes of ``f`` from where it stands (the headers are sent)."""
        while n > 0:
            chunk = f.read(min(n, 1 << 20))
            if not chunk:
                break
            self.wfile.write(chunk)
            n -= len(chunk)

    def _answer(self, body: bool) -> None:
        owner = self.server.owner
        req = Request(self.command, self.path, self.headers.get("Range"))
        stall = owner._on_request(req, self)
        if stall and owner._closing.wait(stall):
            self.close_connection = True  # closing: no answer
            return
        if self.answer_first(req, body):
            return
        path = owner._resolve(unquote(urlsplit(self.path).path))
        opened, status = (None, path) if isinstance(path, int) else owner._open(path)
        if opened is None:
            return self.send(status, {"Content-Type": "text/plain"}, f"{status}\n".encode(), body)
        if not stat.S_ISDIR(os.fstat(opened).st_mode):
            with os.fdopen(opened, "rb") as f:
                return self._send_file(f, req.range, body)
        try:
            if not owner.listing:
                return self.send(404, {"Content-Type": "text/plain"}, b"404\n", body)
            with os.scandir(opened if os.scandir in os.supports_fd else path) as found:
                names = sorted(e.name + ("/" if e.is_dir() else "") for e in found)
        finally:
            os.close(opened)
        page = "".join(f'<a href="{quote(n)}">{html.escape(n)}</a>\n' for n in names).encode()
        return self.send(200, {"Content-Type": "text/html"}, page, body)

    def _send_file(self, f: BinaryIO, rng: str | None, body: bool) -> None:
        st = os.fstat(f.fileno())
        size = st.st_size
        span = parse_range(rng, size)
        meta = {"Accept-Ranges": "bytes", "ETag": RangeServer.etag_of(st), "Content-Type": "application/octet-stream",
                "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
        if span is False:
            return self.send(416, {**meta, "Content-Range": f"bytes */{size}"}, body=body)
        a, b = span or (0, size - 1)
        status, n = (206, b - a + 1) if span else (200, size)
        if span:
            meta["Content-Range"] = f"bytes {a}-{b}/{size}"
        self.send(status, {**meta, "Content-Length": str(n)}, body=False)
        if body:
            f.seek(a)
            self.write_body(f, n)


class RangeServer:
    """Serves the files under ``root`` (read-only) at :attr:`url`; see the module's docstring and
    :func:`serve`. ``listing``: a directory answers an HTML index of ``<a href>`` links (as fsspec's
    HTTP ``ls`` reads) rather than 404. :attr:`latency` may be set while requests are served. ``host``
    and ``port``: where it listens (port 0: a free one); an address taken raises ``OSError``."""

    handler: type[RangeHandler] = RangeHandler  # a subclass's own handler (its hooks)

    def __init__(self, root: str | os.PathLike[str], *, latency: float = 0.0, listing: bool = False,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = Path(root).resolve()
        self.listing = listing
        self._lock = threading.Lock()
        self._latency = float(latency)
        self._requests: list[Request] = []
        self._closing = threading.Event()  # cuts short the latencies of requests in flight on close()
        self._httpd = _HTTPServer((host, port), self.handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(POLL,), name=f"RangeServer:{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (``http://127.0.0.1:PORT`` by default; no trailing slash): a file ``root/a/b`` is
        ``f"{url}/a/b"``. HOST is the address listened on (``[::1]`` for IPv6)."""
        host = self._httpd.server_address[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def latency(self) -> float:
        """Seconds each request waits before it is answered: a far-away store."""
        with self._lock:
            return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latency = float(seconds)

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

    def _on_request(self, req: Request, handler: RangeHandler) -> float:
        """A hook, called as each request arrives: records it; the seconds it waits before its answer."""
        with self._lock:
            self._requests.append(req)
            return self._latency

    def _resolve(self, url_path: str) -> Path | int:
        """The file a URL path names under root, or the status that refuses it (403 outside root, 404 missing)."""
        rel = url_path[1:] if url_path.startswith("/") else url_path
        if rel.startswith("/") or "\\" in rel or "\0" in rel or ".." in rel.split("/"):
            return 403
        path = (self.root / rel).resolve()
        if path != self.root and self.root not in path.parents:
            return 403  # a symlink leading out of root
        return path if path.exists() else 404

    def _open(self, path: Path) -> tuple[int | None, int]:
        """``(fd, 200)``: ``path`` (from :meth:`_resolve`) opened once, never through a link and never
        waiting (a FIFO), its descriptor checked: a regular file or a directory, still under root (a
        folder on the way swapped for a link meanwhile); else ``(None, status)`` (404 gone, 403)."""
        try:
            fd = os.open(path, _FLAGS)
        except FileNotFoundError:
            return None, 404
        except OSError:  # a link put in its place since _resolve looked, or unreadable
            return None, 403
        try:
            mode = os.fstat(fd).st_mode
            real = Path(os.readlink(f"/proc/self/fd/{fd}")) if os.path.isdir("/proc/self/fd") else self.root
        except OSError:
            real = None
        if (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and real is not None and (real == self.root
                                                                                or self.root in real.parents):
            return fd, 200
        os.close(fd)
        return None, 403

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

    def __repr__(self) -> str:
        return f"RangeServer({str(self.root)!r} at {self.url}, latency={self.latency:g} s)"


STOPS = "It serves until it gets SIGINT (Ctrl-C) or SIGTERM (kill PID), then exits with status 0."


_stopping = [False]


def _stop(signum: int, frame: Any) -> None:
    """SIGINT's and SIGTERM's handler in :func:`main`: both stop the server as Ctrl-C does (further ones are
    ignored while it closes). It sets no handler itself: ``signal.signal`` called in a handler can raise
    OSError ("ignored due to race condition") in place of the KeyboardInterrupt."""
    if _stopping[0]:
        return
    _stopping[0] = True
    raise KeyboardInterrupt


def _answer_lines(server: RangeServer) -> None:
    """Answers each line of standard input with the number of requests served so far, until its end; returns at
    once when it is closed or a terminal (a background job that reads its terminal is stopped, SIGTTIN)."""
    if sys.stdin is None or sys.stdin.closed or sys.stdin.isatty():
        return
    for _ in sys.stdin:
        print(len(server.requests), flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m lazyseq.files.httpserver DIR [--latency SECONDS] [--host ADDRESS] [--port PORT]``: see the
    module's docstring."""
    ap = argparse.ArgumentParser(
        prog="python -m lazyseq.files.httpserver", description="Serve DIR over HTTP with Range requests (for "
        "notebooks, benchmarks and tests: not for production). It prints its URL on the first line of its output. "
        + STOPS + " Standard input is not needed (& or < /dev/null are fine); when it is a pipe or a file, each line "
        "read on it is answered with the number of requests served so far.")
    ap.add_argument("directory", metavar="DIR")
    ap.add_argument("--latency", type=float, default=0.0, metavar="SECONDS", help="wait before each answer")
    ap.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="the address to listen on (default: "
                    "%(default)s; another one exposes DIR to the network, without authentication)")
    ap.add_argument("--port", type=int, default=0, help="the port to listen on (default: 0, a free one: the URL "
                    "printed says which)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.directory):
        ap.error(f"{args.directory} is not a directory")
    if not 0 <= args.port <= 65535:
        ap.error(f"--port {args.port} is not a port: give 1 to 65535, or 0 for a free one")
    before = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server = serve(args.directory, args.latency, host=args.host, port=args.port)
        except OSError as e:
            ap.error(f"cannot listen on {args.host} port {args.port}: {e.strerror or e}; give another --port "
                     "(0: a free one) or --host")
        with server:
            print(server.url, flush=True)
            _answer_lines(server)
            while True:
                # a signal's handler raises KeyboardInterrupt here; it runs when this thread wakes up, and
                # a signal the kernel gives to a server thread does not wake it: hence short sleeps
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
