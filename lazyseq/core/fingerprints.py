"""``fingerprint(view)``: what decides which item lands where in a pipeline, as a JSON value that is
equal for the same pipeline in any interpreter on any machine, and :func:`difference`, the first
part that differs between two, in the pipeline's own words.

A view's entry is its kind, its length, its parameters (its public attributes: seeds, weights,
sizes, functions by module and qualified name, ...) and the entries of the sequences it reads.
What may change by design is left out: a view's ``epoch`` (a loader's state records it), a cache's
size, a prefetch's workers (a prefetch, a cache and the instruments are transparent). A source is
its identity, which survives a copy to another machine and costs O(1) reads: a store, a digest of
its manifest; ``chunks``, the files' basenames, lengths and sizes; an array, its shape and dtype; a
list, its length. A view of its own can say more with ``fingerprint_identity()`` (a source) or
hide attributes by naming them in ``fingerprint_skip``. Computing it evaluates no item.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import sys
import types
from typing import Any

import numpy as np

from ..helpers import fname
from .moved import earlier_name
from .node import Node, length

__all__ = ["fingerprint", "difference", "NotResumable", "file_identity"]

_SKIP = frozenset({"finite", "checks_keys", "epoch", "src", "seqs", "values"})  # kept per view, or children
_SHORT = 256  # a list longer than this is digested, not listed


class NotResumable(TypeError):
    """A part of the pipeline is not a pure function of an index (an iterator, a sampler without
    state): a position in it cannot be saved."""


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def code_digest(f: Any) -> str | None:
    """A digest of a function's code (bytecode, constants, names, nested functions' code), or None."""
    code = getattr(f, "__code__", None)
    if code is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    _add_code(h, code)
    return h.hexdigest()


def _add_code(h: Any, c: types.CodeType) -> None:
    """(a function of the module, not a closure calling itself: that would be a reference cycle)"""
    h.update(c.co_code)
    h.update(repr(c.co_names).encode())
    for k in c.co_consts:
        _add_code(h, k) if isinstance(k, types.CodeType) else h.update(repr(k).encode())


def _module(f: Any) -> str:
    """``f``'s module; a script's (``__main__``) by its file's name, as ``import script`` names it."""
    module = earlier_name(getattr(f, "__module__", None) or "?")  # a fingerprint saved before a move still matches
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if path:
            return os.path.splitext(os.path.basename(path))[0]
    return module


def _function(f: Any, code: bool) -> Any:
    name = f"{_module(f)}:{getattr(f, '__qualname__', None) or fname(f)}"
    if code and (d := code_digest(f)) is not None:
        return {"function": name, "code": d}
    return name


def _value(v: Any, code: bool) -> Any:
    """A parameter as JSON: what it is, never where it is in memory."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else repr(float(v))
    if isinstance(v, range):
        return {"range": [v.start, v.stop, v.step]}
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            return {"array": list(v.shape), "dtype": str(v.dtype)}
        return {"array": list(v.shape), "dtype": str(v.dtype), "digest": _digest(np.ascontiguousarray(v).tobytes())}
    if isinstance(v, (list, tuple)):
        if len(v) <= _SHORT:
            return [_value(x, code) for x in v]
        try:
            return {"list": len(v), "digest": _digest(np.asarray(v).tobytes())}
        except (TypeError, ValueError):
            return {"list": len(v)}
    if isinstance(v, dict):
        return {str(k): _value(x, code) for k, x in v.items()}
    if isinstance(v, functools.partial):
        return {"partial": _function(v.func, code), "args": [repr(a) for a in v.args],
                "kwargs": {k: repr(a) for k, a in sorted(v.keywords.items())}}
    if callable(v) and (isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type))):
        return _function(v, code)
    if hasattr(v, "describe_json"):
        return v.describe_json()
    t = type(v)
    if t.__repr__ is not object.__repr__:  # a repr of its own says what it is; object's says where
        return {"object": f"{earlier_name(t.__module__)}:{t.__qualname__}", "repr": repr(v)}
    return {"object": f"{earlier_name(t.__module__)}:{t.__qualname__}"}


def _source(src: Any) -> dict:
    n = length(src)
    if isinstance(src, np.ndarray):
        return {"source": "array", "shape": list(src.shape), "dtype": str(src.dtype)}
    if isinstance(src, range):
        return {"source": "range", "range": [src.start, src.stop, src.step]}
    return {"source": type(src).__name__, "len": n}


def _among(v: Any, kids: tuple) -> bool:
    """Whether ``v`` is one of the view's sources, or a list or tuple of them (described under "of")."""
    if any(v is c for c in kids):
        return True
    return isinstance(v, (list, tuple)) and 0 < len(v) <= _SHORT and all(any(x is c for c in kids) for x in v)


