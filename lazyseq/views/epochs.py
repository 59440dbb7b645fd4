"""Epochs: the views whose order or random numbers depend on an epoch (``shuffle``,
``block_shuffle``, ``mix``, ``smap``/``starmap`` with ``seed=``) take ``epoch=None``.

Built with ``epoch=None``, a view *follows* the epoch of whoever reads it by epochs: a
:class:`lazyseq.DataLoader` binds each epoch with :func:`at_epoch` (``set_epoch``, iteration,
resume and persistent workers alike); read outside a loader, ``None`` is epoch 0. Built with an
int, a view keeps that epoch whatever the loader's.

A view that sets ``takes_loader_seed = True`` (``bucket``) and was built with ``seed=None`` also
takes the loader's seed (``at_epoch(seq, epoch, seed)``); outside a loader its seed is 0.

:func:`at_epoch` never changes a view: it returns a copy of the path from the root to each view
that follows, bound to the epoch, and shares every other part (subtrees without such a view,
sources, functions, data). It costs O(number of views), once per epoch, and nothing per item.
"""

from __future__ import annotations

import operator
from types import MethodType
from typing import Any

import numpy as np

from ..core.node import Node

__all__ = ["FollowsEpoch", "at_epoch", "check_epoch", "follows_epoch"]


def check_epoch(epoch: Any, where: str) -> int | None:
    """``epoch`` as given to a view: None (follow the loader's) or an int >= 0."""
    if epoch is None:
        return None
    if isinstance(epoch, (bool, np.bool_)) or not isinstance(epoch, (int, np.integer)):
        raise TypeError(f"{where}: epoch must be None (follow the DataLoader's epoch) or an int >= 0, "
                        f"got {type(epoch).__name__} {epoch!r}")
    if epoch < 0:
        raise ValueError(f"{where}: epoch must be >= 0, got {int(epoch)}")
    return operator.index(epoch)


class FollowsEpoch:
    """A view whose order or random numbers depend on an epoch.

    ``epoch`` is what it was built with (None: it follows); ``_epoch`` is the epoch it reads now
    (``epoch``, or the one a loader bound, or 0). A subclass computes what depends on the epoch in
    :meth:`_epoch_setup`, which runs in ``__init__`` and on each bound copy."""

    epoch: int | None
    _epoch: int
    # With True, ``seed`` is what the view was built with (None: the loader's) and ``_seed`` the seed
    # it reads now (``seed``, the one a loader bound, or 0); ``_epoch_setup`` depends on both.
    takes_loader_seed = False
    _seed: int = 0

    def _init_epoch(self, epoch: Any, where: str) -> None:
        self.epoch = check_epoch(epoch, where)
        self._epoch = 0 if self.epoch is None else self.epoch
        self._epoch_setup()

    def _epoch_setup(self) -> None:
        raise NotImplementedError

    def _epoch_text(self) -> str:
        """``epoch=...`` for ``describe``: what it was built with, and the bound epoch when it follows one."""
        if self.epoch is not None:
            return f"epoch={self.epoch}"
        return "epoch=None" if self._epoch == 0 else f"epoch={self._epoch} (the loader's)"


def follows_epoch(seq: Any) -> bool:
    """Whether ``seq`` holds a view built with ``epoch=None``: a loader's epochs change its items."""
    return any(isinstance(v, FollowsEpoch) and v.epoch is None for v in _walk(seq, set()))


def _rebinds(node: Any, epoch: int, seed: int | None) -> bool:
    """Whether ``node`` reads another epoch or seed once bound to these."""
    if not isinstance(node, FollowsEpoch):
        return False
    if node.epoch is None and node._epoch != epoch:
        return True
    return seed is not None and node.takes_loader_seed and node.seed is None and node._seed != seed


def _walk(node: Any, seen: set) -> Any:
    if not isinstance(node, Node) or id(node) in seen or getattr(node, "epoch_opaque", False):
        return
    seen.add(id(node))
    yield node
    for k in _links(node):
        yield from _walk(k, seen)


_TUPLE_SCAN = 4096  # a tuple attribute longer than this is data (a source), not a view's sources


