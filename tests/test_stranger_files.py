"""A stranger's files, opened the one way (lazyseq/files/local.py): never through a symbolic link,
never waiting on a FIFO, anything but a regular file refused by its descriptor, a manifest no larger
than a manifest can be. The store's own cases are in test_store_hostile.py; here the Megatron
reader, its index cache, a manifest linked out or pointing at /dev/zero, and a link flipped while
shards open (a check of the path followed by a second open would lose that race)."""

import os
import threading
import time

import numpy as np
import pytest

import lazyseq
import lazyseq.megatron as mg
from lazyseq import StoreError
from lazyseq.files.local import map_data, open_data, read_data
from tests.hostile import raised_within

DOCS = [np.arange(n, dtype=np.int32) for n in range(3, 30)]




@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "id_rsa"
    path.parent.mkdir()
    path.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----" * 40)
    return path


@pytest.mark.parametrize("which", ["bin", "idx"])
def test_a_corpus_file_linked_elsewhere_is_refused(tmp_path, secret, which):
    corpus = tmp_path / "data" / "corpus"
    corpus.parent.mkdir()
    mg.write(corpus, DOCS)
    target = corpus.with_suffix(f".{which}")
    target.unlink()
    if which == "idx":  # a valid index, but outside the data: still a link
        other = tmp_path / "outside" / "other"
        mg.write(other, DOCS)
        secret = other.with_suffix(".idx")
    target.symlink_to(secret)
    with pytest.raises(StoreError, match=rf"corpus.{which} \(the corpus's .{which}\) is a symbolic link"):
        mg.indexed(corpus)


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_a_corpus_file_that_is_not_a_regular_file_is_named_at_once(tmp_path, kind):
    corpus = tmp_path / "corpus"
    mg.write(corpus, DOCS)
    (tmp_path / "corpus.bin").unlink()
    os.mkfifo(tmp_path / "corpus.bin") if kind == "FIFO" else os.mkdir(tmp_path / "corpus.bin")
    err = raised_within(10, lambda: mg.indexed(corpus))
    assert isinstance(err, StoreError) and f"is not a regular file (a {kind})" in str(err), err


def test_a_manifest_linked_out_or_to_dev_zero_is_refused(tmp_path, secret):
    lazyseq.save([{"x": np.arange(3)}] * 4, tmp_path / "s", progress=False)
    manifest = tmp_path / "s" / "manifest.json"
    real = tmp_path / "outside" / "manifest.json"
    manifest.rename(real)
    manifest.symlink_to(real)  # a valid manifest, through a link
    with pytest.raises(StoreError, match=r"\(the manifest\) is a symbolic link"):
        lazyseq.load(tmp_path / "s")
    manifest.unlink()
    manifest.symlink_to("/dev/zero")  # would read until memory runs out
    err = raised_within(10, lambda: lazyseq.load(tmp_path / "s"))
    assert isinstance(err, StoreError) and "is a symbolic link" in str(err)


def test_a_manifest_larger_than_a_manifest_can_be_is_not_read(tmp_path, monkeypatch):
    from lazyseq.store import format as fmt

    lazyseq.save([{"x": np.arange(3)}] * 4, tmp_path / "s", progress=False)
    monkeypatch.setattr(fmt, "MANIFEST_BYTES", 100)
    with pytest.raises(StoreError, match=r"\(the manifest\) is \d+ bytes, more than such a file can be \(100 bytes\)"):
        lazyseq.load(tmp_path / "s")


def test_an_index_cache_that_is_a_fifo_or_a_link_is_rebuilt_not_waited_on(tmp_path, secret):
    corpus = tmp_path / "corpus"
    mg.write(corpus, DOCS)
    want = [s.tolist() for s in mg.gpt(mg.indexed(corpus), 20, 8, seed=3)]
    entries = sorted(p for p in tmp_path.iterdir() if p.name.endswith(".npy"))
    assert entries
    for k, p in enumerate(entries):  # every cache file of the index replaced by a FIFO or a link
        p.unlink()
        os.mkfifo(p) if k % 2 == 0 else p.symlink_to(secret)
    got = []
    err = raised_within(20, lambda: got.extend(s.tolist() for s in mg.gpt(mg.indexed(corpus), 20, 8, seed=3)))
    assert err is None and got == want
    assert all(p.is_file() and not p.is_symlink() for p in entries)  # written again, in place of the links


def test_the_one_way_to_open(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"abc")
    fd, st = open_data(str(f), "a file", root=str(tmp_path))
    os.close(fd)
    assert st.st_size == 3 and read_data(str(f), "a file") == b"abc" and bytes(map_data(str(f), "a file")) == b"abc"
    with pytest.raises(StoreError, match=r"\(a file\) is truncated or was changed: 3 bytes, where 4 are expected"):
        map_data(str(f), "a file", size=4)
    with pytest.raises(FileNotFoundError):
        open_data(str(tmp_path / "none"), "a file")
    (tmp_path / "sub").mkdir()
    with pytest.raises(StoreError, match=r"leads outside its folder"):
        open_data(str(f), "a file", root=str(tmp_path / "sub"))
    assert map_data(str(tmp_path / "sub" / ".." / "f.bin"), "a file", root=str(tmp_path))[:] == b"abc"


def test_a_link_flipped_while_shards_open_is_never_read_through(tmp_path, secret):
    """Another process swaps a shard for a link to a file outside and back, as fast as it can, while
    the store opens its shards again and again: not one read may return the outside file's bytes."""
    lazyseq.save([{"x": np.full(64, i, np.uint8)} for i in range(8)], tmp_path / "s", shard_bytes=64 * 4, progress=False)
    m = lazyseq.load(tmp_path / "s")
    name = m.records[0]["file"]
    shard = tmp_path / "s" / name
    fake = tmp_path / "outside" / "fake.bin"
    fake.write_bytes(b"\xee" * shard.stat().st_size)  # the shard's size: only the link gives it away
    real = tmp_path / "s" / "real.tmp"
    os.link(shard, real)
    stop = time.monotonic() + 2.0
    flips = [0]

    def flip():
        link, back = tmp_path / "s" / "link.tmp", tmp_path / "s" / "back.tmp"
        while time.monotonic() < stop:
            link.symlink_to(fake)
            os.replace(link, shard)  # the link in the shard's place
            os.link(real, back)
            os.replace(back, shard)  # and the real file again
            flips[0] += 1

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    reads = outside = refused = 0
    while time.monotonic() < stop:
        store = lazyseq.Store._reopen(str(tmp_path / "s"), lazyseq.load.__globals__["_manifest"](str(tmp_path / "s")))
        try:
            x = store[0]["x"]
        except lazyseq.EvaluationError as e:
            assert isinstance(e.__cause__, StoreError) and "symbolic link" in str(e.__cause__), e
            refused += 1
            continue
        reads += 1
        outside += int(x[0] == 0xEE)
    t.join(5)
    assert flips[0] > 100 and reads > 10 and refused > 0, (flips, reads, refused)
    assert outside == 0
