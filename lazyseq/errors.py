"""Errors raised while evaluating items, and the process-wide error setting."""

from __future__ import annotations

from typing import Any

__all__ = ["EvaluationError", "PrefetchClosed", "PrefetchTimeout", "RemoteReadError", "RemoteWriteError", "ResumeMismatch",
           "StoreError", "WorkerCrashed",
           "WorkerStartError", "seterr", "wrap_error", "raised"]


class EvaluationError(Exception):
    """Evaluating an item of a view failed; the original exception is ``__cause__``.

    ``item`` is the index at the view that failed and ``view`` that view's short description.

    >>> import lazyseq
    >>> v = lazyseq.smap(lambda x: 1 // x, [1, 0])
    >>> try:
    ...     v[1]
    ... except lazyseq.EvaluationError as e:
    ...     print(e.item, type(e.__cause__).__name__)
    1 ZeroDivisionError
    """

    def __init__(self, message: str, item: int | None = None, view: str | None = None):
        super().__init__(message)
        self.item, self.view = item, view

    def __reduce__(self):  # keep item, view and notes across pickling (prefetch workers send these back)
        return (type(self), (self.args[0] if self.args else "", self.item, self.view), self.__dict__)


class NotWrapped(Exception):
    """Mixin: errors about the machinery itself (not an item), never wrapped in EvaluationError."""


class ResumeMismatch(ValueError):
    """A saved state comes from another pipeline than the one resuming it: ``what`` names the first
    part that differs, in the pipeline's own words (``shuffle(seed=0 -> 1)``, ``len 100 -> 99``)."""

    def __init__(self, message: str, what: str = ""):
        super().__init__(message)
        self.what = what

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.what))


class StoreError(OSError):
    """A store's file is missing, truncated, corrupted or hostile, is not a store at all, or needs
    an opt-in (``allow_pickle=True``) to be read. The message names the file and what is wrong."""


class RemoteReadError(OSError):
    """A read from object storage (an ``s3://``, ``https://``... URL) failed after its retries, or
    cannot succeed (the object is missing, access is denied, the server ignores ranges).

    The message names the URL (without its user info and query string: they may hold
    credentials), the byte range, the item where one was being read, the tries and the last
    error; ``url`` (redacted) and ``range`` (``(start, stop)`` or None for a whole object) say the
    same for code."""

    def __init__(self, message: str, url: str = "", range: tuple[int, int] | None = None):
        super().__init__(message)
        self.url, self.range = url, range

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.url, self.range))

    def about(self, what: str) -> RemoteReadError:
        """The same error, its message saying what was being read (``item 17 of store(...)``)."""
        new = type(self)(f"{self.args[0]} (reading {what})", self.url, self.range)
        new.__cause__ = self.__cause__
        return new


class RemoteWriteError(OSError):
    """A write to object storage (an upload, a small object, a deletion, a listing) failed after
    its retries, or cannot succeed (access denied). The message names the URL without its user
    info and query string, and what was being written; ``url`` (redacted) says the same for code."""

    def __init__(self, message: str, url: str = ""):
        super().__init__(message)
        self.url = url

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.url))


class WorkerCrashed(NotWrapped, RuntimeError):
    """A prefetch worker process died (a segfault, ``os._exit``, SIGKILL, the OOM killer).

    ``pid`` is the worker's process id, ``exitcode`` its exit status (negative: the signal that
    killed it, as in ``multiprocessing``). The prefetch that owned it is closed. ``worker`` says
    which worker died and how (``"worker 0 (pid 123) was killed by signal SIGKILL"``), ``items``
    the indices of the prefetch it was computing (a ``range``; None where unknown or it had no
    job), ``starting`` whether it died while starting (before its first job), ``hint`` the likely
    cause where one can be told (else None). A ``DataLoader`` or ``save`` that reads the prefetch
    raises the same error in its own words (:meth:`reworded`).
    """

    def __init__(self, message: str, pid: int | None = None, exitcode: int | None = None, *,
                 worker: str | None = None, items: range | None = None, starting: bool = False,
                 hint: str | None = None):
        super().__init__(message)
        self.pid, self.exitcode, self.items, self.starting, self.hint = pid, exitcode, items, starting, hint
        self.worker = worker if worker is not None else message

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.pid, self.exitcode), self.__dict__)

    def reworded(self, message: str) -> WorkerCrashed:
        """The same crash (type, ``pid``, ``exitcode``, ``items``, ``hint``, traceback) with another
        message: the words of what read the prefetch (the DataLoader, ``save``)."""
        new = type(self)(message, self.pid, self.exitcode)
        new.__dict__.update(self.__dict__)
        return new.with_traceback(self.__traceback__)


