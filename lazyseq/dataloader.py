"""DataLoader: PyTorch's DataLoader, built from views only.

``order -> shard(rank, world_size) -> batch(collate) -> prefetch(process, shm) -> smap(to_tensor)``.
The order of an epoch is a pure function of (seed, epoch), so resuming mid-epoch is an index,
not a replay, and persistent workers read the batches of every epoch from one infinite view.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .base import Routed, View
from .collate import buffer_bytes, default_collate
from .evaluation import Prefetch, prefetch
from .helpers import ALIGN, PAGE
from .node import check_source, length, read_many
from .views.indexing import arange, gather
from .views.mapping import smap
from .views.order import shard, shuffle
from .views.shape import batch

__all__ = ["DataLoader", "default_collate"]


class _Epochs(Routed):
    """Batch ``b`` of epoch ``e`` at index ``e * per_epoch + b``: one infinite view that persistent
    workers keep across epochs; each epoch's view is made when first read."""

    finite = False
    seqs = ()

    def __init__(self, make: Callable[[int], View], per_epoch: int):
        self.make, self.per_epoch = make, per_epoch
        self._cache: tuple[int, View] | None = None

    def __getstate__(self) -> dict:
        return {"make": self.make, "per_epoch": self.per_epoch, "_cache": None}

    def _where(self, i: int) -> tuple[int, int]:
        return divmod(i, self.per_epoch)

    def _part(self, e: int) -> View:
        c = self._cache
        if c is None or c[0] != e:
            c = self._cache = (e, self.make(e))
        return c[1]

    def _reader(self, e: int) -> Callable[[int], Any]:
        return self._part(e)._get

    def describe(self) -> str:
        return f"epochs({self.per_epoch} batches each)"


class _WorkerInit:
    """Seeds ``random`` and ``numpy.random`` in every worker from (seed, rank, epoch, worker), so
    workers, ranks and epochs draw different augmentations (torch leaves numpy alone, so forked
    workers repeat each other's), then calls worker_init_fn."""

    def __init__(self, seed: int, rank: int, epoch: int, fn: Callable | None):
        self.seed, self.rank, self.epoch, self.fn = seed, rank, epoch, fn

    def __call__(self, worker: int) -> None:
        s = int(np.random.SeedSequence([self.seed, self.rank, self.epoch, worker]).generate_state(1)[0])
        random.seed(s)
        np.random.seed(s)
        if self.fn is not None:
            self.fn(worker)


