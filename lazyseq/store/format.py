"""The on-disk format of a store: the schema of an item (its structure and its fields), how each
field of a shard is laid out, and the small file helpers both sides share.

A store is a directory::

    manifest.json          written last: format, length, structure, fields, shards
    shard-00000-3f9a0c1e.bin ...  one file per shard (a random tag per attempt: see write.py),
                           each field's segments at 64-byte offsets

The structure is JSON: ``{"leaf": k}`` for field ``k``, or a container ``{"dict"|"list"|"tuple":
class or null, "items": [...], "keys": [...] (dicts), "fields": [...] (namedtuples)}``. A class
is ``"module:qualname"``; null is the plain built-in type. See docs/store.md for the fields.
Reading a manifest: :mod:`.checks` checks it, :mod:`.build` rebuilds items from its structure.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import re
import reprlib
from typing import Any

import numpy as np

from ..files.local import read_data

FORMAT = "lazyseq.store"
VERSION = 1
MANIFEST = "manifest.json"
PROGRESS = ".progress"  # job.json, lock, and one record per finished shard, while a save runs
JOB = "job.json"
MANIFEST_BYTES = 256 * 2**20  # no store's manifest is larger: a larger file or object is not read

# Fields: the kind of leaf, and for arrays and numpy scalars their dtype (and ndim).
PYTHON = {"bool": np.dtype(bool), "int": np.dtype("<i8"), "float": np.dtype("<f8"), "complex": np.dtype("<c16")}
BYTES_LIKE = ("str", "bytes", "bytearray", "np.str_", "np.bytes_", "pickle")
ITEM_BYTES = 2**40  # an item's size, counting a 0 in its shape as 1, is at most this: numpy's own limit, with room for a batch


def _numpy_ndim() -> int:
    """numpy's limit on an array's dimensions (32 before numpy 2, 64 since)."""
    try:
        np.empty((1,) * 64)
        return 64
    except ValueError:
        return 32


# an array field has at most this many dimensions: a fixed field's table has one more (the items)
MAX_NDIM = _numpy_ndim() - 1
_LEAF_TYPES = {bool: "bool", int: "int", float: "float", complex: "complex", str: "str", bytes: "bytes",
               bytearray: "bytearray", np.str_: "np.str_", np.bytes_: "np.bytes_", type(None): "none"}


class SchemaError(ValueError):
    """An item that cannot be stored, or whose structure differs from item 0's."""


def shard_name(k: int, tag: str) -> str:
    return f"shard-{k:05d}-{tag}.bin"


def record_name(k: int) -> str:
    return f"shard-{k:05d}.json"


# -- dtypes as JSON --------------------------------------------------------------------------------
def dtype_to_json(dt: np.dtype) -> Any:
    """numpy's ``.npy`` description of ``dt`` (a string, or a list of fields for structured dtypes)."""
    return np.lib.format.dtype_to_descr(dt)


def dtype_from_json(d: Any) -> np.dtype:
    return np.dtype(_descr(d))


def _descr(d: Any) -> Any:  # JSON turned numpy's tuples into lists: turn them back
    if isinstance(d, str):
        return d
    fields = []
    for f in d:
        name = tuple(f[0]) if isinstance(f[0], list) else f[0]  # (title, name)
        fields.append((name, _descr(f[1])) if len(f) == 2 else (name, _descr(f[1]), tuple(f[2])))
    return fields


# -- text from a file, in messages ------------------------------------------------------------------
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")  # a quick test: anything but printable ASCII is looked at


def shown(text: Any, limit: int = 120) -> str:
    """``text`` (a str from a file: a field's path, a class name; anything else as its ``str``) as
    a message shows it: at most ``limit`` characters, control and other unprintable characters
    (terminal escapes, bidirectional overrides, line breaks) escaped as ``repr`` escapes them. Every
    value of a store's manifest that enters a message, repr or warning passes through here."""
    text = text if type(text) is str else str(text)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if _UNPRINTABLE.search(text) is None or text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def short(x: Any, limit: int = 60) -> str:
    """A value from a file (any JSON value) as a message shows it: its ``repr``, bounded however
    large or deep the value (:mod:`reprlib`), cut and escaped as :func:`shown` does."""
    return shown(_REPR.repr(x), limit)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 4, 80, 80, 40


# -- the schema of one item ------------------------------------------------------------------------
def path_str(path: tuple) -> str:
    """A field's place in the item, as Python would index it: ``['image'][0]``, ``.label``."""
    return "".join(f".{p[1:]}" if isinstance(p, str) and p.startswith(".") else f"[{p!r}]" for p in path) or "(item)"


def type_name(t: type) -> str:
    return f"{t.__module__}:{t.__qualname__}"


