"""A dropped pipeline frees what it made at once, with no help from the cyclic garbage collector
(docs/memory.md): with ``gc.disable()``, dropping the last reference to a pipeline, after reading it
directly, through ``prefetch`` or through a closed ``DataLoader``, releases its views, what they
decoded and cached, and every file descriptor and memory map it opened; in the parent and in the
workers, and a worker forked after the drop inherits none of it. One test per source kind and way
of reading; each also checks that something was held before the drop, so that none passes empty."""

import gc
import itertools
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lazyseq as ls
import lazyseq.megatron as mg
from lazyseq.core.node import is_node

DECODED: list[weakref.ref] = []  # every chunk read_chunk made in this process (a forked worker has its own)


def read_chunk(path: str) -> np.ndarray:
    """A chunk's items (np.fromfile: np.load's header parser makes reference cycles of its own)."""
    a = np.fromfile(path, np.float32).reshape(-1, 2)
    DECODED.append(weakref.ref(a))
    return a


def decoded_alive() -> int:
    return sum(r() is not None for r in DECODED)


def lazyseq_garbage() -> list[str]:
    """What the cyclic collector would free here that lazyseq made (a view, a closure of
    lazyseq's, ...): a reference cycle that dropping did not free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [g for g in gc.garbage if _module(g).startswith("lazyseq")]
        names = sorted({f"{type(g).__name__} {getattr(g, '__qualname__', '')}".strip() for g in found})
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    return names


def _module(obj: Any) -> str:
    m = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return m if isinstance(m, str) else ""


def held(root: str) -> dict[str, list[str]]:
    """The file descriptors and memory maps of this process that lead under ``root``."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root):
            fds.append(target)
    with open("/proc/self/maps") as f:
        maps = [line.split()[-1] for line in f if root in line]
    return {"fds": sorted(fds), "maps": sorted(maps)}


def weakrefs(view: Any) -> list[weakref.ref]:
    """A weak reference to every node of the view's tree."""
    out, todo, seen = [], [view], set()
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        out.append(weakref.ref(v))
        if is_node(v):
            todo.extend(v.children())
    return out


@pytest.fixture
def gc_off():
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    DECODED.clear()
    yield
    if was:
        gc.enable()
    gc.collect()


# -- the sources -------------------------------------------------------------------------------------
def _chunk_files(root: str, n: int = 12, rows: int = 10, tag: str = "c") -> list[str]:
    files = []
    for k in range(n):
        path = os.path.join(root, f"{tag}{k}.f32")
        np.arange(k * rows * 2, (k + 1) * rows * 2, dtype=np.float32).tofile(path)
        files.append(path)
    return files


def chunks(root: str) -> Any:
    return ls.chunks(_chunk_files(root), read_chunk, cache=3)


def store(root: str) -> Any:
    ls.save([{"x": np.arange(i % 5, dtype=np.int32), "y": np.full(3, i, np.float32)} for i in range(60)],
            os.path.join(root, "store"), progress=False)
    return ls.load(os.path.join(root, "store"))


def corpus(root: str) -> Any:
    mg.write(os.path.join(root, "corpus"), [np.arange(n, dtype=np.int32) for n in range(3, 40)])
    return mg.gpt(mg.indexed(os.path.join(root, "corpus")), 50, 16, seed=1, cache_dir=root)


def mixture(root: str) -> Any:
    a = ls.chunks(_chunk_files(root, tag="a"), read_chunk, cache=2)
    b = ls.chunks(_chunk_files(root, tag="b"), read_chunk, cache=2)
    return ls.mix([a, b], weights=[1, 3], seed=2)


def packed(root: str) -> Any:
    mg.write(os.path.join(root, "docs"), [np.arange(n, dtype=np.int32) for n in range(2, 30)])
    return ls.pack(mg.indexed(os.path.join(root, "docs")), 32)


