"""Cached indices: ``.npy`` files beside the data (or under ``cache_dir``), keyed by a hash of
every input, read like any file from elsewhere.

A cache entry is a few ``.npy`` files named ``<prefix name>.lazyseq-<kind>-<hash>.<array>.npy``.
The hash covers the kind, this module's format version, the data's absolute path, the ``.bin``
and ``.idx`` sizes and modification times, and every parameter: a stale entry has another name
and is never read. Data at a URL is never written to: its entries go under ``cache_dir`` (else
the ``cache_dir`` of its indexed view, else :func:`default_dir`), keyed by the URL without its
secrets and the objects' sizes and ETags. An entry that is read is checked before use: its
header must give exactly the dtype and shape the inputs imply (nothing allocated from a header),
nothing is unpickled, and the caller's ``check`` bounds-checks the values; an entry that fails is
rebuilt and rewritten. Each file is written atomically; a directory where nothing can be written
only means no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import access

__all__ = ["cached", "default_dir"]

VERSION = 1
Spec = Sequence[tuple[str, Any, tuple[int, ...]]]  # (name, dtype, shape) of each array


def default_dir() -> str:
    """``$XDG_CACHE_HOME/lazyseq``, else ``~/.cache/lazyseq``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "lazyseq")


def _key(kind: str, docs: Any, params: dict) -> str:
    where = docs.shown if docs.remote is not None else docs.prefix  # a URL's secrets stay out of the key
    blob = json.dumps({"kind": kind, "version": VERSION, "prefix": where, "files": docs.version(), "params": params},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _places(docs: Any, cache_dir: str | os.PathLike | None) -> list[str]:
    """Where an entry may be: beside local data when that directory is writable, else ``cache_dir``."""
    if cache_dir is None and docs.remote is not None:
        cache_dir = docs.remote.cache_dir
    there = os.path.abspath(os.path.expanduser(os.fspath(cache_dir if cache_dir is not None else default_dir())))
    if docs.remote is not None:
        return [there]
    here = os.path.dirname(docs.prefix)
    return [here, there] if access.writable_dir(here) else [there]


def _read(base: str, spec: Spec, check: Callable[..., None]) -> list[np.ndarray] | None:
    try:
        arrays = [access.read_npy(f"{base}.{name}.npy", np.dtype(dt), shape) for name, dt, shape in spec]
        check(*arrays)
    except (OSError, ValueError, EOFError):
        return None
    return arrays


def _write(base: str, spec: Spec, arrays: Sequence[np.ndarray]) -> None:
    access.makedirs(os.path.dirname(base))
    for (name, _, _), a in zip(spec, arrays):
        access.write_atomic(f"{base}.{name}.npy", lambda f, a=a: np.save(f, a, allow_pickle=False))


def cached(kind: str, docs: Any, params: dict, spec: Spec, build: Callable[[], Sequence[np.ndarray]],
           check: Callable[..., None], cache_dir: str | os.PathLike | None, enabled: bool = True) -> list[np.ndarray]:
    """The arrays ``spec`` names for the corpus ``docs`` (an :class:`~lazyseq.megatron.Indexed`) and
    ``params``: read from a valid cache entry (``check(*arrays)`` raises ``ValueError`` when they
    are not), or built with ``build()`` and written to the first place that takes them."""
    if not enabled:
        return list(build())
    name = f"{docs.name}.lazyseq-{kind}-{_key(kind, docs, params)}"
    places = _places(docs, cache_dir)
    for place in places:
        arrays = _read(os.path.join(place, name), spec, check)
        if arrays is not None:
            return arrays
    arrays = list(build())
    for place in places:
        try:
            _write(os.path.join(place, name), spec, arrays)
            break
        except OSError:
            continue
    return arrays
