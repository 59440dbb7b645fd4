"""``lazyseq.megatron.gpt``: fixed-length GPT samples over Megatron documents, item for item those
of tinygrad's MLPerf loader (``examples/mlperf/dataloader.py``, ``GPTDataset``).

The index, as tinygrad builds it, with numpy instead of a loop per sample:

- ``epochs``: the fewest (at least 1) whose tokens reach ``num_samples * seq_length``;
- ``doc_idx``: the sequence numbers ``0..n-1`` repeated once per epoch (int32), shuffled as one
  array by ``np.random.RandomState(seed).shuffle`` when ``shuffle``;
- ``sample_idx`` (``num_samples + 1`` rows of ``(position in doc_idx, token offset)``): sample
  ``k`` holds the tokens ``k * seq_length`` to ``k * seq_length + seq_length`` (inclusive) of the
  documents in ``doc_idx`` order, so consecutive samples share one token. Boundary ``k`` is the
  document holding token ``k * seq_length``, counted from a histogram of the cumulative
  lengths (a vectorised ``searchsorted``); row 0 is ``(0, 0)``. When the epochs hold exactly ``num_samples * seq_length`` tokens
  the last boundary is past the end, and tinygrad ends the last sample at the last token: that
  sample has ``seq_length`` tokens, one short;
- ``shuffle_idx``: ``arange(num_samples)`` (int32), shuffled by the same generator afterwards.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ..core.base import View
from ..errors import StoreError
from ..files import redact
from . import cache, gptitem
from .idx import Indexed, indexed

__all__ = ["GPT", "gpt", "epochs", "plan", "build", "boundaries", "check_int"]


def check_int(x: Any, what: str, lo: int, hi: int | None = None) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < lo or (hi is not None and x > hi):
        bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{what} must be an int {bound}, got {x!r}")
    return int(x)


def epochs(tokens: int, num_samples: int, seq_length: int) -> int:
    """How many epochs of ``tokens`` tokens tinygrad reads: the fewest, at least 1, that hold
    ``num_samples * seq_length`` tokens."""
    return max(1, -(-(num_samples * seq_length) // tokens))


INDEX_BYTES = 28  # per entry of doc_idx while the index is built: doc_idx, lengths, ends, their ceilings


def plan(sizes: np.ndarray, num_samples: int, seq_length: int, shown: str) -> int:
    """The epochs of ``sizes`` that ``num_samples`` samples need, checked before anything is
    allocated: a :class:`~lazyseq.StoreError` naming the corpus (``shown``) when it holds no
    token, when it has more sequences than tinygrad's int32 ``doc_idx`` numbers, or when the index
    would hold more document entries than one pass over the corpus plus one per token sampled
    (``len(sizes) + num_samples * (seq_length + 1)``). That bound holds for any corpus whose
    sequences average at least one token (``len(sizes) * epochs <= len(sizes) + tokens
    sampled``); past it, the epochs are made of empty sequences, and the index's size follows
    them rather than the samples asked for."""
    n, tokens = len(sizes), int(sizes.sum(dtype=np.int64))
    if not tokens:
        raise StoreError(f"lazyseq.megatron.gpt: {shown} holds no tokens ({n} sequences, all empty): there are no "
                         "samples to cut")
    if n > np.iinfo(np.int32).max:
        raise StoreError(f"lazyseq.megatron.gpt: {shown} has {n} sequences; the index numbers them in int32 "
                         f"(at most {np.iinfo(np.int32).max}), as tinygrad's does")
    n_epochs = epochs(tokens, num_samples, seq_length)
    bound = n + num_samples * (seq_length + 1)
    if n * n_epochs > bound:
        raise StoreError(
            f"lazyseq.megatron.gpt: {shown} holds {tokens} tokens in {n} sequences: {num_samples} samples of "
            f"{seq_length} tokens need {n_epochs} epochs of it, an index of {n * n_epochs} document entries "
            f"({n * n_epochs * INDEX_BYTES / 2**30:.3g} GiB to build); more than {bound}, one pass over the corpus "
            "and one entry per token sampled, is refused (its sequences are mostly empty): ask for fewer samples, "
            "or leave the empty sequences out of the corpus")
    return n_epochs


def boundaries(lens: np.ndarray, num_samples: int, seq_length: int) -> np.ndarray:
    """``sample_idx`` for documents of lengths ``lens`` (in ``doc_idx`` order), vectorised."""
    out = np.zeros((num_samples + 1, 2), np.int64)
    if not num_samples:
        return out
    ends = np.cumsum(lens, dtype=np.int64)
    pos = np.arange(1, num_samples + 1, dtype=np.int64) * seq_length
    # the document holding token pos (empty ones skipped) is the number of documents ending at or
    # before pos: ends <= k * seq_length exactly when ceil(ends / seq_length) <= k, so one histogram
    # of those ceilings, summed up, counts them for every k at once (a searchsorted, in O(n))
    first = np.minimum((ends + (seq_length - 1)) // seq_length, num_samples + 1)
    d = np.cumsum(np.bincount(first, minlength=num_samples + 2))[1 : num_samples + 1]
    past = d >= len(lens)  # only the last boundary, when the epochs hold exactly the tokens asked for
    if past.any():
        d[past] = len(lens) - 1
    out[1:, 0] = d
    out[1:, 1] = pos - (ends[d] - lens[d])
    if past.any():
        out[1:][past, 1] = lens[-1] - 1
    return out


def build(sizes: np.ndarray, num_samples: int, seq_length: int, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(doc_idx, shuffle_idx)`` as tinygrad builds them: one generator, the documents first."""
    n_epochs = epochs(int(sizes.sum(dtype=np.int64)), num_samples, seq_length)
    doc_idx = np.tile(np.arange(len(sizes), dtype=np.int32), n_epochs)
    shuffle_idx = np.arange(num_samples, dtype=np.int32)
    if shuffle:
        rng = np.random.RandomState(seed)
        rng.shuffle(doc_idx)
        rng.shuffle(shuffle_idx)
    return doc_idx, shuffle_idx


