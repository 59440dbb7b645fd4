import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest

import lazyseq

if TYPE_CHECKING:
    from tests.servers import RangeServer, S3Server

SOAK_EPOCHS, QUICK_EPOCHS = 200, 30  # epochs per loader in tests/test_soak.py: with --soak, without


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (long property runs)")
    parser.addoption("--soak", action="store_true",
                     help=f"tests/test_soak.py: run {SOAK_EPOCHS} epochs per loader (default {QUICK_EPOCHS})")


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: a leak test whose length --soak sets (the soak_epochs fixture)")
    config.addinivalue_line("markers", "slow: a long run of a property test, skipped unless --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def soak_epochs(request) -> int:
    """Epochs a soak test runs after its warm-up: 200 with --soak, 30 otherwise (CI included)."""
    return SOAK_EPOCHS if request.config.getoption("--soak") else QUICK_EPOCHS


@pytest.fixture
def sigint_default():
    """Ctrl-C (SIGINT) raises KeyboardInterrupt during the test, as in an interactive Python, however
    pytest was started: a process started in the background or with ``nohup`` inherits SIGINT ignored,
    and Python then leaves it ignored. Every test that sends SIGINT to itself uses this fixture; the
    previous handler is put back afterwards. (A child process inherits SIG_IGN too: a script a test
    interrupts installs ``signal.default_int_handler`` itself.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace["lazyseq"] = lazyseq
    doctest_namespace["np"] = np


def _shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if "lazyseq" in n or n.startswith(("psm_", "wnsm_"))}
    except FileNotFoundError:
        return set()


def _process_lifelong_threads() -> set[threading.Thread]:
    """Threads that live as long as the process by design, so that no test can end them: fsspec's IO loop
    thread, named "fsspecIO" (fsspec/asyn.py, get_loop(): the event loop that every async fsspec filesystem,
    s3fs and HTTP included, runs on; started on first use, never stopped, a documented process-wide
    singleton), and the worker threads of that loop's default executor (asyncio names them asyncio_N;
    aiobotocore runs its blocking steps there through asyncio.to_thread, and idle workers stay). They
    are picked by identity, fsspec's own ``iothread[0]`` and ``loop[0]``, not by name: a thread of the
    same name anywhere else is still a leak."""
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is None or asyn.iothread[0] is None:
        return set()
    executor = getattr(asyn.loop[0], "_default_executor", None)
    return {asyn.iothread[0], *getattr(executor, "_threads", ())}


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test leaves no extra thread, child process or shared-memory entry behind."""
    import multiprocessing

    threads, shm = set(threading.enumerate()), _shm_entries()
    yield
    lazyseq.seterr("wrap")
    import gc
    import time

    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        lifelong = _process_lifelong_threads()
        extra_threads = [t for t in threading.enumerate() if t not in threads and t not in lifelong and t.is_alive()]
        children = multiprocessing.active_children()
        extra_shm = _shm_entries() - shm
        if not (extra_threads or children or extra_shm) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra_threads, f"threads left running: {extra_threads}"
    assert not children, f"child processes left running: {children}"
    assert not extra_shm, f"/dev/shm entries left: {extra_shm}"


# The local servers of the object-storage tests (issue #25, tests/servers.py). Their teardown runs before
# no_leaks checks (a fixture a test requests is set up after the autouse no_leaks, so torn down before
# it); the session's S3 server is set up before no_leaks' snapshot (higher scope first), and the
# connections a test opened to it are closed, their threads joined, when the test ends.
@pytest.fixture
def http_files(tmp_path) -> Iterator["RangeServer"]:
    """A :class:`tests.servers.RangeServer` over a fresh empty directory, ``http_files.root``: the test
    writes its files there and reads them at ``f"{http_files.url}/{name}"``. Shut down, its threads
    joined, when the test ends."""
    from tests.servers import RangeServer

    root = tmp_path / "http_root"
    root.mkdir()
    with RangeServer(root) as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator["S3Server"]:
    """moto's S3 server (:class:`tests.servers.S3Server`), one for the session: it takes a second to start."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[s3], flask and flask-cors (the test extra)")
    from tests.servers import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3(s3_server) -> Iterator["S3Server"]:
    """The session's S3 server with a fresh, empty bucket for this test: ``s3.bucket`` (its name),
    ``s3.storage_options`` (what s3fs needs), ``s3.client`` (boto3). The bucket is removed and the
    test's connections closed when the test ends."""
    s3_server.bucket = s3_server.make_bucket()
    try:
        yield s3_server
    finally:
        s3_server.remove_bucket(s3_server.bucket)
        s3_server.bucket = None
        s3_server.drop_connections()


# pylance registers a fork hook at import (os.register_at_fork(before=...)) that warns "lance is not
# fork-safe" in the parent at every fork, for the rest of the process. Once a test has imported
# lance, every later test that starts process workers would see that warning, and the tests that
# check which warnings a prefetch or a DataLoader gives would fail for a reason of lance's. So the
# hook is silenced for the rest of the session as soon as lance is found imported (before each
# test); the Lance view's own tests run first and see it as users do.
_SILENT = (lambda: None).__code__


def pytest_runtest_setup(item):
    lance = sys.modules.get("lance")
    hook = getattr(lance, "__warn_on_fork", None) if lance is not None else None
    if hook is not None and getattr(hook, "__code__", None) is not _SILENT:
        hook.__code__ = _SILENT
