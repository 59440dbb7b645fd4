"""Evaluation: computing a view's items ahead of its reader, in threads, worker processes, Ray
actors or on an event loop.

``view.Prefetch`` is what users hold: its life cycle and read path. It reads through a
``window.Window`` (which jobs to run ahead, waiting for the wanted item; ``completion.py`` reads
it in completion order for ``Prefetch.unordered``), which drives one backend through the
protocol of ``backend.py``: ``threads.ThreadBackend``, ``actors.RayBackend`` (Ray actors),
``coroutines.AsyncBackend`` (one event loop) or ``processes.ProcessBackend`` (worker processes,
``worker.py``, whose results travel in shared-memory slots, ``slots.py``, as ``wire.py`` encodes
them). ``filtering`` holds ``lazyseq.filter``, whose one pass in workers runs through ``prefetch``.
"""

from .actors import shutdown as shutdown_ray
from .slots import empty, empty_like
from .view import Prefetch, prefetch

__all__ = ["prefetch", "Prefetch", "empty", "empty_like", "shutdown_ray"]