def _entry(view: Any, code: bool, seen: dict) -> Any:
    if not isinstance(view, Node):
        return _source(view)
    if id(view) in seen:  # a view read twice (a shared subtree) is described once
        return {"same_as": seen[id(view)]}
    seen[id(view)] = len(seen)
    if getattr(view, "fingerprint_transparent", False):
        return _entry(view.src, code, seen)
    if hasattr(view, "fingerprint_identity"):
        return {"source": type(view).__name__.lower(), **view.fingerprint_identity()}
    if getattr(view, "fingerprint_refuse", None):
        raise NotResumable(view.fingerprint_refuse())
    kids = view.children()
    skip = _SKIP | set(getattr(view, "fingerprint_skip", ()))
    params = {k: _value(v, code) for k, v in sorted(vars(view).items())
              if not k.startswith("_") and k not in skip and not _among(v, kids)}
    if hasattr(view, "fingerprint_extra"):  # what a view keeps privately but decides its items
        params.update({k: _value(v, code) for k, v in view.fingerprint_extra().items()})
    # its name as the user wrote it (smap, starmap, shuffle...), without the parameters: an epoch or a
    # cache size in describe() must not make two equal pipelines differ
    return {"view": re.split(r"[(\[ ]", view.describe(), maxsplit=1)[0],
            "len": length(view) if view.finite else None, "params": params,
            "of": [_entry(c, code, seen) for c in kids]}


def fingerprint(seq: Any, *, code: bool = False) -> Any:
    """What decides which item of ``seq`` lands where, as a JSON value (equal for the same
    pipeline anywhere); ``code=True`` also digests functions by their code (a lambda edited in
    place then differs; ``lazyseq.save`` resumes only with the same code). Evaluates no item.

    >>> import lazyseq
    >>> a = lazyseq.fingerprint(lazyseq.shuffle(range(10), seed=0))
    >>> a == lazyseq.fingerprint(lazyseq.shuffle(range(10), seed=0)), a == lazyseq.fingerprint(lazyseq.shuffle(range(10), 1))
    (True, False)
    >>> from lazyseq.core.fingerprints import difference
    >>> difference(a, lazyseq.fingerprint(lazyseq.shuffle(range(10), 1)))
    'shuffle(seed=0 -> 1)'
    """
    return json.loads(json.dumps(_entry(seq, code, {})))  # plain JSON: tuples are lists, as after a save


def _name(e: dict) -> str:
    if "view" in e:
        return e["view"]
    return f"{e['source']}({e['name']!r})" if "name" in e else e["source"]


def difference(old: Any, new: Any, where: str = "") -> str | None:
    """The first part that differs between two fingerprints, in the pipeline's words (None: equal)."""
    if old == new:
        return None
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return f"{where or 'pipeline'}: {old!r} -> {new!r}"
    if old.get("view") != new.get("view") or old.get("source") != new.get("source"):
        return f"{where}{_name(old)} -> {_name(new)}"
    here = f"{where}{_name(old)}: "
    if "view" not in old:  # a source: its identity
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        k = keys[0]
        if k == "len":
            return f"{here}len {old.get('len')} -> {new.get('len')}"
        if k in ("manifest", "index"):
            return f"{here}{k} changed"
        return f"{here}{k} {old.get(k)!r:.60} -> {new.get(k)!r:.60}"
    for k in sorted(set(old["params"]) | set(new["params"])):
        a, b = old["params"].get(k), new["params"].get(k)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict) and "code" in a and a.get("function") == b.get("function"):
                return f"{where}{old['view']}({k}={a['function'].split(':')[-1]}): its code changed"
            return f"{where}{old['view']}({k}={_short(a)} -> {_short(b)})"
    if old.get("len") != new.get("len") and len(old["of"]) == len(new["of"]):
        inner = next((d for a, b in zip(old["of"], new["of"]) if (d := difference(a, b, here))), None)
        return inner or f"{here}len {old['len']} -> {new['len']}"
    if len(old["of"]) != len(new["of"]):
        return f"{here}{len(old['of'])} sources -> {len(new['of'])}"
    return next((d for a, b in zip(old["of"], new["of"]) if (d := difference(a, b, here))), f"{here}changed")


def _short(v: Any) -> str:
    r = json.dumps(v) if not isinstance(v, str) else v
    return r if len(r) <= 60 else r[:57] + "..."


def file_identity(path: str) -> dict:
    """A local file's name and size (its contents are the source's business: a manifest digest)."""
    try:
        return {"name": os.path.basename(path), "bytes": os.path.getsize(path)}
    except OSError:
        return {"name": os.path.basename(path), "bytes": None}