class DataLoader:
    """PyTorch's ``DataLoader``, composed from lazyseq views; batches arrive as tinygrad Tensors.

    ``dataset`` is any sequence: a view, a list, a numpy array, an object with ``__getitem__`` and
    ``__len__``. The loader builds ``order -> shard -> batch(collate) -> prefetch -> to_tensor``
    (see :meth:`make_sequence`). Arguments follow PyTorch's, with these additions:

    - ``shm_size``: bytes of shared memory for process workers (``None``: sized from the first
      sample, 1.25x, for ``num_workers * prefetch_factor + 1`` batches; see :meth:`stats`).
    - ``seed``: the shuffle seed; the order of epoch ``e`` depends on ``(seed, e)`` only.
      ``None`` takes one from ``generator`` if given, else draws one (kept in ``state_dict``).
    - ``rank``, ``world_size``: this process's part of every epoch (disjoint parts of the same
      permutation; ``drop_last=True`` makes them equal in length).
    - ``device``, ``to_tensor``: where tinygrad Tensors go; ``to_tensor=False`` yields numpy.

    ``pin_memory`` is accepted and ignored (tinygrad copies to the device itself). A custom
    ``sampler`` or ``batch_sampler`` is iterated in the reader once per epoch; with one, workers
    restart every epoch even with ``persistent_workers`` (their order cannot be rebuilt in them).

    >>> import lazyseq, numpy as np
    >>> data = [(np.full(3, i, np.float32), i % 2) for i in range(10)]
    >>> loader = lazyseq.DataLoader(data, batch_size=4, shuffle=True, seed=0, to_tensor=False)
    >>> len(loader), [b[0].shape for b in loader]
    (3, [(4, 3), (4, 3), (2, 3)])
    >>> sorted(int(x) for b in loader for x in b[0][:, 0])
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Iterable | None = None, batch_sampler: Iterable | None = None, num_workers: int = 0,
                 collate_fn: Callable | None = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Callable | None = None, multiprocessing_context: Any = None,
                 generator: Any = None, prefetch_factor: int | None = None, persistent_workers: bool = False, *,
                 shm_size: int | None = None, seed: int | None = None, rank: int = 0, world_size: int = 1,
                 device: str | None = None, to_tensor: bool = True):
        batch_size, shuffle, drop_last, prefetch_factor, multiprocessing_context = _torch_checks(
            batch_size, shuffle, sampler, batch_sampler, num_workers, drop_last, timeout, multiprocessing_context,
            prefetch_factor, persistent_workers)
        if not 0 <= rank < world_size:
            raise ValueError(f"DataLoader: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.dataset = check_source(dataset, "DataLoader")
        if length(dataset) is None:
            raise TypeError("DataLoader: the dataset needs a len() (iterable datasets: wrap them with lazyseq.uniter)")
        self.batch_size, self.shuffle, self.sampler, self.batch_sampler = batch_size, shuffle, sampler, batch_sampler
        self.num_workers, self.collate_fn, self.pin_memory, self.drop_last = num_workers, collate_fn, pin_memory, drop_last
        self.timeout, self.worker_init_fn, self.multiprocessing_context = timeout, worker_init_fn, multiprocessing_context
        self.generator, self.prefetch_factor, self.persistent_workers = generator, prefetch_factor, persistent_workers
        self.shm_size, self.rank, self.world_size = shm_size, rank, world_size
        self.device, self.to_tensor = device, to_tensor
        self.seed = _seed_from(seed, generator)
        if world_size > 1 and not drop_last and len(set(len(shard(range(len(sampler) if sampler is not None else
                                                                       len(dataset)), r, world_size))
                                                        for r in range(world_size))) > 1:
            warnings.warn(f"DataLoader: {world_size} ranks get parts of different lengths (the epoch does not "
                          "divide evenly); data-parallel training needs the same number of steps on every rank: "
                          "pass drop_last=True", RuntimeWarning, stacklevel=2)
        self.epoch, self._batch = 0, 0  # the epoch and batch the next iteration starts at
        self._persistent: Prefetch | None = None
        self._open: weakref.WeakSet[Prefetch] = weakref.WeakSet()  # dropped sequences stop their workers
        self.shm_size_used: int | None = None  # what shm_size=None was sized to, from the first sample
        self._shm_note = ("no process workers" if num_workers == 0 else "not sized yet" if shm_size is None
                          else f"given: shm_size={shm_size}")
        self._warned = False  # about a custom order restarting persistent workers

    # -- the pipeline ----------------------------------------------------------------------------
    def _custom_order(self) -> bool:
        return self.sampler is not None or self.batch_sampler is not None

    def _plan(self) -> _Plan:
        return _Plan(self.dataset, self.batch_size, self.shuffle, self.sampler, self.batch_sampler,
                     self.collate_fn, self.drop_last, self.seed, self.rank, self.world_size)

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(shard(range(len(self.batch_sampler)), self.rank, self.world_size, self.drop_last))
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        n = len(shard(range(n), self.rank, self.world_size, drop_remainder=self.drop_last))
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _prefetch(self, seq: View, epoch: int) -> Prefetch:
        shm = self.shm_size
        if shm is None:  # sized once, from the first sample; later epochs reuse the size
            shm = self.shm_size_used or self._size_shm()
        return prefetch(seq, self.num_workers, "process", self.num_workers * self.prefetch_factor + 1,
                        _WorkerInit(self.seed, self.rank, epoch, self.worker_init_fn), shm,
                        mp_context=self.multiprocessing_context,
                        timeout=self.timeout or None, lazy_start=True)

    def _size_shm(self) -> int:
        """Slots sized from the first sample: its buffers times the batch size, 1.25x."""
        sample = read_many(self.dataset, [0])[0] if len(self.dataset) else None
        nbytes, nbuf = buffer_bytes(sample)
        per_batch = (nbytes * (self.batch_size or 1) + ALIGN * nbuf) * 1.25 + PAGE
        slots = self.num_workers * self.prefetch_factor + 1
        self.shm_size_used = int(per_batch) * slots
        self._shm_note = (f"sized from the first sample: {nbytes} bytes in {nbuf} arrays x batch {self.batch_size or 1}"
                          f" x 1.25 = {int(per_batch)} bytes per slot, {slots} slots")
        return self.shm_size_used

    def make_sequence(self, epoch: int | None = None) -> View:
        """The pipeline of one epoch (default: the next one) as a lazy sequence of batches, so any
        batch can be read directly: ``loader.make_sequence()[1234]``. With workers it contains a
        prefetch, whose workers start at the first read: ``loader.close()`` (or leaving the loader's
        ``with`` block) stops them."""
        e = self.epoch if epoch is None else epoch
        seq: View = self._plan()(e)
        if self.num_workers > 0:
            seq = self._prefetch(seq, e)
            self._open.add(seq)  # closed by loader.close() (or leaving its with block), or when dropped
        return self._tensors(seq)

    def _tensors(self, seq: View) -> View:
        """The last stage: batches as tinygrad Tensors on ``device`` (unless ``to_tensor=False``)."""
        if not self.to_tensor:
            return seq
        from .tensor import to_tensor  # tinygrad is imported only by a loader that makes Tensors

        return smap(_ToTensor(to_tensor, self.device), seq)

    # -- iteration -------------------------------------------------------------------------------
    def _where(self) -> tuple[int, int]:
        """The (epoch, batch) the next batch comes from; past an epoch's end is the next epoch."""
        if self._batch and self._batch >= len(self):
            return self.epoch + 1, 0
        return self.epoch, self._batch

    def __iter__(self) -> Iterator:
        epoch, start = self._where()
        self.epoch, self._batch = epoch, start
        order = None
        if self._custom_order():
            order = [list(b) for b in self.batch_sampler] if self.batch_sampler is not None else list(self.sampler)
        plan = self._plan()
        batches = plan(epoch, order)
        nb = len(batches)
        own: Prefetch | None = None  # this iteration's workers, stopped when it ends
        if self.num_workers == 0:
            seq: View = batches
        elif self.persistent_workers and not self._custom_order():
            if self._persistent is not None and self._persistent.closed:  # Ctrl-C, a crash: start afresh
                self._persistent = None
            if self._persistent is None:
                self._persistent = self._prefetch(_Epochs(plan, nb), epoch)
            seq = self._persistent[epoch * nb : (epoch + 1) * nb]
        else:
            if self.persistent_workers:
                self._warn_custom_order()
            seq = own = self._prefetch(batches, epoch)
            self._open.add(own)
        seq = self._tensors(seq)
        try:
            for b in range(start, nb):
                item = seq[b]
                self._batch = b + 1
                yield item
                del item
            self.epoch, self._batch = epoch + 1, 0
        finally:
            if own is not None and own in self._open:
                self._open.discard(own)
                own.close()

    def _warn_custom_order(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn("DataLoader: with a custom sampler or batch_sampler the workers restart every epoch "
                          "(persistent_workers keeps them only for shuffle or sequential order)", RuntimeWarning,
                          stacklevel=3)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (from its first batch)."""
        self.epoch, self._batch = int(epoch), 0

    def state_dict(self) -> dict:
        """Where the loader stands: the next batch to deliver, with the seed that fixes every order."""
        epoch, b = self._where()
        return {"epoch": epoch, "batch": b, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume exactly: the next iteration delivers the batches that would have come next."""
        if state.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"DataLoader.load_state_dict: saved with world_size={state['world_size']}, "
                             f"this loader has {self.world_size}")
        self.epoch, self._batch, self.seed = int(state["epoch"]), int(state["batch"]), int(state["seed"])
        if self._persistent is not None:  # its workers hold the old seed
            self._persistent.close()
            self._persistent = None

    def stats(self) -> dict:
        """The prefetch counters of the running workers, and how the shared memory was sized."""
        out: dict = {"epoch": self.epoch, "batch": self._batch, "shm": self._shm_note,
                     "shm_size": self.shm_size if self.shm_size is not None else self.shm_size_used}
        live = self._persistent or next(iter(self._open), None)
        if live is not None:
            out.update(prefetch=live.stats(), worker_pids=live.worker_pids())
        return out

    def close(self) -> None:
        """Stop every worker of this loader."""
        for p in list(self._open):
            p.close()
        self._open.clear()
        if self._persistent is not None:
            self._persistent.close()
            self._persistent = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Plan:
    """The batches of any epoch, before prefetch: what workers need, and nothing of the loader."""

    def __init__(self, dataset: Any, batch_size: int | None, shuffle: bool, sampler: Any, batch_sampler: Any,
                 collate_fn: Callable | None, drop_last: bool, seed: int, rank: int, world_size: int):
        self.dataset, self.batch_size, self.shuffle, self.sampler = dataset, batch_size, shuffle, sampler
        self.batch_sampler, self.collate_fn, self.drop_last, self.seed = batch_sampler, collate_fn, drop_last, seed
        self.rank, self.world_size = rank, world_size

    def __call__(self, epoch: int, order: Any = None) -> View:
        if self.batch_sampler is not None:
            lists = order if order is not None else [list(b) for b in self.batch_sampler]
            lists = shard(lists, self.rank, self.world_size, self.drop_last)
            return smap(_BatchReader(self.dataset, self.collate_fn or default_collate), lists)
        if self.sampler is not None:
            idx = order if order is not None else list(self.sampler)
        elif self.shuffle:
            idx = shuffle(arange(len(self.dataset)), self.seed, epoch)
        else:
            idx = arange(len(self.dataset))
        idx = shard(idx, self.rank, self.world_size, drop_remainder=self.drop_last)
        items = gather(self.dataset, idx)
        if self.batch_size is None:
            return smap(self.collate_fn, items) if self.collate_fn is not None else items
        return batch(items, self.batch_size, drop_last=self.drop_last, collate_fn=self.collate_fn or default_collate)


