"""on_error: read past the few items of a dataset that fail (corrupt files), counting and logging
each one, and stop when there are too many."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import math
import numbers
import operator
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from ..core.base import View
from ..core.node import Exhausted, Failed, check_source, describe_source, into, is_finite, length, read_each, reader
from ..errors import EvaluationError, passthrough, wrap_error
from ..helpers import fname

__all__ = ["on_error", "Skip", "Errors", "tally"]

logger = logging.getLogger("lazyseq")

# A forked worker starts its own count (and must not inherit a lock held by a thread at the fork).
_forks = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


# The count a reader in this thread (or task) asked for with tally(): None outside one.
_tally: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("lazyseq_on_error_tally", default=None)


@contextlib.contextmanager
def tally(into: list[int]) -> Iterator[list[int]]:
    """Add to ``into[0]`` the items that ``on_error`` views replace in this thread (or asyncio
    task) while the block runs: for a reader that splits a count by what it reads (the
    DataLoader's epochs, read by persistent workers). An enclosing tally counts them too."""
    outer, start = _tally.get(), into[0]
    token = _tally.set(into)
    try:
        yield into
    finally:
        _tally.reset(token)
        if outer is not None:
            outer[0] += into[0] - start


class Skip:
    """``on_error(seq, substitute=Skip)``: a failing item is replaced by the next item that reads,
    looking at most ``limit`` items ahead (wrapping around at the end of ``seq``).

    ``Skip`` itself means ``Skip(limit=16)``.

    >>> import lazyseq
    >>> lazyseq.Skip, lazyseq.Skip(limit=100)
    (<class 'lazyseq.views.faults.Skip'>, Skip(limit=100))
    """

    __slots__ = ("limit",)

    def __init__(self, limit: int = 16):
        self.limit = operator.index(limit)
        if self.limit < 1:
            raise ValueError(f"Skip: limit must be >= 1 (items to try after a failing one), got {limit}")

    def __repr__(self) -> str:
        return f"Skip(limit={self.limit})"

    def __reduce__(self):
        return (Skip, (self.limit,))


class Errors:
    """What an ``on_error`` view replaced in this process: ``count`` failed items, out of ``reads``
    items read, and the ``recent`` ones (the last ``keep``) as ``(index, error text)``."""

    def __init__(self, keep: int = 10):
        self.count, self._bulk, self._recent = 0, 0, deque(maxlen=keep)
        self._ticks = itertools.count()  # single reads: next() is atomic, so no lock on the hot path

    @property
    def reads(self) -> int:
        return int(repr(self._ticks)[6:-1]) + self._bulk  # 'count(n)': n reads so far

    @property
    def recent(self) -> list[tuple[int, str]]:
        return list(self._recent)

    def __repr__(self) -> str:
        return f"Errors(count={self.count}, reads={self.reads}, recent={self.recent!r})"


def _text(error: BaseException) -> str:
    return str(error) if isinstance(error, EvaluationError) else f"{type(error).__name__}: {error}"


def _max_errors(m: Any) -> int | float | None:
    """``max_errors`` checked: None, a count (an int, numpy's too) or a fraction (a float in [0, 1])."""
    if m is None:
        return None
    if isinstance(m, numbers.Integral) and not isinstance(m, bool):
        if m < 0:
            raise ValueError(f"on_error: max_errors must be >= 0, got {m}")
        return int(m)
    if isinstance(m, numbers.Real) and not isinstance(m, bool):
        if not 0 <= m <= 1:
            raise ValueError(f"on_error: a fraction max_errors must lie in [0, 1], got {m} (a count is an int)")
        return float(m)
    raise TypeError(f"on_error: max_errors must be None, an int (a count) or a float (a fraction), got {type(m).__name__}")


class OnError(View):
    def __init__(self, seq: Any, substitute: Any, max_errors: int | float | None):
        self.src, self._rd = check_source(seq, "on_error"), reader(seq)
        self.finite = is_finite(seq)
        if substitute is Skip:
            substitute = Skip()
        self.substitute = substitute
        self._mode = "skip" if isinstance(substitute, Skip) else "call" if callable(substitute) else "value"
        self.max_errors = _max_errors(max_errors)
        self._setup()

    def _setup(self) -> None:
        self._lock, self._errors, self._fork = threading.Lock(), Errors(), _forks[0]

    @property
    def errors(self) -> Errors:
        """The failures this process saw: ``count``, ``reads``, ``recent``."""
        if self._fork != _forks[0]:
            self._setup()
        return self._errors

    def __getstate__(self) -> dict:  # a copy in another process counts its own errors from zero
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_errors", "_fork")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _limit(self, reads: int) -> float:
        m = self.max_errors
        if m is None:
            return math.inf
        if isinstance(m, int):
            return m
        n = length(self.src)
        return m * (reads if n is None else max(reads, n))

    # -- reads -----------------------------------------------------------------------------------
    def _get(self, i: int) -> Any:
        if self._fork != _forks[0]:
            self._setup()
        next(self._errors._ticks)
        try:
            return self._rd(i)
        except Exhausted:
            raise
        except Exception as e:
            return self._fail(i, e, None)

    def _bulk(self, idx: Sequence[int], past_failures: bool) -> list:
        if self._fork != _forks[0]:
            self._setup()
        with self._lock:
            self._errors._bulk += len(idx)
        items = read_each(self.src, idx)
        known = dict(zip(idx, items)) if self._mode == "skip" else None  # good items are not read twice
        for k, x in enumerate(items):
            if type(x) is not Failed:
                continue
            if isinstance(x.error, Exhausted):
                if past_failures:
                    continue
                raise x.error
            try:
                items[k] = self._fail(idx[k], x.error, known)
            except Exception as e:
                if not past_failures:
                    raise
                items[k] = Failed(e)
        return items

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._bulk(idx, False)

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        return into(out, self._bulk(idx, True))

    def _set(self, i: int, value: Any) -> None:
        self.src[i] = value

    # -- a failing item --------------------------------------------------------------------------
    def _fail(self, i: int, error: Exception, known: dict | None) -> Any:
        """Count item ``i``'s failure, stop if there are too many, else return its substitute."""
        text, log = _text(error), self._errors
        with self._lock:
            log.count += 1
            log._recent.append((i, text))
            count, limit = log.count, self._limit(log.reads)
        counted = _tally.get()
        if counted is not None:
            counted[0] += 1
        if count > limit:
            raise self._stop(i, error, count, limit)
        if self._mode == "value":
            value, what = self.substitute, "the fixed value"
        elif self._mode == "call":
            try:
                value = self.substitute(i, error)
            except Exception as e:
                err = wrap_error(e, i, self)
                if err is e:  # already wrapped deeper, or passthrough mode
                    raise
                err.add_note(f"substitute {fname(self.substitute)} raised while replacing item {i}, which failed: {text}")
                raise err from e
            what = f"{fname(self.substitute)}({i}, error)"
        else:
            j, value = self._next_good(i, error, known)
            what = f"item {j}"
        logger.warning("on_error: item %d of %s failed (%s); replaced by %s [%d failed in this process so far]",
                       i, describe_source(self.src), text, what, count)
        return value

    def _next_good(self, i: int, error: Exception, known: dict | None) -> tuple[int, Any]:
        n, limit = length(self.src), self.substitute.limit
        tries = limit if n is None else min(limit, n - 1)
        for step in range(1, tries + 1):
            j = i + step if n is None else (i + step) % n
            if known is not None and j in known:
                x = known[j]
                if type(x) is not Failed:
                    return j, x
                continue
            try:
                x = self._rd(j)
            except Exhausted:  # the end of a source of unknown size: nothing to wrap around to
                tries = step - 1
                break
            except Exception as e:
                if known is not None:
                    known[j] = Failed(e)
                continue
            if known is not None:  # the next failing item of a bulk read may want it too
                known[j] = x
            return j, x
        if passthrough():
            raise error
        desc = self.describe()
        err = EvaluationError(
            f"{desc}: item {i} failed ({_text(error)}) and so did the {tries} items after it"
            f"{' (wrapping around)' if n is not None and i + tries >= n else ''}: none to take its place. "
            f"Is every item failing? Skip(limit=...) looks further", i, desc)
        raise err from error

    def _stop(self, i: int, error: Exception, count: int, limit: float) -> BaseException:
        if passthrough():
            return error
        desc, m = self.describe(), self.max_errors
        allows = f"{m} failed items" if isinstance(m, int) else f"{m:g} of the items read ({limit:g} now)"
        err = EvaluationError(
            f"{desc}: item {i} failed ({_text(error)}): {count} failed items in this process, more than "
            f"max_errors allows ({allows}); see .errors and the 'lazyseq' log for the others", i, desc)
        err.__cause__ = error
        return err

    def describe(self) -> str:
        sub = self.substitute
        what = repr(sub) if self._mode == "skip" else fname(sub) if self._mode == "call" else repr(sub)[:40]
        return f"on_error({what}, max_errors={self.max_errors})"


def on_error(seq: Any, substitute: Any = Skip, max_errors: int | float | None = None) -> View:
    """``seq`` with its failing items replaced: the same length, random access, and a log of each.

    Reading item ``i`` that raises an ``Exception`` (never ``KeyboardInterrupt``/``SystemExit``)
    returns instead, according to ``substitute``:

    - :class:`Skip` (default): the next item that reads (``i + 1``, ``i + 2``, ..., wrapping
      around), trying at most ``Skip.limit`` items (16; ``Skip(limit=100)`` tries more), then
      an :class:`EvaluationError` saying none was found;
    - a callable: ``substitute(i, error)``, where ``error`` is what reading ``seq[i]`` raised;
    - anything else: that value (the same object every time).

    Each failure is counted in ``.errors`` (``count``, ``reads``, the ``recent`` ones) and logged
    (a warning on the ``'lazyseq'`` logger, with the index and the error). ``max_errors``: ``None``
    (no limit), an int (at most that many failed items), or a float ``f`` (at most ``f`` of the
    items read, counting at least ``len(seq)``, so early failures in an epoch do not count
    double). The failure past the limit raises an :class:`EvaluationError` naming that item,
    with its error as ``__cause__``. Counts are per process: a process worker (``prefetch``,
    ``DataLoader``) counts and limits the items it reads; ``on_error(prefetch(seq))`` counts in
    the reader. Bulk reads read each good item once.

    >>> import lazyseq
    >>> def load(i):
    ...     if i in (2, 3):
    ...         raise OSError(f'file {i} is corrupt')
    ...     return i * 10
    >>> data = lazyseq.smap(load, range(6))
    >>> list(lazyseq.on_error(data))
    [0, 10, 40, 40, 40, 50]
    >>> safe = lazyseq.on_error(data, substitute=lambda i, error: -i, max_errors=2)
    >>> list(safe), safe.errors.count, safe.errors.recent[0]
    ([0, 10, -2, -3, 40, 50], 2, (2, 'failed to evaluate item 2 of smap(load): OSError: file 2 is corrupt'))
    >>> try:
    ...     safe[2]                        # a third failure: more than max_errors=2
    ... except lazyseq.EvaluationError as e:
    ...     print(e.item, safe.errors.count, repr(e.__cause__.__cause__))
    2 3 OSError('file 2 is corrupt')
    """
    return OnError(seq, substitute, max_errors)
