"""A tar file's regular members grouped into samples as WebDataset groups them, and the index
of those samples (:class:`TarIndex`): what :func:`~lazyseq.formats.tar.index_tar` builds from a
tar's headers and :mod:`.tarcache` keeps.

The grouping is webdataset's (``webdataset.tariterators``): ``__*__`` meta names skipped, the key
the path up to the first dot of the file name (``base_plus_ext``), the rest its lower-cased
extension, consecutive members of one key one sample. Names are checked first: absolute, with a
``..`` component, or not UTF-8 is a :class:`~lazyseq.StoreError`, as is a sample with two members
of one extension (webdataset raises there too).

>>> ix = group([512, 1536, 2560], [2, 1, 1], [b"a/x.jpg", b"a/x.cls", b"y.seg.PNG"], "t.tar")
>>> len(ix), ix.key(0), ix.members(0), ix.key(1), ix.members(1), ix.span(0)
(2, 'a/x', [('jpg', 512, 2), ('cls', 1536, 1)], 'y', [('seg.png', 2560, 1)], (512, 1537))
"""

from __future__ import annotations

import re

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


def _check_names(blob: bytes, offs: list[int], raw: list[bytes], name: str) -> None:
    """Refuse an absolute name or a ``..`` component among ``raw`` (``blob``: them joined by NULs)."""
    if blob[:1] == b"/" or b"\0/" in blob or (b".." in blob and BAD_NAME.search(blob) is not None):
        k = next(k for k, n in enumerate(raw) if n.startswith(b"/") or b".." in n.split(b"/"))
        raise StoreError(f"{name} (a tar file), the member at byte {offs[k] - BLOCK} ({shown_name(raw[k])}): "
                         "an absolute name or one with '..': a dataset's tar names its members inside it")


def group(offs: list[int], lens: list[int], raw: list[bytes], name: str) -> TarIndex:
    """The members grouped into samples as webdataset's ``group_by_keys`` groups them."""
    blob = b"\0".join(raw)  # no name holds a NUL (cut there, or refused in a PAX path)
    _check_names(blob, offs, raw, name)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as e:
        k = blob.count(b"\0", 0, e.start)
        raise StoreError(f"{name} (a tar file), the member at byte {offs[k] - BLOCK} ({shown_name(raw[k])}): "
                         "its name is not UTF-8") from None
    names = text.split("\0") if raw else []
    prefixes, ids, exts = _split(names)
    pre = np.empty(len(prefixes), object)
    pre[:] = prefixes
    ext = np.asarray(ids, np.int32).reshape(-1)
    kept = np.flatnonzero(ext >= 0)
    ext = ext[kept]
    keys_of = pre[kept]
    change = np.flatnonzero(keys_of[1:] != keys_of[:-1]) + 1 if len(kept) else np.zeros(0, np.int64)
    starts = np.concatenate([[0], change, [len(kept)]]).astype(np.int64) if len(kept) else np.zeros(1, np.int64)
    _no_twice(ext, starts, kept, offs, names, exts, name)
    encoded = [k.encode("utf-8") for k in keys_of[starts[:-1]].tolist()]
    key_ends = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(k) for k in encoded], out=key_ends[1:])
    return TarIndex(np.asarray(offs, np.int64)[kept], np.asarray(lens, np.int64)[kept], ext, starts,
                    key_ends, b"".join(encoded), list(exts))


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


def _no_twice(ext: np.ndarray, starts: np.ndarray, kept: np.ndarray, offs: list[int], names: list[str],
              exts: dict[str, int], name: str) -> None:
    """Refuse a sample with two members of one extension (webdataset raises there too)."""
    if not len(ext):
        return
    sample = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    pair = sample * len(exts) + ext
    order = np.argsort(pair, kind="stable")
    twice = np.flatnonzero(np.diff(pair[order]) == 0)
    if len(twice):
        m = int(kept[order[twice[0] + 1]])
        raise StoreError(f"{name} (a tar file), the member at byte {offs[m] - BLOCK} ({shown_name(names[m])}): its sample "
                         f"holds two members with the extension {shown_name(list(exts)[int(ext[order[twice[0]]])])}")
