"""Datasets stored in many chunk files: chunks (one flat view over them, a few chunks in memory)
and block_shuffle (an epoch order that reads a few whole blocks at a time)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..core.base import Remap, View
from ..core.decoded import DecodedCache, fork_mark
from ..core.fingerprints import file_identity
from ..core.node import Failed, into, length
from ..files import Remote, is_url, redact
from ..files.fileobj import open_file
from ..files.remote import check_settings
from ..helpers import fname
from .epochs import FollowsEpoch

__all__ = ["chunks", "block_shuffle"]

# -- chunks ----------------------------------------------------------------------------------------
class Chunks(View):
    def __init__(self, paths: Sequence, read: Callable[[Any], Sequence], lengths: Sequence[int] | None,
                 cache: int, as_file: bool = False, settings: dict | None = None):
        if isinstance(paths, (str, bytes, os.PathLike)):
            raise TypeError("chunks: paths must be a sequence of paths, got a single path; use [path]")
        self.paths = tuple(paths)
        if not callable(read):
            raise TypeError(f"chunks: read must be callable (read(path) -> sequence of samples), got {type(read).__name__}")
        self.read, self.cache = read, operator.index(cache)
        if self.cache < 1:
            raise ValueError(f"chunks: cache must be >= 1 (chunks held in memory), got {cache}")
        self.as_file, self.settings = bool(as_file), dict(settings or {})
        if self.settings and not self.as_file:
            raise ValueError(f"chunks: {', '.join(sorted(self.settings))} apply to files opened for read "
                             "(as_file=True); without it, read receives the path and opens it itself")
        if self.as_file:
            try:  # now, not at the first read
                check_settings(**{k: v for k, v in self.settings.items() if k in ("block_cache", "cache_dir_bytes", "timeout")})
            except ValueError as e:
                raise ValueError(f"chunks: {e}") from None
        self._given_lengths = lengths is not None
        if lengths is None:
            self._lens: list[int | None] = [None] * len(self.paths)
        else:
            self._lens = [operator.index(n) for n in lengths]
            if len(self._lens) != len(self.paths) or any(n < 0 for n in self._lens):
                raise ValueError(f"chunks: lengths must hold one count >= 0 per path ({len(self.paths)} paths), "
                                 f"got {len(self._lens)} counts{' (some negative)' if any(n < 0 for n in self._lens) else ''}")
        self._setup()

    def _setup(self) -> None:
        self._decoded = DecodedCache(self.cache)  # chunk -> samples: each decoded once, however many threads ask
        self._count = threading.Lock()  # one thread counts the chunks' lengths
        self._fork = fork_mark()
        self._starts: list[int] | None = None  # first index of every chunk, once every length is known
        self._remotes: dict[str, Remote] = {}  # as_file: one per URL scheme, made in this process
        if None not in self._lens:
            self._index()

    def __getstate__(self) -> dict:  # small: the cache stays in this process
        return {"paths": self.paths, "read": self.read, "cache": self.cache, "_lens": self._lens,
                "as_file": self.as_file, "settings": self.settings}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"as_file": False, "settings": {}} | state)
        self._setup()

    def _fresh(self) -> None:
        """In a forked child, start afresh: the parent's chunks are not ours, and its locks may be held."""
        if self._fork != fork_mark():
            self._setup()

    def _index(self) -> None:
        self._starts = list(itertools.accumulate(self._lens[:-1], initial=0)) if self._lens else []
        self._n = sum(self._lens)

    # -- the cache -------------------------------------------------------------------------------
    def _chunk(self, k: int) -> Sequence:
        """The samples of chunk ``k``: from the cache, from another thread decoding it, or read here."""
        self._fresh()
        return self._decoded.get(k, self._decode)

    def _decode(self, k: int) -> Sequence:
        path = self.paths[k]
        shown = repr(redact(path)) if is_url(path) else repr(path)  # a URL's secrets never shown
        try:
            if self.as_file:
                with self._open(path) as f:
                    data = self.read(f)
            else:
                data = self.read(path)
        except Exception as e:
            e.add_note(f"while reading chunk {k} ({shown}) of {self.describe()}")
            raise
        arg = "the file of " * self.as_file + shown
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TypeError(f"{self.describe()}: read({arg}) returned a {type(data).__name__}, not a sequence "
                            "of samples (return a list, an array or a view)")
        n, want = len(data), self._lens[k]
        if want is None:
            self._lens[k] = n
        elif n != want:
            raise ValueError(f"{self.describe()}: read({arg}) returned {n} samples but lengths[{k}] is {want}: "
                             "fix lengths (or the file), or pass lengths=None to count them")
        return data

    def _open(self, path: Any) -> Any:
        """``path`` opened for ``read``: a local file, or a URL's file over ranged reads through this
        process's :class:`Remote` for its scheme (its block cache and connections shared)."""
        if not is_url(path):
            return open_file(path)
        scheme = path.split("://", 1)[0].lower()
        remote = self._remotes.get(scheme)
        if remote is None:
            remote = self._remotes.setdefault(scheme, Remote(path, **self.settings))
        return open_file(path, remote)

    def held(self) -> list[int]:
        """The chunks in memory now, least recently used first."""
        self._fresh()
        return self._decoded.held()

    # -- lengths ---------------------------------------------------------------------------------
    def _counted(self) -> list[int]:
        if self._starts is None:
            self._fresh()
            with self._count:  # one thread reads the uncounted chunks; the others wait for it
                if self._starts is None:
                    for k, n in enumerate(self._lens):
                        if n is None:
                            self._chunk(k)
                    self._index()
        return self._starts  # type: ignore[return-value]

    @property
    def lengths(self) -> tuple[int, ...]:
        """The number of samples in every chunk (counting them reads the chunks not counted yet)."""
        self._counted()
        return tuple(self._lens)  # type: ignore[arg-type]

    @property
    def cuts(self) -> list[int]:
        """The index where each chunk after the first starts (``block_shuffle``'s block form)."""
        return self._counted()[1:]

    def _len(self) -> int:
        if self._starts is None:
            self._counted()
        return self._n

    # -- reads -----------------------------------------------------------------------------------
    def _where(self, i: int) -> tuple[int, int]:
        starts = self._starts if self._starts is not None else self._counted()
        k = bisect.bisect_right(starts, i) - 1  # past empty chunks, which start where the next one does
        return k, i - starts[k]

    def _get(self, i: int) -> Any:
        k, j = self._where(i)
        last = self._decoded.last
        if last[0] == k and self._fork == fork_mark():  # a run of reads in one chunk takes no lock
            return last[1][j]  # type: ignore[index]
        del last  # not held while another chunk is decoded
        return self._chunk(k)[j]

    def _grouped(self, idx: Sequence[int], past_failures: bool) -> list:
        """Read every chunk once for all its items in ``idx``: the chunks in memory first, then the
        others in order of first appearance."""
        where = [self._where(i) for i in idx]
        parts: dict[int, list[int]] = {}
        for at, (k, _) in enumerate(where):
            parts.setdefault(k, []).append(at)
        self._fresh()
        held = set(self._decoded.held())
        out: list = [None] * len(idx)
        for k in sorted(parts, key=lambda k: k not in held):  # held chunks first, before evictions
            ats = parts[k]
            try:
                data = self._chunk(k)
            except Exception as e:
                if not past_failures:
                    raise
                for at in ats:
                    out[at] = Failed(e)
                continue
            for at in ats:
                out[at] = data[where[at][1]]
            data = None  # not held while the next chunk is decoded: the cache bound holds
        return out

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._grouped(idx, False)

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        return into(out, self._grouped(idx, True))

    def fingerprint_identity(self) -> dict:
        """The files' basenames in order, their sizes (local files), the lengths when given and the
        reader, for lazyseq.fingerprint: O(files) stats, no chunk read."""
        given = self._given_lengths
        local = [not is_url(p) for p in self.paths]  # a URL: its name without secrets, no request
        return {"paths": [os.path.basename(os.fspath(p) if here else urlsplit(redact(p)).path)
                          for p, here in zip(self.paths, local)],
                "bytes": [file_identity(os.fspath(p))["bytes"] if here else None for p, here in zip(self.paths, local)],
                "lengths": list(self._lens) if given else None, "read": fname(self.read)}

    def describe(self) -> str:
        return f"chunks({fname(self.read)}, {len(self.paths)} files, cache={self.cache})"


