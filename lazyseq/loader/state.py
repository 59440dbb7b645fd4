"""What a DataLoader's state records besides its position, and the checks a resume makes: the
dataset's fingerprint (:mod:`lazyseq.core.fingerprints`), a custom sampler's contents or state, and the
loader's seed when it was given. A resume with another pipeline is refused with
:class:`~lazyseq.errors.ResumeMismatch`, naming what changed; what may change by design (batch
size, ranks, workers, method, device) is not recorded."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.fingerprints import NotResumable, _digest, difference, fingerprint
from ..errors import ResumeMismatch

__all__ = ["check_resume", "delivered", "recorded"]


def _sampler(name: str, sampler: Any) -> Any:
    """A sampler's part of the state: a digest of its contents (a sequence), its own state (an
    object with state_dict), else NotResumable: its order cannot be rebuilt on resume."""
    if isinstance(sampler, (Sequence, np.ndarray)) and not isinstance(sampler, (str, bytes)):
        try:
            data = np.asarray([list(b) if not np.isscalar(b) else b for b in sampler], dtype=np.int64)
        except (TypeError, ValueError):
            data = np.asarray([repr(b) for b in sampler]).astype("U")
        return {"contents": _digest(data.tobytes()), "len": len(sampler)}
    if hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict"):
        return {"state": sampler.state_dict()}
    raise NotResumable(f"DataLoader.state_dict: the {name} ({type(sampler).__name__}) is an iterable whose order "
                       "is not a function of an index and which has no state_dict(): a position in it cannot be "
                       f"saved. Give a sequence of indices (a list, an array) or a {name} with "
                       "state_dict()/load_state_dict()")


def recorded(loader: Any) -> dict:
    """The part of ``loader.state_dict()`` that a resume checks."""
    out: dict = {"fingerprint": fingerprint(loader.dataset), "seed_given": loader._seed_given}
    for name in ("sampler", "batch_sampler"):
        s = getattr(loader, name)
        if s is not None:
            out[name] = _sampler(name, s)
    return out


def _before(fp: Any, position: int) -> Any:
    """``fp`` with every mixture schedule cut to its segments that start before ``position``: a
    schedule changed from there on (``sched.then(position, ...)``) reads the same items up to it."""
    if isinstance(fp, list):
        return [_before(x, position) for x in fp]
    if not isinstance(fp, dict):
        return fp
    out = {k: _before(v, position) for k, v in fp.items()}
    sched = fp.get("params", {}).get("schedule") if "view" in fp else None
    if isinstance(sched, list):
        out["params"] = {**out["params"], "schedule": [s for s in sched if isinstance(s, dict) and s.get("at", 0) < position],
                         "weights": None}
        out["len"] = None  # stop='first'/'all' follow the schedule's later segments
    return out


def check_resume(loader: Any, state: Mapping, strict: bool) -> None:
    """Raise ResumeMismatch (``strict``) or warn once if ``state`` was saved with another pipeline."""
    if "fingerprint" not in state:
        warnings.warn("DataLoader.load_state_dict: this state was saved without a fingerprint (by an earlier "
                      "lazyseq), so whether it comes from this pipeline cannot be checked; resuming anyway",
                      RuntimeWarning, stacklevel=3)
        return
    now = fingerprint(loader.dataset)
    why = difference(state["fingerprint"], now, "dataset: ")
    position = int(state.get("position", 0))
    if why is not None and difference(_before(state["fingerprint"], position), _before(now, position)) is None:
        why = None  # only a mixture schedule changed, after the saved position: the usual way to change it
    if why is None and loader._seed_given and int(state["seed"]) != loader.seed:
        why = f"DataLoader(seed={int(state['seed'])} -> {loader.seed})"
    for name in ("sampler", "batch_sampler"):
        s = getattr(loader, name)
        if why is None and (s is None) != (name not in state):
            why = f"DataLoader({name}: {'none' if name not in state else 'given'} -> {'none' if s is None else 'given'})"
        elif why is None and s is not None:
            saved, now = state[name], _sampler(name, s)
            if "state" in saved and "state" in now:
                s.load_state_dict(saved["state"])
            elif saved != now:
                why = f"DataLoader({name}): its contents changed"
    if why is None:
        return
    message = (f"DataLoader.load_state_dict: the state was saved with another pipeline: {why}. Resuming would "
               "read other items than the interrupted run; build the loader as it was, or pass strict=False "
               "to resume anyway")
    if strict:
        raise ResumeMismatch(message, why)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def delivered(loader: Any, state: Mapping, strict: bool) -> set[int]:
    """The batches after the state's position that an ``in_order=False`` iteration had delivered
    already (not delivered again): they are batches of this rank's part, so they are told apart
    only with the ``world_size`` and ``batch_size`` they were saved with."""
    done = state.get("delivered") or []
    if not done:
        return set()
    saved = int(state.get("world_size", 1)), state.get("batch_size")
    if saved == (loader.world_size, loader.batch_size):
        return {int(k) for k in done}
    message = (f"DataLoader.load_state_dict: the state lists {len(done)} batches delivered out of order past its "
               f"position with world_size={saved[0]}, batch_size={saved[1]}; this loader has "
               f"world_size={loader.world_size}, batch_size={loader.batch_size}, so which items they held cannot be "
               "told apart. Resume with the settings it was saved with, or pass strict=False to read those "
               "batches' items again")
    if strict:
        raise ValueError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return set()
