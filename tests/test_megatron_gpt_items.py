"""lazyseq.megatron.gpt(..., output='megatron'): megatron-core's GPTDataset items (tokens, labels,
loss_mask, position_ids, attention_mask) equal, value and dtype, to what megatron-core's own
``_get_ltor_masks_and_position_ids`` computes for the same window; the options checked and
fingerprinted; bulk reads equal to single ones."""

from __future__ import annotations

import itertools
import pickle
import warnings

import numpy as np
import pytest

import lazyseq
from lazyseq import megatron
from lazyseq.core.fingerprints import difference
from lazyseq.megatron import gptitem

EOD = 3
FLAGS = list(itertools.product([False, True], repeat=4))  # eod_mask_loss, reset_position_ids, reset_attention_mask, create


def _megatron_core():
    """megatron-core's helper (``megatron-core==0.16.1``, installed with --no-deps: it needs torch)."""
    torch = pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
    except ImportError as e:
        pytest.skip(f"megatron-core is not installed (pip install --no-deps megatron-core==0.16.1): {e}")
    return torch, _get_ltor_masks_and_position_ids


def megatron_item(window: np.ndarray, eod_mask_loss, reset_position_ids, reset_attention_mask, create_attention_mask):
    """What ``GPTDataset.__getitem__`` returns for the window ``text`` (no pad token), as numpy."""
    torch, ltor = _megatron_core()
    text = torch.from_numpy(np.asarray(window)).long()
    tokens, labels = text[:-1].contiguous(), text[1:].contiguous()
    attention_mask, loss_mask, position_ids = ltor(tokens, EOD, reset_position_ids, reset_attention_mask,
                                                   eod_mask_loss, create_attention_mask)
    out = {"tokens": tokens, "labels": labels}
    if create_attention_mask:
        out["attention_mask"] = attention_mask
    out.update(loss_mask=loss_mask, position_ids=position_ids)
    return {k: v.numpy() for k, v in out.items()}


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, (k, got[k].dtype, want[k].dtype)
        assert got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def windows(seed: int, n: int = 12, length: int = 17) -> list[np.ndarray]:
    """Random windows with EODs at random places, at the first and at the last position too."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        w = rng.integers(0, 8, length).astype(np.uint16)  # EOD (3) about one token in eight
        w[rng.random(length) < 0.15] = EOD
        if k % 3 == 0:
            w[0] = EOD
        if k % 4 == 1:
            w[-1] = EOD
        if k % 4 == 2:
            w[-2] = EOD  # the last input token
        out.append(w)
    out += [np.full(length, EOD, np.uint16), np.zeros(length, np.uint16), np.array([EOD, 1], np.uint16)]
    return out


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join("lpac"[k] if x else "-" for k, x in enumerate(f)))
def test_the_item_is_megatron_cores_for_every_option(flags):
    loss, pos, att, create = flags
    opts = dict(eod_token=EOD, eod_mask_loss=loss, reset_position_ids=pos, reset_attention_mask=att,
                create_attention_mask=create)
    ws = windows(sum(k << i for i, k in enumerate(flags)))
    for w in ws:
        assert_same(gptitem.item(w, **opts), megatron_item(w, loss, pos, att, create))
    for got, w in zip(gptitem.item_list(ws, **opts), ws):  # the batched path: equal lengths together
        assert_same(got, megatron_item(w, loss, pos, att, create))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_long_windows_of_any_corpus_dtype(dtype):
    rng = np.random.default_rng(7)
    w = rng.integers(0, 50, 513).astype(dtype)
    w[rng.integers(0, 513, 12)] = EOD
    assert_same(gptitem.item(w, eod_token=EOD, eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True,
                             create_attention_mask=True), megatron_item(w, True, True, True, True))


def test_without_eod_token_no_option_set():
    w = np.arange(9, dtype=np.uint16)
    assert_same(gptitem.item(w), megatron_item(w, False, False, False, False))
    assert_same(gptitem.item(w, create_attention_mask=True), megatron_item(w, False, False, False, True))


# -- through megatron.gpt -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    rng = np.random.default_rng(1)
    docs = [np.append(rng.integers(4, 1000, n), EOD) for n in rng.integers(0, 40, 80)]  # each ends with EOD
    p = tmp_path_factory.mktemp("c") / "corpus"
    megatron.write(p, docs)
    return p


def test_gpt_megatron_items_are_the_token_windows_shifted_with_megatrons_masks(prefix):
    plain = megatron.gpt(prefix, 50, 32, seed=3, cache=False)
    opts = dict(eod_token=EOD, eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True,
                create_attention_mask=True)
    mega = megatron.gpt(prefix, 50, 32, seed=3, cache=False, output="megatron", **opts)
    assert mega.output == "megatron" and plain.output == "tokens" and len(mega) == len(plain)
    for i in range(len(mega)):
        window, item = plain[i], mega[i]
        np.testing.assert_array_equal(item["tokens"], window[:-1])
        np.testing.assert_array_equal(item["labels"], window[1:])
        assert_same(item, megatron_item(window, True, True, True, True))
    idx = [5, 0, 49, 5, 17]
    for got, i in zip(mega[idx], idx):  # a bulk read equals single reads
        assert_same(got, mega[i])
    assert_same(pickle.loads(pickle.dumps(mega))[7], mega[7])


def test_the_short_last_sample_gives_a_short_item(tmp_path):
    megatron.write(tmp_path / "e", [np.arange(30), np.arange(30, 40)])
    v = megatron.gpt(tmp_path / "e", 4, 10, shuffle=False, cache=False, output="megatron")
    assert [len(x["tokens"]) for x in v] == [10, 10, 10, 9]
    assert [len(x["labels"]) for x in v[[3, 0, 3]]] == [9, 10, 9]


def test_a_loader_batches_megatron_items(prefix):
    v = megatron.gpt(prefix, 16, 8, cache=False, output="megatron", eod_token=EOD, reset_position_ids=True)
    batch = next(iter(lazyseq.DataLoader(v, batch_size=4, to_tensor=False)))
    assert sorted(batch) == ["labels", "loss_mask", "position_ids", "tokens"]
    assert batch["tokens"].shape == (4, 8) and batch["loss_mask"].dtype == np.float32


def test_options_are_checked_when_the_view_is_built(prefix):
    for flag in gptitem.EOD_OPTIONS:
        with pytest.raises(ValueError, match=f"{flag}=True needs eod_token"):
            megatron.gpt(prefix, 4, 8, output="megatron", **{flag: True})
    with pytest.raises(ValueError, match="output must be 'tokens' or 'megatron', got 'torch'"):
        megatron.gpt(prefix, 4, 8, output="torch")
    with pytest.raises(ValueError, match="create_attention_mask=True apply to output='megatron' only"):
        megatron.gpt(prefix, 4, 8, create_attention_mask=True)
    with pytest.raises(ValueError, match="eod_token=3 apply to output='megatron' only"):
        megatron.gpt(prefix, 4, 8, eod_token=EOD)
    with pytest.raises(ValueError, match="eod_token must be an int"):
        megatron.gpt(prefix, 4, 8, output="megatron", eod_token="3")


def test_the_options_are_in_the_fingerprint_and_repr(prefix):
    def fp(**kw):
        return lazyseq.fingerprint(megatron.gpt(prefix, 4, 8, cache=False, **kw))

    plain = fp()
    assert "output" not in plain["params"]  # the fingerprint output='tokens' always had
    a = fp(output="megatron", eod_token=EOD, eod_mask_loss=True)
    assert a == fp(output="megatron", eod_token=EOD, eod_mask_loss=True) and a != plain
    b = fp(output="megatron", eod_token=EOD, eod_mask_loss=True, reset_position_ids=True)
    assert difference(a, b) == "megatron.gpt(reset_position_ids=false -> true)"
    assert fp(output="megatron", eod_token=4, eod_mask_loss=True) != a
    v = megatron.gpt(prefix, 4, 8, output="megatron", eod_token=EOD, create_attention_mask=True)
    assert "output='megatron', eod_token=3, create_attention_mask=True" in repr(v)
