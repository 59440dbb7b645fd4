"""Rich display in notebooks: the ``_repr_html_`` of views and of the DataLoader, and the
DataLoader's text ``repr``.

A view shows its pipeline tree (its text ``repr``), its length, and a preview of its first items:
shapes and dtypes of arrays, short reprs of other values, nested dicts, tuples and lists
summarised, and small images (``HxW`` or ``HxWxC`` arrays, ``C`` in 1, 3, 4, uint8 or float) as
inline PNG thumbnails. The preview is read only when a notebook renders the view, and it is
bounded: at most :data:`ITEMS` items and :data:`SECONDS` seconds (the items are read in a helper
thread, so one slow item cannot hold the notebook up; an item still running then finishes in the
background, and is not shown). An item that raises shows its error line: rendering never raises.
A pipeline that contains a prefetch shows no items (reading one would start its workers), nor
one that reads a one-shot iterator (``uniter(generator)``: reading would consume it).

The PNG encoder is a few lines of numpy, zlib and struct: no Pillow. This module sits with
:mod:`lazyseq.core.base` (whose ``View._repr_html_`` calls it) and imports nothing above it.

>>> import lazyseq, numpy as np
>>> html = lazyseq.smap(lambda x: np.zeros((8, 8), np.uint8) + x, range(5))._repr_html_()
>>> 'smap(&lt;lambda&gt;)' in html, html.count('data:image/png;base64,')
(True, 3)
"""

from __future__ import annotations

import base64
import html
import reprlib
import struct
import sys
import threading
import time
import zlib
from typing import Any

import numpy as np

from ..helpers import fname
from .node import Node, _tree

__all__ = ["view_html", "loader_html", "loader_repr", "summary", "png", "thumbnail", "preview"]

ITEMS = 3  # items previewed
SECONDS = 0.5  # at most this long spent reading them
THUMB = 96  # pixels: the longest side of a thumbnail as stored (larger images are subsampled)
SHOW = 64  # pixels: the shortest displayed side of a small image (scaled up, pixelated)
MAX_LEAVES = 4  # thumbnails per item

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxtuple, _short.maxdict = 60, 60, 6, 6, 6

_STYLE = "font-family: monospace; font-size: 12px"
_PRE = "margin: 0 0 4px 0; padding: 4px 6px; line-height: 1.25; background: none"
_MUTED = "color: #777"


# -- items as text ----------------------------------------------------------------------------------
def summary(x: Any, depth: int = 0) -> str:
    """One short line for an item: shapes and dtypes of arrays (anything with ``shape`` and
    ``dtype``, e.g. a tinygrad Tensor), nested dicts, tuples and lists summarised, reprs cut short.

    >>> import numpy as np
    >>> summary({'image': np.zeros((28, 28, 3), np.uint8), 'label': 7, 'name': 'a' * 100})
    "{'image': ndarray(28, 28, 3) uint8, 'label': 7, 'name': 'aaaaaaaaaaaaaaaaaaaaaaaaaaa...aaaaaaaaaaaaaaaaaaaaaaaaaaaa'}"
    >>> summary((np.float32(1.5), [1, 2, 3], None))
    '(float32(1.5), [1, 2, 3], None)'
    """
    if isinstance(x, np.ndarray):
        return f"ndarray{_shape(x.shape)} {x.dtype}" if x.ndim else f"ndarray({x.item()!r}) {x.dtype}"
    if isinstance(x, np.generic):
        return f"{type(x).__name__}({x.item()!r})"
    if isinstance(x, (str, bytes, int, float, complex, bool, type(None))):
        return _short.repr(x)
    shape, dtype = _attr(x, "shape"), _attr(x, "dtype")
    if shape is not None and dtype is not None:  # a Tensor of another library
        device = _attr(x, "device")
        return f"{type(x).__name__}{_shape(shape)} {dtype}" + (f" on {device}" if isinstance(device, str) else "")
    if depth >= 3 and isinstance(x, (dict, list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    if isinstance(x, dict):
        parts = [f"{_short.repr(k)}: {summary(v, depth + 1)}" for k, v in list(x.items())[:8]]
        more = f", ... ({len(x) - 8} more)" if len(x) > 8 else ""
        return "{" + ", ".join(parts) + more + "}"
    if isinstance(x, (list, tuple)):
        parts = [summary(v, depth + 1) for v in x[:8]]
        more = f", ... ({len(x) - 8} more)" if len(x) > 8 else ""
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
            return f"{type(x).__name__}(" + ", ".join(f"{f}={p}" for f, p in zip(x._fields, parts)) + more + ")"
        if isinstance(x, tuple):
            return "(" + ", ".join(parts) + ("," if len(x) == 1 else "") + more + ")"
        return "[" + ", ".join(parts) + more + "]"
    try:
        text = _short.repr(x)
    except Exception as e:  # a repr that raises
        text = f"<{type(x).__name__}: repr raised {type(e).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _attr(x: Any, name: str) -> Any:
    try:
        return getattr(x, name, None)
    except Exception:
        return None


def _shape(shape: Any) -> str:
    try:
        return "(" + ", ".join(str(int(d)) for d in shape) + ")"
    except Exception:
        return f"({shape})"


def _error_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 200 else text[:197] + "..."


# -- images ----------------------------------------------------------------------------------------
def png(a: np.ndarray) -> bytes:
    """A PNG file of a uint8 image ``HxW`` or ``HxWxC`` (``C`` in 1, 2, 3, 4: grey, grey+alpha,
    RGB, RGBA), 8 bits per sample, filter 0, one zlib stream.

    >>> data = png(np.zeros((2, 3, 3), np.uint8))
    >>> data[:8] == b'\\x89PNG\\r\\n\\x1a\\n', struct.unpack('>II', data[16:24])
    (True, (3, 2))
    """
    a = np.ascontiguousarray(a, dtype=np.uint8)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 2, 3, 4) or 0 in a.shape:
        raise ValueError(f"png: need a uint8 array HxW or HxWxC (C in 1..4), got shape {a.shape}")
    h, w, c = a.shape
    rows = np.zeros((h, 1 + w * c), np.uint8)  # each row starts with its filter type, 0: none
    rows[:, 1:] = a.reshape(h, w * c)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    color = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + chunk(b"IEND", b""))