def chunks(paths: Sequence, read: Callable[[Any], Sequence], lengths: Sequence[int] | None = None,
           cache: int = 2, *, as_file: bool = False, storage_options: dict | None = None,
           block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None,
           cache_dir_bytes: int | None = None, timeout: float = 30.0) -> View:
    """The samples of many chunk files as one flat sequence; ``read(path)`` returns a chunk's samples.

    At most ``cache`` chunks are in memory (the least recently used goes first; a chunk being
    decoded counts), so a dataset far larger than memory reads with bounded memory. Threads share
    the cache, and a chunk that one thread is decoding is not decoded again by another: it waits.
    ``lengths`` (one count per path) saves counting: without it, the first ``len`` (or read)
    reads every chunk once to count its samples. ``.lengths`` and ``.cuts`` (where each chunk
    after the first starts, for :func:`block_shuffle`) give the layout. A copy (a pickle sent to
    a worker, a forked worker) starts with an empty cache: each process holds its own chunks.

    ``as_file=True``: ``read(f)`` receives the chunk's file, open, binary and seekable, for a local
    path or any fsspec URL alike (``np.load``, ``pickle.load``, pyarrow take it unchanged), closed
    when ``read`` returns or raises (so ``read`` keeps nothing that reads it later). A URL's file
    reads by ranges (a small file: one HEAD and one GET); ``storage_options``, ``block_cache``,
    ``cache_dir`` (whole files kept on local disk, at most ``cache_dir_bytes``), ``timeout`` are
    :func:`lazyseq.load`'s, and apply only with ``as_file``. See docs/remote.md.

    >>> import lazyseq
    >>> files = {'a': [0, 1, 2], 'b': [3, 4], 'c': [5, 6, 7, 8]}
    >>> data = lazyseq.chunks(['a', 'b', 'c'], files.__getitem__, cache=1)
    >>> len(data), data[4], data.lengths, data.cuts
    (9, 4, (3, 2, 4), [3, 5])
    >>> data.held()  # chunk 2 was read last while counting; chunk 1 replaced it
    [1]
    """
    settings = {k: v for k, v, default in (("storage_options", storage_options, None),
                                           ("block_cache", block_cache, 64 * 2**20), ("cache_dir", cache_dir, None),
                                           ("cache_dir_bytes", cache_dir_bytes, None), ("timeout", timeout, 30.0))
                if v != default}
    return Chunks(paths, read, lengths, cache, as_file, settings)


