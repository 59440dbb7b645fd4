"""A local file that a stranger's data names (a manifest, a shard, a ``.bin``/``.idx``, an index
cache, a ``cache_dir`` entry), opened the one way: once, never through a symbolic link, never
waiting, and judged by the descriptor that was opened, not by its path.

- ``O_NOFOLLOW``: a link in the file's place (``corpus.bin -> ~/.ssh/id_rsa``) is refused, so what
  is read is the file in the data's own folder (the names a format joins to it are plain names,
  checked before); ``root`` also checks where the descriptor leads (``/proc/self/fd``).
- ``O_NONBLOCK``: a FIFO in the file's place cannot make ``open`` wait; ``fstat`` then refuses
  anything but a regular file (a FIFO, a device such as ``/dev/zero``, a directory, a socket).
- ``max_bytes``: a file larger than what its kind can be is refused before a byte is read.

A path is checked and opened in one step, so no other process can swap the file between a check
and the open. Every refusal is a :class:`~lazyseq.errors.StoreError` naming the file and what is
wrong; a missing file is ``FileNotFoundError``.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "a.json"), "w") as f:
...     _ = f.write("{}")
>>> os.symlink(os.path.join(d, "a.json"), os.path.join(d, "b.json"))
>>> read_data(os.path.join(d, "a.json"), "the manifest", max_bytes=100)
b'{}'
>>> read_data(os.path.join(d, "b.json"), "the manifest")  # doctest: +ELLIPSIS
Traceback (most recent call last):
lazyseq.errors.StoreError: .../b.json (the manifest) is a symbolic link: ... never through a link; put the file itself there
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import Any

from ..errors import StoreError

__all__ = ["open_data", "read_data", "map_data", "kind_of"]

FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
         | getattr(os, "O_BINARY", 0))
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` (``st_mode``) is when it is not a regular file (``"a FIFO"``); None if it is one."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_data(path: str, what: str, *, root: str | None = None, max_bytes: int | None = None) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file at ``path``, opened read-only as this module says; the
    caller closes ``fd``. ``root``: the folder the file must be in (its descriptor's real path).
    ``what`` says which file it is in messages: ``/data/s/manifest.json (the manifest) is ...``."""
    try:
        fd = os.open(path, FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EMLINK and os.path.islink(path)):  # (EMLINK: FreeBSD)
            raise StoreError(f"{path} ({what}) is a symbolic link: a dataset's files are read only as regular files in "
                             "its own folder, never through a link; put the file itself there") from None
        raise StoreError(f"{path} ({what}) cannot be opened: {e.strerror or type(e).__name__}") from None
    try:
        st = os.fstat(fd)
        kind = kind_of(st.st_mode)
        if kind is not None:
            raise StoreError(f"{path} ({what}) is not a regular file ({kind}): a dataset's files are plain files")
        if max_bytes is not None and st.st_size > max_bytes:
            raise StoreError(f"{path} ({what}) is {st.st_size} bytes, more than such a file can be ({max_bytes} bytes)")
        if root is not None:
            _inside(fd, path, root, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _inside(fd: int, path: str, root: str, what: str) -> None:
    """Refuse a descriptor whose file is not in ``root`` (where the system says where it leads)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (macOS): O_NOFOLLOW and the plain names formats join are the guard
        return
    if os.path.dirname(real) != os.path.realpath(root):
        raise StoreError(f"{path} ({what}) leads outside its folder (to {real}): a dataset's files must lie in its folder")


def read_data(path: str, what: str, *, root: str | None = None, max_bytes: int | None = None) -> bytes:
    """The whole content of a small file (a manifest, a job file), opened with :func:`open_data`."""
    fd, st = open_data(path, what, root=root, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as f:
        data = f.read(st.st_size + 1)
    if len(data) != st.st_size:
        raise StoreError(f"{path} ({what}) changed while it was read ({st.st_size} bytes, then {len(data)})")
    return data


def map_data(path: str, what: str, *, root: str | None = None, size: int | None = None) -> Any:
    """A read-only memory map of the file (``b""`` when empty: mmap refuses an empty file), opened
    with :func:`open_data`; ``size``: the bytes it must have (else a StoreError: truncated or
    changed). The map holds no descriptor once made."""
    fd, st = open_data(path, what, root=root)
    with os.fdopen(fd, "rb") as f:
        if size is not None and st.st_size != size:
            raise StoreError(f"{path} ({what}) is truncated or was changed: {st.st_size} bytes, where {size} are expected")
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
