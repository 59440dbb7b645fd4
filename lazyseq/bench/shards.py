"""Shards where they lie (issue #33), the rows of ``python -m lazyseq.bench formats`` after the
Parquet ones: SAMPLES samples of ~8 KB (a ``jpg`` of random bytes and an int ``cls``) in SHARDS tar
shards written by ``webdataset.TarWriter`` (by ``tarfile`` where webdataset is missing), and the same
samples written by ``streaming.MDSWriter`` and ``litdata.optimize`` where those are installed, in a
temporary directory (page cache: reads measure the readers, not the disk).

- (a) a shuffled epoch, batches of 64, bytes only, items/s timed from the first batch:
  ``DataLoader(block_shuffle(v, v.cuts, seed), batch_size=64, num_workers=2, to_tensor=False)``
  over ``lazyseq.webdataset``, ``lazyseq.mds`` and ``lazyseq.litdata`` of those files, against
  ``webdataset.WebDataset(urls, shardshuffle=True).shuffle(1000)`` in a torch DataLoader of 2
  workers (batched by the DataLoader, and by ``.batched(64)`` in the workers: the faster is the
  peer), Mosaic's ``StreamingDataset(local=dir, shuffle=True)`` and litdata's
  ``StreamingDataset(dir, shuffle=True)`` in their DataLoaders of 2 workers.
- (b) random single-sample reads once the index is built, us per sample: ``webdataset(tars)[i]``,
  ``mds(dir)[i]``, ``litdata(dir)[i]``, beside Mosaic's ``LocalDataset[i]`` and litdata's
  ``StreamingDataset[i]``.
- (c) the index of one local tar shard of INDEX_BYTES (headers only), built from nothing (a fresh
  index cache; the shard in the page cache): seconds, and the second open (its cached index).
- (d) the tars served by ``lazyseq.files.serve`` in a child process answering after 20 ms: random
  samples, a plain loop against ``prefetch(gather(v, order), nworkers=32, method='thread')``.
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import lazyseq
from lazyseq.bench.formats_data import per_read
from lazyseq.bench.remote import Server

SAMPLES, SHARDS, SAMPLE_BYTES, BATCH, BUFFER, NWORKERS, THREADS, LATENCY = 20_000, 20, 8_000, 64, 1_000, 2, 32, 0.02
INDEX_BYTES = 2**30
TARGETS = {  # key: (what, comparison, threshold)
    "epoch_vs_webdataset": ("(a) shuffled epoch: lazyseq webdataset / webdataset + torch DataLoader", ">=", 1.0),
    "epoch_vs_mosaic": ("(a) shuffled epoch: lazyseq mds / Mosaic StreamingDataset", ">=", 1.0),
    "epoch_vs_litdata": ("(a) shuffled epoch: lazyseq litdata / litdata StreamingDataset", ">=", 1.0),
    "random_read_us": ("(b) random sample reads, local tar: us per sample", "<=", 30.0),
    "index_seconds": ("(c) index of a 1 GiB local tar (headers only): seconds per GiB", "<", 0.5),
    "shards_prefetch_vs_loop": (f"(d) {LATENCY * 1e3:.0f} ms server: {THREADS} threads / plain loop, samples/s", ">=", 10.0),
}
MINE = {"tar": "lazyseq webdataset", "mds": "lazyseq mds", "litdata": "lazyseq litdata"}
WDS, WDS_BATCHED, MOSAIC, LIT = ("webdataset + torch DataLoader", "webdataset .batched(64) + torch DataLoader",
                                 "Mosaic StreamingDataset + DataLoader", "litdata StreamingDataset + StreamingDataLoader")


# -- the files --------------------------------------------------------------------------------------
def sample(i: int) -> dict:
    """Sample ``i``, the same in every format (litdata's workers make it from its index)."""
    rng = np.random.default_rng([7, i])
    size = int(rng.integers(SAMPLE_BYTES - 1_000, SAMPLE_BYTES + 1_000))
    return {"__key__": f"{i:08d}", "jpg": b"\xff\xd8" + rng.bytes(size - 4) + b"\xff\xd9", "cls": int(rng.integers(1000))}


def samples(n: int) -> Iterator[dict]:
    return map(sample, range(n))


def write_tars(root: str, n: int, shards: int, wds: bool) -> list[str]:
    """``shards`` tars of ``n`` samples in all, by webdataset.TarWriter (else tarfile, the same members)."""
    os.makedirs(root)
    paths, per = [], -(-n // shards)
    it = samples(n)
    for k in range(shards):
        path = os.path.join(root, f"shard-{k:05d}.tar")
        chunk = [s for _, s in zip(range(per), it)]
        if wds:
            import webdataset

            with webdataset.TarWriter(path) as w:
                for s in chunk:
                    w.write(s)
        else:
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
                for s in chunk:
                    for ext, data in (("cls", str(s["cls"]).encode()), ("jpg", s["jpg"])):
                        info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def importable(name: str) -> Any:
    """The module ``name``, or None where it (or what it imports) is missing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def streaming_modules() -> Any:
    """``streaming.base`` without its package ``__init__`` (which imports its trainer stack), or None."""
    if importlib.util.find_spec("streaming") is None:
        return None
    if "streaming" not in sys.modules or not hasattr(sys.modules["streaming"], "__path__"):
        root = os.path.dirname(importlib.util.find_spec("streaming").origin)
        for name, sub in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
            m = types.ModuleType(name)
            m.__path__ = [sub]
            sys.modules.setdefault(name, m)
    try:
        from streaming.base.dataset import StreamingDataset
        from streaming.base.format.mds.writer import MDSWriter
        from streaming.base.local import LocalDataset
    except ImportError:
        return None
    return types.SimpleNamespace(StreamingDataset=StreamingDataset, MDSWriter=MDSWriter, LocalDataset=LocalDataset)


def write_mds(root: str, n: int, shards: int, streaming: Any) -> None:
    limit = n * (SAMPLE_BYTES + 64) // shards
    with streaming.MDSWriter(out=root, columns={"jpg": "bytes", "cls": "int"}, size_limit=limit, progress_bar=False) as w:
        for s in samples(n):
            w.write({"jpg": s["jpg"], "cls": s["cls"]})


def _lit_sample(i: int) -> dict:
    s = sample(i)
    return {"jpg": s["jpg"], "cls": s["cls"]}


def write_litdata(root: str, n: int, shards: int) -> None:
    """``litdata.optimize`` in a child process: it sets this process's multiprocessing start method
    to spawn (the peers' DataLoaders would then spawn), and talks."""
    code = ("import sys, litdata; from lazyseq.bench.shards import _lit_sample; "
            "litdata.optimize(fn=_lit_sample, inputs=list(range(int(sys.argv[2]))), output_dir=sys.argv[1], "
            "num_workers=1, chunk_bytes=int(sys.argv[3]))")
    here = str(Path(lazyseq.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code, root, str(n), str(n * (SAMPLE_BYTES + 64) // shards)],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench formats: litdata.optimize failed:\n{proc.stderr[-2000:]}")


def write_index_tar(path: str, size: int) -> int:
    """One tar of about ``size`` bytes of jpg/cls samples (random bytes, shared): its sample count."""
    blob = np.random.default_rng(1).bytes(SAMPLE_BYTES + 1_000)
    n, written = 0, 0
    with open(path, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as t:
        while written < size:
            for ext, data in (("cls", str(n % 1000).encode()), ("jpg", blob[: SAMPLE_BYTES - 1_000 + n % 2_000])):
                info = tarfile.TarInfo(f"{n:08d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
                written += 512 + -(-len(data) // 512) * 512
            n += 1
    with open(path, "rb+") as f:  # on disk before it is timed: no write-back runs during the index
        os.fsync(f.fileno())
    return n


# -- timing -----------------------------------------------------------------------------------------
def epoch_rate(batches: Iterator[Any], n: int, labels: int | None) -> dict:
    """Items/s of one epoch's batches timed from the first, the seconds to the first, the items read;
    with ``labels``, every sample read once (their count and their ``cls``' sum checked)."""
    t = time.perf_counter()
    first = next(batches)
    start = time.perf_counter()
    count, total = len(first["cls"]), sum(int(x) for x in first["cls"])
    for b in batches:
        count, total = count + len(b["cls"]), total + sum(int(x) for x in b["cls"])
    seconds = time.perf_counter() - start
    if labels is not None and (count, total) != (n, labels):
        raise AssertionError(f"bench formats: an epoch read {count} samples (cls' sum {total}), not {n} ({labels})")
    if not 0.9 * n <= count <= 1.1 * n:
        raise AssertionError(f"bench formats: a peer's epoch read {count} samples, not about {n}")
    return {"items_per_s": (count - len(first["cls"])) / seconds, "first_batch_s": start - t, "items": count}


def peer_epochs(files: dict, streaming: Any, rounds: int) -> tuple[dict[str, Callable[[int], Iterator]], list]:
    """Each installed peer's shuffled epoch (``epoch(r)``), and what to close after."""
    epochs: dict[str, Callable[[int], Iterator]] = {}
    closers: list[Callable[[], None]] = []
    if importable("torch") is None:
        return epochs, closers
    from torch.utils.data import DataLoader

    wds = importable("webdataset")
    if wds is not None:
        tars = files["tar"]
        plain = DataLoader(wds.WebDataset(tars, shardshuffle=100, empty_check=False).shuffle(BUFFER), batch_size=BATCH,
                           num_workers=NWORKERS)
        batched = DataLoader(wds.WebDataset(tars, shardshuffle=100, empty_check=False).shuffle(BUFFER).batched(BATCH),
                             batch_size=None, num_workers=NWORKERS)
        epochs[WDS], epochs[WDS_BATCHED] = (lambda r: iter(plain)), (lambda r: iter(batched))
    if streaming is not None and "mds" in files:
        mosaic = streaming.StreamingDataset(local=files["mds"], shuffle=True, shuffle_seed=0, batch_size=BATCH)
        loader = DataLoader(mosaic, batch_size=BATCH, num_workers=NWORKERS)
        epochs[MOSAIC] = lambda r: iter(loader)
        closers.append(lambda: _mosaic_clean(mosaic))
    litdata = importable("litdata") if "litdata" in files else None
    if litdata is not None:
        lit = litdata.StreamingDataset(files["litdata"], shuffle=True, seed=0)
        lit_loader = litdata.StreamingDataLoader(lit, batch_size=BATCH, num_workers=NWORKERS)
        epochs[LIT] = lambda r: iter(lit_loader)
    return epochs, closers


def _mosaic_clean(dataset: Any) -> None:
    """Mosaic's shared memory (its /dev/shm entries), unlinked as its own clean-up does."""
    try:
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        return
    del dataset
    clean_stale_shared_memory()


def views(files: dict, cache: str) -> dict[str, Any]:
    out = {"tar": lazyseq.webdataset(files["tar"], cache_dir=cache)}
    if "mds" in files:
        out["mds"] = lazyseq.mds(files["mds"])
    if "litdata" in files and hasattr(lazyseq, "litdata"):
        out["litdata"] = lazyseq.litdata(files["litdata"])
    return out


# -- the parts --------------------------------------------------------------------------------------
def part_a(files: dict, mine: dict, streaming: Any, n: int, labels: int, rounds: int) -> dict:
    loaders = {MINE[k]: lazyseq.DataLoader(lazyseq.block_shuffle(v, v.cuts, seed=0), batch_size=BATCH,
                                           num_workers=NWORKERS, to_tensor=False) for k, v in mine.items()}
    epochs: dict[str, Callable[[int], Iterator]] = {name: (lambda r, lo=lo: iter(lo)) for name, lo in loaders.items()}
    theirs, closers = peer_epochs(files, streaming, rounds)
    best: dict[str, dict] = {}
    try:
        for r in range(rounds):
            for name, epoch in {**epochs, **theirs}.items():
                got = epoch_rate(epoch(r), n, labels if name in loaders else None)
                if name not in best or got["items_per_s"] > best[name]["items_per_s"]:
                    best[name] = got
    finally:
        for lo in loaders.values():
            lo.close()
        for close in closers:
            close()
    return best


def part_b(files: dict, mine: dict, streaming: Any, n: int, keys: int, rounds: int) -> dict:
    readers: dict[str, Callable[[int], Any]] = {MINE[k]: v.__getitem__ for k, v in mine.items()}
    if streaming is not None and "mds" in files:
        readers["Mosaic LocalDataset[i]"] = streaming.LocalDataset(local=files["mds"]).__getitem__
    litdata = importable("litdata") if "litdata" in files else None
    if litdata is not None:
        readers["litdata StreamingDataset[i]"] = litdata.StreamingDataset(files["litdata"]).__getitem__
    order = np.random.default_rng(2).integers(0, n, keys).tolist()
    for i in order[:50]:
        want = sample(i)["jpg"]
        for name, one in readers.items():
            if bytes(one(i)["jpg"]) != want:
                raise AssertionError(f"bench formats: {name} gives another sample {i}")
    return {"us_per_read": per_read(readers, order, rounds), "keys": keys}


def part_c(root: str, size: int, rounds: int) -> dict:
    path = os.path.join(root, "one.tar")
    count = write_index_tar(path, size)
    built, cached = float("inf"), float("inf")
    for r in range(rounds):
        cache = os.path.join(root, f"index-cache-{r}")
        t = time.perf_counter()
        got = len(lazyseq.webdataset(path, cache_dir=cache))
        built = min(built, time.perf_counter() - t)
        t = time.perf_counter()
        again = len(lazyseq.webdataset(path, cache_dir=cache))
        cached = min(cached, time.perf_counter() - t)
        if got != count or again != count:
            raise AssertionError(f"bench formats: the index of {path} holds {got} samples, not {count}")
    out = {"bytes": os.path.getsize(path), "samples": count, "members": 2 * count, "build_s": built, "cached_s": cached}
    os.remove(path)
    return out


def part_d(tars: list[str], n: int, reads: int) -> dict:
    server = Server(os.path.dirname(tars[0]), LATENCY)
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = os.path.join(os.path.dirname(os.path.dirname(tars[0])), "xdg")  # the index cache
    try:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in tars]
        order = np.random.default_rng(3).integers(0, n, reads).tolist()
        out: dict[str, Any] = {"reads": reads}
        t = time.perf_counter()
        len(lazyseq.webdataset(urls, block_cache=0))  # every shard's index by ranged reads of its headers, kept
        out["index_s"] = time.perf_counter() - t
        for name, read in [("plain loop", lambda v: [v[i] for i in order]),
                           (f"prefetch, {THREADS} threads", lambda v: list(lazyseq.prefetch(
                               lazyseq.gather(v, order), nworkers=THREADS, method="thread")))]:
            v = lazyseq.webdataset(urls, block_cache=0)
            v[order[0]]  # the HTTP client's start and the cached indexes' load, not timed
            before = server.requests()
            t = time.perf_counter()
            got = read(v)
            seconds = time.perf_counter() - t
            if [bytes(s["jpg"]) for s in got] != [sample(i)["jpg"] for i in order]:
                raise AssertionError(f"bench formats: (d) {name} gives other samples than the local tars")
            out[name] = {"seconds": seconds, "samples_per_s": reads / seconds,
                         "requests_per_read": (server.requests() - before) / reads}
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved
        server.close()
    out["server_exit_code"] = server.proc.returncode
    return out


# -- printing, targets and the run ------------------------------------------------------------------
def show(res: dict, rounds: int) -> None:
    a, b, c, d = res["epoch"], res["random"], res["index"], res["remote"]
    tar = a[MINE["tar"]]["items_per_s"]
    print(f"\n(e) shards: one shuffled epoch in batches of {BATCH}, bytes only, items/s timed from the first batch; "
          f"best of {rounds}\n{'':48s}{'items/s':>10s}{'first s':>9s}{'items':>7s}{'webdataset x':>14s}")
    for name in [*MINE.values(), WDS, WDS_BATCHED, MOSAIC, LIT]:
        r = a.get(name)
        missing = "not built (no lazyseq.litdata)" if name == MINE["litdata"] and not hasattr(lazyseq, "litdata") \
            else "not installed"
        print(f"{name:48s}" + (f"{missing:>26s}" if r is None else
                               f"{r['items_per_s']:10.0f}{r['first_batch_s']:9.2f}{r['items']:7d}{tar / r['items_per_s']:14.2f}"))
    print(f"lazyseq: DataLoader(block_shuffle(v, v.cuts, seed=0), batch_size={BATCH}, num_workers={NWORKERS}, "
          f"to_tensor=False) (process workers);\n  webdataset: WebDataset(tars, shardshuffle=100).shuffle({BUFFER}) in "
          f"torch DataLoader(batch_size={BATCH}, num_workers={NWORKERS}), or .batched({BATCH}) with batch_size=None;\n"
          f"  Mosaic: StreamingDataset(local=dir, shuffle=True, batch_size={BATCH}); litdata: StreamingDataset(dir, "
          f"shuffle=True) in its StreamingDataLoader; {NWORKERS} workers each")
    us = b["us_per_read"]
    print(f"\n(f) shards: {b['keys']} random single-sample reads (indexes built), us per read; best of {rounds}")
    for name, v in us.items():
        print(f"{name:48s}{v:10.1f} us")
    print(f"\n(g) the index of one local tar of {c['bytes'] / 2**20:.0f} MiB ({c['members']} members), headers only, "
          f"from nothing: {c['build_s']:.3f} s ({c['bytes'] / c['build_s'] / 1e9:.2f} GB/s); reopened (its cached "
          f"index): {c['cached_s'] * 1e3:.1f} ms")
    loop = d["plain loop"]["samples_per_s"]
    print(f"\n(h) shards: {d['reads']} random samples over lazyseq.files.serve answering after {LATENCY * 1e3:.0f} ms "
          f"(webdataset(urls, block_cache=0); the indexes, by ranged reads of the headers, {d['index_s']:.1f} s, "
          f"untimed)\n{'':48s}{'samples/s':>10s}{'requests/read':>15s}{'x loop':>8s}")
    for name in ("plain loop", f"prefetch, {THREADS} threads"):
        r = d[name]
        print(f"{name:48s}{r['samples_per_s']:10.1f}{r['requests_per_read']:15.2f}{r['samples_per_s'] / loop:8.1f}")


def target_values(res: dict) -> tuple[dict, dict]:
    a, d = res["epoch"], res["remote"]

    def ratio(mine: str, *peers: str) -> float | None:
        have = [a[p]["items_per_s"] for p in peers if p in a]
        return a[mine]["items_per_s"] / max(have) if mine in a and have else None

    values = {"epoch_vs_webdataset": ratio(MINE["tar"], WDS, WDS_BATCHED), "epoch_vs_mosaic": ratio(MINE["mds"], MOSAIC),
              "epoch_vs_litdata": ratio(MINE["litdata"], LIT), "random_read_us": res["random"]["us_per_read"][MINE["tar"]],
              "index_seconds": res["index"]["build_s"] * 2**30 / res["index"]["bytes"],  # (--quick: a smaller tar)
              "shards_prefetch_vs_loop": d[f"prefetch, {THREADS} threads"]["samples_per_s"] / d["plain loop"]["samples_per_s"]}
    why = {"epoch_vs_webdataset": "webdataset or torch not installed",
           "epoch_vs_mosaic": "mosaicml-streaming (and catalogue) or torch not installed",
           "epoch_vs_litdata": "litdata or torch not installed, or lazyseq.litdata missing"}
    return values, why


def run(root: str, quick: bool) -> dict:
    """Write the shards under ``root``, run (e) to (h) and print them; returns the results."""
    n, shards, rounds, index_bytes = (640, 4, 1, 32 * 2**20) if quick else (SAMPLES, SHARDS, 2, INDEX_BYTES)
    have = {name: importable(name) is not None for name in ("webdataset", "torch", "litdata")}
    streaming = streaming_modules()
    res: dict[str, Any] = {"samples": n, "shards": shards, "installed": {**have, "streaming": streaming is not None}}
    for name, ok in res["installed"].items():
        if not ok:
            print(f"({name} is not installed: its shard rows are skipped)")
    files: dict[str, Any] = {"tar": write_tars(os.path.join(root, "tars"), n, shards, have["webdataset"])}
    if streaming is not None:
        files["mds"] = os.path.join(root, "mds")
        write_mds(files["mds"], n, shards, streaming)
    if have["litdata"]:
        files["litdata"] = os.path.join(root, "litdata")
        write_litdata(files["litdata"], n, shards)
    labels = sum(s["cls"] for s in samples(n))
    res["bytes"] = sum(os.path.getsize(p) for p in files["tar"])
    print(f"\n{n} samples (jpg {SAMPLE_BYTES - 1_000}-{SAMPLE_BYTES + 1_000} bytes, cls) in {shards} tar shards: "
          f"{res['bytes'] / 1e6:.0f} MB; the same as {', '.join(k for k in files if k != 'tar') or 'nothing else'}")
    mine = views(files, os.path.join(root, "index-cache"))
    res["epoch"] = part_a(files, mine, streaming, n, labels, rounds)
    res["random"] = part_b(files, mine, streaming, n, 200 if quick else 5_000, 1 if quick else 3)
    res["index"] = part_c(root, index_bytes, 1 if quick else 3)
    res["remote"] = part_d(files["tar"], n, 20 if quick else 200)
    show(res, rounds)
    res["values"], res["why"] = target_values(res)
    return res
