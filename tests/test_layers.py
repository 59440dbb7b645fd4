"""The package's layout follows its layers (docs/architecture.md): every import, also one inside a
function, goes to the same layer or a lower one, and no chain of imports comes back to where it
started. The imports are read from the source (nothing is run), so a function-level import that a
test never reaches counts as much as one at the top of a module."""

import ast
import importlib.util
from pathlib import Path

import pytest

import lazyseq

PACKAGE = Path(lazyseq.__file__).parent

# Each folder (or root module) once, with its layer: an import may go down or sideways, never up.
LAYERS = {
    "lazyseq.helpers": 0, "lazyseq.errors": 0,  # leaves: they import nothing of lazyseq
    "lazyseq.core": 1,  # the view machinery
    "lazyseq.files": 2,  # one file-access layer, local or URL
    "lazyseq.views": 3, "lazyseq.megatron": 3, "lazyseq.formats": 3,  # sources and views
    "lazyseq.evaluation": 4,  # prefetch and its backends
    "lazyseq.store": 5, "lazyseq.loader": 5,  # save (through prefetch), load; the DataLoader and its adapters
    "lazyseq.instrument": 6, "lazyseq": 6,  # the public face
    "lazyseq.cc": 7, "lazyseq.demo": 7, "lazyseq.tour": 7, "lazyseq.bench": 7,  # commands
}
ROOT_MODULES_AT_MOST = 8


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module of the package that ``import name`` runs (an attribute's module for ``from m import a``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Every module of the package that ``module`` imports, at its top or inside a function."""
    path, is_package = MODULES[module]
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names = [str(node.args[0].value)]
        found |= {t for n in names if n.startswith("lazyseq") and (t := _target(n)) and t != module}
    return found


GRAPH = {m: imports(m) for m in MODULES}


def layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module} has no layer: add its folder to LAYERS"
    return LAYERS[best]


def test_the_walk_sees_function_level_and_relative_imports():
    assert "lazyseq.evaluation" in GRAPH["lazyseq.store.job"]  # inside run_job
    assert "lazyseq.store.upload" in GRAPH["lazyseq.store.write"]  # inside save, for a URL
    assert "lazyseq.core.html" in GRAPH["lazyseq.core.base"]  # inside View.__repr__'s helpers
    assert {"lazyseq.core.base", "lazyseq.errors"} <= GRAPH["lazyseq.views.shape"]


def test_every_module_has_a_layer_and_imports_none_above_it():
    up = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                for m, ts in GRAPH.items() for t in ts if layer(t) > layer(m))
    assert not up, "\n".join(up)


def _cycle() -> list[str] | None:
    """One cycle of the import graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                return [*path[path.index(t):], t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    GRAPH["lazyseq.core.node"].add("lazyseq.core.base")  # base imports node: a cycle, for this test only
    try:
        cycle = _cycle()
        assert cycle[0] == cycle[-1] == "lazyseq.core.base" and "lazyseq.core.node" in cycle
    finally:
        GRAPH["lazyseq.core.node"].discard("lazyseq.core.base")


def test_the_root_holds_few_modules_and_every_folder_is_listed():
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, root
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert {f"lazyseq.{f}" for f in folders} <= set(LAYERS), folders
    assert {f"lazyseq.{m}" for m in root if m != "__init__"} <= set(LAYERS), root


@pytest.mark.parametrize("earlier", ["lazyseq.base", "lazyseq.dataloader_plan", "lazyseq.batching", "lazyseq.tensor"])
def test_earlier_module_names_are_no_files(earlier):
    """They import (pickles name them: tests/test_legacy.py) but are not modules of their own."""
    assert earlier not in MODULES and importlib.util.find_spec(earlier) is not None
