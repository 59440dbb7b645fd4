"""A chained-resume harness, the way Grain and torchdata prove their checkpoints: run a DataLoader
pipeline uninterrupted, then again with interruptions, each resume with other settings (workers,
method, persistent workers, world size), and check that the items read equal the uninterrupted
run's item for item, epoch by epoch (up to the tail that ``drop_last`` leaves out of an epoch).

Reusable: ``check_chained(make_dataset, cuts, settings, ...)`` with a function that builds the
dataset afresh (as a restarted process would) and the settings of each segment.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

import lazyseq


def items_of(batch: Any) -> list:
    """A collated batch as its items, each a plain Python value (dict batches: one tuple per item)."""
    if isinstance(batch, dict):
        cols = [np.asarray(v).tolist() for v in batch.values()]
        return [tuple(json.dumps(c[i]) for c in cols) for i in range(len(cols[0]))]
    return [json.dumps(x) for x in np.asarray(batch).tolist()]


def _loaders(make: Callable[[], Any], setting: dict, common: dict) -> list[lazyseq.DataLoader]:
    world = setting.get("world_size", 1)
    kw = {**common, **{k: v for k, v in setting.items() if k != "world_size"}}
    if kw.get("num_workers", 0) == 0:
        kw.pop("persistent_workers", None)
        kw.pop("method", None)
    return [lazyseq.DataLoader(make(), rank=r, world_size=world, to_tensor=False, **kw) for r in range(world)]


def _segment(loaders: list, steps: int | None, epochs: int) -> tuple[dict[int, list], dict]:
    """Read ``steps`` global steps (all ranks one batch each; None: to the end of epoch ``epochs - 1``),
    the items of each epoch in global order, and the state after."""
    try:
        return _read(loaders, steps, epochs)
    finally:  # a failing check leaves no worker behind
        for loader in loaders:
            loader.close()


def _read(loaders: list, steps: int | None, epochs: int) -> tuple[dict[int, list], dict]:
    out: dict[int, list] = {}
    done, state = 0, loaders[0].state_dict()
    while steps is None or done < steps:
        epoch = loaders[0]._where()[0]
        if epoch >= epochs:
            break
        its = [iter(loader) for loader in loaders]
        while steps is None or done < steps:
            parts = [items_of(b) if (b := next(it, None)) is not None else None for it in its]  # every rank steps
            if any(p is None for p in parts):
                assert all(p is None for p in parts), "ranks ended an epoch at different steps"
                break
            if loaders[0].batch_size is None:  # a dataset of batches: the ranks' units are whole batches
                out.setdefault(epoch, []).extend(x for p in parts for x in p)
            else:  # the global order, strided over the ranks: item j of rank r is r + W j
                out.setdefault(epoch, []).extend(p[j] for j in range(len(parts[0])) for p in parts)
            done += 1
        state = loaders[0].state_dict()  # while the iteration is live: after it, the next epoch starts
        for it in its:
            it.close()
    return out, state


def check_chained(make: Callable[[], Any], cuts: list[int], settings: list[dict], epochs: int = 2,
                  **common: Any) -> None:
    """Interrupt after ``cuts`` global steps (one per resume), resuming with ``settings[k]``."""
    base, _ = _segment(_loaders(make, {}, common), None, epochs)
    got: dict[int, list] = {}
    state = None
    for k, setting in enumerate(settings):
        loaders = _loaders(make, setting, common)
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(json.loads(json.dumps(state)))
        part, state = _segment(loaders, cuts[k] if k < len(cuts) else None, epochs)
        for e, xs in part.items():
            got.setdefault(e, []).extend(xs)
    assert sorted(got) == sorted(base), (sorted(got), sorted(base))
    for e in base:
        tail = len(base[e]) - len(got[e])
        assert got[e] == base[e][: len(got[e])], f"epoch {e}: the resumed items differ"
        assert 0 <= tail, f"epoch {e}: more items than the uninterrupted run"
        if not common.get("drop_last"):
            assert tail == 0, f"epoch {e}: {tail} items missing"
