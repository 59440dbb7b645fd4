"""The members of an uncompressed tar file, found by reading its headers only, and grouped into
samples as WebDataset groups them: :func:`index_tar` gives a :class:`TarIndex`.

The headers are read as Python's :mod:`tarfile` reads them (ustar, GNU long names ``L``, PAX
``x``/``g`` headers with ``path`` and ``size``; a ustar ``prefix`` joined to the name), and every
member is grouped as ``webdataset`` does (``webdataset.tariterators``): regular files only,
``__*__`` meta names skipped, the key the path up to the first dot of the file name
(``base_plus_ext``), the rest its lower-cased extension, consecutive members of one key one sample.

A tar file is a stranger's data: a truncated header, a bad checksum, a size that is not a number or
passes the end of the file, a long name or PAX header that lies (its records' lengths past the
header, a name that is not UTF-8 or holds a NUL), a name that is absolute or holds ``..``, a link,
a device, a FIFO or a sparse member is a :class:`~lazyseq.StoreError` naming the file, the member's
offset and its name; nothing is read outside the file, nothing is allocated from a size read in it.

>>> import io, tarfile
>>> buf = io.BytesIO()
>>> with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
...     for name, data in [("a/x.jpg", b"12"), ("a/x.cls", b"3"), ("y.seg.PNG", b"4")]:
...         info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
>>> ix = index_tar(buf.getvalue(), len(buf.getvalue()), "t.tar")
>>> len(ix), ix.key(0), ix.members(0), ix.key(1), ix.members(1)
(2, 'a/x', [('jpg', 512, 2), ('cls', 1536, 1)], 'y', [('seg.png', 2560, 1)])
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import StoreError

__all__ = ["index_tar", "TarIndex", "BLOCK", "MAX_META"]

BLOCK = 512
MAX_META = 2**20  # the most bytes a long-name or PAX header may hold: no name or record is longer
BATCH = 8192  # headers whose checksums are verified at once (numpy)
ZERO = bytes(BLOCK)
REGULAR = (b"0", b"\0", b"7")  # regular files (b"7": contiguous), as tarfile's isreg, sparse aside
SKIPPED = (b"5",)  # directories: no data, nothing to read
REFUSED = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device", b"4": "a block device",
           b"6": "a FIFO", b"S": "a sparse file"}
KNOWN = set(REGULAR) | set(SKIPPED) | set(REFUSED) | {b"L", b"K", b"x", b"g", b"X"}
PAX_RECORD = re.compile(rb"([0-9]{1,20}) ")
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


def _number(field: bytes, where: str, what: str) -> int:
    """A header's number field as tarfile reads it: octal digits up to a NUL, or base-256."""
    if field[0] == 0o200:
        return int.from_bytes(field[1:], "big")
    if field[0] == 0o377:
        raise StoreError(f"{where}: its {what} is negative")
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise StoreError(f"{where}: its {what} field {field!r} is not a number: the header is corrupted") from None


def _shown(name: bytes | str) -> str:
    """A member's name for a message: printable, bounded."""
    text = name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name
    text = repr(text)
    return text if len(text) <= 160 else text[:160] + "...'"


def _pax(data: bytes, where: str) -> dict[str, bytes]:
    """The records of a PAX header (``"%d %s=%s\\n"``), each length checked to frame its record."""
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        m = PAX_RECORD.match(data, pos)
        n = int(m.group(1)) if m else 0
        end = pos + n - 1  # the record's last byte: its newline
        if not m or n < 5 or end >= len(data) or data[end] != 0x0A:
            raise StoreError(f"{where}: a PAX header whose record at byte {pos} is malformed or passes the header's "
                             f"end ({len(data)} bytes): the file is corrupted")
        keyword, eq, value = data[m.end():end].partition(b"=")
        if not keyword or not eq:
            raise StoreError(f"{where}: a PAX header whose record at byte {pos} has no keyword=value")
        out[keyword.decode("utf-8", "replace")] = value
        pos = end + 1
    return out