def _check(count: int, n_epochs: int, num_samples: int):
    """The bounds check of a cached ``(doc_idx, shuffle_idx)``: each sequence ``n_epochs`` times,
    each sample once (shapes and dtypes are checked when read)."""
    def check(doc_idx: np.ndarray, shuffle_idx: np.ndarray) -> None:
        if len(doc_idx) and (doc_idx.min() < 0 or doc_idx.max() >= count
                             or (np.bincount(doc_idx, minlength=count) != n_epochs).any()):
            raise ValueError("doc_idx is not the documents once per epoch")
        if num_samples and (shuffle_idx.min() < 0 or shuffle_idx.max() >= num_samples
                            or (np.bincount(shuffle_idx, minlength=num_samples) != 1).any()):
            raise ValueError("shuffle_idx is not a permutation of the samples")
    return check


class GPT(View):
    fingerprint_skip = ("cache", "cache_dir")  # where the index is cached decides no sample
    """Fixed-length samples of Megatron documents: see :func:`gpt`."""

    checks_keys = False

    def __init__(self, docs: Any, num_samples: int, seq_length: int, *, seed: int = 0, shuffle: bool = True,
                 cache: bool = True, cache_dir: str | os.PathLike | None = None, output: str = "tokens",
                 eod_token: int | None = None, eod_mask_loss: bool = False, reset_position_ids: bool = False,
                 reset_attention_mask: bool = False, create_attention_mask: bool = False, **remote: Any):
        self._opts = gptitem.options("lazyseq.megatron.gpt", output, eod_token, eod_mask_loss=eod_mask_loss,
                                     reset_position_ids=reset_position_ids, reset_attention_mask=reset_attention_mask,
                                     create_attention_mask=create_attention_mask)
        self.docs = opened(docs, remote, "lazyseq.megatron.gpt")
        self.num_samples = check_int(num_samples, "lazyseq.megatron.gpt: num_samples", 0)
        self.seq_length = check_int(seq_length, "lazyseq.megatron.gpt: seq_length", 1)
        self.seed = check_int(seed, "lazyseq.megatron.gpt: seed", 0, 2**32 - 1)
        self.shuffle, self.cache, self.cache_dir = bool(shuffle), bool(cache), cache_dir
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()

    def __reduce__(self):  # the index goes with the view, built once, here
        return (_restore, (self.docs, self.num_samples, self.seq_length, self.seed, self.shuffle, self.cache,
                           self.cache_dir, self.index(), self._opts))

    @property
    def output(self) -> str:
        """``'tokens'`` (windows of ``seq_length + 1`` tokens) or ``'megatron'`` (megatron-core's items)."""
        return "megatron" if self._opts else "tokens"

    def fingerprint_extra(self) -> dict:
        """The item options (none for ``output='tokens'``: its fingerprint is the one it always had)."""
        return {"output": "megatron", **self._opts} if self._opts else {}

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(doc_idx, sample_idx, shuffle_idx)``, as tinygrad's ``GPTDataset`` has them (built, or
        read from the cache, at the first call)."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = self._build()
        return self._index

    def plan(self) -> int:
        """The epochs of the corpus the samples need, checked (see :func:`plan`): a
        :class:`~lazyseq.StoreError` before anything is allocated for a corpus they cannot come from."""
        return plan(self.docs.sizes, self.num_samples, self.seq_length, redact(self.docs.idx_file))

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sizes = self.docs.sizes
        n_epochs, n = self.plan(), self.num_samples
        params = {"num_samples": n, "seq_length": self.seq_length, "seed": self.seed, "shuffle": self.shuffle}
        spec = [("doc_idx", "<i4", (len(sizes) * n_epochs,)), ("shuffle_idx", "<i4", (n,))]
        doc_idx, shuffle_idx = cache.cached(
            "gpt", self.docs, params, spec, lambda: build(sizes, n, self.seq_length, self.seed, self.shuffle),
            _check(len(sizes), n_epochs, n), self.cache_dir, self.cache)
        sample_idx = boundaries(sizes[doc_idx].astype(np.int64), n, self.seq_length)
        return doc_idx, sample_idx, shuffle_idx

    def _len(self) -> int:
        return self.num_samples

    def _get(self, i: int) -> Any:
        window = self._window(i)
        return gptitem.item(window, **self._opts) if self._opts else window

    def _get_many(self, idx: Any) -> list:
        windows = [self._window(i) for i in idx]
        return gptitem.item_list(windows, **self._opts) if self._opts else windows

    def _window(self, i: int) -> np.ndarray:
        doc_idx, sample_idx, shuffle_idx = self.index()
        j = int(shuffle_idx[i])
        (d0, o0), (d1, o1) = sample_idx[j].tolist(), sample_idx[j + 1].tolist()
        docs = self.docs
        if d0 == d1:
            return docs.tokens(int(doc_idx[d0]), o0, o1 + 1).copy()
        ids = doc_idx[d0 : d1 + 1].tolist()
        sizes = docs.sizes
        spans = [(ids[0], o0, int(sizes[ids[0]])), *((k, 0, int(sizes[k])) for k in ids[1:-1]), (ids[-1], 0, o1 + 1)]
        return np.concatenate(docs.spans(spans))  # over a URL: the ranges fetched at once

    def children(self) -> tuple:
        return (self.docs,)

    def describe(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self._opts.items() if v not in (None, False))
        more = f", output='megatron'{opts}" if self._opts else ""
        return (f"megatron.gpt(num_samples={self.num_samples}, seq_length={self.seq_length}, seed={self.seed}, "
                f"shuffle={self.shuffle}{more})")