def leaf_spec(x: Any, allow_pickle: bool) -> dict:
    """The field description of leaf ``x``; SchemaError if it cannot be stored."""
    t = type(x)
    if t is np.ndarray or t is np.memmap:
        if x.dtype.hasobject:
            return _pickled(x, allow_pickle, f"an array of dtype {x.dtype} (it holds Python objects)")
        if not x.dtype.itemsize:  # np.zeros(3, "V0"): numpy reads no value of 0 bytes from a buffer
            return _pickled(x, allow_pickle, f"an array of dtype {x.dtype} (values of 0 bytes)")
        if x.ndim > MAX_NDIM:  # a fixed field's table adds the items' dimension: numpy could not read it back
            raise SchemaError(f"cannot store an array of {x.ndim} dimensions: a store holds arrays of at most {MAX_NDIM} "
                              f"(numpy's limit is {MAX_NDIM + 1}, and a field's table adds one for the items)")
        return {"kind": "array", "dtype": dtype_to_json(x.dtype), "ndim": x.ndim}
    kind = _LEAF_TYPES.get(t)
    if kind is not None:
        return {"kind": kind}
    if isinstance(x, np.generic) and not x.dtype.hasobject and x.dtype.itemsize:  # 0 bytes: as an object
        return {"kind": "scalar", "dtype": dtype_to_json(x.dtype)}
    return _pickled(x, allow_pickle, f"a {t.__module__}.{t.__qualname__}")


def _pickled(x: Any, allow_pickle: bool, what: str) -> dict:
    if not allow_pickle:
        raise SchemaError(f"cannot store {what}: items may hold numpy arrays and scalars, Python numbers, str, "
                          "bytes and None in tuples, lists and dicts; pass allow_pickle=True to pickle other objects")
    return {"kind": "pickle"}


def schema(x: Any, allow_pickle: bool) -> tuple[Any, list[dict]]:
    """The structure of item ``x`` and its fields (each with its ``path``), in leaf order."""
    fields: list[dict] = []
    return _walk(x, (), fields, allow_pickle), fields


def _walk(v: Any, path: tuple, fields: list[dict], allow_pickle: bool) -> Any:
    """:func:`schema` of ``v`` at ``path``; its leaves appended to ``fields``."""
    t = type(v)
    if isinstance(v, dict):
        keys = list(v)
        for key in keys:
            if type(key) not in (str, int):
                raise SchemaError(f"field {path_str(path)}: dict keys must be str or int to be stored, got {key!r}")
        node = {"dict": None if t is dict else type_name(t), "keys": keys}
        if isinstance(v, collections.defaultdict) and v.default_factory is not None:
            node["factory"] = type_name(v.default_factory)
        node["items"] = [_walk(v[key], (*path, key), fields, allow_pickle) for key in keys]
        return node
    if isinstance(v, list):
        return {"list": None if t is list else type_name(t),
                "items": [_walk(e, (*path, k), fields, allow_pickle) for k, e in enumerate(v)]}
    if isinstance(v, tuple):
        names = getattr(t, "_fields", None)
        node = {"tuple": None if t is tuple else type_name(t)}
        if names is not None:
            node["fields"] = list(names)
            node["items"] = [_walk(e, (*path, "." + f), fields, allow_pickle) for f, e in zip(names, v)]
        else:
            node["items"] = [_walk(e, (*path, k), fields, allow_pickle) for k, e in enumerate(v)]
        return node
    try:
        spec = leaf_spec(v, allow_pickle)
    except SchemaError as e:
        raise SchemaError(f"field {path_str(path)}: {e}") from None
    fields.append({"path": path_str(path), **spec})
    return {"leaf": len(fields) - 1}


def mismatch(a: Any, b: Any, allow_pickle: bool) -> str | None:
    """Where and how item ``b``'s structure differs from ``a``'s schema (None: the same)."""
    sa, fa = a
    try:
        sb, fb = schema(b, allow_pickle)
    except SchemaError as e:
        return str(e)
    if sa == sb and fa == fb:
        return None
    for x, y in zip(fa, fb):
        if x != y:
            if x["path"] != y["path"]:
                break
            what = {k: (x.get(k), y.get(k)) for k in ("kind", "dtype", "ndim") if x.get(k) != y.get(k)}
            return f"field {x['path']}: " + ", ".join(f"{k} {p} in the first, {q} in the second" for k, (p, q) in what.items())
    return f"the containers differ: {_brief(sa)} in the first, {_brief(sb)} in the second"


def _brief(node: Any, depth: int = 0) -> str:
    if "leaf" in node:
        return "x"
    kind = next(k for k in ("dict", "list", "tuple") if k in node)
    name = (node[kind] or kind).split(":")[-1]
    if depth > 2:
        return f"{name}(...)"
    parts = [_brief(v, depth + 1) for v in node["items"]]
    if "keys" in node:
        parts = [f"{k!r}: {p}" for k, p in zip(node["keys"], parts)]
    elif "fields" in node:
        parts = [f"{k}={p}" for k, p in zip(node["fields"], parts)]
    return f"{name}({', '.join(parts)})"


# -- files -----------------------------------------------------------------------------------------
def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that a crash leaves the old file or the new one, whole."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path))


def fsync_path(path: str) -> None:
    """Flush a file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str, what: str) -> Any:
    """The JSON file at ``path``, opened once as a stranger's file (:mod:`lazyseq.files.local`: never
    through a link, never waiting on a FIFO, a regular file of at most :data:`MANIFEST_BYTES`).
    OSError (StoreError for a file that is not what it should be) names ``what`` and ``path``;
    FileNotFoundError when it is missing."""
    data = read_data(path, what, max_bytes=MANIFEST_BYTES)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise OSError(f"{path} ({what}) cannot be read: {type(e).__name__}: {str(e)[:200]}") from None


def pickle_dumps(x: Any) -> bytes:
    return pickle.dumps(x, protocol=5)
