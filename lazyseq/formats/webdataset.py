"""WebDataset tar shards read at random, where they lie: :func:`webdataset`.

Each shard is indexed once (its headers only: :mod:`.tar`), the index kept in the index cache
(:mod:`.tarcache`); item ``i`` is then one read of its sample's members' span: slices of the
memory map of a local shard, one ranged GET of a URL (a batch: its spans at once). ``len``
indexes every shard (concurrently), unless ``lengths=`` says their samples.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import itertools
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.base import View
from ..core.decoded import fork_mark
from ..errors import StoreError
from ..files import is_url, local_path
from ..files.remote import check_settings
from .sources import HIDDEN, Opened, Remotes, list_files, open_source, read_by_part, shown

if TYPE_CHECKING:
    from .tarindex import TarIndex

__all__ = ["webdataset", "WebDataset"]

WHAT = "a tar shard"
INDEX_THREADS = 16  # shards indexed at once by len()
COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
DECOMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")  # those lazyseq.formats.untar decompresses


def _compressed(name: str, cache_dir: Any) -> bool:
    """Whether ``name`` is a compressed shard to decompress into ``cache_dir`` (refused without one)."""
    if not name.endswith(COMPRESSED):
        return False
    if cache_dir is None or not name.endswith(DECOMPRESSED):
        how = "decompress it (gunzip) and read the .tar" + (", or give cache_dir= to have it decompressed once there"
                                                            if name.endswith(DECOMPRESSED) else "")
        raise ValueError(f"lazyseq.webdataset: {shown(name)} is a compressed tar: its members cannot be read at random; "
                         f"{how}")
    return True


def _list(urls: Any, remotes: Remotes, cache_dir: Any) -> list[tuple[str, str]]:
    """``(name, path or URL)`` of every shard: a file, a folder (its ``*.tar`` directly in it), an
    object-store prefix (every ``*.tar`` under it), or a list of those; each list sorted. Compressed
    shards are refused unless there is a ``cache_dir`` to decompress them into."""
    items = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    if not items:
        raise ValueError("lazyseq.webdataset: no shards given")
    out: list[tuple[str, str]] = []
    for p in items:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"lazyseq.webdataset: shards are paths or URLs, got a {type(p).__name__}")
        p = os.fspath(p)
        _compressed(p, cache_dir)
        local = None if is_url(p) else local_path(p)
        if local is not None and os.path.isdir(local) and not os.path.islink(local):
            names = sorted(n for n in os.listdir(local) if not n.startswith(HIDDEN))
            found = [(n, os.path.join(local, n)) for n in names
                     if n.endswith(".tar") or _compressed(os.path.join(local, n), cache_dir)]
            if not found:
                raise FileNotFoundError(f"lazyseq.webdataset: no *.tar file in {p}")
            out += found
        elif local is None and not p.endswith((".tar", *COMPRESSED)):
            found = list_files(p, (".tar", *COMPRESSED), "lazyseq.webdataset", remotes)
            for _, u in found:
                _compressed(u, cache_dir)
            out += found
        else:
            out.append((os.path.basename(local) if local is not None else p.rstrip("/").rsplit("/", 1)[-1], local or p))
    return out


class Shard:
    """A shard as this process opened and indexed it."""

    __slots__ = ("opened", "index", "remote")

    def __init__(self, opened: Opened, index: TarIndex):
        self.opened, self.index, self.remote = opened, index, opened.remote

    def sample(self, j: int, key: str | None = None) -> dict:
        ix = self.index
        out: dict[str, Any] = {"__key__": ix.key(j)}
        if self.remote is None:
            buf = self.opened.buffer
            for ext, o, n in ix.members(j):
                out[ext] = buf[o:o + n]  # a map's slice: the member's bytes, one copy
            return out
        a, z = ix.span(j)
        return self._fill(out, ix.members(j), self.remote.read(a, z), a)

    @staticmethod
    def _fill(out: dict, members: list, span: bytes, a: int) -> dict:
        view = memoryview(span)
        for ext, o, n in members:
            out[ext] = bytes(view[o - a:o - a + n])
        return out

    def samples(self, js: Sequence[int]) -> list[dict]:
        """The samples ``js``: over a URL, their spans requested at once."""
        if self.remote is None:
            return [self.sample(j) for j in js]
        ix = self.index
        spans = [ix.span(j) for j in js]
        blobs = self.remote.remote.read_ranges([self.remote.request(a, z) for a, z in spans])
        return [self._fill({"__key__": ix.key(j)}, ix.members(j), b, a) for j, (a, _), b in zip(js, spans, blobs)]


class WebDataset(View):
    """The samples of WebDataset tar shards: see :func:`webdataset`."""

    checks_keys = False

    def __init__(self, urls: Any, lengths: Sequence[int] | None, settings: dict, strict: bool):
        check_settings(**{k: v for k, v in settings.items() if k in ("block_cache", "cache_dir_bytes", "timeout")})
        self.settings, self.strict = dict(settings), bool(strict)
        self._remotes = Remotes(self.settings)
        files = _list(urls, self._remotes, settings.get("cache_dir"))
        self.names, self.paths = [n for n, _ in files], [p for _, p in files]
        if lengths is not None:
            lengths = [int(n) for n in lengths]
            if len(lengths) != len(self.paths) or any(n < 0 for n in lengths):
                raise ValueError(f"lazyseq.webdataset: lengths must hold one count >= 0 per shard ({len(self.paths)} "
                                 f"shards), got {len(lengths)} counts")
        self.lengths = lengths
        # what each shard was when first opened (size, stamp, samples): a worker checks it opens the same
        self._known: list[tuple[int, Any, int] | None] = [None] * len(self.paths)
        self._setup()

    def _setup(self) -> None:
        self._shards: dict[int, Shard] = {}
        self._locks = [threading.Lock() for _ in self.paths]
        self._fork = fork_mark()
        self._starts: list[int] | None = None
        counts = self.lengths if self.lengths is not None else [kn[2] for kn in self._known if kn is not None]
        if len(counts) == len(self.paths):  # (a worker gets what its parent counted: it opens only what it reads)
            self._starts = list(itertools.accumulate(counts, initial=0))

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "strict": self.strict, "names": self.names, "paths": self.paths,
                "lengths": self.lengths, "_known": self._known}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._remotes = Remotes(self.settings)
        self._setup()

    def _fresh(self) -> None:
        """In a forked child, start afresh: the parent's locks may be held, its connections are its own."""
        if self._fork != fork_mark():
            self._remotes = Remotes(self.settings)
            self._setup()

    # -- shards ----------------------------------------------------------------------------------
    def _shard(self, k: int) -> Shard:
        """Shard ``k`` opened and indexed in this process (once, however many threads ask)."""
        got = self._shards.get(k)
        if got is not None:
            return got
        self._fresh()
        with self._locks[k]:
            got = self._shards.get(k)
            if got is None:
                got = self._shards[k] = self._open(k)
        return got

    def _cache_root(self) -> str:
        root = self.settings.get("cache_dir")
        from .tarcache import default_root  # (the tar modules are imported at a view's first index, not with lazyseq)

        return os.fspath(root) if root is not None else default_root()

    def _open(self, k: int) -> Shard:
        path = self.paths[k]
        where = f"{shown(path)} ({WHAT})"
        try:
            opened = open_source(path, WHAT, self._remotes)
        except FileNotFoundError:
            raise FileNotFoundError(f"{where} is missing") from None
        known = self._known[k]
        if known is not None and (opened.size != known[0] or (self.strict and opened.stamp != known[1])):
            raise StoreError(f"{where} changed since this view was made ({known[0]} bytes, then {opened.size}"
                             f"{', or another modification time or ETag' * self.strict}): make the view again over the "
                             "shards as they are now")
        source = os.path.abspath(path) if not is_url(path) else path
        root = self._cache_root()
        tar = self._decompressed(opened, source, where) if path.endswith(COMPRESSED) else opened
        from . import tar as tarmod
        from . import tarcache

        index = tarcache.load(root, source, tar.size, opened.stamp)
        if index is None:
            buf = tar.buffer if tar.remote is None else tar.remote
            index = tarmod.index_tar(buf, tar.size, shown(path))
            tarcache.store(root, source, tar.size, opened.stamp, index)
        want = known[2] if known is not None else None if self.lengths is None else self.lengths[k]
        if want is not None and len(index) != want:
            said = "this view found" if known is not None else "lengths= says"
            raise StoreError(f"{where} holds {len(index)} samples, {said} {want}: "
                             f"{'give the right lengths, or lengths=None to count them' if known is None else 'it changed'}")
        self._known[k] = (opened.size, opened.stamp, len(index))
        return Shard(tar, index)

    def _decompressed(self, opened: Opened, source: str, where: str) -> Opened:
        """A compressed shard's decompressed copy under ``cache_dir``, opened (:mod:`.untar`)."""
        if opened.remote is not None:  # (a URL whose server gives no ETag: cache_dir keeps no copy of it)
            raise StoreError(f"{where} is compressed and its server gives no ETag, so cache_dir keeps no copy of it: "
                             "decompress it and serve the .tar")
        from .untar import decompressed

        copy = decompressed(os.fspath(self.settings["cache_dir"]), source, opened.buffer, opened.stamp,
                            self.settings.get("cache_dir_bytes"), where)
        return open_source(copy, "a decompressed tar shard", self._remotes)

    def _index_all(self) -> None:
        missing = [k for k in range(len(self.paths)) if self._known[k] is None]
        if missing:
            with concurrent.futures.ThreadPoolExecutor(min(INDEX_THREADS, len(missing))) as pool:
                list(pool.map(self._shard, missing))
        if self._starts is None:
            self._starts = list(itertools.accumulate((kn[2] for kn in self._known), initial=0))  # type: ignore[index]

    # -- shape -----------------------------------------------------------------------------------
    def _len(self) -> int:
        if self._starts is None:
            self._index_all()
        return self._starts[-1]  # type: ignore[index]

    @property
    def shard_samples(self) -> tuple[int, ...]:
        """The samples of each shard, in order (indexes every shard not yet indexed, unless ``lengths=``)."""
        self._len()
        return tuple(b - a for a, b in itertools.pairwise(self._starts))  # type: ignore[arg-type]

    @property
    def cuts(self) -> list[int]:
        """The index where each shard after the first starts: ``block_shuffle(v, v.cuts, seed)``."""
        self._len()
        return self._starts[1:-1]  # type: ignore[index]

    # -- reads -----------------------------------------------------------------------------------
    def _where(self, i: int) -> tuple[int, int]:
        if self._starts is None:
            self._len()
        starts = self._starts
        k = bisect.bisect_right(starts, i) - 1  # type: ignore[arg-type]
        return k, i - starts[k]  # type: ignore[index]

    def _get(self, i: int) -> dict:
        k, j = self._where(i)
        return self._shard(k).sample(j)

    def _get_many(self, idx: Sequence[int]) -> list:
        return read_by_part(idx, self._where, lambda k, js: self._shard(k).samples(js))

    # -- description -----------------------------------------------------------------------------
    def _identity(self) -> list[tuple[int, Any, int]]:
        self._index_all()
        return self._known  # type: ignore[return-value]

    def fingerprint_identity(self) -> dict:
        """The shards' names (relative to a folder or prefix given), sizes and samples; with
        ``strict`` their modification times (URLs: ETags) too. Indexes shards not yet indexed (the
        index cache answers), reads no sample."""
        known = self._identity()
        return {"files": self.names, "bytes": [kn[0] for kn in known], "samples": [kn[2] for kn in known],
                "stamps": [str(kn[1]) for kn in known] if self.strict else None}

    def nbytes(self) -> int:
        """The size of the shards, in bytes."""
        return sum(kn[0] for kn in self._identity())

    def describe(self) -> str:
        return f"webdataset({len(self.paths)} shard{'s' * (len(self.paths) != 1)})"


