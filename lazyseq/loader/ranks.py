"""Which part of the data this process reads: ``rank`` and ``world_size`` as given, else from
``torch.distributed`` when it is initialised, else from the launcher's environment (torchrun's
``RANK``/``WORLD_SIZE``, SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``), else rank 0 of 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["ranks"]

_ENV = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def _from_torch() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")  # never imported here: initialised means imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_env(env: Mapping[str, str]) -> tuple[int, int, str] | None:
    for rank_var, size_var in _ENV:
        if rank_var in env and size_var in env:
            try:
                return int(env[rank_var]), int(env[size_var]), f"{rank_var}/{size_var} in the environment"
            except ValueError:
                raise ValueError(f"DataLoader: the environment's {rank_var}={env[rank_var]!r}, "
                                 f"{size_var}={env[size_var]!r} are not integers; fix them or pass rank= and "
                                 "world_size=") from None
    return None


def ranks(rank: int | None, world_size: int | None, env: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """``(rank, world_size, where they come from)``; what is given wins, the rest is found.

    >>> ranks(None, None, env={"RANK": "3", "WORLD_SIZE": "8"})
    (3, 8, 'RANK/WORLD_SIZE in the environment')
    >>> ranks(None, 2, env={"SLURM_PROCID": "1", "SLURM_NTASKS": "4"})  # world_size given: rank found
    (1, 2, 'SLURM_PROCID/SLURM_NTASKS in the environment')
    >>> ranks(None, None, env={})
    (0, 1, 'the default')
    """
    if rank is not None and world_size is not None:
        found: tuple[int, int, str] = (rank, world_size, "given")
    elif (t := _from_torch()) is not None:
        found = (t[0], t[1], "torch.distributed")
    elif (e := _from_env(os.environ if env is None else env)) is not None:
        found = e
    else:
        found = (0, 1, "the default")
    r = found[0] if rank is None else rank
    w = found[1] if world_size is None else world_size
    where = found[2] if rank is None or world_size is None else "given"
    if not 0 <= r < w:
        raise ValueError(f"DataLoader: need 0 <= rank < world_size, got rank={r}, world_size={w} (from {where})")
    return int(r), int(w), where