# -- block_shuffle ---------------------------------------------------------------------------------
def _rng(*key: Any) -> np.random.Generator:
    digest = hashlib.blake2b(":".join(map(str, ("lazyseq.block_shuffle", *key))).encode(), digest_size=16).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def _bounds(block: Any, n: int) -> np.ndarray:
    """The first index of every non-empty block, and ``n``: ``[s0, s1, ..., n]``."""
    if isinstance(block, (int, np.integer)) and not isinstance(block, bool):
        size = int(block)
        if size < 1:
            raise ValueError(f"block_shuffle: block must be >= 1 items, got {block}")
        return np.append(np.arange(0, n, size, dtype=np.int64), n)
    if isinstance(block, (str, bytes)) or not hasattr(block, "__len__"):
        raise TypeError(f"block_shuffle: block must be an int (items per block) or a sequence of cut points "
                        f"(where each block after the first starts), got {type(block).__name__}")
    try:
        cuts = np.array([operator.index(c) for c in block], dtype=np.int64)
    except TypeError:
        raise TypeError("block_shuffle: cut points must be ints") from None
    if len(cuts) and (cuts[0] < 0 or cuts[-1] > n):
        bad = int(cuts[0]) if cuts[0] < 0 else int(cuts[-1])
        raise ValueError(f"block_shuffle: cut point {bad} is out of range for a sequence of {n} items (0..{n})")
    down = np.flatnonzero(np.diff(cuts) < 0)
    if len(down):
        k = int(down[0])
        raise ValueError(f"block_shuffle: cut points must increase, got {int(cuts[k])} then {int(cuts[k + 1])} "
                         f"(at positions {k} and {k + 1})")
    return np.unique(np.concatenate(([0], cuts, [n])))  # repeated cuts (empty chunks) make no block


