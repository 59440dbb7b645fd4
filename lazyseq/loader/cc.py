"""A C compiler for tinygrad's CPU device where the machine has none: the clang inside pip's ``ziglang``.

tinygrad (0.14) compiles every CPU kernel by running ``$CC`` (``clang`` by default) with clang's
flags, ``--target=<arch>-none-unknown-elf`` among them. It reads ``CC`` through its cached
``getenv`` when it compiles its first kernel (the CPU device compiles four of its own as it
opens), not at import. So :func:`setup`, which :func:`lazyseq.to_tensor`, the ``DataLoader`` (when
built with ``to_tensor=True``) and the demo call before tinygrad opens a device, can still point
``CC`` at the shim ``cc.sh`` beside this file: a POSIX shell script that rewrites the target into
Zig's spelling and runs ``zig cc``.

``import lazyseq`` changes nothing in ``os.environ``: ``CC`` is set when tinygrad is first used
through lazyseq. tinygrad used directly before that needs ``lazyseq.cc.setup()`` first (or ``CC``
exported: ``python -m lazyseq.cc --path``). The rule, in order:

1. ``CC`` set: left alone, whatever it is (the user's choice).
2. ``clang`` on ``PATH`` that compiles for the freestanding target: nothing to do (tinygrad's default).
3. the ``ziglang`` package importable, on x86_64 or arm64, Linux or macOS: ``CC`` = the shim,
   ``LAZYSEQ_ZIG`` = the zig binary (both inherited by child processes).
4. otherwise: no compiler; :func:`require` raises :class:`CompilerNotFound` saying what to install.

``python -m lazyseq.cc`` prints what was found and test-compiles with it (exit status 1 if that
fails); ``--path`` prints the shim's path, for ``export CC=...``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.util import find_spec

from ..errors import NotWrapped

__all__ = ["SHIM", "CompilerNotFound", "check_device", "describe", "main", "require", "setup", "zig_binary", "zig_target"]

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cc.sh")
TINYGRAD_ARCH = {"amd64": "x86_64", "aarch64": "arm64"}  # platform.machine() -> tinygrad's arch name
ZIG_ARCH = {"x86_64": "x86_64", "arm64": "aarch64"}  # tinygrad's arch -> Zig's (the shim's two)
_CHECK_TIMEOUT = 60.0  # seconds for clang to compile an empty function (a cold disk, a slow VM)
_INSTALL = ("python3 -m pip install 'lazyseq[tinygrad]' (brings the ziglang package, a clang that pip installs), "
            "or install clang (Debian/Ubuntu: apt-get install clang; macOS: xcode-select --install)")


class CompilerNotFound(NotWrapped, RuntimeError):
    """tinygrad's CPU device needs a C compiler and this machine has none that lazyseq can use."""


_state: dict[str, str | None] = {}  # "cc": what tinygrad will run (None: nothing), "why": the reason


def _uname() -> tuple[str, str]:
    if hasattr(os, "uname"):  # what platform.machine() says on POSIX, without importing platform (3 ms)
        u = os.uname()
        return u.sysname, u.machine
    import platform

    return platform.system(), platform.machine()


def machine_arch() -> str:
    """This machine's architecture as tinygrad names it (``x86_64``, ``arm64``, ...)."""
    m = _uname()[1].lower()
    return TINYGRAD_ARCH.get(m, m)


def zig_target(arch: str | None = None) -> str | None:
    """Zig's name for the freestanding target of tinygrad's ``arch`` (this machine's by default);
    ``None`` where the shim does not support the machine.

    >>> from lazyseq.cc import zig_target
    >>> zig_target("x86_64"), zig_target("arm64"), zig_target("riscv64")
    ('x86_64-freestanding-none', 'aarch64-freestanding-none', None)
    """
    z = ZIG_ARCH.get(arch or machine_arch())
    return f"{z}-freestanding-none" if z else None


