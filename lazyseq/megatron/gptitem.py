"""Megatron-core's ``GPTDataset`` item from a window of ``seq_length + 1`` tokens, in numpy.

``GPTDataset.__getitem__`` (megatron-core 0.16.1, ``add_extra_token_to_sequence=True``) reads
``text``, a window of ``seq_length + 1`` tokens, and returns ``tokens = text[:-1]`` and
``labels = text[1:]`` (int64) with what ``_get_ltor_masks_and_position_ids(tokens, ...)`` builds
from the *inputs* ``tokens``:

- ``loss_mask`` (float32): 1, and 0 where ``tokens == eod_token`` when ``eod_mask_loss`` (the
  prediction made *at* an EOD, of the next document's first token, is not trained; predicting
  the EOD itself is);
- ``position_ids`` (int64): ``0..seq_length-1``; with ``reset_position_ids``, counted from the
  start of each document, the token after an EOD being 0 (the EOD keeps its document's position);
- ``attention_mask`` (bool, ``[1, seq_length, seq_length]``, only with ``create_attention_mask``):
  **True where attention is masked** (megatron's ``attention_mask < 0.5``): above the diagonal,
  and with ``reset_attention_mask`` also from a token to any token at or before an EOD that
  precedes it (tokens attend within their own document only).

Megatron computes them with a Python loop over the EOD positions; here they are vectorised over
a batch of windows: a token's document start is ``np.maximum.accumulate`` over the positions
after the EODs, its document number a cumulative count of EODs before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["OPTIONS", "EOD_OPTIONS", "options", "items", "item", "item_list"]

EOD_OPTIONS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask")
OPTIONS = (*EOD_OPTIONS, "create_attention_mask")


def options(who: str, output: str, eod_token: Any, **flags: Any) -> dict:
    """The megatron options checked: ``output`` ``'tokens'`` or ``'megatron'``; ``eod_token`` an
    int, required by any of :data:`EOD_OPTIONS` set; none of them (nor ``eod_token``) with
    ``output='tokens'``. Returns ``{'eod_token': ..., **flags}`` as bools (empty for ``'tokens'``).

    >>> options('gpt', 'megatron', 2, eod_mask_loss=True, reset_position_ids=False,
    ...         reset_attention_mask=False, create_attention_mask=False)['eod_mask_loss']
    True
    >>> options('gpt', 'megatron', None, eod_mask_loss=True, reset_position_ids=False,
    ...         reset_attention_mask=False, create_attention_mask=False)
    Traceback (most recent call last):
    ValueError: gpt: eod_mask_loss=True needs eod_token (the id of the end-of-document token)
    """
    if output not in ("tokens", "megatron"):
        raise ValueError(f"{who}: output must be 'tokens' or 'megatron', got {output!r}")
    if eod_token is not None and (isinstance(eod_token, (bool, np.bool_)) or not isinstance(eod_token, (int, np.integer))):
        raise ValueError(f"{who}: eod_token must be an int, got {eod_token!r}")
    given = [k for k in OPTIONS if flags[k]]
    if output == "tokens":
        if given or eod_token is not None:
            what = ", ".join([f"{k}=True" for k in given] + ([f"eod_token={eod_token!r}"] if eod_token is not None else []))
            raise ValueError(f"{who}: {what} apply to output='megatron' only (output='tokens' gives the token windows)")
        return {}
    need = [k for k in EOD_OPTIONS if flags[k]]
    if need and eod_token is None:
        raise ValueError(f"{who}: {', '.join(f'{k}=True' for k in need)} needs eod_token (the id of the "
                         "end-of-document token)")
    return {"eod_token": None if eod_token is None else int(eod_token), **{k: bool(flags[k]) for k in OPTIONS}}


def items(text: np.ndarray, eod_token: int | None = None, eod_mask_loss: bool = False,
          reset_position_ids: bool = False, reset_attention_mask: bool = False,
          create_attention_mask: bool = False) -> dict[str, np.ndarray]:
    """Megatron-core's items of a batch of windows ``text`` (``[batch, seq_length + 1]``), each
    array with a leading batch axis (``attention_mask``: ``[batch, 1, seq_length, seq_length]``).

    >>> out = items(np.array([[5, 0, 7, 8, 9]]), eod_token=0, eod_mask_loss=True, reset_position_ids=True)
    >>> out['tokens'], out['labels'], out['loss_mask'], out['position_ids']
    (array([[5, 0, 7, 8]]), array([[0, 7, 8, 9]]), array([[1., 0., 1., 1.]], dtype=float32), array([[0, 1, 0, 1]]))
    """
    text = np.asarray(text)
    tokens, labels = text[:, :-1].astype(np.int64), text[:, 1:].astype(np.int64)
    b, s = tokens.shape
    at = np.arange(s, dtype=np.int64)
    eod = tokens == eod_token if eod_token is not None else np.zeros((b, s), bool)
    loss_mask = np.ones((b, s), np.float32)
    if eod_mask_loss:
        loss_mask[eod] = 0.0
    position_ids = np.tile(at, (b, 1))
    if reset_position_ids and s:
        after = np.zeros((b, s), np.int64)  # where a document starts: the position after an EOD
        after[:, 1:] = np.where(eod[:, :-1], at[1:], 0)
        position_ids -= np.maximum.accumulate(after, axis=1)
    out = {"tokens": tokens, "labels": labels}
    if create_attention_mask:
        masked = np.broadcast_to(at[None, :] > at[:, None], (b, s, s))
        if reset_attention_mask:
            doc = np.cumsum(eod, axis=1) - eod  # the EODs before each token: its document
            masked = masked | (doc[:, :, None] != doc[:, None, :])
        out["attention_mask"] = np.ascontiguousarray(masked)[:, None]
    out["loss_mask"], out["position_ids"] = loss_mask, position_ids
    return out


def item(window: np.ndarray, **opts: Any) -> dict[str, np.ndarray]:
    """Megatron-core's item of one window of ``seq_length + 1`` tokens (see :func:`items`).

    >>> sorted(item(np.arange(5), create_attention_mask=True)['attention_mask'].shape)
    [1, 4, 4]
    """
    return {k: v[0] for k, v in items(np.asarray(window)[None], **opts).items()}


def item_list(windows: Sequence[np.ndarray], **opts: Any) -> list[dict[str, np.ndarray]]:
    """:func:`item` of each window, computed together for the windows of each length (all but
    a short last sample share one).

    >>> [len(x['tokens']) for x in item_list([np.arange(5), np.arange(4), np.arange(5)])]
    [4, 3, 4]
    """
    out: list[Any] = [None] * len(windows)
    by_len: dict[int, list[int]] = {}
    for k, w in enumerate(windows):
        by_len.setdefault(len(w), []).append(k)
    for ks in by_len.values():
        batch = items(np.stack([windows[k] for k in ks]), **opts)
        for row, k in enumerate(ks):
            out[k] = {name: v[row] for name, v in batch.items()}
    return out
