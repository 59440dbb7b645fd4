"""Cached indices: ``.npy`` files beside the data (or under ``cache_dir``), keyed by a hash of
every input, verified by a record of what was written, read like any file from elsewhere.

A cache entry is a few ``.npy`` files named ``<prefix name>.lazyseq-<kind>-<hash>.<array>.npy``
and its record, ``<prefix name>.lazyseq-<kind>-<hash>.json``. The hash (the key) covers the
kind, this module's format version, the data's absolute path, the ``.bin`` and ``.idx`` sizes and
modification times, a digest of the corpus's sequence sizes (:meth:`Indexed.digest`) and every
parameter: a stale entry has another name and is never read. Data at a URL is never written to:
its entries go under ``cache_dir`` (else the ``cache_dir`` of its indexed view, else
:func:`default_dir`), keyed by the URL without its secrets and the objects' sizes and ETags.

The record, written last (atomically, after every array), holds the whole key and a blake2b
digest of each array. An entry is used only when it proves it is what it claims: every file
belongs to this user (an entry another uid wrote is not used), the record names this key, each
``.npy`` header gives exactly the dtype and shape the inputs imply (nothing allocated from a
header, nothing unpickled), each array's digest is the recorded one, and the caller's ``check``
accepts the values. The digests and ``check`` run once per entry per process: an entry whose
files (device, inode, size, mtime, ctime) were verified before is not hashed again. An entry that
fails is rebuilt and written again, atomically; a directory where nothing can be written only
means no cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import access

__all__ = ["cached", "default_dir", "digest"]

VERSION = 2
RECORD_BYTES = 1 << 16  # a record is a few hundred bytes; a larger file is not one
Spec = Sequence[tuple[str, Any, tuple[int, ...]]]  # (name, dtype, shape) of each array

_verified: set[tuple] = set()  # the entries (their files' identities) verified in this process
_verified_lock = threading.Lock()


def default_dir() -> str:
    """``$XDG_CACHE_HOME/lazyseq``, else ``~/.cache/lazyseq``."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "lazyseq")


def digest(a: np.ndarray) -> str:
    """blake2b (32 bytes, hex) of an array's bytes: about 1 GB/s."""
    return hashlib.blake2b(np.ascontiguousarray(a).data, digest_size=32).hexdigest()


def _key(kind: str, docs: Any, params: dict) -> str:
    where = docs.shown if docs.remote is not None else docs.prefix  # a URL's secrets stay out of the key
    blob = json.dumps({"kind": kind, "version": VERSION, "prefix": where, "files": docs.version(),
                       "sizes": docs.digest(), "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _places(docs: Any, cache_dir: str | os.PathLike | None) -> list[str]:
    """Where an entry may be: beside local data when that directory is writable, else ``cache_dir``."""
    if cache_dir is None and docs.remote is not None:
        cache_dir = docs.remote.cache_dir
    there = os.path.abspath(os.path.expanduser(os.fspath(cache_dir if cache_dir is not None else default_dir())))
    if docs.remote is not None:
        return [there]
    here = os.path.dirname(docs.prefix)
    return [here, there] if access.writable_dir(here) else [there]


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read(base: str, key: str, spec: Spec, check: Callable[..., None]) -> list[np.ndarray] | None:
    """The arrays of the entry at ``base`` if it proves to be the one of ``key`` (see the module), else None."""
    try:
        raw, st = access.read_own(f"{base}.json", "an index cache record", RECORD_BYTES)
        record = json.loads(raw)
        if not isinstance(record, dict) or record.get("format") != VERSION or record.get("key") != key \
                or not isinstance(record.get("arrays"), dict):
            return None
        loaded = [access.read_npy(f"{base}.{name}.npy", np.dtype(dt), shape) for name, dt, shape in spec]
        arrays = [a for a, _ in loaded]
        seen = (base, _identity(st), *(_identity(s) for _, s in loaded))
        if seen not in _verified:
            if any(record["arrays"].get(name) != digest(a) for (name, _, _), a in zip(spec, arrays)):
                return None
            check(*arrays)
            with _verified_lock:
                if len(_verified) > 4096:
                    _verified.clear()
                _verified.add(seen)
    except (OSError, ValueError, EOFError):  # StoreError is an OSError; json's and unicode errors ValueErrors
        return None
    return arrays


def _write(base: str, key: str, spec: Spec, arrays: Sequence[np.ndarray]) -> None:
    """The arrays, each written atomically, then the record of their digests, atomically, last."""
    access.makedirs(os.path.dirname(base))
    for (name, _, _), a in zip(spec, arrays):
        access.write_atomic(f"{base}.{name}.npy", lambda f, a=a: np.save(f, a, allow_pickle=False))
    record = {"format": VERSION, "key": key, "arrays": {name: digest(a) for (name, _, _), a in zip(spec, arrays)}}
    access.write_atomic(f"{base}.json", lambda f: f.write(json.dumps(record, sort_keys=True).encode()))


def cached(kind: str, docs: Any, params: dict, spec: Spec, build: Callable[[], Sequence[np.ndarray]],
           check: Callable[..., None], cache_dir: str | os.PathLike | None, enabled: bool = True) -> list[np.ndarray]:
    """The arrays ``spec`` names for the corpus ``docs`` (an :class:`~lazyseq.megatron.Indexed`) and
    ``params``: read from a cache entry that proves to be theirs (``check(*arrays)`` raises
    ``ValueError`` when the values are not), or built with ``build()`` and written to the first
    place that takes them."""
    if not enabled:
        return list(build())
    key = _key(kind, docs, params)
    name = f"{docs.name}.lazyseq-{kind}-{key[:32]}"
    places = _places(docs, cache_dir)
    for place in places:
        arrays = _read(os.path.join(place, name), key, spec, check)
        if arrays is not None:
            return arrays
    arrays = list(build())
    for place in places:
        try:
            _write(os.path.join(place, name), key, spec, arrays)
            break
        except OSError:
            continue
    return arrays
