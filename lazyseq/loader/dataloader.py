"""DataLoader: PyTorch's DataLoader, built from views only.

``order -> shard(rank, world_size) -> batch(collate) -> prefetch(process, shm) -> smap(to_tensor)``.
The order of an epoch is a pure function of (seed, epoch), so resuming mid-epoch is an index,
not a replay, and persistent workers read the batches of every epoch from one infinite view.
"""

from __future__ import annotations

import math
import operator
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.base import View
from ..core.node import check_source, length, read_many
from ..evaluation import Prefetch, prefetch
from ..helpers import ALIGN, PAGE
from ..views.epochs import at_epoch
from ..views.mapping import smap
from ..views.order import shard
from .batching import buffer_bytes, default_collate
from .checks import method_checks, order_checks, seed_from, torch_checks
from .consumers import Consumer
from .iteration import Clock, LoaderIter, read_epoch
from .plan import Epochs, Plan
from .ranks import ranks
from .seeding import SeedEachItem, WorkerInit
from .state import check_resume, delivered, recorded
from .words import LoaderWords, Replaced, epoch_counters, starved_hint

__all__ = ["DataLoader", "default_collate"]


def _same(x: Any) -> Any:
    return x


class DataLoader:
    """PyTorch's ``DataLoader``, composed from lazyseq views; batches arrive as tinygrad Tensors,
    torch tensors, JAX arrays or numpy arrays (``to_tensor``).

    ``dataset`` is any sequence: a view, a list, a numpy array, an object with ``__getitem__`` and
    ``__len__``. The loader builds ``order -> shard -> batch(collate) -> prefetch -> to_tensor``
    (see :meth:`make_sequence`). Arguments follow PyTorch's, with these additions:

    - ``method``: how ``num_workers`` workers run, any method of :func:`lazyseq.prefetch`
      (``'process'``, the default, or ``'thread'``...).
    - ``shm_size``: bytes of shared memory for process workers (``None``: sized from the first
      sample, 1.25x, for ``num_workers * prefetch_factor + 1`` batches; see :meth:`stats`).
    - ``seed``: the shuffle seed; the order of epoch ``e`` depends on ``(seed, e)`` only.
      ``None`` takes one from ``generator`` if given, else draws one (kept in ``state_dict``).
    - ``seed_each_item``: seed ``random``, ``numpy.random`` (and torch's CPU generator, if torch
      is imported) from ``(seed, epoch, i)`` before reading ``dataset[i]``, so item ``i`` draws the
      same numbers with any number of workers, and after a resume.
    - ``rank``, ``world_size``: this process's part of every epoch (disjoint parts of the same
      permutation; ``drop_last=True`` makes them equal in length). ``None``: from
      ``torch.distributed`` when initialised, else ``RANK``/``WORLD_SIZE`` or
      ``SLURM_PROCID``/``SLURM_NTASKS``, else 0 and 1 (``loader.ranks_from`` says which).
    - ``to_tensor``: ``True``/``'tinygrad'`` (:func:`lazyseq.to_tensor`), ``'torch'``
      (:func:`lazyseq.to_torch`: CPU tensors over the shared-memory slots, no copy), ``'jax'``
      (:func:`lazyseq.to_jax`), ``False``/``'numpy'``; a framework not installed is an
      ImportError here. ``device``: where they go (a jax Device or Sharding for ``'jax'``).
    - ``pin_memory``: with ``'torch'`` and CUDA, batches are copied into reused pinned buffers
      (without CUDA: ignored, one RuntimeWarning); other frameworks ignore it.
    - ``in_order=False``: batches in the order they complete (each still the planned batch).

    Iteration follows PyTorch's rules (:mod:`lazyseq.loader.iteration`): each ``iter(loader)``
    is an epoch from its first batch, one left early makes the next ``iter`` the next epoch, and
    a newer ``iter`` ends a live one. A custom ``sampler`` or ``batch_sampler`` is iterated in
    the reader once per epoch; with one, workers restart every epoch even with
    ``persistent_workers`` (their order cannot be rebuilt in them).

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
                 in_order: bool = True, method: str = "process", shm_size: int | None = None, seed: int | None = None,
                 seed_each_item: bool = False, rank: int | None = None, world_size: int | None = None, device: Any = None,
                 to_tensor: bool | str = True):
        batch_size, shuffle, drop_last, prefetch_factor, multiprocessing_context = torch_checks(
            batch_size, shuffle, sampler, batch_sampler, num_workers, drop_last, timeout, multiprocessing_context,
            prefetch_factor, persistent_workers)
        method_checks(method, num_workers, shm_size, multiprocessing_context, seed_each_item)
        self._consumer = Consumer(to_tensor, device, pin_memory)  # a missing framework is refused now
        rank, world_size, self.ranks_from = ranks(rank, world_size)
        self.dataset = check_source(dataset, "DataLoader")
        if length(dataset) is None:
            raise TypeError("DataLoader: the dataset needs a len() (iterable datasets: wrap them with lazyseq.uniter)")
        self.batch_size, self.shuffle, self.sampler, self.batch_sampler = batch_size, shuffle, sampler, batch_sampler
        self.num_workers, self.collate_fn, self.pin_memory, self.drop_last = num_workers, collate_fn, pin_memory, drop_last
        self.timeout, self.worker_init_fn, self.multiprocessing_context = timeout, worker_init_fn, multiprocessing_context
        self.generator, self.prefetch_factor, self.persistent_workers = generator, prefetch_factor, persistent_workers
        self.method, self.shm_size, self.seed_each_item = method, shm_size, bool(seed_each_item)
        self.in_order = bool(in_order)
        self.rank, self.world_size, self.device, self.to_tensor = rank, world_size, device, to_tensor
        order_checks(dataset, shuffle)
        self.seed = seed_from(seed, generator)
        self._bound: tuple | None = None  # (epoch, seed, dataset, the dataset bound to them): see _data
        self._seed_given = seed is not None or generator is not None  # a resume to another seed is refused
        if world_size > 1 and not drop_last and len({len(shard(range(self._units(0)), r, world_size))
                                                     for r in range(world_size)}) > 1:
            warnings.warn(f"DataLoader: {world_size} ranks get parts of different lengths (the epoch does not "
                          "divide evenly); data-parallel training needs the same number of steps on every rank: "
                          "pass drop_last=True", RuntimeWarning, stacklevel=2)
        # where the next iteration starts: the epoch, the item of its global order that this part of
        # it starts at (not 0 after resuming with another world_size), the batches read in the part
        self.epoch, self._start, self._batch = 0, 0, 0
        self._skip: set[int] = set()  # in_order=False: the batches past _batch delivered already
        self._live: weakref.ref[LoaderIter] | None = None  # the latest iteration (live until it ends)
        self._persistent: Prefetch | None = None
        self._epochs: Epochs | None = None  # what the persistent workers read
        self._open: weakref.WeakSet[Prefetch] = weakref.WeakSet()  # dropped sequences stop their workers
        self.shm_size_used: int | None = None  # what shm_size=None was sized to, from the first sample
        self._shm_note = "no process workers" if num_workers == 0 or method != "process" else \
            "not sized yet" if shm_size is None else self._given_note(shm_size)
        self._warned = False  # about a custom order restarting persistent workers
        self._last: dict | None = None  # what stats() says of the last epoch read (to its end or not)
        self._replaced = Replaced()  # on_error replacements in this process (no workers, thread workers)

    # -- the pipeline ----------------------------------------------------------------------------
    def _custom_order(self) -> bool:
        return self.sampler is not None or self.batch_sampler is not None

    def _data(self, epoch: int) -> Any:
        """The dataset as epoch ``epoch`` reads it: its views built with ``epoch=None`` (and those that
        take the loader's seed) bound to it, kept for the last epoch asked, so that a plan of the
        dataset (``bucket``'s batches, ``pack``'s rows) is computed once here and sent to workers."""
        b = self._bound
        if b is None or b[0] != epoch or b[1] != self.seed or b[2] is not self.dataset:
            b = self._bound = (epoch, self.seed, self.dataset, at_epoch(self.dataset, epoch, self.seed))
        return b[3]

    def _plan(self) -> Plan:
        b = self._bound
        bound = (b[0], b[3]) if b is not None and b[1] == self.seed and b[2] is self.dataset else None
        return Plan(self.dataset, self.batch_size, self.shuffle, self.sampler, self.batch_sampler,
                     self.collate_fn, self.drop_last, self.seed, self.rank, self.world_size, self.seed_each_item, bound)

    def _units(self, epoch: int | None = None) -> int:
        """The length of an epoch's global order (default: the current epoch's): items, or the lists
        of a batch_sampler. A dataset of batches by token budget (``bucket``) has its own per epoch."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            return len(self.sampler)
        return len(self._data(self.epoch if epoch is None else epoch))

    def _batches(self, start: int) -> int:
        """This rank's batches in the part of the current epoch from item ``start`` of its global order."""
        n = len(shard(range(max(0, self._units() - start)), self.rank, self.world_size, self.drop_last))
        if self.batch_size is None:  # no batching, or a batch_sampler: one unit per batch
            return n
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __len__(self) -> int:
        """This rank's batches in the current epoch (with a ``bucket`` dataset, epochs differ)."""
        return self._batches(0)

    def _prefetch(self, seq: View, epoch: int) -> Prefetch:
        shm, ctx = 0, None
        if self.method == "process":  # sized once, from the first sample; later epochs reuse the size
            shm = self.shm_size if self.shm_size is not None else self.shm_size_used or self._size_shm()
            ctx = self.multiprocessing_context
        words = LoaderWords(self._consumer.name, self.num_workers, self.prefetch_factor, self.shm_size is None)
        return prefetch(seq, self.num_workers, self.method, self._slots(),
                        WorkerInit(self.seed, self.rank, epoch, self.worker_init_fn, self.seed_each_item, self.method,
                                   self._data(epoch)), shm,
                        mp_context=ctx, timeout=self.timeout or None, lazy_start=True, words=words,
                        report=self._report(seq) if self.method == "process" else None)

    @staticmethod
    def _report(seq: View) -> Callable[[Any], int | dict]:
        """What process workers count of ``on_error`` replacements: a total for one epoch's batches,
        and for persistent workers, by epoch (``Epochs.skipped``)."""
        return operator.attrgetter("skipped") if isinstance(seq, Epochs) else Replaced()

    def _slots(self) -> int:
        """Batches in flight (the prefetch's max_buffered): the shared-memory slots of process workers."""
        return self.num_workers * self.prefetch_factor + 1

    def _given_note(self, shm_size: int) -> str:
        slots = self._slots()
        return (f"given: shm_size={shm_size} / {slots} slots (num_workers {self.num_workers} x prefetch_factor "
                f"{self.prefetch_factor} + 1) = {shm_size // slots} bytes, rounded down to a multiple of {ALIGN}: "
                f"{shm_size // slots // ALIGN * ALIGN} bytes per slot")

    def _size_shm(self) -> int:
        """Slots sized from the first sample (or, for a dataset that bounds its items, such as ``pack``
        or ``bucket``, from its largest ones): its buffers times the batch size, with their alignment,
        1.25x, in whole pages; the note (``stats()['shm']``) says every term."""
        bound = self._data(self.epoch)
        data = SeedEachItem(bound, self.seed, self.epoch) if self.seed_each_item else bound
        largest = getattr(bound, "largest_items", None)
        idx = largest() if largest is not None else [0] if len(bound) else []
        sizes = [buffer_bytes(x) for x in read_many(data, idx)] or [buffer_bytes(None)]
        nbytes, nbuf = max(n for n, _ in sizes), max(k for _, k in sizes)
        what = "the first sample" if largest is None else f"the largest items of the dataset ({idx})"
        # A slot holds one batch: each array of it starts on an ALIGN boundary, 1.25x of room, in whole
        # pages (so shm_size / slots is the slot the pool makes, and workers never share a page).
        bs, slots = self.batch_size or 1, self._slots()
        roomy = -(-(nbytes * bs + ALIGN * nbuf) * 5 // 4)
        slot = max(PAGE, -(-roomy // PAGE) * PAGE)
        self.shm_size_used = slot * slots
        arrays = f"{nbuf} array{'' if nbuf == 1 else 's'}"
        self._shm_note = (f"sized from {what}: ({nbytes} bytes x batch {bs} + {ALIGN} bytes of alignment x "
                          f"{arrays}) x 1.25 = {roomy} bytes, rounded up to whole {PAGE}-byte pages: {slot} bytes per "
                          f"slot; x {slots} slots (num_workers {self.num_workers} x prefetch_factor "
                          f"{self.prefetch_factor} + 1) = shm_size {self.shm_size_used}")
        return self.shm_size_used

    def make_sequence(self, epoch: int | None = None) -> View:
        """The pipeline of one whole epoch (default: the next one) as a lazy sequence of batches, so
        any batch can be read directly: ``loader.make_sequence()[1234]``. With workers it contains a
        prefetch, whose workers start at the first read: ``loader.close()`` (or leaving the loader's
        ``with`` block) stops them."""
        e = self.epoch if epoch is None else epoch
        seq: View = self._plan()(e)
        if self.num_workers > 0:
            seq = self._prefetch(seq, e)
            self._open.add(seq)  # closed by loader.close() (or leaving its with block), or when dropped
        return self._tensors(seq)

    def _convert(self) -> Callable[[Any], Any]:
        """What the last stage does to a batch: the ``to_tensor`` framework's arrays (or nothing)."""
        return self._consumer.stage() or _same

    def _tensors(self, seq: View) -> View:
        """The last stage: batches as tinygrad, torch or JAX arrays on ``device`` (numpy: as they are)."""
        convert = self._convert()
        return seq if convert is _same else smap(convert, seq)

    # -- iteration -------------------------------------------------------------------------------
    def _where(self) -> tuple[int, int, int]:
        """The (epoch, start, batch) the next batch comes from; past a part's end is the next epoch."""
        if self._batch and self._batch >= self._batches(self._start):
            return self.epoch + 1, 0, 0
        return self.epoch, self._start, self._batch

    def __iter__(self) -> LoaderIter:
        """One epoch's batches from where the loader stands, by PyTorch's rules (:mod:`.iteration`):
        a newer ``iter`` ends a live one, and one left early makes the next ``iter`` the next epoch."""
        self._end_live("a newer iteration of this DataLoader started (iter(loader) was called again)")
        epoch, start, first = self._where()
        self.epoch, self._start, self._batch = epoch, start, first
        it = LoaderIter(read_epoch(self, epoch, start, first, self._skip, time.perf_counter()), epoch,
                        self._batches(start) - first - len(self._skip))
        self._live = weakref.ref(it)
        return it

    def _end_live(self, why: str) -> None:
        it = self._live() if self._live is not None else None
        if it is not None:
            it.end(why)
        self._live = None

    def _counters(self, live: Prefetch | None, root: Any) -> tuple[dict | None, int | dict | None]:
        """The prefetch's counters now, and the items on_error views replaced so far (None: not
        counted, as with Ray actors): summed over process workers, else counted in this process;
        by epoch (a dict) for persistent workers, which compute ahead into the next epochs."""
        stats = live.stats() if live is not None else None
        if live is not None and self.method == "ray":
            return stats, None
        if isinstance(root, Epochs):
            return stats, stats.get("reported_by", {}) if self.method == "process" else root.skipped
        if live is not None and self.method == "process":
            return stats, stats["reported"]
        return stats, self._replaced(root)

    def _epoch_ended(self, epoch: int, read: int, finished: bool, live: Prefetch | None, root: Any,
                     before: tuple[dict | None, int | dict | None], clock: Clock) -> None:
        """Keep what stats() says of this epoch: its counters (the change over it, for persistent
        workers), and how long the caller waited in ``next()`` (``wait_s``, ``starved``, ``hint``)."""
        stats, replaced = self._counters(live, root)
        last: dict = {"epoch": epoch, "batches": read, "finished": finished}
        if read:
            last.update(wait_s=clock.wait, wall_s=clock.wall, starved=min(1.0, clock.wait / clock.wall) if clock.wall else 0.0)
        if stats is not None:
            last["prefetch"] = epoch_counters(stats, before[0])
        if read:
            last["hint"] = starved_hint(last, self.num_workers if live is not None else 0)
        if isinstance(replaced, dict):  # persistent workers: what the batches of this epoch replaced
            last["skipped"] = replaced.get(epoch, 0)
        elif replaced is not None:
            last["skipped"] = replaced - (before[1] or 0)
        self._last = last

    def _persistent_part(self, plan: Plan, epoch: int, start: int, nb: int) -> tuple[Prefetch, int]:
        """Where the ``nb`` batches of ``epoch`` from item ``start`` on begin in the persistent
        workers' prefetch (started afresh after a crash, Ctrl-C, or a jump back to an earlier epoch)."""
        p, off = self._persistent, None
        if p is not None and not p.closed:
            off = self._epochs.offset(epoch, start)
        if off is None:
            if p is not None:
                p.close()
            self._epochs = Epochs(plan, epoch, start, nb)
            self._persistent, off = self._prefetch(self._epochs, epoch), 0
        return self._persistent, off

    def _warn_custom_order(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn("DataLoader: with a custom sampler or batch_sampler the workers restart every epoch "
                          "(persistent_workers keeps them only for shuffle or sequential order)", RuntimeWarning,
                          stacklevel=3)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (from its first batch); a live one ends."""
        self._end_live("set_epoch() was called")
        self.epoch, self._start, self._batch = int(epoch), 0, 0
        self._skip.clear()

    def state_dict(self) -> dict:
        """Where the loader stands: the epoch of the next batch, and ``position``, the items of that
        epoch's global order that all ranks together have consumed (every rank having read as many
        batches as this one), with the seed that fixes every order. Taken while an iteration is
        live, it is exactly where that iteration is; with ``in_order=False``, ``delivered`` lists
        the batches after ``position`` already delivered (of this rank's part from there)."""
        epoch, start, b = self._where()
        position = min(self._units(epoch), start + self.world_size * b * (self.batch_size or 1))
        out = {"epoch": epoch, "position": position, "seed": self.seed, "rank": self.rank,
               "world_size": self.world_size, **recorded(self)}
        if self._skip and (epoch, start) == (self.epoch, self._start):
            out.update(delivered=sorted(k - b for k in self._skip), batch_size=self.batch_size)
        return out

    def load_state_dict(self, state: Mapping, strict: bool = True) -> None:
        """Resume where ``state`` was saved: the next iteration delivers this rank's part of what
        remains of the epoch's global order, whatever ``world_size`` (and ``batch_size``) the state
        was saved with; with the same ones, exactly the batches that would have come next.

        The state holds the dataset's :func:`lazyseq.fingerprint`: a state saved with another
        pipeline raises :class:`lazyseq.ResumeMismatch` naming what changed (``strict=False``:
        a warning, and the resume goes on)."""
        self._end_live("load_state_dict() was called")
        check_resume(self, state, strict)
        epoch, seed = int(state["epoch"]), int(state["seed"])
        if "position" in state:
            position = int(state["position"])
        else:  # saved before positions: the batch this rank was at, every rank as far
            position = int(state["batch"]) * int(state.get("world_size", self.world_size)) * (self.batch_size or 1)
        n = self._units(epoch) if epoch >= 0 else 0
        if not 0 <= position <= n or epoch < 0:
            raise ValueError(f"DataLoader.load_state_dict: the state is at item {position} of epoch {epoch}, but "
                             f"an epoch of this loader has {n} items: was it saved with another dataset?")
        self.epoch, self._start, self._batch, self.seed = epoch, position, 0, seed
        self._skip = delivered(self, state, strict)
        if self._persistent is not None:  # its workers hold the old seed
            self._persistent.close()
            self._persistent = None

    def stats(self) -> dict:
        """Where the loader stands (``epoch``, ``batch``), how the shared memory was sized (``shm``:
        every term of the sum; ``shm_size``; ``slot_size``, the bytes of one batch's slot), the
        ``prefetch`` counters and ``worker_pids`` of the running workers, and ``last_epoch``: what
        the last epoch read (to its end or not) did, kept after its workers stop: its ``epoch``,
        the ``batches`` read, whether it ``finished``, its ``prefetch`` counters (for persistent
        workers, their change over the epoch) and ``skipped``: the items that ``on_error`` views
        in the dataset replaced, summed over the workers (not counted with ``method='ray'``); for
        persistent workers, in the batches of that epoch they computed, whenever they did; and
        ``wait_s``, the seconds the caller spent inside ``next()`` waiting for batches, ``starved``,
        that over the epoch's wall time (``wall_s``: from ``iter()`` to the last batch delivered;
        0: the loader was always ahead), with a ``hint`` of what limited it when above 0.1."""
        shm = self.shm_size if self.shm_size is not None else self.shm_size_used
        out: dict = {"epoch": self.epoch, "batch": self._batch, "shm": self._shm_note, "shm_size": shm}
        if self.num_workers and self.method == "process":
            out["slot_size"] = shm // self._slots() // ALIGN * ALIGN if shm else None  # as the slot pool cuts it
        live = self._persistent or next(iter(self._open), None)
        if live is not None:
            out.update(prefetch=live.stats(), worker_pids=live.worker_pids())
        if self._last is not None:
            out["last_epoch"] = {**self._last}
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

    def __repr__(self) -> str:
        """The settings, the length in batches and the next batch's epoch, then the dataset's tree."""
        from ..core.html import loader_repr

        return loader_repr(self)

    def _repr_html_(self) -> str:
        """Notebooks: the ``repr``, then the dataset's first items (:mod:`lazyseq.core.html`)."""
        from ..core.html import loader_html

        return loader_html(self)
