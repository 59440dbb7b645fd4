"""Set-up with pip alone: tinygrad's CPU device compiles through pip's ziglang where there is no
clang (lazyseq/loader/cc.py, lazyseq/loader/cc.sh), and where there is nothing, lazyseq says what to install.

The subprocess tests run with an empty PATH (no clang, no cc, no zig) and an empty tinygrad
compile cache (CACHEDB), so every kernel is really compiled by what lazyseq set up.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from importlib.util import find_spec
from pathlib import Path

import pytest

from lazyseq.loader import cc

ROOT = Path(__file__).resolve().parents[1]
needs_zig = pytest.mark.skipif(cc.zig_binary() is None, reason="the ziglang package is not installed")
needs_tinygrad = pytest.mark.skipif(find_spec("tinygrad") is None, reason="tinygrad is not installed")
KERNEL = """typedef float float4 __attribute__((aligned(16),ext_vector_type(4)));
void E_4(float* restrict data0, const float* restrict data1, int core_id) {
  for (int i = 0; i < 64; i++) {
    float4 v = *((float4*)(data1 + i * 4));
    *((float4*)(data0 + i * 4)) = (float4){__builtin_sqrtf(v[0]), v[1] * 2.0f, v[2] + 0.5f, v[3]};
  }
}
"""


@pytest.fixture
def fresh_cc(monkeypatch):
    """lazyseq.cc as if never run, and CC / LAZYSEQ_ZIG as they were afterwards."""
    saved = {k: os.environ.get(k) for k in ("CC", "LAZYSEQ_ZIG")}
    monkeypatch.setattr(cc, "_state", {})
    for k in saved:
        os.environ.pop(k, None)
    yield
    for k, v in saved.items():
        os.environ.pop(k, None)
        if v is not None:
            os.environ[k] = v
    helpers = sys.modules.get("tinygrad.helpers")
    if helpers is not None:
        helpers.getenv.cache_clear()


def run_script(tmp_path: Path, script: str, hide_zig: bool = False, timeout: float = 600,
               **extra_env: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter with no compiler on PATH and an empty tinygrad cache."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "LAZYSEQ_ZIG", "DEV")}
    env.update(PATH=str(empty), CACHEDB=str(tmp_path / "tinygrad-cache.db"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p), **extra_env)
    prelude = "import sys\nsys.modules['ziglang'] = None  # as if not installed\n" if hide_zig else ""
    path = tmp_path / "script.py"
    path.write_text(prelude + textwrap.dedent(script))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


# -- the shim ------------------------------------------------------------------------------------------
def elf_machine(obj: bytes) -> int:
    assert obj[:4] == b"\x7fELF", obj[:64]
    return int.from_bytes(obj[18:20], "little")


@needs_zig
@needs_tinygrad
@pytest.mark.parametrize("arch,machine", [(["x86_64", "native"], 62), (["arm64", "generic"], 183)])
def test_shim_compiles_tinygrads_command_line(fresh_cc, monkeypatch, arch, machine):
    """tinygrad's own ClangCompiler, run through the shim: an object its loader relocates. arm64 is
    cross-compiled here (-mcpu=generic: tinygrad passes -mcpu=native on an arm64 machine, untested)."""
    from tinygrad.helpers import getenv
    from tinygrad.runtime.support.compiler_cpu import ClangCompiler
    from tinygrad.runtime.support.elf import jit_loader

    monkeypatch.setattr(cc, "clang_works", lambda *a, **k: "no 'clang' on PATH (pretended)")
    assert cc.setup() == cc.SHIM and os.environ["CC"] == cc.SHIM and os.access(os.environ["LAZYSEQ_ZIG"], os.X_OK)
    assert getenv("CC", "clang") == cc.SHIM  # tinygrad's cached getenv sees it
    obj = ClangCompiler(arch).compile(KERNEL)
    assert elf_machine(obj) == machine
    assert len(jit_loader(obj)) > 0


@needs_zig
@pytest.mark.parametrize("args,says", [
    (["-c", "--target=x86_64-none-unknown-elf", "-Wall", "-"], "unknown flag -Wall"),
    (["-c", "--target=riscv64-none-unknown-elf", "-"], "unsupported target riscv64"),
    (["-c", "--target=arm64-none-unknown-elf", "-mcpu=native+nofp16", "-"], "CPU feature lists"),
    (["-c", "-x", "c++", "--target=x86_64-none-unknown-elf", "-"], "only C"),
    (["-c", "-x", "c", "-"], "no --target"),
])
def test_shim_refuses_what_it_does_not_know(args, says):
    env = dict(os.environ, LAZYSEQ_ZIG=cc.zig_binary())
    p = subprocess.run([cc.SHIM, *args], input=b"void f(void){}", env=env, capture_output=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr.decode() and p.stderr.decode().startswith("lazyseq-cc: ")


def test_shim_without_zig_says_so(tmp_path):
    env = {"PATH": str(tmp_path)}  # no zig there, and no LAZYSEQ_ZIG
    p = subprocess.run([cc.SHIM, "-c", "--target=x86_64-none-unknown-elf", "-"], input=b"", env=env,
                       capture_output=True, timeout=60)
    assert p.returncode == 2 and b"pip install ziglang" in p.stderr


def test_shim_is_executable_and_packaged():
    assert os.access(cc.SHIM, os.X_OK), "lazyseq/loader/cc.sh lost its executable bit"
    assert Path(cc.SHIM).read_text().startswith("#!/bin/sh\n")


# -- the rule ----------------------------------------------------------------------------------------
def test_a_users_cc_is_left_alone(fresh_cc, monkeypatch):
    monkeypatch.setattr(cc, "clang_works", lambda *a, **k: pytest.fail("CC is set: nothing to check"))
    os.environ["CC"] = "/opt/my/clang"
    assert cc.setup() == "/opt/my/clang" and os.environ["CC"] == "/opt/my/clang"
    assert "leaves it alone" in cc.describe() and "LAZYSEQ_ZIG" not in os.environ


def test_a_working_clang_is_tinygrads_default(fresh_cc, monkeypatch):
    monkeypatch.setattr(cc, "clang_works", lambda *a, **k: None)
    assert cc.setup() == "clang" and "CC" not in os.environ


@needs_zig
def test_no_clang_uses_zig_once(fresh_cc, monkeypatch):
    calls = []
    monkeypatch.setattr(cc, "clang_works", lambda *a, **k: calls.append(1) or "no 'clang' on PATH")
    assert cc.setup() == cc.SHIM == cc.setup() == cc.require("x")
    assert calls == [1] and os.environ["CC"] == cc.SHIM
    assert "Zig toolchain" in cc.describe()


@pytest.mark.parametrize("machine,zig,says", [
    ("x86_64", None, "the ziglang package is not installed"),
    ("riscv64", "/usr/bin/true", "supports only x86_64 and arm64 on Linux and macOS"),
])
def test_nothing_usable_raises_what_to_install(fresh_cc, monkeypatch, machine, zig, says):
    monkeypatch.setattr(cc, "clang_works", lambda *a, **k: "no 'clang' on PATH")
    monkeypatch.setattr(cc, "zig_binary", lambda: zig)
    monkeypatch.setattr(cc, "machine_arch", lambda: machine)
    assert cc.setup() is None and "CC" not in os.environ
    with pytest.raises(cc.CompilerNotFound, match="lazyseq.to_tensor: tinygrad's CPU device") as e:
        cc.require("lazyseq.to_tensor")
    assert says in str(e.value) and "pip install 'lazyseq[tinygrad]'" in str(e.value)
    assert "apt-get install clang" in str(e.value) and "xcode-select --install" in str(e.value)


def test_import_lazyseq_leaves_the_environment_alone(tmp_path):
    """No clang on PATH, ziglang installed: ``import lazyseq`` still sets nothing (CC is set when
    tinygrad is first used through lazyseq), and does not import lazyseq.loader.cc."""
    proc = run_script(tmp_path, """
        import os, sys
        before = dict(os.environ)
        import lazyseq
        assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
        assert "lazyseq.loader.cc" not in sys.modules and "tinygrad" not in sys.modules
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


