"""``to_torch``: nested batches of numpy arrays to torch tensors, over the arrays' own memory.

torch is optional: it is imported on the first call, not by ``import lazyseq``.

A CPU tensor is ``torch.from_numpy`` of the array: no copy, and the tensor (and every view of it)
holds the array, hence the ``prefetch`` shared-memory slot under it, which is reused only once
they are all gone (as for the numpy arrays themselves). ``pin_memory=True`` copies into page-locked
buffers from a pool (:class:`PinnedPool`) reused across batches once nothing uses them, so that
``device='cuda'`` copies run asynchronously (``non_blocking=True``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import tree
from ..helpers import need
from .batching import HostInt

__all__ = ["PinnedPool", "to_torch"]

_INSTALL = "pip install 'lazyseq[torch]' (torch==2.13.0 is the CPU wheel the tests use)"


def need_torch(what: str) -> Any:
    """``import torch``, or ImportError saying that ``what`` needs it and how to install it."""
    return need("torch", what, "PyTorch", _INSTALL)


class PinnedPool:
    """Page-locked host buffers reused across batches: a buffer is handed out again only once the
    tensors made over it are gone and the device copy from it (a CUDA event) is done. ``alloc``
    makes a buffer of ``n`` bytes (``torch.empty(n, dtype=uint8, pin_memory=True)``)."""

    def __init__(self, alloc: Callable[[int], Any] | None = None):
        self._alloc = alloc
        self._buffers: list[list] = []  # [buffer, its storage's use count when free, event or None]

    @staticmethod
    def _uses(buffer: Any) -> int:
        """Tensors (views too) over the buffer's storage: a view need not keep its base's Python object."""
        import torch

        return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata)

    def _free(self, entry: list) -> bool:
        if self._uses(entry[0]) > entry[1]:
            return False
        return entry[2] is None or entry[2].query()

    def take(self, a: np.ndarray, torch: Any) -> Any:
        """A pinned tensor holding a copy of ``a``, in a free buffer of at least its size."""
        n = max(a.nbytes, 1)
        entry = next((e for e in self._buffers if e[0].numel() >= n and self._free(e)), None)
        if entry is None:
            alloc = self._alloc or (lambda k: torch.empty(k, dtype=torch.uint8, pin_memory=True))
            buffer = alloc(max(n, 1 << 16))
            entry = [buffer, self._uses(buffer), None]
            self._buffers.append(entry)
        entry[2] = None
        t = entry[0][: a.nbytes].view(_torch_dtype(a.dtype, torch)).view(a.shape)
        t.copy_(_from_numpy(a, torch))
        return t, entry

    def __len__(self) -> int:
        return len(self._buffers)


def _torch_dtype(dt: np.dtype, torch: Any) -> Any:
    if dt.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dt)).dtype


def _from_numpy(a: np.ndarray, torch: Any) -> Any:
    """``torch.from_numpy`` where it takes ``a`` as it is, else of the least copy it needs."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if any(s < 0 for s in a.strides) or not a.flags.writeable:  # torch refuses negative strides, warns on read-only
        a = np.array(a)
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the same 2 bytes, seen as torch's
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class _Ctx:
    __slots__ = ("torch", "device", "cpu", "pool", "events")

    def __init__(self, torch: Any, device: Any, pool: PinnedPool | None):
        self.torch, self.pool, self.events = torch, pool, []
        self.device = torch.device(device) if device is not None else None
        self.cpu = self.device is None or self.device.type == "cpu"


def _leaf(x: Any, c: _Ctx) -> Any:
    torch = c.torch
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biufc" and x.dtype.name != "bfloat16":  # strings, objects, records: not tensor data
            return x
        if c.pool is not None:
            t, entry = c.pool.take(x, torch)
            if c.cpu:
                return t
            out = t.to(c.device, non_blocking=True)
            c.events.append(entry)  # the copy reads the buffer until its event is done
            return out
        t = _from_numpy(x, torch)
        return t if c.cpu else t.to(c.device, non_blocking=True)
    if isinstance(x, (bool, int, float, complex)) and type(x) is not HostInt:
        t = torch.tensor(x)  # torch's defaults: bool, int64, float32 (complex64)
        return t if c.cpu else t.to(c.device)
    if isinstance(x, torch.Tensor) and not c.cpu and x.device != c.device:
        return x.to(c.device, non_blocking=True)
    return x  # str, bytes, None, HostInt (a kernel argument), other objects


def to_torch(x: Any, device: Any = None, pin_memory: bool | PinnedPool = False) -> Any:
    """``x`` with every numpy array and number in it turned into a torch tensor.

    Tuples, lists, dicts and namedtuples are rebuilt with their own types (:mod:`lazyseq.core.tree`);
    strings, ``None``, other objects and arrays of strings or objects are kept.

    - CPU (``device=None``): each array becomes ``torch.from_numpy(array)``, no copy: the tensor
      shares the array's memory (a ``prefetch`` slot stays reserved while any tensor or view of it
      lives; ``.clone()`` what you keep). Arrays torch cannot take as they are (negative strides,
      read-only, non-native byte order) are copied first.
    - dtypes are kept: bool, (u)int8...64, float16/32/64, complex; ``ml_dtypes.bfloat16`` arrays
      become ``torch.bfloat16`` (the same bytes). numpy scalars and 0-d arrays give 0-d tensors of
      their dtype; Python numbers take torch's defaults (``bool``, ``int64``, ``float32``), except
      a :class:`~lazyseq.loader.batching.HostInt` (``varlen_collate``'s ``max_seqlen``).
    - ``device``: ``'cuda'``, ``'cuda:1'``, a ``torch.device``...: tensors are moved with
      ``non_blocking=True``. ``pin_memory=True`` (or a :class:`PinnedPool`, as the DataLoader keeps
      one per loader) first copies each array into a page-locked buffer, so that the move to the GPU
      runs asynchronously; without CUDA, pinning raises torch's own error (the DataLoader checks
      first, and warns once).

    >>> import lazyseq, numpy as np
    >>> batch = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([1, 0]), "id": "a", "n": 3}
    >>> out = lazyseq.to_torch(batch)
    >>> out["x"].dtype, tuple(out["x"].shape), out["y"].tolist(), out["id"], out["n"].dtype
    (torch.float32, (2, 3), [1, 0], 'a', torch.int64)
    >>> batch["y"][0] = 7  # the tensor shares the array's memory
    >>> out["y"].tolist()
    [7, 0]
    """
    torch = need_torch("lazyseq.to_torch")
    pool = pin_memory if isinstance(pin_memory, PinnedPool) else PinnedPool() if pin_memory else None
    c = _Ctx(torch, device, pool)
    out = tree.map(lambda v: _leaf(v, c), x)
    if c.events:  # each buffer is free again once the copies queued so far are done
        event = torch.cuda.Event()
        event.record()
        for entry in c.events:
            entry[2] = event
    return out


def pin_checked(pin_memory: bool, device: Any, torch: Any, warned: list) -> bool:
    """Whether to pin: ``pin_memory`` where CUDA is available; without it, False, with one
    RuntimeWarning per loader (``warned``: its flag)."""
    if not pin_memory:
        return False
    if torch.cuda.is_available():
        return True
    if not warned:
        warned.append(True)
        warnings.warn("DataLoader(pin_memory=True): CUDA is not available, so batches are not pinned (pinned "
                      "memory only speeds up copies to a CUDA device); pass pin_memory=False to silence this",
                      RuntimeWarning, stacklevel=4)  # the DataLoader(...) call
    return False