def _pax_fields(pax: dict[str, bytes], where: str) -> tuple[bytes | None, int | None]:
    """``(path, size)`` that PAX records set (None where they set none)."""
    if any(k.startswith("GNU.sparse") for k in pax):
        raise StoreError(f"{where}: a sparse member (GNU sparse PAX records): not supported; write the tar without "
                         "sparse files")
    size = pax.get("size")
    if size is not None:
        if not size.isdigit() or len(size) > 20:
            raise StoreError(f"{where}: a PAX header whose size {_shown(size)} is not a number")
        size = int(size)
    path = pax.get("path")
    if path is not None:
        if b"\0" in path:
            raise StoreError(f"{where}: a PAX header whose path {_shown(path)} holds a NUL byte")
        path = path.rstrip(b"/")
    return path, size


def _stated_sums(fields: np.ndarray, one: Any) -> np.ndarray:
    """The checksum each header states (its field at bytes 148-156): octal digits between spaces,
    up to a NUL, parsed at once; any other form of the field by :func:`_number`, one by one
    (``one(k)``: the field of row ``k`` and where it is, for a message)."""
    col = np.arange(8)
    isnul = fields == 0
    end = np.where(isnul.any(1), isnul.argmax(1), 8)[:, None]
    inside = col < end
    digit = (fields >= 48) & (fields <= 55) & inside
    last = 7 - digit[:, ::-1].argmax(1)
    first = digit.argmax(1)
    plain = (~inside | digit | (fields == 32)).all(1) & ((digit.sum(1) == last - first + 1) | ~digit.any(1))
    power = np.where(digit, 8 ** np.clip(last[:, None] - col, 0, 7), 0)
    out = ((fields.astype(np.int64) - 48) * power).sum(1)
    for k in np.flatnonzero(~plain).tolist():
        out[k] = _number(*one(k), "checksum")
    return out


