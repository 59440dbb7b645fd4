"""Coroutines in a synchronous pipeline: ``async def`` item functions, run on a managed event loop.

A plain read of an ``smap`` whose function is async runs the coroutine on an event loop in a
background thread of lazyseq's and waits for it. That works from any thread, and inside a running
event loop too (a Jupyter cell), where ``asyncio.run`` refuses. The loop starts at the first such
read and stops when the last async function lazyseq holds is garbage (or at interpreter exit): no
thread outlives the views that need it. A worker thread of an async prefetch sets its own loop
(:func:`use_loop`), so its reads join that loop instead.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["is_async", "Blocking", "run", "use_loop", "gather"]

BULK = 64  # coroutines of one bulk read (a chunk of a prefetch, a batch) that run at once
_WAKE = 0.5  # seconds between looks at the loop's health while waiting for a coroutine


def is_async(f: Any) -> bool:
    """Whether calling ``f`` returns a coroutine: an ``async def`` function or method, a
    ``functools.partial`` of one, or an object whose ``__call__`` is ``async def``."""
    while isinstance(f, functools.partial):
        f = f.func
    if inspect.iscoroutinefunction(f):
        return True
    if inspect.isroutine(f) or isinstance(f, type):
        return False
    call = next((c.__dict__["__call__"] for c in type(f).__mro__ if "__call__" in c.__dict__), None)
    return inspect.iscoroutinefunction(call)


class _Managed:
    """The shared loop: started on demand, stopped when no holder is left."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def hold(self) -> None:
        with self.lock:
            self.holders += 1

    def release(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders <= 0:
                self.holders = 0
                self._stop()

    def get(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(target=serve, args=(self.loop,), name="lazyseq-async-loop", daemon=True)
                self.thread.start()
            return self.loop

    def _stop(self) -> None:  # under the lock
        loop, self.loop, self.thread = self.loop, None, None
        if loop is not None:
            try:
                loop.call_soon_threadsafe(loop.stop)  # the thread closes the loop and ends
            except RuntimeError:  # closed already
                pass

    def shutdown(self, grace: float = 1.0) -> None:
        with self.lock:
            thread = self.thread
            self._stop()
        if thread is not None and thread is not threading.current_thread():
            thread.join(grace)

    def after_fork(self) -> None:  # the loop's thread does not exist in a forked child
        self.lock, self.loop, self.thread = threading.Lock(), None, None


_managed = _Managed()
_local = threading.local()  # .loop: the loop of the async prefetch whose worker this thread is
atexit.register(_managed.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_managed.after_fork)


def serve(loop: asyncio.AbstractEventLoop, ready: Callable[[], None] | None = None) -> None:
    """Run ``loop`` in this thread until it is stopped; then cancel what is left and close it."""
    asyncio.set_event_loop(loop)
    try:
        if ready is not None:
            ready()
        loop.run_forever()
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        finally:
            loop.close()


def use_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Coroutines read by this thread run on ``loop`` (None: the shared one)."""
    _local.loop = loop


def run(coro: Coroutine) -> Any:
    """Run ``coro`` to completion on this thread's loop (the shared one by default) and return its
    result; from that loop's own thread (a plain read inside a coroutine of it), in a thread of
    its own, as that loop cannot wait for itself."""
    loop = getattr(_local, "loop", None)
    if loop is None:
        _managed.hold()  # the loop stays up while the read runs, whatever is collected meanwhile
        try:
            return _wait(coro, _managed.get())
        finally:
            _managed.release()
    return _wait(coro, loop)


def _wait(coro: Coroutine, loop: asyncio.AbstractEventLoop) -> Any:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # blocking the loop on itself would never end: a loop of its own, aside
        box: list = []
        t = threading.Thread(target=lambda: box.append(_outcome(coro)), name="lazyseq-async-aside", daemon=True)
        t.start()
        t.join()
        ok, value = box[0]
        if ok:
            return value
        raise value
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        while True:
            done, _ = concurrent.futures.wait([fut], timeout=_WAKE)
            if done:
                return fut.result()
            if loop.is_closed() or not loop.is_running():
                raise RuntimeError("lazyseq: the event loop running this item was stopped (its prefetch was closed)")
    except BaseException:
        fut.cancel()  # Ctrl-C, or the loop gone: the coroutine does not run on unobserved
        raise


async def gather(coros: list) -> list[tuple[bool, Any]]:
    """``(True, result)`` or ``(False, exception)`` for each of ``coros``, at most :data:`BULK`
    running at once; entries that are not coroutines come back as ``(False, entry)``."""
    sem = asyncio.Semaphore(BULK)

    async def one(c: Any) -> tuple[bool, Any]:
        if not inspect.iscoroutine(c):
            return False, c
        async with sem:
            try:
                return True, await c
            except Exception as e:
                return False, e

    return list(await asyncio.gather(*map(one, coros)))


def _outcome(coro: Coroutine) -> tuple[bool, Any]:
    try:
        return True, asyncio.run(coro)
    except BaseException as e:
        return False, e


class Blocking:
    """An async function as a plain one: a call runs the coroutine to completion (:func:`run`).
    While one is alive, the shared loop may run; when the last is garbage, the loop stops."""

    def __init__(self, f: Callable[..., Coroutine]):
        self.f = f
        # what descriptions show: the async function's name
        self.__qualname__ = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
        self.__name__ = getattr(f, "__name__", None) or self.__qualname__
        _managed.hold()
        weakref.finalize(self, _managed.release)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run(self.f(*args, **kwargs))

    def __reduce__(self):  # a copy (e.g. in a worker process) holds the loop of its own process
        return (Blocking, (self.f,))
