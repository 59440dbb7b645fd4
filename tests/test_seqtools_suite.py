"""seqtools 1.4.1's own test suite, run against lazyseq (``import lazyseq as seqtools``).

The suite is not copied here: it comes from seqtools' source distribution (found in
``$LAZYSEQ_TEST_CACHE``, default ``~/.cache/lazyseq-tests``, or in pip's find-links directories,
else fetched once with ``pip download``; checked against its sha256). Its ``tests/`` directory runs
in a pytest subprocess where a shim package on ``PYTHONPATH`` makes ``seqtools`` *be* ``lazyseq``
(the installed seqtools, if any, is never imported: the run checks it), with a conftest that gives
its ``@pytest.mark.timeout`` marks effect and records every outcome as it happens (a run killed at
its time limit still reports what ran). Each seqtools test is then one test here, by name.

Not run, each with its reason: the tests of seqtools internals (``IGNORED``, ``DESELECTED``) and
those asserting a seqtools behaviour that lazyseq deliberately does differently (each a row of
docs/seqtools.md). Tests that fail until the evaluation layer is fixed are ``EVALUATION_XFAIL``.
Set ``LAZYSEQ_SEQTOOLS_SDIST`` to a path to use that sdist instead of looking for one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import lazyseq

VERSION = "1.4.1"
SDIST = f"seqtools-{VERSION}.tar.gz"
SDIST_SHA256 = "615c4e23411c9fbc7351c91454607056add493b5825e821a3e7d72fbae6705e0"  # PyPI's file
RUN_TIMEOUT = float(os.environ.get("LAZYSEQ_SEQTOOLS_TIMEOUT", "600"))  # seconds, the whole run
TEST_TIMEOUT = 120  # seconds, a test without a timeout mark of its own

# Modules not collected at all (they import seqtools internals).
IGNORED = {
    "test_utils.py": "tests seqtools.utils.SeqSlice, seqtools' internal slice class (lazyseq's is base.Slice)",
}
# Tests not run: what they check and why that does not apply to lazyseq.
DESELECTED = {
    "test_instrument.py::test_debug":
        "counts debug(max_rate=10) calls over a ~1 s read and expects 10: seqtools drops the first read "
        "made within 1/max_rate s of construction, lazyseq reports it (docs/seqtools.md, "
        "'instrument.debug(..., max_rate=r)'), so lazyseq gets 10 or 11 depending on timer overshoot",
}
EVALUATION_XFAIL: set[str] = set()  # seqtools tests that fail until the evaluation layer is fixed: none now

_KW = [f"prefetch_kwargs{k}" for k in range(3)]
SUITE = [
    *(f"test_evaluation.py::test_prefetch_{name}[{kw}]"
      for name in ("random_objects", "infinite", "start_hook", "timings", "throughput") for kw in _KW),
    *(f"test_evaluation.py::test_prefetch_errors[{pickle_ok}-{kw}-{mode}]"
      for pickle_ok in ("False", "True") for kw in _KW for mode in ("wrap", "passthrough")),
    "test_evaluation.py::test_worker_crash", "test_evaluation.py::test_orphan_workers_die",
    *(f"test_indexing.py::test_{name}" for name in
      ("arange", "reindex", "case", "switch", "cycle", "interleave", "interleave_nolen", "repeat", "uniter")),
    "test_instrument.py::test_debug", "test_instrument.py::test_throughput",
    "test_mapping.py::test_smap_basics", "test_mapping.py::test_smap_exceptions[wrap]",
    "test_mapping.py::test_smap_exceptions[passthrough]", "test_mapping.py::test_starmap",
    "test_memory.py::test_cached", "test_memory.py::test_cached_timing",
    "test_serialization.py::test_SerializableFunc", "test_serialization.py::test_nestprotection",
    *(f"test_shape.py::test_{name}" for name in ("collate", "concatenate", "batching", "split")),
]

# Makes `import seqtools` (and `seqtools.instrument`, ...) give lazyseq and its modules.
SHIM = """\
import sys

import lazyseq

for _name, _mod in list(sys.modules.items()):
    if _name.startswith("lazyseq."):
        sys.modules["seqtools." + _name[len("lazyseq."):]] = _mod
sys.modules[__name__] = lazyseq
"""

# The conftest of the run: a guard, the timeout marks, and one JSON line per test phase.
CONFTEST = """\
import json
import os
import signal
import sys

import pytest

import lazyseq
import seqtools

if seqtools is not lazyseq:
    raise RuntimeError(f"seqtools is {seqtools.__file__}, not lazyseq: the shim is not first on sys.path")