class BlockShuffle(FollowsEpoch, Remap):
    def __init__(self, seq: Any, block: Any, seed: int | None, epoch: int | None, window: int):
        self._bind(seq, "block_shuffle")
        n = length(seq)
        if n is None:
            raise TypeError("block_shuffle: the sequence has no len(); only finite sequences can be shuffled")
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else operator.index(seed)
        self.window = operator.index(window)
        if self.window < 1:
            raise ValueError(f"block_shuffle: window must be >= 1 blocks, got {window}")
        self._n = n
        self._bounds = _bounds(block, n)
        self._init_epoch(epoch, "block_shuffle")
        _warn_small_cache(seq, self.window)

    def _epoch_setup(self) -> None:
        bounds = self._bounds
        order = _rng(self.seed, self._epoch).permutation(len(bounds) - 1)
        self._first = bounds[:-1][order]  # the blocks in epoch order: first index and size
        self._size = np.diff(bounds)[order]
        group_sizes = np.add.reduceat(self._size, np.arange(0, len(order), self.window)) if len(order) else []
        self._gstarts = list(itertools.accumulate(map(int, group_sizes), initial=0))[:-1]
        self._recent: tuple = ()  # ((group, source indices), ...): the last two groups read

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_recent"} | {"_recent": ()}

    @property
    def blocks(self) -> int:
        return len(self._first)

    def _len(self) -> int:
        return self._n

    def _group(self, g: int) -> np.ndarray:
        """The source index of every item of group ``g``, in epoch order (computed once per group)."""
        for h, src in self._recent:
            if h == g:
                return src
        lo, hi = g * self.window, (g + 1) * self.window
        src = np.concatenate([np.arange(f, f + s, dtype=np.int64) for f, s in zip(self._first[lo:hi], self._size[lo:hi])])
        _rng(self.seed, self._epoch, g).shuffle(src)
        self._recent = ((g, src), *self._recent[:1])  # one assignment: readers in other threads see either
        return src

    def _map(self, i: int) -> int:  # i is valid: View checked it
        g = bisect.bisect_right(self._gstarts, i) - 1
        return int(self._group(g)[i - self._gstarts[g]])

    def _map_many(self, idx: Sequence[int]) -> list[int]:
        if len(idx) < 16:
            return [self._map(i) for i in idx]
        x = np.asarray(idx, dtype=np.int64)
        if len(x) and (x.min() < 0 or x.max() >= self._n):
            bad = int(x[(x < 0) | (x >= self._n)][0])
            raise IndexError(f"index {bad} out of range for {self.describe()} of length {self._n}")
        return self._map_array(x).tolist()

    def _map_array(self, x: np.ndarray) -> np.ndarray:
        g = np.searchsorted(np.asarray(self._gstarts, dtype=np.int64), x, side="right") - 1
        out = np.empty_like(x)
        for h in dict.fromkeys(g.tolist()):  # groups in order of first appearance
            at = g == h
            out[at] = self._group(h)[x[at] - self._gstarts[h]]
        return out

    def order(self) -> list[int]:
        """The source index of every item: ``[source index of item 0, of item 1, ...]``."""
        return self._map_many(range(self._n))

    def fingerprint_extra(self) -> dict:
        return {"blocks": self._bounds}

    def describe(self) -> str:
        return f"block_shuffle({self.blocks} blocks, window={self.window}, seed={self.seed}, {self._epoch_text()})"


def _warn_small_cache(seq: Any, window: int) -> None:
    """A source that keeps fewer decoded blocks than a window holds (``parquet(..., cache=4)`` under
    the default window of 8) decodes most of the window again for every batch: said once, with the fix."""
    kept = getattr(seq, "cache", None)
    if getattr(seq, "decodes_blocks", False) and isinstance(kept, int) and kept < window:
        import warnings

        warnings.warn(f"block_shuffle(window={window}) over {seq.describe()}, which keeps {kept} decoded blocks: "
                      f"each batch decodes most of the window's {window} blocks again (measured: 3.8x slower); make "
                      f"the view with cache={window} or more, or pass window={kept}", RuntimeWarning, stacklevel=4)


def block_shuffle(seq: Any, block: int | Sequence[int], seed: int | None, epoch: int | None = None,
                  window: int = 8) -> View:
    """A shuffle for data on slow storage: whole blocks in a random order, items shuffled within
    each group of ``window`` consecutive blocks, so reading in order works through ``window``
    blocks at a time.

    ``block`` is an int (blocks of that many consecutive items, the last one shorter) or the cut
    points: the index where each block after the first starts (``chunks(...).cuts`` gives one
    block per chunk file). Every item comes once per epoch; the order is fixed by
    ``(seed, epoch)`` and differs between epochs (``seed=None`` draws a seed once, kept in
    ``.seed``; ``epoch=None`` follows the :class:`DataLoader`'s epoch, 0 outside one). Reads are
    O(log groups); the order within a group is computed when the group is
    first read (O(group size)) and the last two groups' orders are kept.

    >>> import lazyseq
    >>> s = lazyseq.block_shuffle(range(12), 3, seed=0, window=2)
    >>> sorted(s) == list(range(12)), list(s) == list(lazyseq.block_shuffle(range(12), 3, seed=0, window=2))
    (True, True)
    >>> list(s)  # blocks 3 and 2 (items 6..11) shuffled together, then blocks 1 and 0
    [11, 6, 9, 7, 10, 8, 3, 4, 0, 1, 2, 5]
    >>> list(lazyseq.block_shuffle(range(6), [2, 5], seed=4, window=1))  # blocks [0, 1], [2, 3, 4], [5]
    [4, 2, 3, 5, 0, 1]
    """
    return BlockShuffle(seq, block, seed, epoch, window)