def test_python_m_lazyseq_cc_runs_without_runpy_warning(tmp_path):
    """The README's command: no "found in sys.modules after import of package" warning, and what it
    says is what it found (not "CC ... set by you or a parent process" for lazyseq's own shim)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "LAZYSEQ_ZIG")}
    env.update(PATH=str(tmp_path), PYTHONPATH=str(ROOT))
    for args in ([], ["--path"]):
        p = subprocess.run([sys.executable, "-W", "default", "-m", "lazyseq.cc", *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert "RuntimeWarning" not in p.stderr and "found in sys.modules" not in p.stderr, p.stderr
        assert "set by you or a parent process" not in p.stdout, p.stdout
    assert p.returncode == 0 and p.stdout.strip() == cc.SHIM
    env.update(CC=cc.SHIM)  # exported (as .ci/run does): said to be lazyseq's shim, set before it looked
    p = subprocess.run([sys.executable, "-m", "lazyseq.cc"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert f"CC={cc.SHIM}: lazyseq's Zig shim" in p.stdout and "RuntimeWarning" not in p.stderr, p.stdout + p.stderr


@needs_tinygrad
def test_a_dataloader_that_makes_tensors_sets_the_compiler_up(tmp_path):
    proc = run_script(tmp_path, """
        import os
        import lazyseq
        from lazyseq.loader import cc
        assert "CC" not in os.environ
        lazyseq.DataLoader(list(range(4)), batch_size=2, to_tensor=False)  # numpy batches: nothing to set
        assert "CC" not in os.environ
        lazyseq.DataLoader(list(range(4)), batch_size=2)  # Tensors: set up when built, before any batch
        print(os.environ.get("CC") == cc.setup())
    """)
    assert proc.returncode == 0 and proc.stdout == "True\n", proc.stderr + proc.stdout


def test_clang_check():
    assert cc.clang_works("no-such-compiler-here") == "no 'no-such-compiler-here' on PATH"
    if shutil.which("clang"):
        assert cc.clang_works() is None
    assert cc.clang_works("false").startswith(f"{shutil.which('false')} cannot compile for tinygrad")


def test_command_line(capsys):
    assert cc.main(["--path"]) == 0 and capsys.readouterr().out.strip() == cc.SHIM
    assert cc.main(["--nope"]) == 2


@needs_zig
def test_command_line_test_compiles_through_the_shim(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "LAZYSEQ_ZIG")}
    env.update(PATH=str(tmp_path), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "lazyseq.cc"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and f"compiler: {cc.SHIM}" in p.stdout and "test compile: ok" in p.stdout, p.stdout + p.stderr
    assert sorted(os.listdir(tmp_path)) == [], "the test compile left a file behind"
    env.update(CC=cc.SHIM, LAZYSEQ_ZIG=str(tmp_path / "no-zig"))  # a CC that cannot work: said, status 1
    p = subprocess.run([sys.executable, "-m", "lazyseq.cc"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and "test compile: " in p.stdout and "lazyseq-cc: no Zig compiler" in p.stdout, p.stdout


# -- end to end, in a fresh interpreter with no compiler on PATH ---------------------------------------
@needs_zig
@needs_tinygrad
def test_pip_only_to_tensor_and_dataloader_compute(tmp_path):
    proc = run_script(tmp_path, """
        import os
        import numpy as np
        import lazyseq
        from lazyseq.loader import cc
        from tinygrad import Tensor

        assert "CC" not in os.environ  # import lazyseq sets nothing: the first use through lazyseq does
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        t = lazyseq.to_tensor(x, "CPU")
        assert (Tensor.ones(2, 3) @ Tensor.ones(3, 2)).numpy().tolist() == [[3.0, 3.0], [3.0, 3.0]]  # tinygrad too
        assert ((t @ t.T).numpy() == x @ x.T).all()
        w = Tensor.ones(4, 1).contiguous().realize()
        data = [(np.full(4, i, np.float32), np.float32(i)) for i in range(16)]
        total = 0.0
        with lazyseq.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True) as loader:
            for xb, yb in loader:
                total += float(((xb @ w).flatten() - yb).sum().item())
        assert total == 3 * sum(range(16)), total
        print(os.environ["CC"] == cc.SHIM, cc.describe())
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("True no 'clang' on PATH: using the Zig toolchain's clang"), proc.stdout
    assert (tmp_path / "tinygrad-cache.db").stat().st_size > 0  # kernels were compiled (and cached) here


