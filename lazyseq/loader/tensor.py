"""``to_tensor``: nested batches of numpy arrays to realised tinygrad Tensors, copied out of their memory.

tinygrad is optional: it is imported on the first call, not by ``import lazyseq``.

Route (measured by ``python -m lazyseq.bench tensor``, see docs/tensor.md): on the CPU device each
array is copied straight into the host memory of a fresh ``Tensor.empty`` buffer with one
``numpy.copyto`` (which also makes strided arrays contiguous on the way). That skips tinygrad's
scheduler, which ``Tensor(arr).realize()`` runs for every array: 1.6x (38 MB) to 7x (small arrays) faster.
``Tensor.from_blob(...).contiguous()`` and ``.to('CPU')`` are no-ops on a CPU blob (the result still
reads the numpy memory) and ``.clone()`` compiles and runs a copy kernel, slower than ``copyto``.
Other devices use tinygrad's own ``Tensor(arr, device=d)``, realised once per batch; tinygrad reads
the numpy memory during that call or keeps a reference to it until its copy is done.
"""

from __future__ import annotations

import subprocess
import weakref
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import tree
from ..helpers import ALIGN
from .batching import HostInt

if TYPE_CHECKING:
    from tinygrad import Tensor

__all__ = ["to_tensor"]

_INSTALL = "pip install 'lazyseq[tinygrad]'"


def prepare(what: str, alternative: str = "") -> str | None:
    """Before lazyseq feeds tinygrad (a ``DataLoader`` that makes Tensors): tinygrad must be
    installed (else ``ImportError`` saying ``what`` needs it and how to install it; tinygrad is not
    imported), and its CPU device gets a C compiler (:func:`lazyseq.cc.setup`, which sets ``CC``
    where there is no clang: lazyseq changes the environment only then, never at import).
    Returns that compiler (``None``: none)."""
    if find_spec("tinygrad") is None:
        raise ImportError(f"{what}, and tinygrad is not installed: {_INSTALL}{f', {alternative}' if alternative else ''}")
    from . import cc

    return cc.setup()


def _need_tinygrad() -> str | None:
    """Imports tinygrad, with a C compiler set up for its CPU device first (:mod:`lazyseq.cc`:
    clang, or the ziglang shim); returns that compiler (``None``: none)."""
    from . import cc as _cc

    cc = _cc.setup()  # before tinygrad compiles anything: it reads CC once, at its first compile
    try:
        import tinygrad  # noqa: F401
    except ImportError as e:
        raise ImportError(f"lazyseq.to_tensor needs tinygrad: {_INSTALL}") from e
    return cc


def to_tensor(x: Any, device: str | None = None, copy: bool = True) -> Any:
    """``x`` with every numpy array and number in it turned into a realised tinygrad ``Tensor`` on ``device``.

    Tuples, lists and dicts (namedtuples and subclasses too, by the rule of :mod:`lazyseq.core.tree`)
    are rebuilt with their own types; strings, ``None`` and other objects, and arrays of strings or objects, are returned
    unchanged. Call it once per batch: the whole structure is converted in one call.

    - ``device``: a tinygrad device name (``'CPU'``, ``'CUDA'``, ...); ``None``: tinygrad's default.
      The CPU device compiles its kernels with clang, or with pip's ziglang where there is none
      (:mod:`lazyseq.cc`); with neither it raises :class:`lazyseq.cc.CompilerNotFound`, saying what
      to install. Other devices need no C compiler.
    - dtypes are kept (bool, (u)int8/16/32/64, float16/32/64; float64 stays float64 on the CPU). On a
      device that cannot compute a dtype natively (float64 on some GPUs, WebGPU) tinygrad either
      emulates it or fails when a kernel uses it: cast the arrays first (``astype(np.float32)``) if
      that matters. Complex arrays and numbers raise ``TypeError`` (tinygrad has no complex dtype).
    - numpy scalars and 0-d arrays become 0-d Tensors of their dtype; Python numbers take
      tinygrad's defaults (``bool``, ``dtypes.default_int``, ``dtypes.default_float``), except a
      :class:`lazyseq.loader.batching.HostInt` (``varlen_collate``'s ``max_seqlen``), left a Python int. Every
      result is a real buffer on ``device`` (tinygrad's own ``Tensor(0-d array)`` is a deviceless
      constant instead).
    - Tensors are returned as they are, or moved (and realised) when ``device`` differs.
    - ``copy=True``: the data is copied, so the numpy memory (say a ``prefetch`` shared-memory
      slot) can be overwritten or reused as soon as this returns.
    - ``copy=False``: an array on the CPU device that is C-contiguous, writable, native-endian,
      not empty and 64-byte aligned (as arrays delivered from ``prefetch`` slots are) becomes a
      zero-copy Tensor over the numpy memory, which keeps the array (hence its slot) alive for as
      long as the Tensor's buffer lives; writes to either side show in the other. Every other
      array, and every array for a non-CPU device, is copied as with ``copy=True``. A Tensor that
      holds a ``prefetch`` slot keeps the slot from being reused: drop it before the reader needs
      the slot again, or ``prefetch`` falls back to its pipe with a warning.

    >>> import lazyseq, numpy as np
    >>> from lazyseq.loader.tensor import to_tensor
    >>> batch = {"image": np.ones((2, 3), np.uint8), "label": np.array([3, 1]), "name": "a"}
    >>> out = to_tensor(batch, "CPU")
    >>> out["image"].shape, out["image"].dtype, out["label"].tolist(), out["name"]
    ((2, 3), dtypes.uchar, [3, 1], 'a')
    >>> batch["label"][:] = 0  # the Tensor holds a copy
    >>> out["label"].tolist()
    [3, 1]
    """
    cc = _need_tinygrad()
    from tinygrad import Device, Tensor, dtypes
    from tinygrad.dtype import DType

    from . import cc as _cc

    dev = None
    try:
        dev = Device.canonicalize(device)
        pending: list[Tensor] = []  # Tensors tinygrad itself copies: realised together at the end
        out = _convert(x, _Ctx(Tensor, dtypes, DType, device, dev, copy, pending))
        if pending:
            pending[0].realize(*pending[1:])
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        # tinygrad's own words are "no usable devices" or a failed `clang` run: say what to install
        cpu = dev is None or dev.split(":")[0] == "CPU"
        if cc is None and cpu and not isinstance(e, _cc.CompilerNotFound):
            raise _cc.CompilerNotFound(_cc.message("lazyseq.to_tensor")) from e
        if cpu and isinstance(e, (OSError, subprocess.CalledProcessError)) and cc not in ("clang", _cc.SHIM):
            e.add_note(f"lazyseq.to_tensor: tinygrad compiled with CC={cc}, which lazyseq leaves alone; it must take "
                       "clang's flags. Unset CC to let lazyseq pick clang or the ziglang shim (python -m lazyseq.cc)")
        raise
    return out


