"""Every module of the package imports by its dotted name, and no public name hides a module.

``import lazyseq.x`` must give the module ``lazyseq/x.py``: a function ``lazyseq.x`` would make
``lazyseq.x`` mean two things (the attribute after ``import lazyseq``, the module for
``import lazyseq.x`` and for the documentation tools, which read the files), as ``lazyseq.collate``
did while ``default_collate`` lived in ``lazyseq/collate.py`` (now ``lazyseq/loader/batching.py``).

Optional dependencies (tinygrad, Ray, torch, Pillow, psutil ...) are imported where they are used,
never when a module is imported: the check runs in a fresh interpreter (where nothing has imported a
submodule yet, and so nothing has rebound a name) with every optional dependency made unimportable,
so every module of ``lazyseq`` and ``lazyseq.bench`` must import with the core dependencies alone."""

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

import lazyseq

# not dependencies of lazyseq (numpy, cloudpickle, tqdm): the extras', and the test tools
OPTIONAL = ("tinygrad", "ziglang", "ray", "torch", "seqtools", "PIL", "psutil", "matplotlib", "datasets", "spdl",
            "sklearn", "fsspec", "grain", "griffe", "mkdocs", "pytest", "hypothesis", "nbformat", "nbclient",
            "array_record")

CHECK = r"""
import importlib, json, pkgutil, sys, types

for dep in sys.argv[1:]:
    sys.modules[dep] = None  # import dep raises ImportError; find_spec(dep) is None
out = {"modules": [], "not_modules": {}, "failed": {}, "hidden": {}}
seen = {}  # package -> its names as its import left them, before any other submodule import rebinds one


def package_imported(pkg):
    seen.setdefault(pkg.__name__, dict(vars(pkg)))


import lazyseq

package_imported(lazyseq)


def onerror(name):
    out["failed"][name] = repr(sys.exc_info()[1])


for info in pkgutil.walk_packages(lazyseq.__path__, "lazyseq.", onerror=onerror):
    out["modules"].append(info.name)
    try:
        mod = importlib.import_module(info.name)
    except BaseException as e:  # noqa: BLE001 - reported by name
        out["failed"][info.name] = repr(e)
        continue
    if not isinstance(mod, types.ModuleType) or mod.__name__ != info.name:
        out["not_modules"][info.name] = repr(mod)
    if info.ispkg:
        package_imported(mod)
for name in out["modules"]:
    mod = sys.modules.get(name)
    package, _, last = name.rpartition(".")
    if mod is None:
        continue
    for when, value in (("after importing the package", seen.get(package, {}).get(last)),
                        ("after importing everything", getattr(sys.modules[package], last, None))):
        if value is not None and value is not mod:
            out["hidden"][name] = f"{package}.{last} is {value!r} {when}, not the module"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def walked() -> dict:
    proc = subprocess.run([sys.executable, "-c", CHECK, *OPTIONAL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_imports_by_its_dotted_name_without_the_optional_dependencies(walked):
    assert {"lazyseq.loader.batching", "lazyseq.loader.dataloader", "lazyseq.views.shape", "lazyseq.evaluation.actors",
            "lazyseq.bench", "lazyseq.bench.__main__", "lazyseq.bench.memory", "lazyseq.bench.spdl"} <= set(walked["modules"])
    assert not walked["failed"], walked["failed"]  # an optional dependency imported at the top: import it where it is used
    assert not walked["not_modules"], walked["not_modules"]


def test_no_public_name_hides_a_module(walked):
    assert not walked["hidden"], walked["hidden"]
    top = {name.split(".")[1] for name in walked["modules"]}
    for name in top:  # here too, in the test process
        assert getattr(lazyseq, name, None) in (None, importlib.import_module(f"lazyseq.{name}")), name


def test_collate_is_the_view_and_batching_holds_default_collate():
    import lazyseq.loader.batching
    import lazyseq.views.shape

    assert lazyseq.collate is lazyseq.views.shape.collate  # seqtools' collate stays
    assert list(lazyseq.collate([[1, 2], "ab"])) == [(1, "a"), (2, "b")]
    assert lazyseq.default_collate is lazyseq.loader.batching.default_collate
    assert importlib.util.find_spec("lazyseq.collate") is None
