"""Notebook display (lazyseq/core/html.py): a view's ``_repr_html_`` shows its tree, its length and its
first items (thumbnails for images), escaped, bounded in time, never raising; the text repr is
unchanged; the DataLoader's ``repr`` shows its settings and its dataset's tree."""

from __future__ import annotations

import base64
import re
import struct
import threading
import time
import zlib

import numpy as np
import pytest

import lazyseq
from lazyseq.core import html as lhtml

PNG_URI = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def decode_png(data: bytes) -> np.ndarray:
    """A minimal PNG reader for what lazyseq.core.html.png writes: 8-bit, filter 0, one IDAT."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])
        assert zlib.crc32(tag + body) & 0xFFFFFFFF == crc, tag
        chunks[tag] = body
        pos += 12 + n
    w, h, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and b"IEND" in chunks
    c = {0: 1, 4: 2, 2: 3, 6: 4}[color]
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(h, 1 + w * c)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return rows[:, 1:].reshape(h, w, c)


def thumbnails(html: str) -> list[np.ndarray]:
    return [decode_png(base64.b64decode(m)) for m in PNG_URI.findall(html)]


# -- the text repr stays as it was ------------------------------------------------------------------
def test_text_repr_is_unchanged():
    v = lazyseq.batch(lazyseq.smap(abs, range(10)), 4)
    assert repr(v) == str(v) == "batch(4)  len=3\n└─ smap(abs)  len=10\n   └─ range(0, 10)"
    c = lazyseq.collate([np.zeros((5, 3)), list("abcde")])
    assert repr(c) == ("collate(2 sequences)  len=5\n├─ ndarray(shape=(5, 3), dtype=float64)\n"
                       "└─ list  len=5")
    s = lazyseq.shard(lazyseq.cycle([1, 2, 3])[:10], 0, 2)
    assert repr(s) == "shard(0 of 2)  len=5\n└─ slice[0:10]  len=10\n   └─ cycle()\n      └─ list  len=3"


def test_html_holds_the_tree_and_the_length():
    v = lazyseq.batch(lazyseq.smap(abs, range(10)), 4)
    h = v._repr_html_()
    assert "batch(4)  len=3\n└─ smap(abs)  len=10\n   └─ range(0, 10)" in h
    assert "3 items" in h and "[8, 9]" in h and "first 3 items" in h


# -- escaping ---------------------------------------------------------------------------------------
def test_a_deep_tree_says_how_many_levels_it_hides():
    v = np.arange(5)
    for _ in range(12):
        v = lazyseq.smap(abs, v)
    lines = repr(v).splitlines()
    assert len(lines) == 10 and lines[-1].strip() == "└─ ... (4 more levels)"  # 3 smaps and the array
    assert "(4 more levels)" in v._repr_html_()
    one = lazyseq.smap(abs, lazyseq.smap(abs, lazyseq.concatenate([v, lazyseq.smap(abs, np.arange(3))])))
    assert repr(one).splitlines()[9].strip() == "│                 └─ ... (7 more levels)"  # 6 smaps and the array
    w = np.arange(5)
    for _ in range(9):
        w = lazyseq.smap(abs, w)
    assert repr(w).splitlines()[-1].strip() == "└─ ... (1 more level)"


def test_everything_is_escaped():
    v = lazyseq.smap(lambda x: {"<b>name</b>": "<script>alert(1)</script>", "n": x}, range(4))
    h = v._repr_html_()
    assert "&lt;lambda&gt;)  len=4" in h and "<lambda>" not in h
    assert "<script>" not in h and "&lt;script&gt;" in h
    assert "<b>" not in h and "&lt;b&gt;name&lt;/b&gt;" in h


# -- failures and slow items ------------------------------------------------------------------------
def test_a_failing_item_shows_its_error_line():
    def load(i):
        if i == 1:
            raise ValueError("bad checksum <here>")
        return i * 10

    h = lazyseq.smap(load, range(5))._repr_html_()
    assert re.search(r"EvaluationError: failed to evaluate item 1 of smap\([\w.]*load\): "
                     r"ValueError: bad checksum &lt;here&gt;", h)
    assert "<code>0</code>" in h and "<code>20</code>" in h  # the items around it still show


def test_rendering_never_raises():
    class Broken(lazyseq.View):
        def _len(self):
            return 3

        def _get(self, i):
            raise KeyboardInterrupt  # not even a BaseException escapes

        def describe(self):
            raise RuntimeError("no description")

    h = Broken()._repr_html_()
    assert "repr raised RuntimeError" in h and "KeyboardInterrupt" in h


def test_a_slow_item_is_not_waited_for():
    calls = []

    def slow(i):
        calls.append(i)
        time.sleep(1.5)
        return i

    v = lazyseq.smap(slow, range(10))
    t = time.perf_counter()
    h = v._repr_html_()
    took = time.perf_counter() - t
    assert took < lhtml.SECONDS + 0.5, took
    assert "item 0 was still being computed after 0.5 s: none shown" in h
    # the item under way finishes in the background, and no other is started
    deadline = time.monotonic() + 5
    while any(t.name == "lazyseq-repr-html" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls == [0]


def test_items_are_read_only_when_rendered_and_at_most_three():
    calls = []
    v = lazyseq.smap(lambda x: calls.append(x) or x, range(100))
    repr(v)
    assert calls == []
    v._repr_html_()
    assert calls == [0, 1, 2]


def test_infinite_and_empty_views():
    h = lazyseq.cycle([1, 2])._repr_html_()
    assert "no len()" in h and "len=" not in h.split("</pre>")[1] and "<code>1</code>" in h
    h = lazyseq.smap(abs, [])._repr_html_()
    assert "0 items" in h and "no items" in h


def test_a_prefetch_or_a_one_shot_iterator_is_not_read():
    calls = []
    with lazyseq.prefetch(lazyseq.smap(lambda x: calls.append(x) or x, range(10)), 2, "thread") as p:
        h = lazyseq.batch(p, 2)._repr_html_()
    assert "contains a prefetch" in h and calls == []
    g = lazyseq.uniter(iter([1, 2, 3]))
    assert "one-shot iterator" in g._repr_html_()
    assert list(g) == [1, 2, 3]  # not consumed


# -- items: summaries and thumbnails ----------------------------------------------------------------
def test_items_are_summarised():
    item = {"image": np.zeros((28, 28, 3), np.uint8), "meta": ({"id": 3}, [1.5, "x"]), "label": np.int64(7)}
    s = lhtml.summary(item)
    assert s == "{'image': ndarray(28, 28, 3) uint8, 'meta': ({'id': 3}, [1.5, 'x']), 'label': int64(7)}"
    assert lhtml.summary(list(range(20))).endswith(", 7, ... (12 more)]")
    assert len(lhtml.summary(object.__new__(type("T", (), {"__repr__": lambda s: "t" * 500})))) <= 80


@pytest.mark.parametrize("shape", [(16, 12), (16, 12, 1), (16, 12, 3), (16, 12, 4)])
def test_thumbnails_of_uint8_images_decode_to_the_image(shape):
    img = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    h = lazyseq.smap(lambda i: (img, i), range(2))._repr_html_()
    thumbs = thumbnails(h)
    assert len(thumbs) == 2
    assert thumbs[0].shape[:2] == (16, 12)  # the IHDR size
    np.testing.assert_array_equal(thumbs[0].reshape(shape), img)


def test_thumbnails_of_float_images_and_large_images():
    unit = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    (t,) = thumbnails(lazyseq.smap(lambda i: unit, range(1))._repr_html_())
    assert t.shape == (8, 8, 1) and t.min() == 0 and t.max() == 255
    wide = np.linspace(-5, 5, 64).reshape(8, 8)  # outside 0..1: stretched
    (t,) = thumbnails(lazyseq.smap(lambda i: wide, range(1))._repr_html_())
    assert t.min() == 0 and t.max() == 255
    big = np.zeros((1000, 500, 3), np.uint8)
    (t,) = thumbnails(lazyseq.smap(lambda i: big, range(1))._repr_html_())
    assert max(t.shape[:2]) <= lhtml.THUMB


def test_no_thumbnails_for_what_is_not_an_image():
    not_images = [np.zeros(64, np.uint8), np.zeros((32, 8, 8), np.float32), np.zeros((8, 8), np.int64),
                  np.zeros((1, 8), np.uint8), "text"]
    h = lazyseq.smap(lambda i: not_images, range(1))._repr_html_()
    assert "data:image/png" not in h


# -- the DataLoader -----------------------------------------------------------------------------------
def test_dataloader_repr_shows_its_settings_and_pipeline():
    data = lazyseq.smap(abs, range(10))
    loader = lazyseq.DataLoader(data, batch_size=4, seed=0, to_tensor=False)
    assert repr(loader) == ("DataLoader(batch_size=4, shuffle=False, drop_last=False, num_workers=0, seed=0, "
                            "to_tensor=False)\n  len=3  next: epoch 0\n└─ smap(abs)  len=10\n   └─ range(0, 10)")
    loader = lazyseq.DataLoader(data, batch_size=2, shuffle=True, drop_last=True, num_workers=2, seed=3,
                                persistent_workers=True, rank=1, world_size=2, device="CPU")
    text = repr(loader)
    assert "object at 0x" not in text
    for part in ("batch_size=2", "shuffle=True", "drop_last=True", "num_workers=2", "method='process'",
                 "prefetch_factor=2", "persistent_workers=True", "shm_size=None", "seed=3", "rank=1, world_size=2",
                 "to_tensor=True", "device='CPU'", "len=2", "└─ smap(abs)  len=10"):
        assert part in text, (part, text)
    with lazyseq.DataLoader(list(range(10)), batch_size=4, to_tensor=False, seed=0) as loader:
        it = iter(loader)
        next(it)
        assert "next: epoch 0, batch 1" in repr(loader) and "└─ list  len=10" in repr(loader)
        list(it)
        assert "next: epoch 1\n" in repr(loader)


def test_dataloader_html_shows_the_repr_and_the_datasets_items():
    img = np.zeros((8, 8), np.uint8)
    loader = lazyseq.DataLoader(lazyseq.smap(lambda i: (img, i), range(5)), batch_size=2, seed=0, to_tensor=False)
    h = loader._repr_html_()
    assert "DataLoader(batch_size=2" in h and "&lt;lambda&gt;)  len=5" in h
    assert len(thumbnails(h)) == 3 and "(ndarray(8, 8) uint8, 2)" in h


def test_dataloader_html_shows_the_items_of_its_next_epoch():
    data = lazyseq.smap(lambda i, rng: int(rng.integers(10**9)), range(4), seed=0)  # follows the loader's epoch
    loader = lazyseq.DataLoader(data, batch_size=2, seed=0, to_tensor=False)
    loader.set_epoch(3)
    h = loader._repr_html_()
    first = lazyseq.smap(lambda i, rng: int(rng.integers(10**9)), range(4), seed=0, epoch=3)[0]
    assert "the dataset&#x27;s first items in epoch 3:" in h and f"<code>{first}</code>" in h