def is_image(x: Any) -> bool:
    """Whether ``x`` looks like an image: a uint8 or float array ``HxW`` or ``HxWxC``, ``C`` in
    1, 3, 4, at least 2 pixels each way."""
    if not isinstance(x, np.ndarray) or not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating)):
        return False
    if x.ndim == 3 and x.shape[2] not in (1, 3, 4):
        return False
    return x.ndim in (2, 3) and x.shape[0] >= 2 and x.shape[1] >= 2


def thumbnail(x: np.ndarray) -> str | None:
    """An ``<img>`` tag showing the image ``x`` (see :func:`is_image`) as a PNG data URI, at most
    :data:`THUMB` pixels a side (larger images are subsampled); None if ``x`` is not an image.
    Floats are taken as 0..1 if they lie there, else stretched from their minimum to their maximum."""
    if not is_image(x):
        return None
    h, w = x.shape[:2]
    step = max(1, -(-max(h, w) // THUMB))
    a = x[::step, ::step]
    if a.dtype != np.uint8:
        a = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = float(a.min()), float(a.max())
        if lo < 0 or hi > 1:
            a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
        a = np.clip(np.rint(a * 255), 0, 255).astype(np.uint8)
    data = base64.b64encode(png(a)).decode("ascii")
    scale = max(1, SHOW // min(a.shape[:2]))  # small images shown larger, pixel by pixel
    dh, dw = a.shape[0] * scale, a.shape[1] * scale
    return (f'<img src="data:image/png;base64,{data}" width="{dw}" height="{dh}" '
            f'title="{html.escape(f"{h}x{w}" + (f"x{x.shape[2]}" if x.ndim == 3 else ""))} {x.dtype}" '
            'style="image-rendering: pixelated; margin: 1px 4px 1px 0; border: 1px solid #ddd">')


def _images(x: Any, out: list, depth: int = 0) -> list:
    """The first :data:`MAX_LEAVES` images among the leaves of an item (dicts, lists, tuples)."""
    if len(out) >= MAX_LEAVES or depth > 3:
        return out
    if isinstance(x, np.ndarray):
        if is_image(x):
            out.append(x)
    elif isinstance(x, dict):
        for v in list(x.values())[:16]:
            _images(v, out, depth + 1)
    elif isinstance(x, (list, tuple)):
        for v in x[:16]:
            _images(v, out, depth + 1)
    return out


# -- reading the first items -----------------------------------------------------------------------
def preview(seq: Any, n: int = ITEMS, seconds: float = SECONDS) -> tuple[list, str]:
    """The first ``n`` items of ``seq`` as ``[(index, ok, item or error line)]``, read in a helper
    thread for at most ``seconds``; and a note on what was read (or why not)."""
    why = _not_to_read(seq)
    if why is not None:
        return [], why
    try:
        total = len(seq)
    except Exception:
        total = None
    count = n if total is None else min(n, total)
    if count <= 0:
        return [], "no items" if total == 0 else ""
    got: list = []
    stop = threading.Event()

    def read() -> None:
        for i in range(count):
            if stop.is_set():
                return
            try:
                got.append((i, True, seq[i]))
            except IndexError as e:
                if total is None:  # the end of a view of unknown size
                    return
                got.append((i, False, _error_line(e)))
            except Exception as e:
                got.append((i, False, _error_line(e)))
            except BaseException as e:  # a thread's exit is not the notebook's
                got.append((i, False, _error_line(e)))
                return

    t0 = time.perf_counter()
    worker = threading.Thread(target=read, name="lazyseq-repr-html", daemon=True)
    worker.start()
    worker.join(seconds)
    stop.set()
    took = time.perf_counter() - t0
    done = list(got)
    if worker.is_alive():
        shown = f"the first {len(done)} shown" if done else "none shown"
        return done, f"item {len(done)} was still being computed after {seconds:g} s: {shown}"
    return done, f"first {len(done)} item{'s' if len(done) != 1 else ''}, read in {_duration(took)}"


def _duration(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} us"


def _not_to_read(seq: Any) -> str | None:
    """Why the items of ``seq`` are better not read for a display, or None: a prefetch would start
    its workers, a uniter over a one-shot iterator would consume it."""
    # the classes of upper layers, looked up without importing them (no such module loaded: no such view)
    prefetch = getattr(sys.modules.get("lazyseq.evaluation.view"), "Prefetch", ())
    uniter = getattr(sys.modules.get("lazyseq.views.indexing"), "Uniter", ())
    stack, seen = [seq], set()
    while stack:
        node = stack.pop()
        if isinstance(node, prefetch):
            return "items not read: the pipeline contains a prefetch, and reading would start its workers"
        if isinstance(node, uniter) and getattr(node, "one_shot", False):
            return "items not read: the pipeline reads a one-shot iterator (uniter), which reading would consume"
        if isinstance(node, Node) and id(node) not in seen and len(seen) < 1000:
            seen.add(id(node))
            try:
                stack.extend(node.children())
            except Exception:
                pass
    return None


def _items_html(seq: Any) -> str:
    items, note = preview(seq)
    rows = []
    for i, ok, value in items:
        if ok:
            text = html.escape(summary(value))
            thumbs = "".join(t for t in map(thumbnail, _images(value, [])) if t)
        else:
            text, thumbs = f'<span style="color: #b00">{html.escape(value)}</span>', ""
        rows.append(f'<tr><td style="text-align: right; vertical-align: top; {_MUTED}">[{i}]</td>'
                    f'<td style="text-align: left; vertical-align: top">{thumbs}'
                    f'{"<br>" if thumbs else ""}<code>{text}</code></td></tr>')
    table = f'<table style="border-collapse: collapse; margin: 0">{"".join(rows)}</table>' if rows else ""
    return table + (f'<div style="{_MUTED}">{html.escape(note)}</div>' if note else "")


# -- views -----------------------------------------------------------------------------------------
def _length_text(seq: Any) -> str:
    if isinstance(seq, Node) and not seq.finite:
        return "no len(): infinite, or of unknown size"
    try:
        n = len(seq)
    except Exception:
        return "no len()"
    return f"{n:,} item{'s' if n != 1 else ''}"


def view_html(view: Any) -> str:
    """The HTML of a view (its ``_repr_html_``): the tree, the length, the first items. Never raises."""
    try:
        tree = repr(view)
    except Exception as e:
        tree = f"<{type(view).__name__}: repr raised {_error_line(e)}>"
    try:
        body = (f'<pre style="{_PRE}">{html.escape(tree)}</pre>'
                f"<div>{html.escape(_length_text(view))}</div>{_items_html(view)}")
    except Exception as e:  # whatever happens, the notebook shows something
        body = f'<pre style="{_PRE}">{html.escape(tree)}</pre><div style="color: #b00">{html.escape(_error_line(e))}</div>'
    return f'<div class="lazyseq" style="{_STYLE}">{body}</div>'


# -- the DataLoader ----------------------------------------------------------------------------------
def _settings(loader: Any) -> list[str]:
    """``name=value`` for the loader's settings: the main ones always, the others when set."""
    g = loader.__dict__.get
    out = [f"batch_size={g('batch_size')!r}", f"shuffle={g('shuffle')!r}", f"drop_last={g('drop_last')!r}",
           f"num_workers={g('num_workers')!r}"]
    workers = bool(g("num_workers"))
    if workers:
        out += [f"method={g('method')!r}", f"prefetch_factor={g('prefetch_factor')!r}"]
        if g("persistent_workers"):
            out.append("persistent_workers=True")
        if g("method") == "process":
            shm = g("shm_size")
            out.append(f"shm_size={shm!r}" if shm is not None else
                       f"shm_size=None ({g('shm_size_used')} bytes)" if g("shm_size_used") else "shm_size=None")
    out.append(f"seed={g('seed')!r}")
    for name, default in (("sampler", None), ("batch_sampler", None), ("collate_fn", None),
                          ("seed_each_item", False), ("timeout", 0), ("worker_init_fn", None)):
        value = g(name)
        if value is not None and value is not default and value != default:
            out.append(f"{name}={_fname(value)}")
    if g("world_size", 1) != 1 or g("ranks_from", "given") not in ("given", "the default"):
        where = g("ranks_from", "given")
        out.append(f"rank={g('rank')!r}, world_size={g('world_size')!r}" + ("" if where == "given" else f" (from {where})"))
    out.append(f"to_tensor={g('to_tensor')!r}")
    if g("to_tensor") and g("device") is not None:
        out.append(f"device={g('device')!r}")
    return out


def _fname(x: Any) -> str:
    name = getattr(x, "__qualname__", None) or getattr(x, "__name__", None)
    return fname(x) if isinstance(name, str) else summary(x)


def _next_epoch(loader: Any) -> Any:
    try:
        return loader._where()[0]
    except Exception:
        return loader.__dict__.get("epoch")


def _position(loader: Any) -> str:
    try:
        epoch, _, batch = loader._where()
    except Exception:
        epoch, batch = loader.__dict__.get("epoch"), 0
    return f"next: epoch {epoch}" + (f", batch {batch}" if batch else "")


def _starved(loader: Any) -> str:
    """After an epoch: how much of it the caller spent waiting for batches, and the loader's hint."""
    last = loader.__dict__.get("_last") or {}
    if "starved" not in last:
        return ""
    hint = f" ({last['hint']})" if last.get("hint") else ""
    return (f"\n  last epoch {last['epoch']}: starved {last['starved']:.0%} (waited {last['wait_s']:.2f} s of "
            f"{last['wall_s']:.2f} s){hint}")


def _loader_len(loader: Any) -> str:
    try:
        return f"len={len(loader)}  "
    except Exception:
        return ""


def _wrap(words: list[str], first: str, indent: str, width: int = 100) -> list[str]:
    lines, line = [], first
    for k, w in enumerate(words):
        piece = w + (", " if k < len(words) - 1 else ")")
        if len(line) + len(piece) > width and line.strip() and line != first:
            lines.append(line.rstrip())
            line = indent
        line += piece
    return [*lines, line]


def loader_repr(loader: Any) -> str:
    """The DataLoader's ``repr``: its settings, its length in batches and position, then the
    dataset's tree under it.

    >>> import lazyseq
    >>> loader = lazyseq.DataLoader(lazyseq.smap(abs, range(10)), batch_size=4, seed=0, to_tensor=False)
    >>> print(repr(loader))
    DataLoader(batch_size=4, shuffle=False, drop_last=False, num_workers=0, seed=0, to_tensor=False)
      len=3  next: epoch 0
    └─ smap(abs)  len=10
       └─ range(0, 10)
    """
    try:
        head = _wrap(_settings(loader), "DataLoader(", " " * 11)
        head.append(f"  {_loader_len(loader)}{_position(loader)}{_starved(loader)}")
        sub = _tree(loader.__dict__.get("dataset"), 0)
        return "\n".join(head + ["└─ " + sub[0]] + ["   " + s for s in sub[1:]])
    except Exception as e:  # a repr never raises
        return f"<DataLoader: repr raised {_error_line(e)}>"


def loader_html(loader: Any) -> str:
    """The DataLoader's ``_repr_html_``: its ``repr``, then the dataset's first items as the
    loader's next epoch reads them (views built with ``epoch=None`` bound to it). Never raises."""
    text = loader_repr(loader)
    label = "the dataset's first items"
    try:
        data = loader.__dict__.get("dataset")
        at_epoch = getattr(sys.modules.get("lazyseq.views.epochs"), "at_epoch", None)
        epoch = _next_epoch(loader)
        if at_epoch is not None and isinstance(epoch, int):
            data, label = at_epoch(data, epoch), f"{label} in epoch {epoch}"
        items = _items_html(data)
    except Exception as e:
        items = f'<div style="color: #b00">{html.escape(_error_line(e))}</div>'
    return (f'<div class="lazyseq" style="{_STYLE}"><pre style="{_PRE}">{html.escape(text)}</pre>'
            f"<div>{html.escape(label)}:</div>{items}</div>")