def _links(node: Any) -> list:
    """The nodes ``node`` holds in its attributes: directly, as a bound method's ``__self__`` (the
    cached readers ``src._get``), or in a tuple of them (``seqs``, ``_rds``)."""
    out = []
    for v in getattr(node, "__dict__", {}).values():
        if isinstance(v, Node):
            out.append(v)
        elif isinstance(v, MethodType) and isinstance(v.__self__, Node):
            out.append(v.__self__)
        elif type(v) is tuple and len(v) <= _TUPLE_SCAN:
            out += [x if isinstance(x, Node) else x.__self__ for x in v
                    if isinstance(x, Node) or (isinstance(x, MethodType) and isinstance(x.__self__, Node))]
    return out


def _relinked(v: Any, swap: dict[int, Any]) -> Any:
    new = swap.get(id(v))
    if new is not None:
        return new
    if isinstance(v, MethodType) and id(v.__self__) in swap:
        return MethodType(v.__func__, swap[id(v.__self__)])
    if type(v) is tuple and len(v) <= _TUPLE_SCAN:
        t = tuple(_relinked(x, swap) for x in v)
        return t if any(a is not b for a, b in zip(t, v)) else v
    return v


def _copy(node: Any, swap: dict[int, Any]) -> Any:
    """A copy of ``node`` as a worker would get it (``__getstate__``: caches start empty) whose links
    to the nodes in ``swap`` lead to their replacements."""
    state = node.__getstate__()
    state = dict(state if state is not None else node.__dict__)
    for k, v in state.items():
        state[k] = _relinked(v, swap)
    c = object.__new__(type(node))
    if hasattr(c, "__setstate__"):
        c.__setstate__(state)
    else:
        c.__dict__.update(state)
    return c


def at_epoch(seq: Any, epoch: int, seed: int | None = None) -> Any:
    """``seq`` with every view built with ``epoch=None`` reading epoch ``epoch`` (views built with
    an int keep theirs): the DataLoader's way to bind an epoch. ``seq`` itself is unchanged, and
    returned as it is when nothing in it follows the epoch.

    ``seed`` (the loader's) goes to the views that take the loader's seed when built with
    ``seed=None`` (:func:`lazyseq.bucket`); None leaves their seed as it is (0 outside a loader).
    A view whose sources were rebound and that keeps something computed from its sources' items
    (a packing plan) drops it there (its ``_sources_rebound`` hook), so the copy plans again.

    >>> import lazyseq
    >>> s = lazyseq.shuffle(range(6), seed=1)          # epoch=None: 0 here, the loader's inside one
    >>> list(lazyseq.at_epoch(s, 0)) == list(s), list(lazyseq.at_epoch(s, 1)) == list(lazyseq.shuffle(range(6), 1, epoch=1))
    (True, True)
    >>> fixed = lazyseq.shuffle(range(6), seed=1, epoch=5)
    >>> lazyseq.at_epoch(fixed, 1) is fixed
    True
    """
    epoch = check_epoch(epoch, "at_epoch")
    if epoch is None:
        raise TypeError("at_epoch: give the epoch to bind, an int >= 0")
    return _bind(seq, epoch, seed, {})


def _bind(node: Any, epoch: int, seed: int | None, memo: dict[int, Any]) -> Any:
    """:func:`at_epoch` of ``node``; ``memo``: the copies made so far, by the id of what they copy.
    (A function of the module: a closure calling itself would be a reference cycle holding every
    view of both trees until the cyclic garbage collector runs.)"""
    if not isinstance(node, Node) or getattr(node, "epoch_opaque", False):
        return node
    done = memo.get(id(node))
    if done is not None:
        return done
    memo[id(node)] = node  # (a view tree has no cycles; this keeps a malformed one finite)
    swap = {id(k): n for k in _links(node) if (n := _bind(k, epoch, seed, memo)) is not k}
    follows = _rebinds(node, epoch, seed)
    new = node
    if swap or follows:
        new = _copy(node, swap)
        if swap and hasattr(new, "_sources_rebound"):
            new._sources_rebound()
        if follows:
            if new.epoch is None:
                new._epoch = epoch
            if seed is not None and new.takes_loader_seed and new.seed is None:
                new._seed = seed
            new._epoch_setup()
    memo[id(node)] = new  # a view read twice in the tree (a shared subtree) is copied once
    return new