class _Ctx:
    __slots__ = ("Tensor", "dtypes", "DType", "device", "dev", "cpu", "copy", "pending")

    def __init__(self, tensor: Any, dtypes: Any, dtype: Any, device: str | None, dev: str, copy: bool, pending: list):
        self.Tensor, self.dtypes, self.DType, self.device, self.dev = tensor, dtypes, dtype, device, dev
        self.copy, self.pending = copy, pending
        self.cpu = dev.split(":")[0] == "CPU"


def _convert(x: Any, c: _Ctx) -> Any:
    return tree.map(lambda v: _leaf(v, c), x)


def _leaf(x: Any, c: _Ctx) -> Any:
    if isinstance(x, np.ndarray):
        return _array(x, c)
    if isinstance(x, (str, bytes, bytearray)) or x is None:
        return x
    if isinstance(x, np.generic):
        a = np.asarray(x)
        return _array(a, c) if a.dtype.kind in "biufc" else x
    if isinstance(x, (bool, int, float, complex)):
        if type(x) is HostInt:  # a kernel argument (varlen_collate's max_seqlen): stays a Python int
            return x
        return _array(_pyscalar(x, c.dtypes), c)
    if isinstance(x, c.Tensor):
        if c.device is None or x.device == c.dev:
            return x
        c.pending.append(t := x.to(c.dev))
        return t
    return x


def _pyscalar(x: bool | int | float | complex, dtypes: Any) -> np.ndarray:
    if isinstance(x, complex):
        raise TypeError(f"to_tensor: tinygrad has no complex dtype (got {x!r})")
    dt = dtypes.bool if isinstance(x, bool) else dtypes.default_int if isinstance(x, int) else dtypes.default_float
    return np.array(x, dtype=np.dtype(dt.fmt or "f"))


def _array(a: np.ndarray, c: _Ctx) -> Any:
    kind = a.dtype.kind
    if kind not in "biufc":  # strings, objects, datetimes, records: not tensor data
        return a
    dt = getattr(c.dtypes, a.dtype.name, None) if kind != "c" else None
    if not isinstance(dt, c.DType):
        raise TypeError(f"to_tensor: tinygrad has no dtype for numpy {a.dtype} (shape {a.shape})")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    Tensor = c.Tensor
    if a.size == 0:
        return Tensor.empty(*a.shape, dtype=dt, device=c.dev)  # nothing to copy (and no buffer to allocate)
    if not c.cpu:
        t = Tensor(np.ascontiguousarray(a).reshape(a.shape or (1,)), device=c.dev)
        c.pending.append(t)
        return t if a.ndim else t.reshape(())  # Tensor(0-d array) would be a deviceless constant
    if not c.copy and a.ndim and a.flags.c_contiguous and a.flags.writeable and a.ctypes.data % ALIGN == 0:
        t = Tensor.from_blob(a.ctypes.data, a.shape, dtype=dt, device=c.dev)
        weakref.finalize(t.uop.buffer, _release, c.dev, a).atexit = False  # the buffer keeps `a` alive
        return t
    t = Tensor.empty(*a.shape, dtype=dt, device=c.dev)
    host = t.uop.buffer.ensure_allocated().as_memoryview(force_zero_copy=True)  # waits for the device first
    np.copyto(np.frombuffer(host, a.dtype).reshape(a.shape), a, casting="no")
    return t


def _release(dev: str, a: np.ndarray) -> None:
    """Lets ``a`` go when its zero-copy buffer dies, once no queued kernel can still read it."""
    from tinygrad import Device

    Device[dev].synchronize()


if find_spec("tinygrad") is None:  # pragma: no cover
    # without tinygrad the example cannot run: keep it out of the doctest collection
    to_tensor.__doc__ = (to_tensor.__doc__ or "").replace(">>>", ">>")