def webdataset(urls: Any, *, lengths: Sequence[int] | None = None, storage_options: dict | None = None,
               block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None,
               cache_dir_bytes: int | None = None, timeout: float = 30.0, strict: bool = True) -> WebDataset:
    """The samples of WebDataset tar shards as a random-access view of dicts ``{'__key__': key,
    ext: bytes, ...}``, the same keys and bytes ``webdataset.WebDataset(urls)`` yields (its
    ``__url__`` and ``__local_path__`` aside).

    ``urls``: an uncompressed ``.tar`` path or URL, a list of them, a folder (every ``*.tar``
    directly in it, sorted) or an object-store prefix (every ``*.tar`` under it, by relative path);
    names starting with ``_`` or ``.`` are skipped. A sample is a run of consecutive members with
    one key (the path up to the first dot of the file name); each member is an entry named by the
    rest of its name, lower-cased (``'jpg'``, ``'seg.png'``). Samples never span shards.

    Each shard is indexed once, by reading its headers (over a URL: ranged reads of a few MiB;
    with ``cache_dir`` the whole shard is kept on local disk first), and the index is kept in the
    index cache (under ``cache_dir``, else ``~/.cache/lazyseq``: see :mod:`.tarcache`), reused
    while the shard's path, size and modification time (URL: ETag) are unchanged. Item ``i`` then
    costs one read of its sample's bytes. ``lengths``: the samples of each shard, making ``len``
    and ``.cuts`` free (each is checked when its shard is indexed: a wrong one is a StoreError);
    without it, the first ``len`` indexes every shard, concurrently. ``.cuts`` are the shards'
    starts: ``block_shuffle(v, v.cuts, seed)`` shuffles reading a few shards at a time.

    ``storage_options``, ``block_cache``, ``cache_dir_bytes``, ``timeout``, ``strict``: as
    :func:`~lazyseq.parquet`'s. A compressed tar (``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``)
    is refused unless ``cache_dir`` is given: it is then decompressed once into it (:mod:`.untar`)
    and read from there (``cache_dir_bytes`` bounds one copy). The view pickles without data (a
    worker opens the shards and reads their indices itself).

    >>> import io, os, tarfile, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with tarfile.open(os.path.join(root, "a.tar"), "w") as t:
    ...     for name, data in [("k0.jpg", b"abc"), ("k0.cls", b"1"), ("k1.jpg", b"de"), ("k1.cls", b"2")]:
    ...         info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
    >>> v = webdataset(root, cache_dir=os.path.join(root, "cache"))
    >>> v, v[1], v.cuts
    (webdataset(1 shard)  len=2, {'__key__': 'k1', 'jpg': b'de', 'cls': b'2'}, [])
    """
    settings = {"storage_options": storage_options, "block_cache": block_cache, "cache_dir": cache_dir,
                "cache_dir_bytes": cache_dir_bytes, "timeout": timeout}
    return WebDataset(urls, lengths, settings, strict)
