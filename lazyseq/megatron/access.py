"""Every file access of :mod:`lazyseq.megatron`, in one place.

DESIGN section 2: a format never opens a file itself, it asks the files layer
(:mod:`lazyseq.files`). These few functions are the only ones in this package that touch a file,
local or in object storage:

- :func:`open_pair`: a corpus's ``.bin`` and ``.idx``: memory maps of local files; for a URL, the
  ``.idx`` read whole and the ``.bin`` a :class:`~lazyseq.files.RemoteFile` read by ranges (or,
  with ``cache_dir``, both kept whole on local disk and memory-mapped), and what identifies them
  (sizes and times as opened, or versions);
- :func:`map_file`: a read-only, zero-copy ``uint8`` array over a memory map of a regular file;
- :func:`create`, :func:`commit`, :func:`write_atomic`: new files written beside their final path
  and renamed into place when complete;
- :func:`writable_dir`: whether a directory is local and writable (where an index is cached);
- :func:`read_npy`, :func:`read_own`: a cache entry's ``.npy`` file (read with ``allow_pickle=False``)
  and record, used only when this user owns them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ..errors import StoreError
from ..files import DiskCache, Remote, RemoteFile, redact
from ..files.fileobj import read_into
from ..files.local import open_data

__all__ = ["open_pair", "map_file", "create", "commit", "write_atomic", "writable_dir", "makedirs", "read_npy", "read_own",
           "remove", "IDX_LIMIT"]

IDX_LIMIT = 4 * 2**30  # bytes: an .idx over a URL is read whole into memory; a larger object is refused
HEAD_BYTES = 2**20  # the first part of a URL's .idx, read (and its header judged) before the rest


def open_pair(bin_file: str, idx_file: str, remote: Remote | None,
              check_head: Callable[[bytes, int], None] | None = None) -> tuple[Any, np.ndarray, list, tuple]:
    """``(bin, idx, version, identity)`` of a corpus: ``bin`` a ``uint8`` memory map or a
    :class:`~lazyseq.files.RemoteFile` (``len`` and ranges), ``idx`` the ``.idx``'s bytes as a
    read-only ``uint8`` array; ``version`` what keys a cached index: the files' ``(size,
    mtime_ns)`` as opened (``.idx`` first), or the objects' ``[size, etag]`` for a URL;
    ``identity`` what tells that a later opening found the same files: locally their device,
    inode, size, mtime and ctime as opened, for a URL ``version``. ``check_head(first bytes,
    size)`` judges a URL's ``.idx`` before the rest of it is read into memory (its first
    ``HEAD_BYTES`` are read first). ``FileNotFoundError`` names a missing file."""
    if remote is None:
        (bin_, b), (idx, i) = _map(bin_file, "the corpus's .bin"), _map(idx_file, "the corpus's .idx")
        version = [(i.st_size, i.st_mtime_ns), (b.st_size, b.st_mtime_ns)]
        return bin_, idx, version, tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in (i, b))
    idx_info, bin_info = remote.info(idx_file), remote.info(bin_file)
    if idx_info["size"] > IDX_LIMIT:
        raise StoreError(f"{redact(idx_file)} is {idx_info['size']} bytes: larger than any index this reader reads "
                         f"into memory ({IDX_LIMIT} bytes)")
    disk = DiskCache(remote.cache_dir, remote.cache_dir_bytes, remote) if remote.cache_dir is not None else None
    idx = _cached(disk, idx_file, idx_info)  # each mapped as soon as it is there: a later entry's eviction
    bin_ = _cached(disk, bin_file, bin_info)  # (or another process's) cannot take it away any more
    if idx is None:
        idx = _read_idx(remote, idx_file, idx_info["size"], check_head)
    if bin_ is None:
        bin_ = RemoteFile(remote, bin_file, bin_info["size"], bin_info["etag"])
    version = [[i["size"], i["etag"]] for i in (idx_info, bin_info)]
    return bin_, idx, version, tuple(tuple(v) for v in version)


def _read_idx(remote: Remote, url: str, size: int, check_head: Callable[[bytes, int], None] | None) -> np.ndarray:
    """A URL's ``.idx``, read whole into memory, its first part first: ``check_head`` judges the
    header against the object's size before more than ``HEAD_BYTES`` are allocated (a small
    ``.idx`` is one request)."""
    first = bytearray(min(HEAD_BYTES, size))
    read_into(remote, url, 0, memoryview(first), cache=False)
    if check_head is not None:
        check_head(bytes(first[:64]), size)
    if size > len(first):
        buf = bytearray(size)
        buf[: len(first)] = first
        read_into(remote, url, len(first), memoryview(buf)[len(first):], cache=False)
        first = buf
    idx = np.frombuffer(first, np.uint8)
    idx.flags.writeable = False
    return idx


def _cached(disk: DiskCache | None, url: str, info: dict) -> np.ndarray | None:
    """The memory map of the local copy of ``url`` in ``disk``; None where there is none (no
    cache_dir, no ETag, evicted before it was mapped, another process stalled downloading it)."""
    if disk is None:
        return None
    try:
        local = disk.map(url, info["size"], info["etag"])  # the entry verified, as opened
        return _array(local) if local is not None else None
    except (FileNotFoundError, TimeoutError):
        return None


def map_file(path: str, what: str = "a corpus file") -> np.ndarray:
    """The bytes of the regular file ``path`` as a read-only ``uint8`` array over a memory map,
    opened once as a stranger's file (:mod:`lazyseq.files.local`: never through a link, never
    waiting on a FIFO; anything but a regular file is a :class:`StoreError` naming it). A missing
    file raises ``FileNotFoundError``."""
    return _map(path, what)[0]


def _array(mm: Any) -> np.ndarray:
    """A memory map (or ``b""``) as a read-only ``uint8`` array."""
    if not len(mm):  # mmap refuses an empty file
        return _empty()
    return np.frombuffer(mm, np.uint8)


def _empty() -> np.ndarray:
    empty = np.zeros(0, np.uint8)
    empty.flags.writeable = False
    return empty


def _map(path: str, what: str) -> tuple[np.ndarray, os.stat_result]:
    """:func:`map_file`'s array and the ``fstat`` of the descriptor it was mapped from."""
    fd, st = open_data(path, what, root=os.path.dirname(path) or ".")
    try:
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else None
    except (OSError, ValueError) as e:  # a file system that cannot map, a file that shrank to nothing
        raise StoreError(f"{path} ({what}) cannot be memory-mapped: {getattr(e, 'strerror', None) or e}") from None
    finally:
        os.close(fd)  # the map holds no descriptor
    if mm is None:  # mmap refuses an empty file
        return _empty(), st
    return np.frombuffer(mm, np.uint8), st