class _BatchReader:
    """Reads and collates one list of dataset indices (batch_sampler mode)."""

    def __init__(self, dataset: Any, collate: Callable):
        self.dataset, self.collate = dataset, collate

    def __call__(self, indices: list[int]) -> Any:
        return self.collate(read_many(self.dataset, indices) if isinstance(self.dataset, View)
                            else [self.dataset[i] for i in indices])


class _ToTensor:
    def __init__(self, fn: Callable, device: str | None):
        self.fn, self.device = fn, device
        self.__qualname__ = "to_tensor" if device is None else f"to_tensor[{device}]"  # for repr trees

    def __call__(self, x: Any) -> Any:
        return self.fn(x, device=self.device)


def _torch_checks(batch_size: int | None, shuffle: bool | None, sampler: Any, batch_sampler: Any, num_workers: int,
                  drop_last: bool, timeout: float, multiprocessing_context: Any,
                  prefetch_factor: int | None, persistent_workers: bool) -> tuple[int | None, bool, bool, int | None, Any]:
    """PyTorch's argument checks and messages, in its order; returns the arguments as the loader
    uses them: (batch_size, shuffle, drop_last, prefetch_factor, multiprocessing context)."""
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                         "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
    if num_workers > 0 and prefetch_factor is None:
        prefetch_factor = 2
    elif prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
    if multiprocessing_context is not None:
        if num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading "
                             f"(num_workers > 0), but got num_workers={num_workers}")
        if isinstance(multiprocessing_context, str):
            methods = multiprocessing.get_all_start_methods()
            if multiprocessing_context not in methods:
                raise ValueError(f"multiprocessing_context option should specify a valid start method in {methods!r}, "
                                 f"but got multiprocessing_context={multiprocessing_context!r}")
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        elif not isinstance(multiprocessing_context, multiprocessing.context.BaseContext):
            raise TypeError("multiprocessing_context option should be a valid context object or a string "
                            f"specifying the start method, but got multiprocessing_context={multiprocessing_context}")
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size <= 0):
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
    return batch_size, shuffle, drop_last, prefetch_factor, multiprocessing_context


def _seed_from(seed: int | None, generator: Any) -> int:
    if seed is not None:
        return int(seed)
    if generator is not None:
        if hasattr(generator, "initial_seed"):  # torch.Generator
            return int(generator.initial_seed())
        if hasattr(generator, "integers"):  # numpy Generator
            return int(generator.integers(2**63))
        raise TypeError(f"DataLoader: generator must be a torch.Generator or numpy Generator, got {type(generator).__name__}")
    return int.from_bytes(os.urandom(8), "little") >> 1