def clang_works(clang: str = "clang", arch: str | None = None) -> str | None:
    """``None`` when ``clang`` compiles a freestanding object for ``arch`` (tinygrad's target);
    otherwise why not. Runs it once (~30 ms): a ``clang`` that exists may still fail (macOS's
    stub without the command line tools, a build without that target)."""
    path = shutil.which(clang)
    if path is None:
        return f"no {clang!r} on PATH"
    # the object to stdout, as tinygrad has it (zig cc given -o /dev/null leaves a "-.o" in the cwd)
    cmd = [path, "-c", "-x", "c", "-ffreestanding", "-nostdlib", f"--target={arch or machine_arch()}-none-unknown-elf",
           "-", "-o", "-"]
    try:
        p = subprocess.run(cmd, input=b"void f(void) {}\n", capture_output=True, timeout=_CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{path} failed to run: {e}"
    if p.returncode:
        return f"{path} cannot compile for tinygrad: {p.stderr.decode(errors='replace').strip()[:300]}"
    return None


def zig_binary() -> str | None:
    """The zig executable of the ``ziglang`` package, or ``None`` (found without importing it)."""
    spec = find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        exe = os.path.join(d, "zig.exe" if os.name == "nt" else "zig")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


def _shim_runnable() -> bool:
    if os.access(SHIM, os.X_OK):
        return True
    try:  # an installer that dropped the executable bit: put it back where we may
        os.chmod(SHIM, os.stat(SHIM).st_mode | 0o111)
    except OSError:
        return False
    return os.access(SHIM, os.X_OK)


def _choose() -> tuple[str | None, str]:
    """(the value for CC or None, the reason): the rule of the module docstring."""
    cc = os.environ.get("CC")
    if cc and cc == SHIM:
        return cc, (f"CC={cc}: lazyseq's Zig shim (zig: {os.environ.get('LAZYSEQ_ZIG') or zig_binary() or 'none found'}), "
                    "set before lazyseq looked (an export, your code, or a parent process that used lazyseq)")
    if cc:
        return cc, f"CC={cc} (set by you or a parent process; lazyseq leaves it alone)"
    clang = clang_works()
    if clang is None:
        return "clang", "clang on PATH"
    zig, target = zig_binary(), zig_target()
    if os.name != "posix" or target is None:
        return None, (f"{clang}, and lazyseq's Zig shim supports only x86_64 and arm64 on Linux and macOS "
                      f"(this is {' '.join(_uname())}): install clang")
    if zig is None:
        return None, f"{clang}, and the ziglang package is not installed"
    if not _shim_runnable():
        return None, f"{clang}, and lazyseq's compiler shim {SHIM} is not executable (chmod +x it)"
    return SHIM, f"{clang}: using the Zig toolchain's clang ({zig}) through {SHIM}"


def setup() -> str | None:
    """Make sure tinygrad's CPU device has a C compiler, by the rule of the module docstring;
    returns the compiler tinygrad will run (``None``: none). Cheap after the first call.

    Never overrides a ``CC`` the environment sets. Call it before tinygrad compiles its first
    kernel; :func:`lazyseq.to_tensor` and the ``DataLoader`` do.
    """
    if "cc" not in _state:
        cc, why = _choose()
        if cc == SHIM and not os.environ.get("CC"):
            os.environ["LAZYSEQ_ZIG"] = zig_binary() or ""
            os.environ["CC"] = SHIM
            helpers = sys.modules.get("tinygrad.helpers")
            if helpers is not None:  # tinygrad imported already: its getenv may have cached CC's absence
                helpers.getenv.cache_clear()
        _state.update(cc=cc, why=why)
    return _state["cc"]


def describe() -> str:
    """What :func:`setup` found, in words."""
    setup()
    return _state["why"] or ""


def message(what: str) -> str:
    """Why ``what`` cannot run tinygrad on the CPU here, and what to install."""
    return (f"{what}: tinygrad's CPU device compiles its kernels with a C compiler (clang), and none is usable here "
            f"({describe()}). Install one: {_INSTALL}. Or use another tinygrad device (device='METAL', 'CUDA', ...).")


def require(what: str) -> str:
    """The compiler tinygrad will run; raises :class:`CompilerNotFound` (a message naming ``what``
    and what to install) when there is none."""
    cc = setup()
    if cc is None:
        raise CompilerNotFound(message(what))
    return cc


def check_device(what: str, device: str | None = None) -> None:
    """Raise :class:`CompilerNotFound` if tinygrad's ``device`` (``None``: its default) cannot open
    for want of a compiler; a GPU device, or kernels already in tinygrad's cache, need none."""
    if setup() is not None:
        return
    from tinygrad import Device

    try:
        Device[Device.canonicalize(device)]  # opening the CPU device compiles its own kernels
    except Exception as e:
        raise CompilerNotFound(message(what)) from e


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--path"]:
        print(SHIM)
        return 0
    if args:
        print("usage: python -m lazyseq.cc [--path]", file=sys.stderr)
        return 2
    cc = setup()
    problem = clang_works(cc) if cc else None  # a test compile with tinygrad's target, through the shim too
    print(f"tinygrad's CPU compiler: {cc or 'none'}\n  {describe()}\n  test compile: {problem or 'ok'}")
    if cc is None:
        print(message("lazyseq"), file=sys.stderr)
    return 0 if cc and not problem else 1

