"""``SerializableFunc``: a function that pickles with the source of its module, as it was.

seqtools 1.4.1 has it; lazyseq provides it for code that uses it. It is rarely needed: prefetch
sends pipelines with ``cloudpickle``, which carries lambdas and closures by value already. Its use
is a pipeline pickled to disk and loaded later, after the file that defines its functions changed.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import linecache
import os
import sys
import threading
import tokenize
import types
from collections.abc import Callable
from typing import Any

__all__ = ["SerializableFunc"]


class SerializableFunc:
    """Decorate a module-level function so that pickling it saves its module's source code, and
    unpickling runs that saved source: the copy behaves as the function did when it was
    decorated, whatever became of the file since.

    Unlike seqtools, unpickling neither writes a temporary file nor touches ``sys.path``: the saved
    source runs in a module of its own (shared by every copy of the same source in a process), and
    tracebacks show its lines. Relative imports in it resolve against the original package.
    Functions that cannot be found by name in their module (lambdas, nested functions) are
    refused at decoration, rather than failing when unpickled.

    >>> import pickle
    >>> from lazyseq import SerializableFunc, helpers
    >>> f = SerializableFunc(helpers.align)
    >>> g = pickle.loads(pickle.dumps(f))
    >>> g(100), g.func is helpers.align, g.__name__
    (128, False, 'align')
    """

    def __init__(self, func: Callable):
        if isinstance(func, SerializableFunc):  # decorated twice: the same saved source
            self.name, self.source, self.module, self.package = func.name, func.source, func.module, func.package
            self.func = func.func
        else:
            self.name, self.source = _locate(func)
            self.module = getattr(func, "__module__", None) or "__main__"
            self.package = getattr(sys.modules.get(self.module), "__package__", None)
            self.func = func
        functools.update_wrapper(self, self.func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:  # a decorated method binds
        return self if obj is None else types.MethodType(self, obj)

    def __getstate__(self) -> dict:
        return {"name": self.name, "source": self.source, "module": self.module, "package": self.package}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        func = _lookup(_load(self.source, self.module, self.package), self.name)
        self.func = func.func if isinstance(func, SerializableFunc) else func
        functools.update_wrapper(self, self.func)

    def __repr__(self) -> str:
        return f"SerializableFunc({self.module}.{self.name})"


def _locate(func: Callable) -> tuple[str, str]:
    """The qualified name of ``func`` and the source of the file that defines it."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if not name or "<" in name:
        raise ValueError(f"SerializableFunc: {name or repr(func)} cannot be found by name in its module (a lambda "
                         "or a nested function); decorate a function defined at the top level of a module")
    try:
        filename = inspect.getsourcefile(func)
    except TypeError as e:  # a builtin, a C function
        raise TypeError(f"SerializableFunc: {name} has no Python source ({e})") from None
    if filename is not None and os.path.exists(filename):
        with tokenize.open(filename) as f:  # honours the file's encoding declaration
            return name, f.read()
    # no file: a saved source run by _load (a decorated function in it), or a notebook cell
    source = "".join(linecache.getlines(filename)) if filename else ""
    if not source:
        raise RuntimeError(f"SerializableFunc: failed to locate the source file of {name}")
    return name, source


_lock = threading.RLock()  # re-entrant: a saved source may unpickle another


def _load(source: str, module: str, package: str | None) -> types.ModuleType:
    """The module that runs ``source``; one per source in a process. It is registered in
    ``sys.modules`` (under a name of its own) so that what it defines pickles by reference."""
    digest = hashlib.sha256(f"{package}\0{source}".encode()).hexdigest()[:16]
    modname = f"lazyseq_serialized_{digest}"
    with _lock:
        mod = sys.modules.get(modname)
        if mod is not None:
            return mod
        filename = f"<SerializableFunc source of {module} {digest}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        mod = types.ModuleType(modname)
        mod.__file__, mod.__package__ = filename, package
        sys.modules[modname] = mod
        try:
            exec(compile(source, filename, "exec"), mod.__dict__)
        except BaseException:
            del sys.modules[modname]
            raise
        return mod


def _lookup(mod: types.ModuleType, qualname: str) -> Any:
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