DEFAULTS = {"storage_options": None, "block_cache": 64 * 2**20, "timeout": 30.0}  # indexed()'s, passed through


def opened(docs: Any, remote: dict, who: str) -> Indexed:
    """``docs`` if an :class:`Indexed` view, else the corpus at the prefix ``docs`` opened with
    ``remote`` (the keywords of :func:`indexed` in ``DEFAULTS``)."""
    unknown = set(remote) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"{who}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if isinstance(docs, Indexed):
        given = sorted(k for k, v in remote.items() if v != DEFAULTS[k])
        if given:
            raise ValueError(f"{who}: {', '.join(given)} open a corpus from its prefix; docs is already an indexed "
                             "view (pass them to megatron.indexed)")
        return docs
    return indexed(docs, **remote)


def _restore(docs, num_samples, seq_length, seed, shuffle, use_cache, cache_dir, index, opts=None) -> GPT:
    more = {"output": "megatron", **opts} if opts else {}
    v = GPT(docs, num_samples, seq_length, seed=seed, shuffle=shuffle, cache=use_cache, cache_dir=cache_dir, **more)
    v._index = index
    return v


def gpt(docs: Any, num_samples: int, seq_length: int, *, seed: int = 0, shuffle: bool = True, cache: bool = True,
        cache_dir: str | os.PathLike | None = None, output: str = "tokens", eod_token: int | None = None,
        eod_mask_loss: bool = False, reset_position_ids: bool = False, reset_attention_mask: bool = False,
        create_attention_mask: bool = False, storage_options: dict | None = None,
        block_cache: int = 64 * 2**20, timeout: float = 30.0) -> GPT:
    """``num_samples`` samples of ``seq_length + 1`` tokens cut from the documents ``docs`` (an
    :func:`indexed` view, or a prefix), item for item those of tinygrad's MLPerf ``GPTDataset``.

    Item ``i`` equals ``GPTDataset(prefix, num_samples, seq_length, seed, shuffle)[i]``: the
    documents are repeated for as many epochs as ``num_samples * seq_length`` tokens need,
    shuffled together with ``np.random.RandomState(seed)``, cut into samples that span documents
    and share one token with the next, and the samples are shuffled with the same generator.
    When the epochs hold exactly ``num_samples * seq_length`` tokens, the last sample (before the
    sample shuffle) is one token short, as in tinygrad. ``shuffle=False`` keeps both orders.
    Items are new (writable) arrays of the documents' dtype.

    ``output='megatron'`` gives megatron-core's ``GPTDataset`` item of each window instead, as
    numpy (no torch): a dict of ``tokens`` (the window's first ``seq_length`` tokens) and
    ``labels`` (its last ``seq_length``), int64; ``loss_mask``, float32; ``position_ids``, int64;
    and with ``create_attention_mask=True`` an ``attention_mask``, bool of shape ``[1, seq_length,
    seq_length]``, **True where attention is masked** (megatron's convention). Megatron-core's
    options: ``eod_mask_loss`` (loss 0 where the input token is ``eod_token``),
    ``reset_position_ids`` (positions counted from each document's start) and
    ``reset_attention_mask`` (attention within a document; without ``create_attention_mask`` it
    changes nothing, as in megatron-core) each need ``eod_token``. The values equal ``_get_ltor_masks_and_position_ids``'s
    for the same window (see :mod:`lazyseq.megatron.gptitem`; a tokenizer's pad token, which
    megatron-core also masks, is not taken). The options enter the view's fingerprint.

    Building the view reads nothing: the index is built at the first read, with vectorised numpy,
    and cached beside the data (else under ``cache_dir``, default ``$XDG_CACHE_HOME/lazyseq`` or
    ``~/.cache/lazyseq``; ``cache=False``: not at all). The samples are fixed by ``seed`` and take
    no epoch: shuffle them per epoch on top (a ``DataLoader`` with ``shuffle=True`` does). The view
    pickles with its index: prefetch workers never rebuild it, and refuse (``StoreError``) a corpus
    whose sequence sizes changed since. Sizes the data implies are checked before the index is
    built: a corpus without tokens, or one so empty that the index would hold more document
    entries than one pass over it plus one per token sampled, is a ``StoreError`` (:func:`plan`).

    A URL prefix opens with ``storage_options``, ``block_cache`` and ``timeout`` (see
    :func:`indexed`); its index is cached under ``cache_dir`` (else the indexed view's
    ``cache_dir``, else the default), never beside the data. ``gpt(indexed(url, cache_dir=d), ...)``
    also keeps the corpus's files in ``d``.

    >>> import tempfile, os
    >>> from lazyseq import megatron
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'corpus')
    >>> megatron.write(prefix, [np.arange(10), np.arange(100, 105)])
    >>> samples = megatron.gpt(prefix, num_samples=3, seq_length=4, shuffle=False)
    >>> [s.tolist() for s in samples]
    [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, 100, 101, 102]]
    >>> item = megatron.gpt(prefix, 3, 4, shuffle=False, output='megatron', eod_token=9, reset_position_ids=True)[2]
    >>> item['tokens'], item['labels'], item['position_ids']
    (array([  8,   9, 100, 101]), array([  9, 100, 101, 102]), array([0, 1, 0, 1]))
    """
    return GPT(docs, num_samples, seq_length, seed=seed, shuffle=shuffle, cache=cache, cache_dir=cache_dir,
               output=output, eod_token=eod_token, eod_mask_loss=eod_mask_loss, reset_position_ids=reset_position_ids,
               reset_attention_mask=reset_attention_mask, create_attention_mask=create_attention_mask,
               storage_options=storage_options, block_cache=block_cache, timeout=timeout)
