"""Who takes the DataLoader's batches (``to_tensor=``): tinygrad, torch, JAX or numpy, checked when
the loader is built (a missing package is an ImportError then, never at the first batch), and the
last stage that turns a batch into that framework's arrays."""

from __future__ import annotations

from typing import Any

__all__ = ["CONSUMERS", "Consumer"]

CONSUMERS = {True: "tinygrad", "tinygrad": "tinygrad", "torch": "torch", "jax": "jax", False: "numpy",
             "numpy": "numpy", None: "numpy"}


class Consumer:
    """``to_tensor``'s framework (``name``), installed and set up, and its last stage (:meth:`stage`)."""

    def __init__(self, to_tensor: Any, device: Any, pin_memory: bool):
        try:
            self.name = CONSUMERS[to_tensor] if isinstance(to_tensor, (bool, str, type(None))) else None
        except KeyError:
            self.name = None
        if self.name is None:
            raise ValueError(f"DataLoader: to_tensor must be True or 'tinygrad', 'torch', 'jax', or False or 'numpy'; "
                             f"got {to_tensor!r}")
        self.device, self.pin, self.warned = device, False, []
        if self.name == "tinygrad":  # and tinygrad's CPU compiler is set up (lazyseq.cc)
            from .tensor import prepare

            prepare(f"DataLoader(to_tensor={to_tensor!r}){', the default,' if to_tensor is True else ''} makes tinygrad "
                    "Tensors", "or pass to_tensor='torch', 'jax' or False (numpy)")
        elif self.name == "torch":
            from .totorch import need_torch, pin_checked

            self.pin = pin_checked(pin_memory, device, need_torch("DataLoader(to_tensor='torch')"), self.warned)
        elif self.name == "jax":
            from .tojax import need_jax

            jax = need_jax("DataLoader(to_tensor='jax')")
            if device is not None and not isinstance(device, (str, jax.Device, jax.sharding.Sharding)):
                raise TypeError(f"DataLoader(to_tensor='jax'): device must be a jax Device, a Sharding or a platform "
                                f"name, got {type(device).__name__}")
        self._pool: Any = None

    @property
    def holds_slots(self) -> bool:
        """Whether batches keep their shared-memory slot while the user holds them (views, not copies)."""
        return self.name != "tinygrad"

    def stage(self) -> Any:
        """The function the loader's last stage applies to each batch (None: batches as they are)."""
        from .plan import ToTensor

        if self.name == "numpy":
            return None
        if self.name == "tinygrad":
            from .tensor import to_tensor

            return ToTensor(to_tensor, self.device, "to_tensor")
        if self.name == "torch":
            from .totorch import PinnedPool, to_torch

            if self.pin and self._pool is None:
                self._pool = PinnedPool()  # one per loader, reused by every batch
            return ToTensor(to_torch, self.device, "to_torch", pin_memory=self._pool or False)
        from .tojax import to_jax

        return ToTensor(to_jax, self.device, "to_jax")