class WorkerStartError(NotWrapped, RuntimeError):
    """A prefetch worker failed to start (its ``start_hook`` raised, or the pipeline could not be
    rebuilt in it); the original exception is ``__cause__``. The prefetch is closed."""


class PrefetchClosed(NotWrapped, RuntimeError):
    """A read from a prefetch that was closed (by ``close()``, a ``with`` block or Ctrl-C)."""


class PrefetchTimeout(NotWrapped, TimeoutError):
    """An item did not arrive within the prefetch's ``timeout``; ``item`` is its index."""

    def __init__(self, message: str, item: int | None = None):
        super().__init__(message)
        self.item = item

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.item), self.__dict__)


# One setting for the whole process: a thread that flips it flips it for every thread, as the
# user expects of a debugging switch (seqtools keeps it per thread, which surprises workers).
_passthrough = False


def seterr(evaluation: str | None = None) -> str:
    """Set how errors raised while evaluating items propagate, and return the setting.

    ``'wrap'`` (default) raises :class:`EvaluationError` naming the item and the view, with the
    original exception as ``__cause__``; ``'passthrough'`` lets the original exception through
    unchanged, which is handy under a debugger. ``None`` only reads the setting. The setting
    applies to the whole process.

    >>> import lazyseq
    >>> lazyseq.seterr()
    'wrap'
    >>> lazyseq.seterr('passthrough')
    'passthrough'
    >>> lazyseq.seterr('wrap')
    'wrap'
    """
    global _passthrough
    if evaluation == "wrap":
        _passthrough = False
    elif evaluation == "passthrough":
        _passthrough = True
    elif evaluation is not None:
        raise ValueError(f"seterr(evaluation={evaluation!r}): expected 'wrap', 'passthrough' or None")
    return "passthrough" if _passthrough else "wrap"


def passthrough() -> bool:
    return _passthrough


def wrap_error(cause: BaseException, item: int, view: Any) -> BaseException:
    """The exception to raise for ``cause`` while evaluating ``item`` of ``view``.

    Already-wrapped errors and passthrough mode return ``cause`` itself, so each failure is
    wrapped exactly once, by the innermost view that saw it.
    """
    if _passthrough or isinstance(cause, (EvaluationError, NotWrapped)):
        return cause
    desc = view.describe() if hasattr(view, "describe") else type(view).__name__
    err = EvaluationError(
        f"failed to evaluate item {item} of {desc}: {type(cause).__name__}: {cause}", item, desc
    )
    err.__cause__ = cause
    return err


def raised(err: BaseException, item: int, view: Any) -> BaseException:
    """The exception ``view[item]`` raises when reading the item raised ``err``: ``IndexError`` and
    errors about the machinery as they are, an ``EvaluationError`` from deeper in the pipeline with
    a note naming this read, anything else wrapped (see :func:`wrap_error`)."""
    if isinstance(err, (IndexError, NotWrapped)):
        return err
    if isinstance(err, EvaluationError):
        desc = view.describe()
        if err.view != desc or err.item != item:
            err.add_note(f"while reading item {item} of {desc}")
        return err
    return wrap_error(err, item, view)
