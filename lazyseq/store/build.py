"""Rebuilding a store's items from their leaf values: the manifest's structure turned into a tree
of plain functions, never into source text.

A store is data from elsewhere, so the classes its manifest names are trusted only so far: with
``allow_pickle=False`` (the default) a class is used only if its module is already imported and
it is the kind the manifest declares (a dict, list or tuple subclass; a namedtuple with the same
fields), and a defaultdict's factory only if it is a plain built-in type. Nothing is imported and
no attribute's code runs while looking (``inspect.getattr_static``). Anything else comes back as
its base type (a namedtuple made again from its name and fields), with one warning per store.

A class is made as its base type is: a dict subclass from a plain dict of its items (``cls(d)``:
``Counter(pairs)`` would count the pairs), a defaultdict from its factory and pairs, a list or
tuple subclass from its items, a namedtuple from its fields. Its constructor is the user's code:
whatever it raises becomes a StoreError naming the class, its place in the item and the store.
Manifest text in messages and warnings goes through :func:`.format.shown`.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import keyword
import sys
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..errors import StoreError
from ..helpers import warn as warn_user
from .format import path_str, shown, type_name

__all__ = ["builder"]

Build = Callable[[Any], Any]  # the leaf values (a sequence) -> the item
FACTORIES = {f"builtins:{t.__name__}": t for t in (list, dict, set, int, float, str, tuple)}


def _namedtuple(name: str, fields: tuple) -> type:
    cls = _NAMEDTUPLES.get((name, fields))
    if cls is None:
        cls = collections.namedtuple(name, fields)
        cls.__reduce__ = lambda self: (_make_namedtuple, (name, fields, tuple(self)))  # pickles by its spec
        _NAMEDTUPLES[(name, fields)] = cls
    return cls


_NAMEDTUPLES: dict[tuple, type] = {}


def _make_namedtuple(name: str, fields: tuple, values: tuple) -> tuple:
    return _namedtuple(name, fields)(*values)


class _Classes:
    """Looks up the classes a manifest names, under the policy above; remembers what it refused."""

    def __init__(self, allow_import: bool, file: str):
        self.allow_import, self.file, self.refused = allow_import, file, []

    def lookup(self, name: str) -> Any:
        module, _, qual = name.partition(":")
        try:
            obj: Any = importlib.import_module(module) if self.allow_import else sys.modules.get(module)
            for part in qual.split("."):
                obj = getattr(obj, part) if self.allow_import else inspect.getattr_static(obj, part)
            return obj
        except Exception:  # not imported, not there, or its module fails to import (allow_pickle=True)
            return None

    def resolve(self, name: str | None, base: type, fields: list | None = None) -> type:
        if name is None:
            return base
        cls = self.lookup(name)
        if isinstance(cls, type) and issubclass(cls, base) and (fields is None or list(getattr(cls, "_fields", ())) == fields):
            return cls
        if fields is not None:
            qual = name.rpartition(":")[2].rsplit(".", 1)[-1]
            return _namedtuple(qual if qual.isidentifier() and not keyword.iskeyword(qual) else "namedtuple", tuple(fields))
        self.refused.append(name)
        return base

    def factory(self, name: str | None) -> Any:
        """A defaultdict's factory, or False where the policy refuses it (the item becomes a dict)."""
        if name is None:
            return None
        if name in FACTORIES:
            return FACTORIES[name]
        if self.allow_import:
            obj = self.lookup(name)
            if callable(obj):
                return obj
        self.refused.append(f"{name} (a defaultdict's factory)")
        return False


def _values(subs: list[Build], leaves: list[int | None]) -> Build:
    """The function giving a container's item values as a tuple (one C call when all are leaves)."""
    if not leaves:
        return lambda v: ()
    if all(k is not None for k in leaves):
        if len(leaves) == 1:
            k = leaves[0]
            return lambda v: (v[k],)
        return itemgetter(*leaves)
    return lambda v: tuple([f(v) for f in subs])


