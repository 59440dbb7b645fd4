import os
import signal
import threading

import numpy as np
import pytest

import lazyseq

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
        extra_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        children = multiprocessing.active_children()
        extra_shm = _shm_entries() - shm
        if not (extra_threads or children or extra_shm) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra_threads, f"threads left running: {extra_threads}"
    assert not children, f"child processes left running: {children}"
    assert not extra_shm, f"/dev/shm entries left: {extra_shm}"
