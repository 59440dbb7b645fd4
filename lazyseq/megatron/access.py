"""Every file access of :mod:`lazyseq.megatron`, in one place.

DESIGN section 2: a format never opens a file itself, it asks the files layer
(:mod:`lazyseq.files`). These few functions are the only ones in this package that touch a file,
local or in object storage:

- :func:`open_pair`: a corpus's ``.bin`` and ``.idx``: memory maps of local files; for a URL, the
  ``.idx`` read whole and the ``.bin`` a :class:`~lazyseq.files.RemoteFile` read by ranges (or,
  with ``cache_dir``, both kept whole on local disk and memory-mapped), and the objects' versions;
- :func:`map_file`: a read-only, zero-copy ``uint8`` array over a memory map of a regular file;
- :func:`stamp`: a file's size and modification time (the key of a cached index);
- :func:`create`, :func:`commit`, :func:`write_atomic`: new files written beside their final path
  and renamed into place when complete;
- :func:`writable_dir`: whether a directory is local and writable (where an index is cached);
- :func:`read_npy`: a ``.npy`` file from elsewhere, read with ``allow_pickle=False``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ..errors import StoreError
from ..files import DiskCache, Remote, RemoteFile, redact
from ..files.fileobj import read_into
from ..files.local import map_data, open_data

__all__ = ["open_pair", "map_file", "stamp", "create", "commit", "write_atomic", "writable_dir", "makedirs", "read_npy",
           "remove", "IDX_LIMIT"]

IDX_LIMIT = 4 * 2**30  # bytes: an .idx over a URL is read whole into memory; a larger object is refused


def open_pair(bin_file: str, idx_file: str, remote: Remote | None) -> tuple[Any, np.ndarray, list | None]:
    """``(bin, idx, version)`` of a corpus: ``bin`` a ``uint8`` memory map or a
    :class:`~lazyseq.files.RemoteFile` (``len`` and ranges), ``idx`` the ``.idx``'s bytes as a
    read-only ``uint8`` array, ``version`` the objects' ``[size, etag]`` (``.idx`` first) for a URL,
    None locally. ``FileNotFoundError`` names a missing file."""
    if remote is None:
        return map_file(bin_file, "the corpus's .bin"), map_file(idx_file, "the corpus's .idx"), None
    idx_info, bin_info = remote.info(idx_file), remote.info(bin_file)
    if idx_info["size"] > IDX_LIMIT:
        raise StoreError(f"{redact(idx_file)} is {idx_info['size']} bytes: larger than any index this reader reads "
                         f"into memory ({IDX_LIMIT} bytes)")
    disk = DiskCache(remote.cache_dir, remote.cache_dir_bytes, remote) if remote.cache_dir is not None else None
    idx = _cached(disk, idx_file, idx_info)  # each mapped as soon as it is there: a later entry's eviction
    bin_ = _cached(disk, bin_file, bin_info)  # (or another process's) cannot take it away any more
    if idx is None:
        buf = bytearray(idx_info["size"])
        read_into(remote, idx_file, 0, memoryview(buf), cache=False)
        idx = np.frombuffer(buf, np.uint8)
        idx.flags.writeable = False
    if bin_ is None:
        bin_ = RemoteFile(remote, bin_file, bin_info["size"], bin_info["etag"])
    return bin_, idx, [[i["size"], i["etag"]] for i in (idx_info, bin_info)]


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
    return _array(map_data(path, what, root=os.path.dirname(path) or "."))


def _array(mm: Any) -> np.ndarray:
    """A memory map (or ``b""``) as a read-only ``uint8`` array."""
    if not len(mm):  # mmap refuses an empty file
        empty = np.zeros(0, np.uint8)
        empty.flags.writeable = False
        return empty
    return np.frombuffer(mm, np.uint8)


def stamp(path: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path`` (``FileNotFoundError`` when missing)."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


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


def read_npy(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, which must hold exactly ``shape`` items of ``dtype``:
    its header is read and checked against them (and the file's size) before anything is
    allocated, and nothing is unpickled. ``ValueError`` says what differs; ``OSError`` when
    the file cannot be read."""
    fmt = np.lib.format
    fd, _ = open_data(path, "an index cache file")  # never through a link, never waiting on a FIFO
    with os.fdopen(fd, "rb") as f:
        version = fmt.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"unknown .npy version {version}")
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        got_shape, fortran, got_dtype = read(f, max_header_size=10000)
        if got_dtype != np.dtype(dtype) or tuple(got_shape) != tuple(shape) or (fortran and len(shape) > 1):
            raise ValueError(f"it holds {got_dtype} {tuple(got_shape)}, not {np.dtype(dtype)} {tuple(shape)}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if os.fstat(f.fileno()).st_size != f.tell() + nbytes:
            raise ValueError("its size does not match its header")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError("it was truncated while read")
    return np.frombuffer(data, dtype).reshape(shape)


def remove(path: str) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