REPORT = os.environ["LAZYSEQ_SUITE_REPORT"]
DEFAULT_TIMEOUT = float(os.environ["LAZYSEQ_SUITE_TEST_TIMEOUT"])


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): fail the test after that many seconds")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    mark = item.get_closest_marker("timeout")
    seconds = float(mark.args[0]) if mark and mark.args else DEFAULT_TIMEOUT

    def expire(signum, frame):
        pytest.fail(f"timeout: the test ran past its {seconds:g} s", pytrace=True)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_runtest_logreport(report):
    entry = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
             "xfail": hasattr(report, "wasxfail"), "text": report.longreprtext[-4000:]}
    with open(REPORT, "a") as f:
        f.write(json.dumps(entry) + "\\n")


def pytest_sessionfinish(session):
    strays = sorted(n for n, m in sys.modules.items()
                    if n.split(".")[0] == "seqtools" and not getattr(m, "__name__", "").startswith("lazyseq"))
    with open(REPORT, "a") as f:
        f.write(json.dumps({"nodeid": "<modules>", "strays": strays}) + "\\n")
"""


# -- the sdist ------------------------------------------------------------------------------------
def _cache_dir() -> Path:
    base = os.environ.get("LAZYSEQ_TEST_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lazyseq-tests"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked(path: Path) -> Path:
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        pytest.fail(f"{path} is not PyPI's {SDIST}: sha256 {digest}, expected {SDIST_SHA256}; delete it")
    return path


def _find_links() -> list[Path]:
    dirs = [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d).is_dir()]


def _pip_download(cache: Path) -> tuple[Path | None, str]:
    """``pip download`` the sdist into the cache (atomically); the path, or why not."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"the cache directory cannot be created ({e}); set LAZYSEQ_TEST_CACHE"
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"seqtools=={VERSION}", "--no-deps",
               "--no-binary", ":all:", "--timeout", "20", "--retries", "1", "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None, "pip download ran past 300 s"
        got = [p for p in Path(tmp).iterdir() if p.name.lower() == SDIST]
        if done.returncode or not got:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"pip download failed ({last})"
        _checked(got[0])
        os.replace(got[0], cache / SDIST)
    return cache / SDIST, ""


@functools.cache
def _sdist() -> tuple[Path | None, str]:
    given = os.environ.get("LAZYSEQ_SEQTOOLS_SDIST")
    if given:
        return _checked(Path(given)), ""
    cached = _cache_dir() / SDIST
    if cached.is_file():
        return _checked(cached), ""
    for d in _find_links():
        for p in d.iterdir():
            if p.name.lower() == SDIST:
                cached.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(_checked(p), cached)
                return cached, ""
    return _pip_download(cached.parent)


# -- the run --------------------------------------------------------------------------------------
def _extract_tests(sdist: Path, root: Path) -> Path:
    prefix = f"seqtools-{VERSION}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(root / "tests", members=members, filter="data")
    (root / "shim" / "seqtools").mkdir(parents=True)
    (root / "shim" / "seqtools" / "__init__.py").write_text(SHIM)
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "pytest.ini").write_text("[pytest]\n")  # node ids relative to tests/
    return root / "tests"


def _run(tests: Path, args: list[str], report: Path) -> dict[str, dict]:
    """Run pytest on ``tests`` with ``args``; each test's worst phase, by node id."""
    report.unlink(missing_ok=True)
    env = dict(os.environ, LAZYSEQ_SUITE_REPORT=str(report), LAZYSEQ_SUITE_TEST_TIMEOUT=str(TEST_TIMEOUT),
               PYTHONPATH=os.pathsep.join([str(tests.parent / "shim"), os.environ.get("PYTHONPATH", "")]),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tests / "pytest.ini"),
           "--rootdir", str(tests), *args]
    proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the run and any worker it left
        out, _ = proc.communicate()
        out += f"\n[killed after {RUN_TIMEOUT:g} s]"
    results: dict[str, dict] = {"<output>": {"text": out[-6000:], "returncode": proc.returncode}}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for line in report.read_text().splitlines() if report.exists() else []:
        entry = json.loads(line)
        if "when" not in entry:  # the modules seen at the end
            results[entry["nodeid"]] = entry
            continue
        if entry["when"] != "call" and entry["outcome"] == "failed":
            entry["outcome"] = "error"  # a failing fixture
        old = results.get(entry["nodeid"])
        if old is None or rank.get(entry["outcome"], 3) > rank.get(old["outcome"], 3):
            results[entry["nodeid"]] = entry
    return results


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, dict]:
    sdist, why = _sdist()
    if sdist is None:
        pytest.skip(f"no seqtools {VERSION} sdist: none in {_cache_dir()} nor in pip's find-links, and {why}")
    tests = _extract_tests(sdist, tmp_path_factory.mktemp("seqtools_suite"))
    args = [f"--ignore={name}" for name in IGNORED] + [f"--deselect={nodeid}" for nodeid in DESELECTED]
    results = _run(tests, args, tests.parent / "report.jsonl")
    # One more try for the failures: several seqtools tests time themselves on a machine that is
    # not idle; a test that passes then is reported as flaky.
    failed = sorted(n for n, r in results.items() if r.get("outcome") in ("failed", "error") and n in SUITE)
    if failed and len(failed) <= 8:
        again = _run(tests, failed, tests.parent / "rerun.jsonl")
        for nodeid in failed:
            if again.get(nodeid, {}).get("outcome") == "passed":
                results[nodeid] = {**again[nodeid], "flaky": results[nodeid]["text"]}
    return results


