"""``lazyseq.load``: a store on disk as a view, read through memory maps of its shard files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..core.base import View
from ..errors import RemoteReadError, StoreError
from ..files import DiskCache, Remote, is_url, local_path, redact
from ..files.local import open_data
from . import checks
from . import format as fmt
from .build import builder
from .gather import gather
from .remote import remote_manifest, remote_verify
from .shard import Shard, open_local
from .shardfile import file_crc
from .span import Spans

__all__ = ["Store", "load"]

_OPEN_SHARDS = 256  # memory maps kept open at once (each holds a file descriptor)
# a field of a shard: item j; the items at an array of indices (variable fields); the fixed table or None
class Store(View):
    """A store written by :func:`lazyseq.save`, as a view: ``store[i]`` is item ``i`` as it was
    saved (values, dtypes, shapes and container types). See :func:`load`."""

    checks_keys = False

    def __init__(self, path: str | os.PathLike, *, verify: bool = False, allow_pickle: bool = False,
                 storage_options: dict | None = None, block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None,
                 cache_dir_bytes: int | None = None, timeout: float = 30.0):
        remote = None
        if is_url(path):
            remote = Remote(path, storage_options, block_cache, cache_dir, cache_dir_bytes, timeout)
            path, manifest = remote.url, remote_manifest(remote)
        else:
            path = local_path(path)
            manifest = _manifest(path)
        self._setup(path, manifest, allow_pickle, checks.manifest(manifest, self._where(path, fmt.MANIFEST), allow_pickle),
                    remote=remote)
        self._check_files(verify)

    @classmethod
    def _reopen(cls, path: str, manifest: dict, allow_pickle: bool = False, remote: Remote | None = None) -> Store:
        self = cls.__new__(cls)
        file = self._where(path, fmt.MANIFEST)
        self._setup(path, manifest, allow_pickle, checks.manifest(manifest, file, allow_pickle), warn=False, remote=remote)
        return self

    def __reduce__(self):  # the location, the manifest and the trust: a worker maps or fetches the files itself
        return (Store._reopen, (self.path, self.manifest, self.allow_pickle, self.remote))

    def _setup(self, path: str, manifest: dict, allow_pickle: bool, dtypes: list, warn: bool = True,
               remote: Remote | None = None) -> None:
        self.path, self.manifest, self.allow_pickle, self.remote = path, manifest, allow_pickle, remote
        self.n, self.per_shard = manifest["length"], manifest["per_shard"]
        self.fields, self.records, self._dtypes = manifest["fields"], manifest["shards"], dtypes
        file = self._where(path, fmt.MANIFEST)
        self._build = builder(manifest["structure"], allow_import=allow_pickle, file=file, warn=warn) if self.n else None
        self._open: dict[int, Shard] = {}
        self._opening: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # the fixed fields' rows over the open memory maps (.span), remade after shards open or go
        self._is_open, self._opened, self._span = np.zeros(len(self.records), bool), 0, None
        self._disk = DiskCache(remote.cache_dir, remote.cache_dir_bytes, remote) if remote and remote.cache_dir else None

    @staticmethod
    def _where(path: str, name: str) -> str:
        """How messages name the file ``name`` of the store at ``path`` (a URL without its secrets)."""
        return redact(path) + "/" + name if is_url(path) else os.path.join(path, name)

    def _check_files(self, verify: bool) -> None:
        if self.remote is not None:  # sizes: checked as each shard opens (one HEAD request)
            if verify:
                for k in range(len(self.records)):
                    remote_verify(self.remote, self._url(k), self.records[k])
            return
        for k, rec in enumerate(self.records):  # each opened once, its size and checksum read from that descriptor
            f, what = os.path.join(self.path, rec["file"]), f"shard {k}"
            try:
                fd, st = open_data(f, what, root=self.path)
            except FileNotFoundError:
                raise StoreError(f"{f} ({what}) is missing: the store is incomplete") from None
            try:
                if st.st_size != rec["bytes"]:
                    raise StoreError(f"{f} ({what}) is truncated or was changed: {st.st_size} bytes, the manifest says "
                                     f"{rec['bytes']}")
                if verify and file_crc(fd) != rec["crc32"]:
                    raise StoreError(f"{f} ({what}) is corrupted: its checksum differs from the manifest's")
            finally:
                os.close(fd)

    # -- reads -----------------------------------------------------------------------------------
    def _len(self) -> int:
        return self.n

    def _url(self, k: int) -> str:
        return self.remote.join(self.records[k]["file"], "a shard")

    def _shard(self, k: int) -> Shard:
        shard = self._open.get(k)
        if shard is None:
            if self._pid != os.getpid():  # a forked child: a thread of the parent may have held these
                self._lock, self._opening, self._pid = threading.Lock(), {}, os.getpid()
            with self._lock:
                lock = self._opening.setdefault(k, threading.Lock())
            with lock:  # one thread opens shard k; others open other shards meanwhile (remote: requests)
                shard = self._open.get(k)
                if shard is None:
                    shard = self._open_shard(k)
                    with self._lock:
                        # the oldest opened goes (a memory map holds a file descriptor; a remote shard,
                        # whose opening costs requests, holds none and stays); arrays read from it stay valid
                        if len(self._open) >= _OPEN_SHARDS and self.remote is None:
                            oldest = next(iter(self._open))
                            del self._open[oldest]
                            self._is_open[oldest] = False
                        self._open[k] = shard
                        self._is_open[k], self._opened = True, self._opened + 1
        return shard

    def _open_many(self, ks: list[int]) -> None:
        """Open shards ``ks`` at once where each costs requests (a remote store's first batch over
        many shards: one HEAD and one table read each, concurrently rather than in turn)."""
        missing = [k for k in ks if k not in self._open]
        if self.remote is None or len(missing) < 2:
            return
        with ThreadPoolExecutor(min(16, len(missing)), thread_name_prefix="lazyseq-open") as pool:
            list(pool.map(self._shard, missing))

    def _open_shard(self, k: int) -> Shard:
        rec = self.records[k]
        if self.remote is None:
            path = os.path.join(self.path, rec["file"])  # a plain name (checks.py): the file is in the store's folder
            return Shard(open_local(path, rec, f"shard {k}", root=self.path), path, rec, self.fields, self._dtypes)
        url = self._url(k)
        f = None
        with contextlib.suppress(FileNotFoundError):
            f = self.remote.open(url)
        if f is None:
            raise StoreError(f"{redact(url)} is missing: the store is incomplete")
        if f.size != rec["bytes"]:
            raise StoreError(f"{redact(url)} is {f.size} bytes, the manifest says {rec['bytes']}: the object is truncated "
                             "or was replaced")
        local = None
        if self._disk is not None:  # another process downloading it without progress: read by ranges meanwhile
            with contextlib.suppress(TimeoutError):
                local = self._disk.map(url, f.size, f.etag, crc32=rec["crc32"])  # verified: the manifest's CRC-32
        if local is not None:
            return Shard(local, redact(url), rec, self.fields, self._dtypes)
        return Shard(f, redact(url), rec, self.fields, self._dtypes)

    def _spans(self, k: np.ndarray) -> Spans | None:
        """For :mod:`.gather`: the fixed fields' rows over shards ``k`` (all open memory maps) as
        one array each (:class:`.span.Spans`), or None. A local store only: a remote one keeps
        every shard it opened, so remaking the snapshot at each opening would cost O(shards**2)."""
        if self.remote is not None:
            return None
        s = self._span
        if s is None or s.opened != self._opened:
            if not self._is_open[k].all():
                return None  # the shard-by-shard path opens them first
            # no lock (a forked child may inherit it held): the count read first, then one copy of
            # the open shards, made in one C call; a shard opened meanwhile only makes it remade later
            opened = self._opened
            s = self._span = Spans(opened, dict(self._open), len(self.records), self._rows, len(self.fields))
        return s if s.whole or s.covered[k].all() else None

    def _rows(self, k: int) -> int:
        return self.records[k]["stop"] - self.records[k]["start"]

    def _holding(self, groups: list) -> Any:
        """For :mod:`.gather`: every range a bulk read of ``groups`` needs, fetched at once (remote)."""
        if self.remote is None:
            return contextlib.nullcontext()
        reqs = [r for shard, _, js in groups if shard.remote for req in shard.reqs for r in req(js)]
        return self.remote.holding(reqs)

    def _get(self, i: int) -> Any:
        k = i // self.per_shard
        j = i - k * self.per_shard
        if self.remote is None:
            return self._build([one(j) for one in self._shard(k).ones])
        try:
            shard = self._shard(k)
            if not shard.remote or len(shard.reqs) < 2:
                return self._build([one(j) for one in shard.ones])
            with self._holding([(shard, None, np.array([j]))]):  # the fields' ranges at once
                return self._build([one(j) for one in shard.ones])
        except RemoteReadError as e:
            raise e.about(f"item {i} of {self.describe()}") from None

    def _get_many(self, idx: Sequence[int]) -> list:
        """Items ``idx`` by the store's one bulk read (:func:`.gather.gather`): a gather per field
        and shard, or zero-copy slices where ``idx`` runs through a shard in order."""
        if len(idx) < 4:  # a gather's set-up costs more than a few single reads
            get = self._get
            return [get(i) for i in idx]
        if isinstance(idx, range):
            return self._ranges(idx)
        return self._gather(np.asarray(idx, dtype=np.int64), False)

    def _gather(self, idx: np.ndarray, columns: bool) -> Any:
        try:
            return gather(self, idx, columns)
        except RemoteReadError as e:  # which items the failed read was for
            some = ", ".join(map(str, idx[:4].tolist())) + (f", ... ({len(idx)} items)" if len(idx) > 4 else "")
            raise e.about(f"items {some} of {self.describe()}") from None

    def _ranges(self, idx: range) -> list:
        out, i, step = [], idx.start, idx.step
        if step != 1:
            return self._gather(np.arange(idx.start, idx.stop, step, dtype=np.int64), False)
        while i < idx.stop:  # one gather (a slice) per shard
            k = i // self.per_shard
            stop = min(idx.stop, (k + 1) * self.per_shard)
            out += self._gather(np.arange(i, stop, dtype=np.int64), False)
            i = stop
        return out

    def _columnar(self) -> bool:
        return self.n > 0 and not any(f["kind"] == "pickle" for f in self.fields)

    def _get_columns(self, idx: np.ndarray) -> Any:
        """``default_collate`` of items ``idx``, gathered by columns: see :mod:`lazyseq.store.gather`."""
        return self._gather(idx, True)

    @property
    def sizes(self) -> np.ndarray | None:
        """The length of every item where an item is one 1-D array (token sequences), read from the
        shards' shape tables without reading an item (what ``lazyseq.pack`` and ``bucket`` plan
        from); None for other items.

        >>> import lazyseq, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), 'docs')
        >>> lazyseq.save([np.arange(n) for n in (3, 1, 4, 1, 5)], path, method='thread')
        >>> lazyseq.load(path).sizes.tolist()
        [3, 1, 4, 1, 5]
        """
        f = self.fields[0] if len(self.fields) == 1 else None
        if f is None or self.manifest["structure"] != {"leaf": 0} or f["kind"] != "array" or f["ndim"] != 1:
            return None
        parts = []
        for k, rec in enumerate(self.records):
            m, lay = rec["stop"] - rec["start"], rec["fields"][0]
            if "shape" in lay:
                parts.append(np.full(m, lay["shape"][0], dtype=np.int64))
            else:  # checked when the shard opened: non-negative, inside the file
                parts.append(self._shard(k).table(lay["shapes"], "<i8", (m,)).astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def fingerprint_identity(self) -> dict:
        """For lazyseq.fingerprint: the store's name, length and a digest of its manifest (the same
        wherever the store was copied to), no shard read."""
        text = json.dumps(self.manifest, sort_keys=True, separators=(",", ":")).encode()
        name = urlsplit(self.path).path.rstrip("/").rsplit("/", 1)[-1] if is_url(self.path) else os.path.basename(self.path)
        return {"name": name, "len": self.n,
                "manifest": hashlib.blake2b(text, digest_size=16).hexdigest()}

    # -- description ------------------------------------------------------------------------------
    def nbytes(self) -> int:
        """The size of the shard files, in bytes."""
        return sum(r["bytes"] for r in self.records)

    def describe(self) -> str:
        return f"store({redact(self.path)!r})"

    def __repr__(self) -> str:
        head = f"{self.describe()}  len={self.n}  {len(self.records)} shard{'s' * (len(self.records) != 1)}, " \
               f"{_size(self.nbytes())} {'stored' if self.remote else 'on disk'}"
        lines = [head]
        for k, f in enumerate(self.fields):
            dt = self._dtypes[k]
            what = f["kind"] if f["kind"] not in ("array", "scalar") else str(dt)
            if f["kind"] == "scalar":
                what = f"numpy {dt} scalar"
            shape = "variable" if f.get("shape") is None else str(tuple(f["shape"]))
            if f["kind"] in ("none", "scalar", *fmt.PYTHON):
                shape = ""
            lines.append(f"{'└─' if k == len(self.fields) - 1 else '├─'} {fmt.shown(f['path'])}  {fmt.shown(what)}  "
                         f"{fmt.shown(shape, 400)}".rstrip())
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _manifest(path: str) -> dict:
    file = os.path.join(path, fmt.MANIFEST)
    try:
        m = fmt.read_json(file, "the manifest")
    except FileNotFoundError:
        partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lazyseq-partial")
        hint = f"; an interrupted save is in {partial}: run the same lazyseq.save again to finish it" \
            if os.path.isdir(partial) else ""
        if not os.path.exists(path):
            raise FileNotFoundError(f"lazyseq.load: there is no store at {path}{hint}") from None
        raise StoreError(f"lazyseq.load: {path} is not a lazyseq store: it has no {fmt.MANIFEST}{hint}") from None
    except OSError as e:
        raise StoreError(str(e)) from None
    if not isinstance(m, dict) or m.get("format") != fmt.FORMAT:
        raise StoreError(f"{file} is not the manifest of a lazyseq store")
    if m.get("version") != fmt.VERSION:
        raise StoreError(f"{file} has format version {m.get('version')!r:.40}; this lazyseq reads version {fmt.VERSION}")
    return m


def load(path: str | os.PathLike, *, verify: bool = False, allow_pickle: bool = False, storage_options: dict | None = None,
         block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int | None = None,
         timeout: float = 30.0) -> Store:
    """The store that :func:`lazyseq.save` wrote at ``path``, as a view with O(1) reads.

    ``path`` is a local directory or any fsspec URL (``s3://bucket/train``, ``https://host/train``,
    ``gs://...``; fsspec and the protocol's package installed, ``pip install 'lazyseq[remote]'``).
    Over a URL the manifest is read once, each shard's length is checked (one HEAD) when it is
    first touched, and an item costs one ranged GET per field (a batch: its ranges at once, neighbours
    joined). ``storage_options`` go to fsspec (credentials, endpoint; never shown in a repr or an
    error); ``block_cache`` bytes keep ranges read (0: off); ``cache_dir`` keeps whole shards on
    local disk after their first read (at most ``cache_dir_bytes``, least recently used out), keyed
    by URL and ETag; a failed request is retried with backoff for up to ``timeout`` seconds, then
    raises :class:`lazyseq.RemoteReadError` naming the URL, the byte range and the item. Arrays read
    over a URL are read-only copies (no memory map). See docs/remote.md.

    ``store[i]`` equals the saved ``seq[i]``: values, dtypes, shapes, and the container types (a
    namedtuple class that is not imported comes back as a namedtuple of the same name and fields).

    A store is data: loading and reading one never unpickles and never imports a module. Every
    count, offset, size, dtype and file name of the manifest is checked against the shard files
    first, and a bad one raises :class:`StoreError` naming the file. A container class the manifest
    names is used only if its module is already imported and it is the kind the manifest declares
    (else the item comes back as a plain dict, list or tuple, with a warning). A store with pickled
    fields is refused unless ``allow_pickle=True``, which also lets the store's classes be imported:
    only for stores you trust. The flag travels with the store to prefetch workers. Arrays come
    back as **read-only, zero-copy views** of a memory map of the shard file (``np.array(x)``
    copies one); reading a contiguous range in bulk (``batch``) costs one slice per field.
    Slices and index arrays are lazy views. A store pickles as its path and manifest, so prefetch
    workers map the files themselves. Missing or truncated files raise :class:`StoreError`
    naming the file; ``verify=True`` also checks every shard's checksum (reads every byte).

    >>> import lazyseq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), 'squares')
    >>> lazyseq.save([(np.full(2, i), i * i) for i in range(10)], path, method='thread')
    >>> store = lazyseq.load(path)
    >>> store[3], len(store), store[3][0].flags.writeable
    ((array([3, 3]), 9), 10, False)
    """
    return Store(path, verify=verify, allow_pickle=allow_pickle, storage_options=storage_options, block_cache=block_cache,
                 cache_dir=cache_dir, cache_dir_bytes=cache_dir_bytes, timeout=timeout)
