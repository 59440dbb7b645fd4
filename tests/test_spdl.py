"""The SPDL DataLoader example (docs/spdl.md): paths -> decode and resize in workers -> one array per
batch -> transfer to the device (tinygrad, CPU) in one thread; the same batches in order or not."""

import numpy as np
import pytest

import lazyseq as ls
from lazyseq.bench.spdl import Decode, make_jpegs, stack

pytest.importorskip("PIL")
pytest.importorskip("tinygrad")

N, BATCH, OUT = 40, 8, 32


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return make_jpegs(str(tmp_path_factory.mktemp("jpegs")), N, size=64)


@pytest.fixture(scope="module")
def expected(paths):
    decode = Decode(OUT)
    return [np.stack([decode(p) for p in paths[k : k + BATCH]]) for k in range(0, N, BATCH)]


def to_device(b):
    return ls.to_tensor(b, device="CPU")


def test_generated_images_decode_to_the_size_asked(paths):
    img = Decode(OUT)(paths[0])
    assert img.shape == (OUT, OUT, 3) and img.dtype == np.uint8 and img.flags.writeable
    assert len(set(paths)) == N and 0 < img.std()  # not blank


@pytest.mark.parametrize("method", ["thread", "process"])
def test_in_order_with_a_one_thread_transfer_stage(paths, expected, method):
    batches = ls.batch(ls.smap(Decode(OUT), paths), BATCH, collate_fn=stack)
    shm = 4 * BATCH * OUT * OUT * 3 + (1 << 16) if method == "process" else 0
    with ls.prefetch(batches, 2, method, max_buffered=4, shm_size=shm) as decoded, \
            ls.prefetch(ls.smap(to_device, decoded), 1, max_buffered=2) as loader:
        got = [t.numpy() for t in loader]
        assert (loader[3].numpy() == expected[3]).all()  # any batch, in any order
        if method == "process":
            assert decoded.stats()["fallbacks"] == 0  # every batch came through shared memory
    assert len(got) == len(expected) and all((g == e).all() for g, e in zip(got, expected))


@pytest.mark.parametrize("method", ["thread", "process"])
def test_completion_order_delivers_the_same_batches_a_slow_file_last(paths, expected, method):
    decode = Decode(OUT, slow=[paths[2]], extra=0.6)
    batches = ls.batch(ls.smap(decode, paths), BATCH, collate_fn=stack)
    shm = 4 * BATCH * OUT * OUT * 3 + (1 << 16) if method == "process" else 0
    with ls.prefetch(batches, 2, method, max_buffered=4, shm_size=shm) as decoded:
        arrived = [(k, to_device(b)) for k, b in decoded.unordered()]
        assert (decoded[0] == expected[0]).all()  # random access again after the pass
    order = [k for k, _ in arrived]
    assert sorted(order) == list(range(len(expected))) and order[-1] == 0
    assert all((t.numpy() == expected[k]).all() for k, t in arrived)


def test_completion_order_behind_a_one_thread_transfer_stage(paths, expected):
    decode = Decode(OUT, slow=[paths[2]], extra=0.4)
    batches = ls.batch(ls.smap(decode, paths), BATCH, collate_fn=stack)
    with ls.prefetch(batches, 2, max_buffered=4) as decoded:
        pairs = ls.uniter(decoded.unordered())
        staged = ls.smap(lambda kb: (kb[0], to_device(kb[1])), pairs)
        with ls.prefetch(staged, 1, max_buffered=2) as loader:
            arrived = list(loader)
    assert [k for k, _ in arrived][-1] == 0 and sorted(k for k, _ in arrived) == list(range(len(expected)))
    assert all((t.numpy() == expected[k]).all() for k, t in arrived)


def test_images_in_completion_order_batched_as_they_come(paths, expected):
    """SPDL's other reading of completion order: images of different batches mix."""
    decode = Decode(OUT, slow=[paths[0]], extra=0.4)
    with ls.prefetch(ls.smap(decode, paths), 2) as images:
        batches, buf = [], []
        for k, img in images.unordered():
            buf.append((k, img))
            if len(buf) == BATCH:
                batches.append(buf)
                buf = []
    flat = np.concatenate(expected)
    assert len(batches) == N // BATCH and 0 not in [k for k, _ in batches[0]]
    assert sorted(k for b in batches for k, _ in b) == list(range(N))
    assert all((img == flat[k]).all() for b in batches for k, img in b)