def parquet(root: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.table({"x": np.arange(60, dtype=np.int32), "y": [[float(i)] * (i % 4) for i in range(60)]})
    pq.write_table(t, os.path.join(root, "t.parquet"), row_group_size=16, write_page_index=True)
    return ls.parquet(os.path.join(root, "t.parquet"), cache=2)


def arrow(root: str) -> Any:
    import pyarrow as pa

    t = pa.table({"x": np.arange(60, dtype=np.int32), "y": [[float(i)] * 3 for i in range(60)]})
    with pa.OSFile(os.path.join(root, "t.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        for b in t.to_batches(max_chunksize=16):
            w.write_batch(b)
    return ls.arrow(os.path.join(root, "t.arrow"), cache=2)


def _tar_numbers(sample: dict) -> np.ndarray:
    return np.frombuffer(sample["x"], np.uint8)


def webdataset(root: str) -> Any:
    import io
    import tarfile

    with tarfile.open(os.path.join(root, "t.tar"), "w") as t:
        for i in range(60):
            info = tarfile.TarInfo(f"s{i:03d}.x")
            info.size = i % 5 + 1
            t.addfile(info, io.BytesIO(bytes([i + 1]) * info.size))
    return ls.smap(_tar_numbers, ls.webdataset(os.path.join(root, "t.tar"), cache_dir=os.path.join(root, "index")))


SOURCES: dict[str, Callable[[str], Any]] = {"chunks": chunks, "store": store, "megatron": corpus,
                                            "mix": mixture, "pack": packed, "parquet": parquet, "arrow": arrow,
                                            "webdataset": webdataset}


# -- the ways of reading -----------------------------------------------------------------------------
def _sum(x: Any) -> float:
    if isinstance(x, dict):
        return sum(_sum(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_sum(v) for v in x)
    return float(np.sum(x))


def directly(v: Any) -> float:
    total = sum(_sum(x) for x in v)
    return total + _sum(list(v[np.arange(0, len(v), 3)]))


def through_prefetch(v: Any) -> float:
    with ls.prefetch(v, 2, method="process") as p:
        return sum(_sum(x) for x in p)


def through_a_dataloader(v: Any) -> float:
    loader = ls.DataLoader(v, batch_size=4, shuffle=True, seed=0, num_workers=2, to_tensor=False, collate_fn=list)
    total = 0.0
    for _ in range(2):
        total += sum(_sum(b) for b in loader)
    loader.close()
    return total


READS = {"directly": directly, "prefetch": through_prefetch, "dataloader": through_a_dataloader}


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("source", SOURCES)
def test_a_dropped_pipeline_frees_everything_at_once(gc_off, tmp_path, source, read):
    root = str(tmp_path)
    pipeline = SOURCES[source](root)
    assert READS[read](pipeline) > 0
    if read == "directly":  # (through workers, the parent reads nothing of it)
        if source in ("store", "megatron", "pack", "parquet", "arrow", "webdataset"):
            assert held(root)["maps"], "nothing was mapped: the check below would prove nothing"
        else:
            assert decoded_alive() > 0
    refs = weakrefs(pipeline)
    del pipeline
    assert [type(r()).__name__ for r in refs if r() is not None] == []
    assert decoded_alive() == 0
    assert held(root) == {"fds": [], "maps": []}
    assert lazyseq_garbage() == []


def garbage_here(x: Any) -> tuple:
    """An item and what the cyclic collector would free in the process that read it."""
    return x, os.getpid(), len(lazyseq_garbage()), decoded_alive()


CALLS = itertools.count()  # per process: a forked worker counts from the parent's value


def garbage_now_and_then(x: Any) -> tuple:
    """:func:`garbage_here` with the collector's look every 8th item read in this process (a full
    collection in a worker that imported torch costs ~0.1 s: every item's made this test 97 s in CI)."""
    looked = next(CALLS) % 8 == 0
    return x, os.getpid(), len(lazyseq_garbage()) if looked else 0, decoded_alive(), looked


def test_persistent_workers_free_each_epochs_pipeline(gc_off, tmp_path):
    """Each epoch binds the dataset's views to it in the worker (a copy of what follows the epoch):
    the copy of the epoch before is gone by the next, nothing left for a collector."""
    data = ls.smap(garbage_now_and_then, ls.block_shuffle(chunks(str(tmp_path)), 20, seed=3))
    loader = ls.DataLoader(data, batch_size=6, shuffle=True, seed=1, num_workers=2, persistent_workers=True,
                           to_tensor=False, collate_fn=list)
    seen = []
    for epoch in range(3):
        seen += [(epoch, *x[1:]) for b in loader for x in b]
    loader.close()
    assert len(seen) == 3 * 120 and len({pid for _, pid, _, _, _ in seen}) == 2
    for epoch in range(3):  # the collector looked in each worker in each epoch
        assert {s[1] for s in seen if s[0] == epoch and s[4]} == {s[1] for s in seen}, epoch
    assert [s for s in seen if s[2] != 0] == []  # no cycle of lazyseq's in a worker, in any epoch
    assert max(s[3] for s in seen) <= 3 + 1  # the chunk cache's 3, and the one being read


def test_a_worker_forked_after_the_drop_inherits_nothing_of_it(gc_off, tmp_path):
    data = chunks(str(tmp_path))
    loader = ls.DataLoader(data, batch_size=5, shuffle=True, seed=0, to_tensor=False, collate_fn=list)
    assert sum(len(b) for b in loader) == 120 and decoded_alive() > 0
    del data, loader
    with ls.prefetch(ls.smap(garbage_here, range(4)), 2, method="process", mp_context="fork") as p:
        report = list(p)
    assert [(garbage, alive) for _, _, garbage, alive in report] == [(0, 0)] * 4
