"""The documentation site (mkdocs.yml, docs/): every public name (``lazyseq.__all__``, the
``__all__`` of ``lazyseq.instrument``, ``lazyseq.loader.cc``, ``lazyseq.core.aio`` and ``lazyseq.store``) has an
API reference entry, and every page is in the nav.

The site itself is built by ``.ci/run`` (``mkdocs build --strict``, a few seconds), which fails on
a broken link, anchor or reference; these checks need no mkdocs, so a new public name without a
reference entry, or a new page left out of the nav, fails here too, in milliseconds.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import lazyseq

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
DIRECTIVE = re.compile(r"^::: ([\w.]+)[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n(?=[ \t]+\S))*)", re.M)


def resolve(path: str):
    """The object a mkdocstrings identifier names, found as Python finds it (module, then attributes)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def directives() -> dict[str, str]:
    """``::: identifier`` of every reference page -> its options block."""
    found: dict[str, str] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for m in DIRECTIVE.finditer(page.read_text()):
            assert m.group(1) not in found, f"{m.group(1)} is documented twice ({page.name})"
            found[m.group(1)] = m.group(2)
    return found


def test_every_directive_names_an_existing_object():
    for path in directives():
        try:
            resolve(path)
        except (ImportError, AttributeError) as e:
            pytest.fail(f"docs/reference: '::: {path}' names nothing ({e!r}): fix or remove the entry")


def test_every_public_name_has_a_reference_entry():
    documented = {id(resolve(path)) for path in directives()}
    missing = [name for name in lazyseq.__all__ if id(getattr(lazyseq, name)) not in documented]
    assert not missing, (f"lazyseq.__all__ names without an entry in docs/reference/*.md: {missing}; add "
                         f"'::: lazyseq.NAME' to the page of its family (and a row in docs/reference/index.md)")


def load_extension():
    """tools/griffe_lazyseq.py, the griffe extension of the reference (griffe comes with the docs extra)."""
    pytest.importorskip("griffe", reason="griffe comes with the docs extra")
    spec = importlib.util.spec_from_file_location("griffe_lazyseq", ROOT / "tools" / "griffe_lazyseq.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# lazyseq's public modules with an __all__ of their own, rendered whole (``::: module`` with
# ``filters: public``) so that a new name there appears without a new entry. The griffe extension
# keeps the same list (WHOLE_MODULES), to link the roles of their docstrings.
WHOLE_MODULES = ("lazyseq.instrument", "lazyseq.loader.cc", "lazyseq.core.aio")


def test_instrument_cc_aio_and_store_names_are_documented():
    found = directives()
    for module in WHOLE_MODULES:
        options = found.get(module)
        assert options is not None and "filters: public" in options and "members:" not in options, (
            f"docs/reference: '::: {module}' with 'filters: public' (and no members list) renders every name "
            f"of its __all__: {sorted(importlib.import_module(module).__all__)}")
    documented = {id(resolve(path)) for path in found}
    missing = [name for name in lazyseq.store.__all__ if id(getattr(lazyseq.store, name)) not in documented]
    assert not missing, f"lazyseq.store names without a reference entry: {missing}"


def nav_pages() -> list[str]:
    """The pages named in mkdocs.yml's nav (read as text: the file has tags PyYAML's safe loader refuses)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, re.M)


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    pages = nav_pages()
    assert len(pages) == len(set(pages)), "a page appears twice in mkdocs.yml's nav"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not set(pages) - on_disk, f"mkdocs.yml's nav names missing pages: {sorted(set(pages) - on_disk)}"
    assert not on_disk - set(pages), f"pages missing from mkdocs.yml's nav (add a line each): {sorted(on_disk - set(pages))}"


def test_docstrings_render_as_markdown():
    ext = load_extension()
    assert ext.WHOLE_MODULES == WHOLE_MODULES
    names, modules = ext.public_names(), ext.module_names()
    text = "See :func:`prefetch` and :class:`~lazyseq.core.base.View`, not :func:`read_many`.\n\n>>> 1 + 1\n2\n\nAfter."
    assert ext.fence_doctests(ext.link_roles(text, names, modules, "lazyseq.views.mapping")) == (
        "See [`prefetch`][lazyseq.prefetch] and [`View`][lazyseq.View], not `read_many`.\n\n"
        "```pycon\n>>> 1 + 1\n2\n```\n\nAfter.")
    # a name of the docstring's own module, when that module is rendered whole, wins over lazyseq's
    assert ext.link_roles(":func:`gather`", names, modules, "lazyseq.core.aio") == "[`gather`][lazyseq.core.aio.gather]"
    assert ext.link_roles(":func:`gather`", names, modules, "lazyseq.core.base") == "[`gather`][lazyseq.gather]"
    assert ext.link_roles(":func:`lazyseq.instrument.debug`", names, modules) == "[`debug`][lazyseq.instrument.debug]"
    listed = "- item:\n\n  >>> x = 1  # doctest: +SKIP\n  >>> x\n  1\n- next"
    assert ext.fence_doctests(listed) == "- item:\n\n  ```pycon\n  >>> x = 1\n  >>> x\n  1\n  ```\n- next"
    targets = set(directives())
    unlinked = [f"{name} -> {path}" for name, path in names.items() if path not in targets]
    assert not unlinked, f"roles would link to identifiers the reference does not define: {unlinked}"
