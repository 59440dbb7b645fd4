"""``to_jax``: nested batches of numpy arrays to JAX arrays on a device, or split over a sharding.

JAX is optional: it is imported on the first call, not by ``import lazyseq``. All the arrays of a
batch go to the devices in one ``jax.device_put`` call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import tree
from ..helpers import need
from .batching import HostInt

__all__ = ["to_jax"]

_INSTALL = "pip install 'lazyseq[jax]' (jax, with its CPU backend; see JAX's install page for GPUs and TPUs)"


def need_jax(what: str) -> Any:
    """``import jax``, or ImportError saying that ``what`` needs it and how to install it."""
    return need("jax", what, "JAX", _INSTALL)


def _placement(jax: Any, device: Any, sharding: Any) -> tuple[Any, Any]:
    """(where arrays of one or more axes go, where 0-d arrays go): one device for both, or the
    sharding and the same devices with everything replicated."""
    if sharding is None and isinstance(device, jax.sharding.Sharding):
        device, sharding = None, device
    if sharding is not None:
        if device is not None:
            raise ValueError("to_jax: give device or sharding, not both")
        if not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(f"to_jax: sharding must be a jax.sharding.Sharding, got {type(sharding).__name__}")
        mesh = getattr(sharding, "mesh", None)
        if mesh is None:
            mesh = jax.sharding.Mesh(np.array(sorted(sharding.device_set, key=lambda d: d.id)), ("batch",))
        return sharding, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    if device is None:
        device = jax.local_devices()[0]
    elif isinstance(device, str):
        device = jax.devices(device)[0]
    return device, device


def to_jax(x: Any, device: Any = None, sharding: Any = None) -> Any:
    """``x`` with every numpy array and number in it turned into a JAX array.

    Tuples, lists, dicts and namedtuples are rebuilt with their own types (:mod:`lazyseq.core.tree`);
    strings, ``None``, other objects and arrays of strings or objects are kept.

    - ``device``: a ``jax.Device`` or a platform name (``'cpu'``, ``'gpu'``); ``None``: the first
      local device. A ``jax.sharding.Sharding`` given as ``device`` is taken as ``sharding``.
    - ``sharding``: each array of one or more axes is split on its first axis over the sharding's
      devices (a ``NamedSharding(mesh, PartitionSpec('data'))``: the batch axis over the mesh's
      ``data`` axis); its first axis must divide evenly (``drop_last=True`` in a DataLoader, with
      a batch size that is a multiple of the device count); 0-d arrays are replicated.
    - dtypes are kept where JAX has them: bool, (u)int8...64, float16/32/64, bfloat16, complex;
      without ``jax.config.update('jax_enable_x64', True)``, JAX stores 64-bit types in 32 bits
      (float64 -> float32, int64 -> int32, uint64 -> uint32, complex128 -> complex64). Python
      numbers become 0-d arrays of numpy's defaults (int64, float64, bool), cast the same way.

    A process that runs JAX's runtime forks badly (XLA's threads; JAX warns at every fork), so
    process workers started after it use ``forkserver`` by default: a script then needs its
    ``if __name__ == "__main__":`` guard. (This example starts JAX, so the test suite runs it in
    a process of its own: ``tests/test_frameworks.py``.)

    >>> import lazyseq, numpy as np
    >>> out = lazyseq.to_jax({"x": np.ones((2, 3), np.float32), "y": np.array([1, 0], np.int8), "id": "a"})  # doctest: +SKIP
    >>> out["x"].dtype, out["x"].shape, out["y"].tolist(), out["id"]  # doctest: +SKIP
    (dtype('float32'), (2, 3), [1, 0], 'a')
    """
    jax = need_jax("lazyseq.to_jax")
    where, scalar = _placement(jax, device, sharding)
    arrays: list[np.ndarray] = []
    targets: list[Any] = []

    def collect(v: Any) -> Any:
        if isinstance(v, (bool, int, float, complex)) and type(v) is not HostInt:
            v = np.asarray(v)
        elif isinstance(v, np.generic):
            v = np.asarray(v)
        if isinstance(v, np.ndarray) and (v.dtype.kind in "biufc" or v.dtype.name == "bfloat16"):
            arrays.append(v)
            targets.append(where if v.ndim else scalar)
            return _Slot(len(arrays) - 1)
        if isinstance(v, jax.Array):
            arrays.append(v)
            targets.append(where if v.ndim else scalar)
            return _Slot(len(arrays) - 1)
        return v

    shaped = tree.map(collect, x)
    if not arrays:
        return shaped
    try:
        put = jax.device_put(arrays, targets)
    except ValueError as e:
        raise ValueError(_indivisible(arrays, where, e)) from e
    return tree.map(lambda v: put[v.i] if isinstance(v, _Slot) else v, shaped)


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _indivisible(arrays: list, where: Any, e: Exception) -> str:
    shapes = sorted({tuple(a.shape) for a in arrays if a.ndim})
    n = len(getattr(where, "device_set", ())) or 1
    return (f"to_jax: the batch's arrays (shapes {shapes}) cannot be placed with {where}: {e}. Arrays are split "
            f"on their first axis over the sharding's {n} devices, so that axis must be a multiple of the devices "
            "it is split over: in a DataLoader, a batch_size that is a multiple of it and drop_last=True")