def test_suite_runs_as_expected(suite):
    """Every test of the suite ran, against lazyseq, and nothing else did."""
    ran = {n for n in suite if "::" in n}
    expected = {n for n in SUITE if n not in DESELECTED}
    assert ran == expected, f"missing: {sorted(expected - ran)}, unexpected: {sorted(ran - expected)}\n" \
                            f"{suite['<output>']['text']}"
    assert suite["<modules>"]["strays"] == [], "modules of the installed seqtools were imported"


def _param(nodeid: str):
    marks = [pytest.mark.xfail(strict=True, reason="lead fixes evaluation")] if nodeid in EVALUATION_XFAIL else []
    if nodeid in DESELECTED:
        marks = [pytest.mark.skip(reason=f"deselected: {DESELECTED[nodeid]}")]
    return pytest.param(nodeid, marks=marks, id=nodeid)


@pytest.mark.parametrize("nodeid", [_param(n) for n in SUITE])
def test_seqtools(suite, nodeid):
    result = suite.get(nodeid)
    assert result is not None, f"{nodeid} did not run\n{suite['<output>']['text']}"
    if result["xfail"]:  # marked xfail by seqtools itself (a throughput benchmark): either way
        return
    if "flaky" in result:
        warnings.warn(f"{nodeid} failed once, then passed:\n{result['flaky'][-1500:]}", stacklevel=1)
    assert result["outcome"] == "passed", f"{nodeid}: {result['outcome']}\n{result['text']}"


def test_exclusions_name_tests_of_the_suite():
    assert set(DESELECTED) <= set(SUITE) and EVALUATION_XFAIL <= set(SUITE)
    assert all(reason.strip() for reason in [*IGNORED.values(), *DESELECTED.values()])


# -- what the suite found, as tests of their own ----------------------------------------------------
class _LocalError(Exception):
    pass


def _raise_unpicklable(x):
    class Unpicklable(Exception):  # a local class: pickle cannot find it by name
        pass

    if x is None:
        raise Unpicklable("item is None")
    return x


def test_passthrough_unpicklable_error_from_process_worker_is_evaluation_error():
    lazyseq.seterr("passthrough")
    try:
        with lazyseq.prefetch(lazyseq.smap(_raise_unpicklable, [1, 2, None]), nworkers=1, method="process") as p:
            assert p[0] == 1
            with pytest.raises(lazyseq.EvaluationError, match="Unpicklable"):
                p[2]
    finally:
        lazyseq.seterr("wrap")


def test_wrap_unpicklable_error_from_process_worker_is_evaluation_error():
    with lazyseq.prefetch(lazyseq.smap(_raise_unpicklable, [1, 2, None]), nworkers=1, method="process") as p:
        with pytest.raises(lazyseq.EvaluationError, match="Unpicklable") as caught:
            p[2]
    assert caught.value.item == 2


