"""The data and the timing of ``python -m lazyseq.bench formats`` (:mod:`lazyseq.bench.formats`): the
Parquet files it writes, pyarrow by hand and Hugging Face ``datasets`` as its peers read them, and
how a read and an epoch are timed."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

BATCH = 256  # rows per batch of an epoch


# -- the data ---------------------------------------------------------------------------------------
def write_files(root: str, rows: int, files: int, group: int, **options: Any) -> list[str]:
    """``files`` Parquet files of ``rows // files`` rows each, row groups of ``group`` rows (``options``:
    more of ``pyarrow.parquet.write_table``'s)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    per, paths = rows // files, []
    for k in range(files):
        rng, ids = np.random.default_rng(k), np.arange(k * per, (k + 1) * per)
        sizes = 2560 + rng.integers(0, 1024, per)
        off = np.zeros(per + 1, np.int32)
        np.cumsum(sizes, out=off[1:])
        data = rng.integers(0, 256, int(off[-1]), dtype=np.uint8)
        data[off[:-1]], data[off[:-1] + 1], data[off[1:] - 2], data[off[1:] - 1] = 0xFF, 0xD8, 0xFF, 0xD9
        image = pa.Array.from_buffers(pa.binary(), per, [None, pa.py_buffer(off), pa.py_buffer(data)])
        table = pa.table({"image": image, "label": ids % 1000, "text": [f"a photo of item {i}, class {i % 1000}" for i in ids]})
        paths.append(os.path.join(root, f"part-{k:05d}.parquet"))
        pq.write_table(table, paths[-1], row_group_size=group, **options)
    return paths


class ByHand:
    """pyarrow by hand: the last ``cache`` decoded row groups kept (least recently used out)."""

    def __init__(self, paths: list[str], cache: int):
        import pyarrow.parquet as pq

        self.files = [pq.ParquetFile(p) for p in paths]
        self.groups = [(k, r, f.metadata.row_group(r).num_rows) for k, f in enumerate(self.files)
                       for r in range(f.metadata.num_row_groups)]
        self.starts = np.cumsum([0] + [n for _, _, n in self.groups]).tolist()
        self.cache, self.held = cache, collections.OrderedDict()

    def _table(self, i: int) -> tuple[Any, int]:
        import bisect

        g = bisect.bisect_right(self.starts, i) - 1
        t = self.held.get(g)
        if t is None:
            k, r, _ = self.groups[g]
            t = self.held[g] = self.files[k].read_row_group(r, use_threads=False)
            if len(self.held) > self.cache:
                self.held.popitem(last=False)
        else:
            self.held.move_to_end(g)
        return t, i - self.starts[g]

    def by_slice(self, i: int) -> dict:
        t, j = self._table(i)
        return t.slice(j, 1).to_pylist()[0]

    def by_columns(self, i: int) -> dict:
        t, j = self._table(i)
        return {name: col[j].as_py() for name, col in zip(t.column_names, t.columns)}


def plain(row: dict) -> dict:
    """A row's values as Python's (numpy scalars by ``.item()``), to compare readers."""
    return {k: v.item() if isinstance(v, (np.generic, np.ndarray)) else v for k, v in row.items()}


def load_hf(paths: list[str], root: str) -> tuple[Any, float]:
    """``datasets.load_dataset('parquet', data_files=paths, split='train')``, its caches under ``root``
    (offline: nothing looked up on the Hub); and the seconds its conversion took."""
    env = {"HF_HOME": os.path.join(root, "hf-home"), "HF_DATASETS_CACHE": os.path.join(root, "hf-cache"),
           "HF_HUB_OFFLINE": "1"}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # read when datasets is imported: keep out of the user's caches
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
        t = time.perf_counter()
        ds = datasets.load_dataset("parquet", data_files=paths, split="train", cache_dir=env["HF_DATASETS_CACHE"])
        return ds, time.perf_counter() - t
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def arrow_of() -> Callable | None:
    """``lazyseq.formats.arrow.arrow``, or None where it is not there yet."""
    try:
        from lazyseq.formats.arrow import arrow
    except ImportError:
        return None
    return arrow


# -- timing -----------------------------------------------------------------------------------------
def per_read(readers: dict[str, Callable[[int], Any]], keys: list[int], rounds: int) -> dict[str, float]:
    """Microseconds per read of ``keys``: the best of ``rounds``, the readers alternating."""
    best = {name: float("inf") for name in readers}
    for _ in range(rounds):
        for name, one in readers.items():
            t = time.perf_counter()
            for i in keys:
                one(i)
            best[name] = min(best[name], (time.perf_counter() - t) / len(keys) * 1e6)
    return best


def epoch_rate(batches: Iterator[dict], n: int, labels: int) -> tuple[float, float]:
    """Items/s of one epoch's batches timed from the first, and the seconds to the first; every row
    read once (their count and their labels' sum checked)."""
    t = time.perf_counter()
    first = next(batches)
    start = time.perf_counter()
    count, total = len(first["label"]), int(np.sum(first["label"]))
    for b in batches:
        count, total = count + len(b["label"]), total + int(np.sum(b["label"]))
    seconds = time.perf_counter() - start
    if count != n or total != labels:
        raise AssertionError(f"bench formats: an epoch read {count} rows (labels' sum {total}), not {n} ({labels})")
    return (n - len(first["label"])) / seconds, start - t


def iter_batches(paths: list[str], seed: int) -> Iterator[dict]:
    """A sequential pass (``seed`` unused): each batch's columns as the DataLoader's collate gives them."""
    import pyarrow.parquet as pq

    for p in paths:
        for b in pq.ParquetFile(p).iter_batches(BATCH):
            yield {"image": b.column(0).to_pylist(), "label": b.column(1).to_numpy(), "text": b.column(2).to_pylist()}
