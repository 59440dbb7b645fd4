"""``python -m lazyseq.cc``: which C compiler tinygrad's CPU device runs, test-compiled (``--path``:
the shim's path, for ``export CC=...``). The code is :mod:`lazyseq.loader.cc`; this module is the
command, and keeps ``lazyseq.cc.setup()`` and its companions where the docs name them.

>>> from lazyseq import cc
>>> import lazyseq.loader.cc
>>> cc.setup is lazyseq.loader.cc.setup
True
"""

import sys

from .loader.cc import SHIM, CompilerNotFound, check_device, describe, main, require, setup, zig_binary, zig_target

__all__ = ["SHIM", "CompilerNotFound", "check_device", "describe", "require", "setup", "zig_binary", "zig_target"]

if __name__ == "__main__":
    sys.exit(main())
