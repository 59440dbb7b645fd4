"""``python -m lazyseq.files.httpserver DIR`` as a process, as scripts start it: with its standard input
closed, at its end or /dev/null (``&`` in a script, ``< /dev/null``) it serves until SIGINT or SIGTERM and
exits with status 0 on either; ``--port`` and ``--host`` choose where it listens; ``--help`` says how it
stops. Each test kills the process it started, whatever happens."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lazyseq.files.httpserver import serve

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and /bin/sh")

ROOT = Path(__file__).resolve().parents[1]
DATA = bytes(range(256)) * 8
TIMEOUT = 20  # seconds any wait here may take


class Server:
    """The server process over ``root`` with ``args``; its output lines arrive on :attr:`lines`."""

    def __init__(self, root: Path, *args: str, stdin: str = "devnull") -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "lazyseq.files.httpserver", str(root), *args]
        if stdin == "closed":  # no file descriptor 0 at all
            cmd = ["/bin/sh", "-c", 'exec "$0" "$@" <&-', *cmd]
        pipe = {"devnull": subprocess.DEVNULL, "closed": None, "pipe": subprocess.PIPE}.get(stdin, stdin)
        self.proc = subprocess.Popen(cmd, stdin=pipe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # the end of its output

    def line(self) -> str | None:
        """Its next output line (None: its output ended)."""
        return self.lines.get(timeout=TIMEOUT)

    def stop(self, sig: int) -> int:
        """Sends ``sig``; its exit status."""
        self.proc.send_signal(sig)
        return self.proc.wait(TIMEOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "a.bin").write_bytes(DATA)
    return tmp_path


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url + "/a.bin", timeout=TIMEOUT) as r:
        return r.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stdin", ["devnull", "closed"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serves_without_standard_input_until_a_signal_then_exits_0(root, stdin, sig):
    server = Server(root, stdin=stdin)
    try:
        url = server.line()
        assert url is not None and url.startswith("http://127.0.0.1:"), url
        time.sleep(1.0)  # it used to exit at once: at the end of its input
        assert server.proc.poll() is None, "the server exited with no signal sent"
        assert fetch(url) == DATA
        assert server.stop(sig) == 0
        assert server.proc.stderr is not None and server.proc.stderr.read() == ""  # no traceback
        server._reader.join(TIMEOUT)
        assert server.line() is None  # nothing printed after the URL: no line was read
    finally:
        server.kill()


def test_lines_on_a_pipe_are_answered_and_its_end_does_not_stop_it(root):
    """The bench's protocol: a line in, the number of requests served out; closing the pipe changes nothing."""
    server = Server(root, stdin="pipe")
    try:
        url = server.line()
        assert url is not None
        assert fetch(url) == DATA
        assert server.proc.stdin is not None
        server.proc.stdin.write("\n")
        server.proc.stdin.flush()
        assert server.line() == "1"
        server.proc.stdin.close()
        time.sleep(0.5)
        assert server.proc.poll() is None and fetch(url) == DATA
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.kill()


def test_a_terminal_is_not_read(root):
    """A background job that reads its terminal is stopped (SIGTTIN): the server never reads one."""
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    try:
        server = Server(root, stdin=slave)
        try:
            url = server.line()
            assert url is not None
            os.write(master, b"\n")
            time.sleep(0.5)
            assert fetch(url) == DATA
            assert server.stop(signal.SIGTERM) == 0
            server._reader.join(TIMEOUT)
            assert server.line() is None  # the line typed was not answered
        finally:
            server.kill()
    finally:
        os.close(master)
        os.close(slave)


def test_port_is_honoured(root):
    port = free_port()
    server = Server(root, "--port", str(port))
    try:
        assert server.line() == f"http://127.0.0.1:{port}"
        assert fetch(f"http://127.0.0.1:{port}") == DATA
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.kill()


def test_a_port_taken_is_an_error_naming_it(root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(root, "--port", str(port))
        try:
            assert server.proc.wait(TIMEOUT) == 2
            assert server.line() is None
            assert server.proc.stderr is not None
            err = server.proc.stderr.read()
            assert f"cannot listen on 127.0.0.1 port {port}" in err and "--port" in err, err
        finally:
            server.kill()


def test_host_is_honoured(root):
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        pytest.skip("127.0.0.2 is not a loopback address here")
    server = Server(root, "--host", "127.0.0.2")
    try:
        url = server.line()
        assert url is not None and url.startswith("http://127.0.0.2:"), url
        assert fetch(url) == DATA
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(urllib.error.URLError):  # not listening on 127.0.0.1
            fetch(f"http://127.0.0.1:{port}")
        assert server.stop(signal.SIGINT) == 0
    finally:
        server.kill()


def test_help_says_how_it_stops():
    r = subprocess.run([sys.executable, "-m", "lazyseq.files.httpserver", "--help"], capture_output=True, text=True,
                       timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0
    text = " ".join(r.stdout.split())  # argparse wraps lines
    assert "until it gets SIGINT (Ctrl-C) or SIGTERM" in text and "--port" in text and "--host" in text, text


def test_serve_listens_on_an_ipv6_address(root):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with serve(root, host="::1") as server:
        assert server.url == f"http://[::1]:{server.port}"
        assert fetch(server.url) == DATA
