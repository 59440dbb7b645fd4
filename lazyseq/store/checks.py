"""Checks of a store's manifest and files, made before anything they name is used.

A store is data from elsewhere (docs/store.md, "Stores from elsewhere"): every count, offset,
size, shape, dtype and file name in the manifest is checked here, against the other values and
the shard files' sizes, so that a read can only ever touch the bytes of its own item inside the
store's own files. What depends on a shard's contents (its offset and shape tables) is checked
when the shard is opened (:mod:`.read`).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np

from ..errors import StoreError
from . import format as fmt

__all__ = ["manifest", "KINDS"]

KINDS = frozenset({"array", "scalar", "none", *fmt.PYTHON, *fmt.BYTES_LIKE})
MAX_DEPTH = 64  # containers inside containers in one item
MAX_NDIM = fmt.MAX_NDIM  # numpy's limit, less the items' dimension of a fixed field's table
MAX_EMPTY_ITEMS = 2**24  # a store's length is at most its shards' bytes, or this many items that hold no data
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")  # a plain file name: no separator, no '..', not hidden


class _Bad(Exception):
    """What is wrong with the manifest (becomes a StoreError naming the file)."""


_short, _shown = fmt.short, fmt.shown  # every manifest value in a message: bounded, control characters escaped


def _int(x: Any, what: str, lo: int = 0, hi: int = 2**62) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise _Bad(f"{what} is {_short(x)}, not an int from {lo} to {hi}")
    return x


def _list(x: Any, what: str) -> list:
    if type(x) is not list:
        raise _Bad(f"{what} is {_short(x)}, not a list")
    return x


def _dict(x: Any, what: str) -> dict:
    if type(x) is not dict:
        raise _Bad(f"{what} is {_short(x)}, not an object")
    return x


def dtype(d: Any, what: str) -> np.dtype:
    """The plain-data dtype that ``d`` (numpy's .npy description) names."""
    try:
        dt = fmt.dtype_from_json(d)
    except (Exception, RecursionError) as e:
        raise _Bad(f"{what}: {_short(d)} is not a numpy dtype ({type(e).__name__})") from None
    if dt.hasobject:
        raise _Bad(f"{what} has dtype {_shown(dt)}, which holds Python objects: a store holds plain data only")
    if not dt.itemsize:
        raise _Bad(f"{what} has dtype {_shown(dt)}, of 0 bytes: a store's values take at least one byte")
    return dt


# -- the manifest ------------------------------------------------------------------------------------
def manifest(m: dict, file: str, allow_pickle: bool) -> list[np.dtype | None]:
    """Check every value of the manifest ``m`` (read from ``file``); the fields' dtypes.

    A :class:`StoreError` names the file and what is wrong; a store with pickled fields is refused
    unless ``allow_pickle``."""
    try:
        n = _int(m.get("length"), "length")
        per = _int(m.get("per_shard"), "per_shard", 1)
        fields = _list(m.get("fields"), "fields")
        dtypes = [_field(f, k) for k, f in enumerate(fields)]
        if n:
            _structure(m.get("structure"), len(fields))
        shards = _list(m.get("shards"), "shards")
        if len(shards) != -(-n // per):
            raise _Bad(f"it lists {len(shards)} shards, and {n} items at {per} per shard make {-(-n // per)}")
        names: set[str] = set()
        for k, rec in enumerate(shards):
            _shard(_dict(rec, f"shard {k}"), k, n, per, fields, dtypes, names)
        total = sum(rec["bytes"] for rec in shards)
        if n > max(total, MAX_EMPTY_ITEMS):  # what len(store) sizes (a loader's order, .sizes) is vouched for by the files
            raise _Bad(f"it lists {n} items, and its shard files hold {total} bytes: an item takes at least a byte in "
                       f"its shard, unless it holds no data (None, empty arrays), and a store holds at most "
                       f"{MAX_EMPTY_ITEMS} of those")
    except _Bad as e:
        raise StoreError(f"{file} is corrupted: {e}") from None
    pickled = [f["path"] for f in fields if f["kind"] == "pickle"]
    if pickled and not allow_pickle:
        raise StoreError(f"{file}: the field{'s' * (len(pickled) > 1)} {_shown(', '.join(pickled), 300)} of this store "
                         f"{'are' if len(pickled) > 1 else 'is'} pickled, and unpickling runs code the store chooses; "
                         "pass allow_pickle=True to lazyseq.load, only for stores you trust")
    return dtypes


def _field(f: Any, k: int) -> np.dtype | None:
    f = _dict(f, f"field {k}")
    kind, path = f.get("kind"), f.get("path")
    if type(path) is not str or type(kind) is not str or kind not in KINDS:
        raise _Bad(f"field {k} has path {_short(path)} and kind {_short(kind)}; kinds are {', '.join(sorted(KINDS))}")
    path = _shown(path)
    shape = f.get("shape")
    if shape is not None:
        for d in _list(shape, f"field {path}'s shape"):
            _int(d, f"a dimension of field {path}'s shape")
    if kind == "array":
        ndim = f.get("ndim")
        if type(ndim) is int and MAX_NDIM < ndim <= MAX_NDIM + 1:
            raise _Bad(f"field {path} has {ndim} dimensions: a store's arrays have at most {MAX_NDIM} (numpy's limit is "
                       f"{MAX_NDIM + 1}, and a field's table adds one for the items)")
        _int(ndim, f"field {path}'s ndim", 0, MAX_NDIM)
        if shape is not None and len(shape) != ndim:
            raise _Bad(f"field {path}'s shape {_short(shape)} has not {ndim} dimensions")
    if kind in ("array", "scalar"):
        return dtype(f.get("dtype"), f"field {path}")
    return fmt.PYTHON.get(kind)


def _structure(node: Any, nfields: int) -> None:
    """The container tree: known node kinds, keys and fields that match their items, the leaves
    numbering the fields in order (each used once), nested at most MAX_DEPTH deep."""
    leaves = [0]  # the next field's number
    _walk(node, 0, leaves)
    if leaves[0] != nfields:
        raise _Bad(f"its structure has {leaves[0]} leaves for {nfields} fields")


def _walk(node: Any, depth: int, leaves: list[int]) -> None:
    """One node of :func:`_structure` and the nodes below it; ``leaves[0]``: the next field's number."""
    if depth > MAX_DEPTH:
        raise _Bad(f"its structure is nested more than {MAX_DEPTH} deep")
    node = _dict(node, "a node of its structure")
    if "leaf" in node:
        if node["leaf"] != leaves[0] or type(node["leaf"]) is not int:
            raise _Bad(f"its structure names field {_short(node['leaf'])} where field {leaves[0]} comes next")
        leaves[0] += 1
        return
    kinds = [c for c in ("dict", "list", "tuple") if c in node]
    if len(kinds) != 1:
        raise _Bad(f"a node of its structure is neither a leaf nor one container: {_short(node)}")
    cls = node[kinds[0]]
    if cls is not None and (type(cls) is not str or cls.count(":") != 1):
        raise _Bad(f"its structure names the class {_short(cls)}, not 'module:qualname'")
    items = _list(node.get("items"), "a container's items")
    if kinds[0] == "dict":
        keys = _list(node.get("keys"), "a dict's keys")
        if len(keys) != len(items) or any(type(x) not in (str, int) for x in keys) or len(set(keys)) != len(keys):
            raise _Bad(f"a dict's keys {_short(keys)} are not {len(items)} distinct str or int keys")
        if node.get("factory") is not None and type(node["factory"]) is not str:
            raise _Bad(f"a defaultdict's factory is {_short(node['factory'])}")
    if "fields" in node:
        names = _list(node["fields"], "a namedtuple's fields")
        if kinds[0] != "tuple" or len(names) != len(items) or any(type(x) is not str for x in names):
            raise _Bad(f"the namedtuple fields {_short(names)} do not match its {len(items)} items")
    for item in items:
        _walk(item, depth + 1, leaves)


# -- shards ------------------------------------------------------------------------------------------
def _shard(rec: dict, k: int, n: int, per: int, fields: list, dtypes: list, names: set) -> None:
    start, stop = k * per, min(n, (k + 1) * per)
    if (rec.get("start"), rec.get("stop")) != (start, stop) or type(rec["start"]) is not int or type(rec["stop"]) is not int:
        raise _Bad(f"shard {k} holds items {_short(rec.get('start'))} to {_short(rec.get('stop'))}, "
                   f"where items {start} to {stop} belong")
    name = rec.get("file")
    if type(name) is not str or not _NAME.fullmatch(name) or name in names:
        raise _Bad(f"shard {k}'s file {_short(name)} is not a plain file name inside the store, or names another "
                   "shard's file (a path separator, '..', an absolute path or a hidden name is refused)")
    names.add(name)
    size = _int(rec.get("bytes"), f"shard {k}'s bytes")
    _int(rec.get("crc32"), f"shard {k}'s crc32", 0, 2**32 - 1)
    layouts = _list(rec.get("fields"), f"shard {k}'s fields")
    if len(layouts) != len(fields):
        raise _Bad(f"shard {k} lays out {len(layouts)} fields; the store has {len(fields)}")
    parts: list[tuple[int, int, str]] = []
    for f, lay, dt in zip(fields, layouts, dtypes):
        where = f"shard {k}, field {_shown(f['path'])}"
        parts += _layout(f, _dict(lay, f"{where}: its layout"), dt, stop - start, size, where)
    parts.sort()
    for (a, na, wa), (b, nb, wb) in itertools.pairwise(parts):
        if a + na > b and na and nb:
            raise _Bad(f"{wa} and {wb} overlap in the shard file")


def _layout(f: dict, lay: dict, dt: np.dtype | None, m: int, size: int, what: str) -> list[tuple[int, int, str]]:
    """The parts ``(offset, nbytes, name)`` of one field's layout, each checked to fit the file and
    to hold exactly what ``m`` items need."""
    def part(name: str, need: int | None = None) -> tuple[int, int, str]:
        p = lay.get(name)
        if type(p) is not list or len(p) != 2:
            raise _Bad(f"{what}: its {name} part is {_short(p)}, not [offset, nbytes]")
        off, nbytes = _int(p[0], f"{what}: its {name} offset"), _int(p[1], f"{what}: its {name} size")
        if off + nbytes > size:
            raise _Bad(f"{what}: its {name} part [{off}, {nbytes}] ends past the end of the file ({size} bytes)")
        if need is not None and nbytes != need:
            raise _Bad(f"{what}: its {name} part holds {nbytes} bytes, where {m} items need {need}")
        return off, nbytes, f"{what} ({name})"

    kind = f["kind"]
    if kind == "none":
        return []
    if kind in fmt.BYTES_LIKE:
        return [part("data"), part("offsets", 8 * (m + 1))]
    if kind == "array" and "shape" not in lay:
        return [part("data"), part("offsets", 8 * (m + 1)), part("shapes", 8 * m * f["ndim"])]
    shape = []
    if kind == "array":
        shape = _list(lay["shape"], f"{what}: its shape")
        if len(shape) != f["ndim"]:
            raise _Bad(f"{what}: its shape {_short(shape)} has not {f['ndim']} dimensions")
        for d in shape:
            _int(d, f"{what}: a dimension of its shape")
    count = m * math.prod(shape)
    if count >= 2**62:
        raise _Bad(f"{what}: {m} items of shape {tuple(shape)} are more elements than an array holds")
    item_bytes(shape, dt.itemsize, m, what)
    return [part("data", count * dt.itemsize)]


def item_bytes(shape: list, itemsize: int, m: int, what: str) -> None:
    """An item of ``shape`` (and ``m`` of them) is no larger than numpy makes, counting a 0 in the
    shape as 1 as numpy does before it makes an empty array ("array is too big"): a 0 beside huge
    dimensions holds no bytes, so no file size vouches for them."""
    one = itemsize * math.prod(d or 1 for d in shape)
    if one > fmt.ITEM_BYTES or m * one >= 2**62:
        raise _Bad(f"{what}: its shape {_short(tuple(shape))} is too large for an array (counting a 0 dimension as 1, "
                   f"more than {fmt.ITEM_BYTES} bytes an item, or 2**62 in all)")