def _node(node: dict, classes: _Classes, path: tuple) -> Build:
    """The function that builds the value of ``node`` (at ``path`` in the item) from the leaf values."""
    if "leaf" in node:
        return itemgetter(node["leaf"])
    if "fields" in node:  # a namedtuple: its items are at .name
        subs = [_node(n, classes, (*path, "." + str(f))) for n, f in zip(node["items"], node["fields"])]
    else:
        subs = [_node(n, classes, (*path, k)) for k, n in zip(node.get("keys", range(len(node["items"]))), node["items"])]
    get = _values(subs, [n.get("leaf") for n in node["items"]])
    if "dict" in node:
        return _dict(node, get, classes, path)
    if "list" in node:
        cls = classes.resolve(node["list"], list)
        return (lambda v: list(get(v))) if cls is list else _made(cls, get, "one", classes, path)
    cls = classes.resolve(node["tuple"], tuple, node.get("fields"))
    if cls is tuple:
        return get
    return _made(cls, get, "star" if "fields" in node else "one", classes, path)


_PAIRS = (dict.__init__, collections.OrderedDict.__init__)  # __init__s that take (key, value) pairs as a dict does


def _dict(node: dict, get: Build, classes: _Classes, path: tuple) -> Build:
    """A dict node's function: a dict subclass is made as its class is made from a dict (``cls(d)``,
    as ``Counter``, ``OrderedDict`` and most subclasses are; ``Counter(pairs)`` would count the
    pairs), a defaultdict with its factory; an ``__init__`` that takes pairs gets them, no copy."""
    keys = tuple(node["keys"])
    cls = classes.resolve(node["dict"], dict)
    if cls is not dict and issubclass(cls, collections.defaultdict):
        factory = classes.factory(node.get("factory"))
        if factory is not False:
            return _made(cls, lambda v: zip(keys, get(v)), "factory", classes, path, factory)
        cls = dict
    if cls is dict:
        return lambda v: dict(zip(keys, get(v)))
    if cls.__init__ in _PAIRS:
        return _made(cls, lambda v: zip(keys, get(v)), "one", classes, path)
    return _made(cls, lambda v: dict(zip(keys, get(v))), "one", classes, path)


def _made(cls: type, get: Build, how: str, classes: _Classes, path: tuple, factory: Any = None) -> Build:
    """The function making a container of class ``cls`` (a user's class, whose constructor may
    raise) from ``get(v)``: ``cls(x)``, ``cls(*x)`` (``how="star"``) or ``cls(factory, x)``; a
    failure is a StoreError naming the class, where it is in the item, and the store."""
    def failed(e: Exception) -> StoreError:
        return StoreError(f"{classes.file}: the {shown(type_name(cls))} at {shown(path_str(path))} of the item cannot be "
                          f"made from its saved values: {type(e).__name__}: {shown(e, 200)}; a class of a store is made as "
                          "its base type is (a dict subclass from a dict, a list subclass from a list, a namedtuple from "
                          "its fields)")

    if how == "star":
        def build(v: Any) -> Any:
            try:
                return cls(*get(v))
            except StoreError:  # an inner container's
                raise
            except Exception as e:  # the class's own code: any exception
                raise failed(e) from None
    elif how == "factory":
        def build(v: Any) -> Any:
            try:
                return cls(factory, get(v))
            except StoreError:
                raise
            except Exception as e:
                raise failed(e) from None
    else:
        def build(v: Any) -> Any:
            try:
                return cls(get(v))
            except StoreError:
                raise
            except Exception as e:
                raise failed(e) from None
    return build


def builder(structure: dict, *, allow_import: bool, file: str, warn: bool = True) -> Build:
    """The function that turns a store's leaf values into its item (built once per store). The
    structure was checked (:mod:`.checks`) before it comes here."""
    classes = _Classes(allow_import, file)
    try:
        build = _node(structure, classes, ())
    except (ValueError, TypeError) as e:  # namedtuple field names that Python refuses
        raise StoreError(f"{file} is corrupted: its structure cannot be rebuilt: {shown(e, 200)}") from None
    if classes.refused and warn:
        names = shown(", ".join(dict.fromkeys(classes.refused)), 300)
        warn_user(f"lazyseq.load: {file} names {names}, which {'is' if len(classes.refused) == 1 else 'are'} not imported "
             "or not the kind the manifest declares: those items come back as plain dicts, lists or tuples. Import "
             "the module before load, or pass allow_pickle=True for a store you trust (it imports what the store names)")
    return build
