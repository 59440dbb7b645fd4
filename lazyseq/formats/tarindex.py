"""A tar file's regular members grouped into samples as WebDataset groups them, and the index
of those samples (:class:`TarIndex`): what :func:`~lazyseq.formats.tar.index_tar` builds from a
tar's headers and :mod:`.tarcache` keeps.

The grouping is webdataset's (``webdataset.tariterators``): ``__*__`` meta names skipped, the key
the path up to the first dot of the file name (``base_plus_ext``), the rest its lower-cased
extension, consecutive members of one key one sample. It is computed in numpy over the names as
rows of bytes, without a Python string per member, wherever a file name is plain (a dot after
its first byte, no newline, not ``__*``, an ASCII extension); the regex splits the rest. Names
are checked first: absolute, with a ``..`` component, or not UTF-8 is a :class:`~lazyseq.StoreError`,
as is a sample with two members of one extension (webdataset raises there too).

>>> ix = group([512, 1536, 2560], [2, 1, 1], [b"a/x.jpg", b"a/x.cls", b"y.seg.PNG"], "t.tar")
>>> len(ix), ix.key(0), ix.members(0), ix.key(1), ix.members(1), ix.span(0)
(2, 'a/x', [('jpg', 512, 2), ('cls', 1536, 1)], 'y', [('seg.png', 2560, 1)], (512, 1537))
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import StoreError

__all__ = ["TarIndex", "group", "shown_name", "BLOCK"]

BLOCK = 512
BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext, exactly
SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
BAD_NAME = re.compile(rb"(?:^|[/\0])\.\.(?:$|[/\0])|(?:^|\0)/")  # a ".." component, an absolute path


class TarIndex:
    """The samples of one tar file: member ``m`` holds bytes ``offsets[m]`` to ``offsets[m] +
    sizes[m]`` and extension ``exts[ext_ids[m]]``; sample ``j`` is members ``starts[j]`` to
    ``starts[j + 1]`` and its key is ``keys[key_ends[j]:key_ends[j + 1]]`` (UTF-8)."""

    __slots__ = ("offsets", "sizes", "ext_ids", "starts", "key_ends", "keys", "exts", "_mv")

    def __init__(self, offsets: np.ndarray, sizes: np.ndarray, ext_ids: np.ndarray, starts: np.ndarray,
                 key_ends: np.ndarray, keys: bytes, exts: list[str]):
        i64 = np.dtype(np.int64)  # native order: a memoryview indexes it
        self.offsets, self.sizes, self.starts, self.key_ends = (np.ascontiguousarray(a, i64) for a in
                                                                 (offsets, sizes, starts, key_ends))
        self.ext_ids = np.ascontiguousarray(ext_ids, np.dtype(np.int32))
        self.keys, self.exts = keys, exts
        # memoryviews index to Python ints several times faster than arrays do: a read costs microseconds
        arrays = (self.offsets, self.sizes, self.ext_ids, self.starts, self.key_ends)
        self._mv = tuple(memoryview(a).cast("B").cast(a.dtype.char) for a in arrays)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def key(self, j: int) -> str:
        ke = self._mv[4]
        return self.keys[ke[j]:ke[j + 1]].decode("utf-8")

    def span(self, j: int) -> tuple[int, int]:
        """The bytes from the start of sample ``j``'s first member to the end of its last."""
        off, size, _, st, _ = self._mv
        a, z = st[j], st[j + 1] - 1
        return off[a], off[z] + size[z]

    def members(self, j: int) -> list[tuple[str, int, int]]:
        """``(extension, offset, size)`` of each member of sample ``j``."""
        off, size, ext, st, _ = self._mv
        exts = self.exts
        return [(exts[ext[m]], off[m], size[m]) for m in range(st[j], st[j + 1])]

    def check(self, file_size: int, where: str) -> None:
        """Raise a StoreError unless the arrays describe members inside a file of ``file_size``
        bytes (an index read from a cache proves itself so, beside its digest)."""
        o, s, e, st, ke = self.offsets, self.sizes, self.ext_ids, self.starts, self.key_ends
        m, n = len(o), len(st) - 1
        ok = (len(s) == m and len(e) == m and n >= 0 and len(ke) == n + 1 and (m == 0 or n > 0)
              and st[0] == 0 and st[-1] == m and bool((np.diff(st) > 0).all())
              and ke[0] == 0 and ke[-1] == len(self.keys) and bool((np.diff(ke) >= 0).all())
              and bool((o >= BLOCK).all()) and bool((s >= 0).all()) and bool((o + s <= file_size).all())
              and bool((np.diff(o) > 0).all()) and bool((e >= 0).all()) and bool((e < len(self.exts)).all()))
        if ok:
            try:
                self.keys.decode("utf-8")
            except UnicodeDecodeError:
                ok = False
        if not ok:
            raise StoreError(f"{where}: its index does not describe members inside the file ({file_size} bytes)")


