"""A griffe extension for the API reference (mkdocs.yml loads it): makes lazyseq's docstrings render.

They are markdown with doctests and a few Sphinx roles, without Google or NumPy sections, so the
reference parses them with no style (plain markdown) after two rewrites:

- a doctest (a ``>>>`` line and what follows up to a blank line) becomes a ``pycon`` code block:
  bare, markdown would read ``>>>`` as nested quotes;
- ``:func:`name```, ``:class:`~mod.Name``` and the other roles become a link to the reference entry
  when the name has one (``lazyseq.__all__``, ``lazyseq.store``'s errors, the ``__all__`` of the
  modules rendered whole: ``WHOLE_MODULES``), else a code span: a link to an undocumented internal
  would fail the strict build.

It lives outside ``docs/`` and ``lazyseq/`` because pytest imports every module there for doctests,
and griffe is only installed with the ``docs`` extra.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import griffe

import lazyseq

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|exc|data|obj):`~?([\w.]+)`")
_DOCTEST_FLAGS = re.compile(r"\s*#\s*doctest:.*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


# Modules whose reference page renders them whole (``::: module`` with ``filters: public``): their
# ``__all__`` names are documented as ``module.name``.
WHOLE_MODULES = ("lazyseq.instrument", "lazyseq.loader.cc", "lazyseq.core.aio")


def public_names() -> dict[str, str]:
    """Each public short name of ``lazyseq`` -> the identifier of its entry in the reference pages."""
    # ``lazyseq.<name>`` for each: no public name shares its name with a module of the package
    # (tests/test_package_modules.py), so griffe, which reads the files, finds what Python imports
    names = {name: f"lazyseq.{name}" for name in lazyseq.__all__}
    names.update({name: f"lazyseq.store.{name}" for name in ("SchemaError",)})
    return names


def module_names() -> dict[str, set[str]]:
    """The ``__all__`` of each module of ``WHOLE_MODULES``."""
    return {path: set(importlib.import_module(path).__all__) for path in WHOLE_MODULES}


def link_roles(text: str, names: dict[str, str], modules: dict[str, set[str]] | None = None, here: str = "") -> str:
    """``:func:`a.b.name``` -> a link to ``name``'s reference entry if it has one, else ``name`` as code.

    An unqualified name is looked up in ``here`` (the docstring's module) if that module is
    rendered whole, then among ``lazyseq``'s public names."""
    modules = modules or {}

    def replace(m: re.Match) -> str:
        target = m.group(1)
        prefix, _, last = target.rpartition(".")
        for module in (prefix,) if prefix else (here,):
            if last in modules.get(module, ()):
                return f"[`{last}`][{module}.{last}]"
        if last in names and (not prefix or target.startswith("lazyseq")):
            return f"[`{last}`][{names[last]}]"
        return f"`{last if target.startswith('lazyseq.') else target}`"
    return _ROLE.sub(replace, text)


def fence_doctests(text: str) -> str:
    """Wraps every doctest (``>>>`` up to a blank or less indented line) in a ``pycon`` fence at its
    indentation."""
    out: list[str] = []
    lines = text.split("\n")
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if out and out[-1].strip():
            out.append("")  # a fence needs a blank line before it inside a list item
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):  # as doctest reads it
            out.append(_DOCTEST_FLAGS.sub("", lines[i]))
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class LazyseqDocstrings(griffe.Extension):
    """Rewrites the docstrings of every object of the package once it is loaded."""

    def __init__(self) -> None:
        self.names, self.modules = public_names(), module_names()

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "lazyseq":  # not the packages griffe loads to resolve bases (numpy, the stdlib)
            self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            text = link_roles(obj.docstring.value, self.names, self.modules, obj.module.path)
            obj.docstring.value = fence_doctests(text)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)