def test_passthrough_picklable_error_from_process_worker_is_the_error():
    lazyseq.seterr("passthrough")
    try:
        with lazyseq.prefetch(lazyseq.smap(lambda x: 1 // x, [1, 0]), nworkers=1, method="process") as p:
            with pytest.raises(ZeroDivisionError):
                p[1]
    finally:
        lazyseq.seterr("wrap")


def test_slice_of_gather_is_a_gather_of_the_sliced_indexes():
    idx = [5, -1, 2, 0, 3, 3, 1]
    g = lazyseq.gather(list("abcdef"), idx)
    for key in [slice(None), slice(1, -1, 2), slice(-2, -6, -2), slice(None, None, -1), slice(10, 20)]:
        assert g[key].indexes == idx[key] and list(g[key]) == list(g)[key]
    arr = np.array(idx)
    ga = lazyseq.gather(list("abcdef"), arr)
    assert ga[::-2].indexes.base is arr and list(ga[::-2]) == [list("abcdef")[i] for i in idx[::-2]]
    lazy = lazyseq.gather(list("abcdef"), lazyseq.arange(6)[::-1])
    assert list(lazy[1:4]) == ["e", "d", "c"] and list(lazy[1:4].indexes) == [4, 3, 2]
    g[1:3] = ["X", "Y"]  # writes through the sliced indexes
    assert list(g)[1:3] == ["X", "Y"]


def test_concatenate_sequences_are_flattened():
    inner = lazyseq.concatenate([[1, 2], [3]])
    outer = lazyseq.concatenate([inner, [4, 5]])
    assert len(outer.sequences) == 3 and outer.sequences == outer.seqs and list(outer) == [1, 2, 3, 4, 5]


def test_infinite_repeat_slice_assignment_takes_any_number_of_values():
    r = lazyseq.repeat(3)
    r[80:91] = list(range(10))  # 11 items, 10 values: the last one stays (seqtools accepts it too)
    assert r[0] == 9 and r[10**9] == 9
    r[5:5] = [1, 2]  # an empty slice: nothing changes
    assert r[0] == 9
    r[10:2:-3] = iter([7])
    assert r[0] == 7
    with pytest.raises(ValueError, match="no value"):
        r[0:3] = []
    with pytest.raises(ValueError, match="open-ended"):
        r[5:] = [1]
    with pytest.raises(IndexError):
        r[80:-10] = list(range(10))
    with pytest.raises(ValueError, match="zero"):
        r[0:4:0] = [1]
    finite = lazyseq.repeat(3, 100)
    with pytest.raises(ValueError, match="one-to-one"):  # a finite repeat keeps list semantics, as in seqtools
        finite[80:91] = list(range(10))
    finite[80:-10] = list(range(10))
    assert list(finite) == [9] * 100


@pytest.fixture
def fresh_package(tmp_path, monkeypatch):
    """Writes a package (its ``__init__`` and ``mod``) on a temporary sys.path entry; the package's name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def make(mod: str, init: str = "") -> str:
        name = f"serial_pkg_{len(names)}_{os.getpid()}"
        names.append(name)
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(textwrap.dedent(init))
        (tmp_path / name / "mod.py").write_text(textwrap.dedent(mod))
        return name

    yield make
    for name in list(sys.modules):
        if name.split(".")[0] in names:
            del sys.modules[name]


def test_serializable_func_keeps_the_source_it_was_pickled_with(fresh_package):
    import importlib
    import pickle

    import cloudpickle

    name = fresh_package("""
        from lazyseq import SerializableFunc
        from . import helper_value

        @SerializableFunc
        def f(x):
            return x + OFFSET + helper_value()

        OFFSET = 10

        class Holder:
            @SerializableFunc
            def method(self, x):
                return 2 * x
    """, init="def helper_value():\n    return 100\n")
    mod = importlib.import_module(f"{name}.mod")
    assert mod.f(1) == 111 and mod.Holder().method(4) == 8
    saved = pickle.dumps(mod.f)
    Path(mod.__file__).write_text("def f(x):\n    return -1\n")
    mod = importlib.reload(mod)
    assert mod.f(1) == -1
    back = pickle.loads(saved)
    assert back(1) == 111 and back.__name__ == "f" and isinstance(back, lazyseq.SerializableFunc)
    assert pickle.loads(pickle.dumps(back))(2) == 112  # twice
    assert cloudpickle.loads(cloudpickle.dumps(back))(3) == 113
    assert lazyseq.SerializableFunc(back)(0) == 110  # wrapped again: the same source
    assert pickle.loads(saved).func is back.func  # one module per saved source in a process


def test_serializable_func_refuses_what_it_cannot_find_again():
    with pytest.raises(ValueError, match="lambda"):
        lazyseq.SerializableFunc(lambda x: x)

    def nested(x):
        return x

    with pytest.raises(ValueError, match="nested"):
        lazyseq.SerializableFunc(nested)
    with pytest.raises(TypeError, match="no Python source"):
        lazyseq.SerializableFunc(len)


def test_serializable_func_in_a_pipeline_through_process_workers(fresh_package):
    import importlib

    name = fresh_package("""
        from lazyseq import SerializableFunc

        @SerializableFunc
        def square(x):
            return x * x
    """)
    mod = importlib.import_module(f"{name}.mod")
    with lazyseq.prefetch(lazyseq.smap(mod.square, range(20)), nworkers=2, method="process",
                          mp_context="spawn") as p:
        assert list(p) == [x * x for x in range(20)]