def shown_name(name: bytes | str) -> str:
    """A member's name for a message: printable, bounded."""
    text = name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name
    text = repr(text)
    return text if len(text) <= 160 else text[:160] + "...'"


def _check_names(names: np.ndarray, offs: Any, name: str) -> None:
    """Refuse an absolute name, one with a ``..`` component, or one not UTF-8 among the rows of
    ``names`` (each name's bytes, then NULs)."""
    n, width = names.shape
    padded = np.zeros((n, width + 1), np.uint8)  # a NUL after every name, at least: the regex's separator
    padded[:, :width] = names
    blob = padded.tobytes()

    def refuse(k: int, why: str) -> None:
        raise StoreError(f"{name} (a tar file), the member at byte {offs[k] - BLOCK} "
                         f"({shown_name(names[k].tobytes().rstrip(bytes(1)))}): {why}")

    at = [int(k) for k in np.flatnonzero(names[:, 0] == 47)[:1]]  # the first absolute name, the first ".."
    found = BAD_NAME.search(blob) if b".." in blob else None
    at += [found.start() // (width + 1)] if found is not None else []
    if at:
        refuse(min(at), "an absolute name or one with '..': a dataset's tar names its members inside it")
    try:
        blob.decode("utf-8")
    except UnicodeDecodeError as e:
        refuse(e.start // (width + 1), "its name is not UTF-8")


def group(offs: Any, lens: Any, names: Any, name: str) -> TarIndex:
    """The members grouped into samples as webdataset's ``group_by_keys`` groups them: member ``m``
    at byte ``offs[m]``, of ``lens[m]`` bytes, named ``names[m]`` (bytes; no NUL in a name: cut
    there, or refused in a PAX path)."""
    rows = names if isinstance(names, np.ndarray) else np.array(names, "S")
    width = max(1, int(np.char.str_len(rows).max(initial=0)))
    table = np.ascontiguousarray(rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)[:, :width])  # NULs after
    rows = table.view(f"S{width}").ravel()
    _check_names(table, offs, name)
    klen, ext, exts = _cut(table, rows)
    kept = np.flatnonzero(ext >= 0)
    ext, klen = ext[kept], klen[kept]
    keys = table[kept] * (np.arange(width) < klen[:, None])  # each key, NULs after it
    flat = keys.view(rows.dtype).ravel()
    change = np.flatnonzero((flat[1:] != flat[:-1]) | (klen[1:] != klen[:-1])) + 1
    starts = np.concatenate([[0], change, [len(kept)]]).astype(np.int64) if len(kept) else np.zeros(1, np.int64)
    _no_twice(ext, starts, kept, offs, rows, exts, name)
    first = starts[:-1]
    key_ends = np.zeros(len(first) + 1, np.int64)
    np.cumsum(klen[first], out=key_ends[1:])
    at = keys[first]
    return TarIndex(np.asarray(offs, np.int64)[kept], np.asarray(lens, np.int64)[kept], ext, starts,
                    key_ends, at[np.arange(width) < klen[first, None]].tobytes(), exts)


def _cut(names: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(key lengths in bytes, extension ids, extensions)`` of the members whose names are the rows
    of ``names`` (NULs after each): webdataset's ``base_plus_ext`` with numpy where the file name is
    plain (a dot after its first byte, no newline, not ``__*``, an ASCII extension); by
    :func:`_split` (one string at a time) where not. Id -1: in no sample."""
    n = len(names)
    plain, cut, size = _plain(names)
    klen, ids = np.where(plain, cut, -1), np.full(n, -1, np.int32)
    at = np.flatnonzero(plain)
    first, inverse, of_class = _extensions(names, at, cut[at], size[at])
    seen: dict[str, int] = {}  # an extension -> the first member that has it
    for e, k in zip(of_class, at[first].tolist()):
        seen[e] = min(seen.get(e, n), k)
    rest = np.flatnonzero(~plain).tolist()
    prefixes, rest_ids, rest_exts = _split([n.decode("utf-8") for n in rows[rest].tolist()])
    by_id = list(rest_exts)
    for k, prefix, e in zip(rest, prefixes, rest_ids):
        if e >= 0:
            seen[by_id[e]] = min(seen.get(by_id[e], n), k)
            klen[k] = len(prefix.encode("utf-8"))
    exts = sorted(seen, key=seen.__getitem__)  # ids in order of first appearance, as _split gives them
    number = {e: j for j, e in enumerate(exts)}
    ids[at] = np.array([number[e] for e in of_class], np.int32)[inverse] if len(at) else 0
    if rest:
        ids[rest] = np.array([number[by_id[e]] if e >= 0 else -1 for e in rest_ids], np.int32)
    return klen, ids, exts


def _plain(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(which names are plain, where each one's file name has its first dot, each one's length)``."""
    n, width = names.shape
    col = np.arange(width)
    size = np.count_nonzero(names, 1)
    dot = names == 46
    slash = names == 47
    if slash.any():
        base = np.where(slash.any(1), width - np.argmax(slash[:, ::-1], 1), 0)  # the file name's first byte
        dot &= col >= base[:, None]
    else:
        base = np.zeros(n, np.intp)
    cut = np.argmax(dot, 1)  # the first dot of the file name
    plain = dot[np.arange(n), cut] & (cut > base) & ~((names[:, 0] == 95) & (names[:, 1 % width] == 95))
    if (names == 10).any():
        plain &= ~(names == 10).any(1)
    high = names >= 128
    if high.any():
        plain &= ~(high & (col > cut[:, None])).any(1)
    return plain, cut, size


def _extensions(names: np.ndarray, at: np.ndarray, cut: np.ndarray, size: np.ndarray) -> tuple:
    """The lower-cased extensions of the plain names ``names[at]`` (first dots at ``cut``, lengths
    ``size``) as classes: ``(each class's first row in at, each row's class, each class's extension)``."""
    width, chunk = names.shape[1], 8192
    length = size - cut - 1
    span = -(-max(1, int(length.max(initial=0))) // 8) * 8
    codes = np.zeros((len(at), span), np.uint8)
    flat, offsets = names.reshape(-1), np.arange(span)
    for a in range(0, len(at), chunk):  # (a gather's indices are 8 bytes a byte: in chunks)
        idx = (at[a:a + chunk] * width + cut[a:a + chunk] + 1)[:, None] + offsets
        got = np.take(flat, idx, mode="clip")
        got[offsets >= length[a:a + chunk, None]] = 0
        codes[a:a + chunk] = np.where((got >= 65) & (got <= 90), got | 32, got)
    keys = codes.view(np.uint64 if span == 8 else f"S{span}").reshape(-1)
    first, inverse = _classes(keys)
    return first, inverse, [codes[k, :length[k]].tobytes().decode("ascii") for k in first.tolist()]


def _classes(keys: np.ndarray, few: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``(a first index of each distinct value, each item's class)``: a pass per value while they are
    few (a shard's extensions are), else a sort."""
    inverse = np.full(len(keys), -1, np.int64)
    first: list[int] = []
    while len(first) < few:
        k = int(np.argmax(inverse < 0)) if len(keys) else 0
        if not len(keys) or inverse[k] >= 0:
            return np.asarray(first, np.int64), inverse
        inverse[keys == keys[k]] = len(first)
        first.append(k)
    _, starts, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return starts, inverse.reshape(-1)


def _split(names: list[str]) -> tuple[list, list[int], dict[str, int]]:
    """``(keys, extension ids, extensions)`` of the members named ``names``: webdataset's meta
    names and names without an extension are in no sample (key None, id -1)."""
    prefixes, ids = [], []
    exts: dict[str, int] = {}
    of_raw: dict[str, int] = {}  # an extension as named -> its id (lower-cased)
    match, skip = BASE_PLUS_EXT.match, SKIP_META.match
    plain = "\n" not in "".join(names)  # (where a name holds a newline, the regex's own rules)
    for fname in names:
        if fname[:2] == "__" and (("/" not in fname and fname.endswith("__")) or skip(fname)):
            prefixes.append(None)
            ids.append(-1)
            continue
        j = fname.rfind("/") + 1
        i = fname.find(".", j)
        if plain and i > j:  # base_plus_ext where the file name has a dot after its first character
            prefix, suffix = fname[:i], fname[i + 1:]
        else:
            m = match(fname)
            if m is None:
                prefixes.append(None)
                ids.append(-1)
                continue
            prefix, suffix = m.groups()
        e = of_raw.get(suffix)
        if e is None:
            e = of_raw[suffix] = exts.setdefault(suffix.lower(), len(exts))
        prefixes.append(prefix)
        ids.append(e)
    return prefixes, ids, exts


def _no_twice(ext: np.ndarray, starts: np.ndarray, kept: np.ndarray, offs: Any, rows: np.ndarray,
              exts: list[str], name: str) -> None:
    """Refuse a sample with two members of one extension (webdataset raises there too)."""
    if not len(ext):
        return
    sample = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    pair = sample * len(exts) + ext
    order = np.argsort(pair, kind="stable")
    twice = np.flatnonzero(np.diff(pair[order]) == 0)
    if len(twice):
        m = int(kept[order[twice[0] + 1]])
        raise StoreError(f"{name} (a tar file), the member at byte {offs[m] - BLOCK} ({shown_name(rows[m].item())}): its sample "
                         f"holds two members with the extension {shown_name(exts[int(ext[order[twice[0]]])])}")