class _Walk:
    """One pass over the headers of a tar file (see :func:`index_tar`): a tight loop reads the two
    fields that lead to the next header (type, size); then, in batches, numpy verifies the
    checksums and reads the names of the plain members."""

    def __init__(self, buf: Any, size: int, name: str):
        self.buf, self.size, self.name = buf, size, name
        self.at: list[int] = []  # every header's offset
        self.offsets: list[int] = []  # data offset, size and name (None: read in a batch) of each regular member
        self.sizes: list[int] = []
        self.names: list[bytes | None] = []

    def where(self, pos: int, name: bytes | None = None) -> str:
        return f"{self.name} (a tar file), the member at byte {pos}" + (f" ({_shown(name)})" if name is not None else "")

    def meta(self, pos: int, n: int, what: str) -> bytes:
        """The data of a long-name or PAX header at ``pos``: at most MAX_META bytes, inside the file."""
        if n > MAX_META or pos + BLOCK + n > self.size:
            raise StoreError(f"{self.where(pos)}: {what} says it holds {n} bytes, "
                             f"{'more than any such header' if pos + BLOCK + n <= self.size else 'past the end of the file'}")
        return bytes(self.buf[pos + BLOCK:pos + BLOCK + n])

    def run(self) -> None:
        buf, size, pos = self.buf, self.size, 0
        at, offsets, sizes, names = self.at, self.offsets, self.sizes, self.names
        pending: Any = 0  # 1: a PAX header that sets nothing read came; a dict: headers that name the next member
        while pos + BLOCK <= size:
            kind = buf[pos + 156]
            if kind == 48 or kind == 120:  # a regular file or a PAX header: the common cases, here
                field = buf[pos + 124:pos + 136]
                try:  # the common form: 11 octal digits and a NUL or a space
                    n = int(field[:11], 8) if field[11] == 0 or field[11] == 32 else -1
                except ValueError:
                    n = -1
                if n < 0:
                    n = _number(field, self.where(pos), "size")
                end = pos + BLOCK + n
                if kind == 48 and pending.__class__ is int:
                    if end > size:
                        self.past_end(pos, n, None)
                    at.append(pos)
                    offsets.append(pos + BLOCK)
                    sizes.append(n)
                    names.append(None)
                    pos = (end + BLOCK - 1) & -BLOCK
                    pending = 0
                    continue
                if kind == 120 and not pending:  # read in full at its member only if it sets what is read
                    data = self.meta(pos, n, "a PAX header")
                    pending = {"pax": data} if (b"path=" in data or b"size=" in data or b"GNU.sparse" in data) else 1
                    at.append(pos)
                    pos = (end + BLOCK - 1) & -BLOCK
                    continue
            head = bytes(buf[pos:pos + BLOCK])
            if head == ZERO:
                break
            at.append(pos)
            pos, pending = self.other(pos, head, _number(head[124:136], self.where(pos), "size"), pending)
        else:
            if pos != size:
                raise StoreError(f"{self.where(pos)}: a truncated header ({size - pos} bytes of {BLOCK}): the file is "
                                 "cut short")
        if pending.__class__ is not int:
            raise StoreError(f"{self.where(pos)}: the archive ends after a long-name or PAX header")
        self.verify()

    def past_end(self, pos: int, n: int, name: bytes | None) -> None:
        raise StoreError(f"{self.where(pos, name)}: its size ({n} bytes) passes the end of the file "
                         f"({self.size} bytes): the file is truncated or corrupted")

    def other(self, pos: int, head: bytes, n: int, pending: Any) -> tuple[int, Any]:
        """Any header but a plain regular file's or a first PAX header's: ``(next header, pending)``."""
        kind = head[156:157]
        state = pending if pending.__class__ is dict else {"pax": True} if pending else {}
        if kind in (b"L", b"K", b"x", b"X", b"g"):
            data = self.meta(pos, n, "a GNU long-name header" if kind in (b"L", b"K") else "a PAX header")
            if kind == b"g":  # what a global header sets is ignored, as tarfile does, unless it would name or size members
                if any(k in ("path", "size") or k.startswith("GNU.sparse") for k in _pax(data, self.where(pos))):
                    raise StoreError(f"{self.where(pos)}: a global PAX header sets the path, size or sparse map of "
                                     "every member: not supported")
                return pos + BLOCK + ((n + BLOCK - 1) & -BLOCK), pending
            if kind != b"K":
                slot = "long" if kind == b"L" else "pax"
                if state.get(slot) is not None:
                    raise StoreError(f"{self.where(pos)}: two {'GNU long-name' if slot == 'long' else 'PAX'} headers "
                                     "for one member")
                state[slot] = data.split(b"\0", 1)[0] if slot == "long" else data
            return pos + BLOCK + ((n + BLOCK - 1) & -BLOCK), state or {"link": True}
        return self.member(pos, head, kind, n, state), 0

    def member(self, pos: int, head: bytes, kind: bytes, n: int, state: dict) -> int:
        """Record the member whose header is at ``pos`` (after long-name or PAX headers: ``state``);
        the offset of the next header."""
        long_name, pax = state.get("long"), state.get("pax")
        name = head[:100].split(b"\0", 1)[0]
        if long_name is None:
            prefix = head[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        else:
            name = long_name
        if isinstance(pax, bytes):
            path, pax_size = _pax_fields(_pax(pax, self.where(pos)), self.where(pos, name))
            if path is not None:
                if long_name is not None:
                    raise StoreError(f"{self.where(pos, name)}: both a GNU long name and a PAX path name it")
                name = path
            n = n if pax_size is None else pax_size
        if kind in REFUSED:
            raise StoreError(f"{self.where(pos, name)} is {REFUSED[kind]}: a dataset's tar holds regular files only; "
                             "write the tar without it")
        if kind == b"5" or (kind == b"\0" and name.endswith(b"/")):
            return pos + BLOCK  # a directory: tarfile reads no data after its header
        if pos + BLOCK + n > self.size:
            self.past_end(pos, n, name)
        if kind in REGULAR:
            self.offsets.append(pos + BLOCK)
            self.sizes.append(n)
            self.names.append(name)
        # an unknown type's data is skipped, as tarfile does
        return pos + BLOCK + ((n + BLOCK - 1) & -BLOCK)

    def rows(self, at: list[int]) -> np.ndarray:
        """The headers at offsets ``at`` as an ``(n, 512)`` array."""
        buf = self.buf
        if isinstance(buf, _Window):
            return np.frombuffer(b"".join(buf.block(p) for p in at), np.uint8).reshape(-1, BLOCK)
        blocks = np.frombuffer(buf, np.uint8, self.size // BLOCK * BLOCK).reshape(-1, BLOCK)  # no copy
        return blocks[np.asarray(at, np.int64) // BLOCK]

    def verify(self) -> None:
        """Check every header's checksum, and read the plain members' names, a batch at a time."""
        for a in range(0, len(self.at), BATCH):
            at = self.at[a:a + BATCH]
            h = self.rows(at)
            field = h[:, 148:156]
            stated = _stated_sums(field, lambda k, h=h, at=at: (bytes(h[k, 148:156]), self.where(at[k])))
            halves = h.reshape(-1, 2, BLOCK // 2).sum(2, dtype=np.uint16)  # (exact: 256 * 255 < 2**16; fast)
            unsigned = halves.sum(1, dtype=np.int64) - field.sum(1, dtype=np.int64) + 8 * 32
            bad = np.flatnonzero(stated != unsigned)
            if len(bad):
                hb = h[bad].view(np.int8)
                signed = hb.sum(1, dtype=np.int64) - hb[:, 148:156].sum(1, dtype=np.int64) + 8 * 32
                bad = bad[stated[bad] != signed]
            if len(bad):
                raise StoreError(f"{self.where(at[int(bad[0])])}: a bad header checksum: the file is corrupted, or not "
                                 "a tar file")
        missing = [k for k, n in enumerate(self.names) if n is None]
        for a in range(0, len(missing), BATCH):
            ks = missing[a:a + BATCH]
            for k, name in zip(ks, _names(self.rows([self.offsets[k] - BLOCK for k in ks]))):
                self.names[k] = name


def _names(h: np.ndarray) -> list[bytes]:
    """The names of the ustar headers ``h`` (``(n, 512)``), as tarfile reads them: the name field up
    to its first NUL, after the prefix field (up to its first NUL) and a slash where it has one."""
    out = np.ascontiguousarray(h[:, :100]).view("S100").ravel().tolist()  # (trailing NULs dropped)
    if b"\0" in b"".join(out):  # a byte after the first NUL of a name: the name ends there
        out = [n.split(b"\0", 1)[0] for n in out]
    for k in np.flatnonzero(h[:, 345]).tolist():
        out[k] = bytes(h[k, 345:500]).split(b"\0", 1)[0] + b"/" + out[k]
    return out


class _Window:
    """A URL's bytes read in windows of ``chunk`` bytes (the headers of a shard of small members come
    in a few requests; a large member's data is skipped); the header blocks read are kept."""

    def __init__(self, f: Any, chunk: int = 4 * 2**20):
        self.f, self.chunk, self.start, self.data = f, chunk, 0, b""
        self.blocks: dict[int, bytes] = {}

    def _have(self, a: int, b: int) -> None:
        if not (self.start <= a and b <= self.start + len(self.data)):
            self.start = a
            self.data = self.f.remote.read_ranges([self.f.request(a, min(self.f.size, a + max(self.chunk, b - a)))],
                                                  cache=False)[0]

    def __getitem__(self, s: Any) -> Any:
        if isinstance(s, int):
            p = s - s % BLOCK  # a header's field: its block is kept for the checksums
            self._have(p, p + BLOCK)
            self.blocks[p] = self.data[p - self.start:p - self.start + BLOCK]
            return self.data[s - self.start]
        self._have(s.start, s.stop)
        return self.data[s.start - self.start:s.stop - self.start]

    def block(self, p: int) -> bytes:
        return self.blocks[p]


def _check_names(blob: bytes, offs: list[int], raw: list[bytes], name: str) -> None:
    """Refuse an absolute name or a ``..`` component among ``raw`` (``blob``: them joined by NULs)."""
    if blob[:1] == b"/" or b"\0/" in blob or (b".." in blob and BAD_NAME.search(blob) is not None):
        k = next(k for k, n in enumerate(raw) if n.startswith(b"/") or b".." in n.split(b"/"))
        raise StoreError(f"{name} (a tar file), the member at byte {offs[k] - BLOCK} ({_shown(raw[k])}): "
                         "an absolute name or one with '..': a dataset's tar names its members inside it")


def _group(offs: list[int], lens: list[int], raw: list[bytes], name: str) -> TarIndex:
    """The members grouped into samples as webdataset's ``group_by_keys`` groups them."""
    blob = b"\0".join(raw)  # no name holds a NUL (cut there, or refused in a PAX path)
    _check_names(blob, offs, raw, name)
    try:
        names = blob.decode("utf-8").split("\0") if raw else []
    except UnicodeDecodeError as e:
        k = blob.count(b"\0", 0, e.start)
        raise StoreError(f"{name} (a tar file), the member at byte {offs[k] - BLOCK} ({_shown(raw[k])}): "
                         "its name is not UTF-8") from None
    ids, starts, keys = [], [], []  # ids: each member's extension (-1: not in a sample)
    exts: dict[str, int] = {}
    of_raw: dict[str, int] = {}  # an extension as named -> its id (lower-cased)
    match, skip = BASE_PLUS_EXT.match, SKIP_META.match
    current = None
    for k, fname in enumerate(names):
        m = None if fname[:2] == "__" and (("/" not in fname and fname.endswith("__")) or skip(fname)) else match(fname)
        if m is None:  # webdataset's meta names, names without an extension: in no sample
            ids.append(-1)
            continue
        prefix, suffix = m.groups()
        e = of_raw.get(suffix)
        if e is None:
            e = of_raw[suffix] = exts.setdefault(suffix.lower(), len(exts))
        ids.append(e)
        if prefix != current:
            current = prefix
            starts.append(k)
            keys.append(prefix)
    ext = np.asarray(ids, np.int32)
    kept = np.flatnonzero(ext >= 0)
    first = np.searchsorted(kept, np.asarray(starts, np.int64))  # sample starts among the kept members
    starts_kept = np.append(first, len(kept)).astype(np.int64)
    _no_twice(ext[kept], starts_kept, kept, offs, names, exts, name)
    encoded = [k.encode("utf-8") for k in keys]
    key_ends = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(k) for k in encoded], out=key_ends[1:])
    return TarIndex(np.asarray(offs, np.int64)[kept], np.asarray(lens, np.int64)[kept], ext[kept], starts_kept,
                    key_ends, b"".join(encoded), list(exts))


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
        raise StoreError(f"{name} (a tar file), the member at byte {offs[m] - BLOCK} ({_shown(names[m])}): its sample "
                         f"holds two members with the extension {_shown(list(exts)[int(ext[order[twice[0]]])])}")


def index_tar(buf: Any, size: int, name: str) -> TarIndex:
    """The samples of the tar file whose bytes are ``buf`` (a memory map or bytes; or a
    :class:`~lazyseq.files.RemoteFile`, read in windows) and which holds ``size`` bytes; ``name``
    names it in messages."""
    if hasattr(buf, "remote") and hasattr(buf, "request"):
        buf = _Window(buf)
    if size >= 2 and bytes(buf[0:2]) == b"\x1f\x8b":
        raise StoreError(f"{name} is gzip-compressed, not a tar file: a compressed tar cannot be read at random; "
                         "decompress it (gunzip) and read the .tar")
    walk = _Walk(buf, size, name)
    walk.run()
    return _group(walk.offsets, walk.sizes, walk.names, name)