def create(path: str) -> tuple[BinaryIO, str]:
    """A new, empty temporary file beside ``path`` (same directory, hidden name), opened for
    reading and writing, and its path: :func:`commit` renames it into place, :func:`remove`
    drops it."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".lazyseq-tmp", dir=directory)
    return os.fdopen(fd, "w+b"), tmp


def commit(f: BinaryIO, tmp: str, path: str) -> None:
    """Flush, sync and close ``f`` (made by :func:`create`), and rename ``tmp`` to ``path``: the file
    appears there complete, or not at all."""
    f.flush()
    os.fsync(f.fileno())
    f.close()
    os.chmod(tmp, 0o644)  # mkstemp makes it 0o600; a dataset is for others to read too
    os.replace(tmp, path)


def write_atomic(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write a file with ``write(f)``: it appears at ``path`` complete when ``write`` returns, and
    never otherwise."""
    f, tmp = create(path)
    try:
        write(f)
        commit(f, tmp, path)
    except BaseException:
        f.close()
        remove(tmp)
        raise


def writable_dir(directory: str) -> bool:
    """Whether ``directory`` is an existing local directory this process may create files in."""
    return os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)


def makedirs(directory: str) -> None:
    """Create ``directory`` and its parents where missing."""
    os.makedirs(directory, exist_ok=True)


def _own(fd: int, st: os.stat_result, path: str, what: str) -> None:
    """Refuse (closing ``fd``) a file another user owns: a cache entry is used only by whom wrote it."""
    uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid != uid:
        os.close(fd)
        raise StoreError(f"{path} ({what}) belongs to uid {st.st_uid}, not to this process's ({uid}): not used")


def read_own(path: str, what: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a small file this user owns (a cache entry's record), at most ``max_bytes``, and
    the ``fstat`` of what was read; a :class:`StoreError` for anything else."""
    fd, st = open_data(path, what, max_bytes=max_bytes)
    _own(fd, st, path, what)
    with os.fdopen(fd, "rb") as f:
        data = f.read(st.st_size + 1)
    if len(data) != st.st_size:
        raise StoreError(f"{path} ({what}) changed while it was read")
    return data, st


def read_npy(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[np.ndarray, os.stat_result]:
    """The array of the ``.npy`` file ``path``, which must hold exactly ``shape`` items of ``dtype``
    and belong to this user, and the ``fstat`` of what was read: its header is read and checked
    against them (and the file's size) before anything is allocated, and nothing is unpickled.
    ``ValueError`` says what differs; ``OSError`` (a :class:`StoreError`) when the file cannot be
    read or is another user's."""
    fmt = np.lib.format
    fd, st = open_data(path, "an index cache file")  # never through a link, never waiting on a FIFO
    _own(fd, st, path, "an index cache file")
    with os.fdopen(fd, "rb") as f:
        version = fmt.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"unknown .npy version {version}")
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        got_shape, fortran, got_dtype = read(f, max_header_size=10000)
        if got_dtype != np.dtype(dtype) or tuple(got_shape) != tuple(shape) or (fortran and len(shape) > 1):
            raise ValueError(f"it holds {got_dtype} {tuple(got_shape)}, not {np.dtype(dtype)} {tuple(shape)}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if st.st_size != f.tell() + nbytes:
            raise ValueError("its size does not match its header")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError("it was truncated while read")
    return np.frombuffer(data, dtype).reshape(shape), st


def remove(path: str) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