@needs_zig
@needs_tinygrad
@pytest.mark.skipif(shutil.which("clang") is None or os.environ.get("CC") == cc.SHIM,
                    reason="tests/test_demo.py runs the demo through the shim already (as .ci/run has it)")
def test_pip_only_demo_first_epoch(tmp_path):
    """The README's first command on a machine without clang (one epoch, ~45 s of CPU with an empty cache)."""
    proc = run_script(tmp_path, """
        from lazyseq import demo
        demo.main(["--epochs", "1"])
    """)
    assert proc.returncode == 0, proc.stderr
    assert "test accuracy" in proc.stdout and "0 fallbacks" in proc.stdout


@needs_tinygrad
def test_nothing_to_compile_with(tmp_path):
    """No clang, no ziglang: another device (tinygrad's PYTHON device stands in for a GPU) needs no
    compiler; the CPU says what to install, from to_tensor, the DataLoader and the demo alike."""
    proc = run_script(tmp_path, """
        import numpy as np
        import lazyseq
        from lazyseq import demo
        from lazyseq.loader import cc

        assert cc.setup() is None
        batch = {"x": np.arange(6, dtype=np.int32).reshape(2, 3), "y": np.float32(2.5), "n": 7}
        out = lazyseq.to_tensor(batch, device="PYTHON")
        assert out["x"].device == "PYTHON" and out["x"].shape == (2, 3)
        assert np.frombuffer(out["x"].uop.buffer.as_memoryview(), np.int32).tolist() == list(range(6))
        assert np.frombuffer(out["y"].uop.buffer.as_memoryview(), np.float32).tolist() == [2.5]
        doubled = (out["x"] + out["x"]).realize()  # computed on the device, no CPU kernel
        assert np.frombuffer(doubled.uop.buffer.as_memoryview(), np.int32).tolist() == [0, 2, 4, 6, 8, 10]
        loader = lazyseq.DataLoader([np.float32(i) for i in range(8)], batch_size=4, device="PYTHON")
        assert [b.device for b in loader] == ["PYTHON", "PYTHON"]

        for what, call in [("to_tensor", lambda: lazyseq.to_tensor(batch)),
                           ("to_tensor", lambda: lazyseq.to_tensor(batch, "CPU")),
                           ("to_tensor", lambda: next(iter(lazyseq.DataLoader([np.float32(1)] * 8, batch_size=4))))]:
            try:
                call()
            except cc.CompilerNotFound as e:
                assert "pip install 'lazyseq[tinygrad]'" in str(e), e
                print(what, "ok")
        try:
            demo.main(["--epochs", "1"])
        except SystemExit as e:
            assert "python -m lazyseq.demo: tinygrad's CPU device" in str(e.code), e.code
            assert "pip install 'lazyseq[tinygrad]'" in str(e.code)
            print("demo ok")
    """, hide_zig=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ["to_tensor ok"] * 3 + ["demo ok", ""], proc.stdout


@needs_tinygrad
def test_a_users_cc_that_fails_is_kept_and_noted(tmp_path):
    proc = run_script(tmp_path, """
        import subprocess
        import numpy as np
        import lazyseq
        try:
            lazyseq.to_tensor(np.ones(3, np.float32), "CPU")
        except (OSError, subprocess.CalledProcessError) as e:
            print("".join(e.__notes__))
    """, CC=shutil.which("false"))
    assert proc.returncode == 0, proc.stderr
    assert f"tinygrad compiled with CC={shutil.which('false')}, which lazyseq leaves alone" in proc.stdout, proc.stdout
