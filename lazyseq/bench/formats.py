"""Data where it already lives (issue #32): ``lazyseq.parquet`` against pyarrow by hand, Hugging Face
``datasets`` and Ray Data, in one run on one machine, over the same files: ROWS rows (an image-bytes
column of ~3 KB, JPEG markers at both ends, random between; an int label; a short text) in FILES
Parquet files with row groups of GROUP rows, written in a temporary directory (page cache: reads
measure the readers, not the disk).

- (a) single-row reads, us per read: ``parquet(dir)[i]`` (its default cache: 4 decoded row groups)
  against pyarrow by hand with the same cache policy (the last 4 ``read_row_group(rg,
  use_threads=False)`` tables kept, least recently used out; the row by ``table.slice(j,
  1).to_pylist()[0]`` or by ``column[j].as_py()``: the faster is the peer) and ``datasets``
  (``load_dataset('parquet', ...)``, its one-off conversion timed apart; ``ds[i]``); and
  ``parquet(dir, cache=<every row group>)``, the files decoded once into memory (its first round)
  as datasets converts them once. Four orders: random uniform (nearly every read decodes a row
  group), random rows of the 4 row groups both readers hold (the cost of a read itself), and
  ``block_shuffle`` order with its default window of 8 row groups (twice the cache: about half
  the reads decode) and with a window of 4 (the cache: a decode per 1,000 reads).
- (b) a shuffled epoch in batches of 256, items/s timed from the first batch:
  ``DataLoader(block_shuffle(pq, pq.cuts, seed=0), batch_size=256, num_workers=2, to_tensor=False)``
  (process workers) with ``parquet(dir)`` (cache 4) and ``parquet(dir, cache=8)`` (the window), and
  the second without workers (``num_workers=0``: the batches built in the reader);
  against a sequential ``ParquetFile.iter_batches(256)`` pass over the files, ``datasets``'
  ``ds.shuffle(seed).iter(batch_size=256)`` (python and numpy formats) and Ray Data's
  ``read_parquet(dir).iter_batches(batch_size=256, local_shuffle_buffer_size=8 row groups)``.
- (c) the files served by ``lazyseq.files.serve`` in a child process answering after 20 ms: one
  random row of every row group, row groups in a random order (each read fetches its row group),
  a plain loop against ``prefetch(gather(pq, order), nworkers=32, method='thread')``.
- (d) ``lazyseq.formats.arrow.arrow(ds)[i]`` against ``ds.with_format('numpy')[i]`` on the
  ``datasets`` table of (a), random rows, the values compared.

Readers alternate round by round (the best round), so a shared machine's noise hits them alike.
Peers not installed (``datasets``, ``ray``) leave their rows saying so; ``--quick`` skips Ray.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import lazyseq
from lazyseq.bench import shards
from lazyseq.bench.formats_data import BATCH, ByHand, arrow_of, epoch_rate, iter_batches, load_hf, per_read, plain, write_files
from lazyseq.bench.remote import Server, _load, machine

NWORKERS, THREADS, LATENCY, WINDOW = 2, 32, 0.02, 8
PAGE = 64 * 1024  # (c)'s second set of files: data pages of this size, with a page index
CACHE = 4  # lazyseq.parquet's default, given to the hand-written reader too
TARGETS = {  # key: (what, comparison, threshold)
    "random_vs_pyarrow": ("(a) random reads: lazyseq / pyarrow by hand, us per read", "<=", 1.2),
    "random_vs_datasets": ("(a) random reads: datasets ds[i] / lazyseq, us per read", ">=", 10.0),
    "held_vs_pyarrow": ("(a) reads in held row groups: lazyseq / pyarrow by hand", "<=", 1.2),
    "held_vs_datasets": ("(a) reads in held row groups: datasets ds[i] / lazyseq", ">=", 10.0),
    "all_held_vs_datasets": ("(a) random reads, cache = every row group: datasets / lazyseq", ">=", 10.0),
    "epoch_vs_iter_batches": ("(b) epoch (cache=8): lazyseq / sequential iter_batches, items/s", ">=", 0.8),
    "epoch_vs_datasets": ("(b) epoch (cache=8): lazyseq / datasets shuffle().iter, items/s", ">", 1.0),
    "epoch_vs_ray": ("(b) epoch (cache=8): lazyseq / Ray Data iter_batches, items/s", ">", 1.0),
    "remote_prefetch_vs_loop": (f"(c) {LATENCY * 1e3:.0f} ms server: {THREADS} threads / plain loop, rows/s", ">=", 10.0),
    "remote_paged_prefetch_vs_loop": (f"(c) the same, files with a page index: {THREADS} threads / plain loop", ">=", 10.0),
    "arrow_vs_datasets": ("(d) datasets numpy ds[i] / arrow(ds)[i], us per read", ">=", 10.0),
}
HAND = ("pyarrow by hand, slice().to_pylist()", "pyarrow by hand, column[j].as_py()")
LAZY = ("lazyseq DataLoader, cache=4 (default)", "lazyseq DataLoader, cache=8")
IN_READER = "lazyseq DataLoader, cache=8, num_workers=0"  # the same loader without workers
ALL = "lazyseq, cache = every row group"
HELD = "held row groups"  # (a)'s order of random rows of the row groups both readers hold
HF, RAY, ITER = "datasets ds[i]", "Ray Data", "pyarrow iter_batches, sequential"
PARTS = ("parquet", "shards")  # --only: the Parquet parts (a) to (d), the shard parts (e) to (h)


# -- the parts --------------------------------------------------------------------------------------
def part_a(root: str, paths: list[str], ds: Any, n: int, sizes: dict[str, int], rounds: int) -> dict:
    pq, hand = lazyseq.parquet(root), ByHand(paths, CACHE)
    every = lazyseq.parquet(root, cache=pq.blocks)
    readers: dict[str, Callable[[int], Any]] = {"lazyseq": pq.__getitem__, HAND[0]: hand.by_slice, HAND[1]: hand.by_columns,
                                                ALL: every.__getitem__}
    if ds is not None:
        readers[HF] = ds.__getitem__
    for i in sorted({0, n - 1, *range(0, n, max(1, n // 37))}):
        want = hand.by_slice(i)
        for name, one in readers.items():
            if plain(one(i)) != want:
                raise AssertionError(f"bench formats: {name} gives another row {i} than pyarrow's")
    rng = np.random.default_rng(0)
    orders = {"random": rng.integers(0, n, sizes["random"]).tolist(),
              HELD: rng.integers(0, pq.cuts[CACHE - 1], sizes[HELD]).tolist()}  # rows of the first CACHE row groups
    for window in (WINDOW, CACHE):
        orders[f"block_shuffle, window {window}"] = [
            int(i) for i in lazyseq.block_shuffle(range(n), pq.cuts, seed=0, window=window)[: sizes[f"window {window}"]]]
    return {"us_per_read": {o: per_read(readers, keys, rounds) for o, keys in orders.items()},
            "keys": {o: len(keys) for o, keys in orders.items()}}


def part_b(root: str, paths: list[str], ds: Any, n: int, rounds: int, ray: bool) -> dict:
    import pyarrow.parquet as pq_

    labels = sum(int(pq_.read_table(p, columns=["label"]).column(0).to_numpy().sum()) for p in paths)
    loaders = {}
    for name, cache, workers in zip((*LAZY, IN_READER), (CACHE, WINDOW, WINDOW), (NWORKERS, NWORKERS, 0)):
        pq = lazyseq.parquet(root, cache=cache)
        loaders[name] = lazyseq.DataLoader(lazyseq.block_shuffle(pq, pq.cuts, seed=0), batch_size=BATCH,
                                           num_workers=workers, to_tensor=False)
    epochs: dict[str, Callable[[int], Iterator[dict]]] = {ITER: lambda r: iter_batches(paths, r)}
    for name, loader in loaders.items():
        epochs[name] = lambda r, loader=loader: iter(loader)  # epoch r: the loader's next epoch
    if ds is not None:
        epochs["datasets shuffle().iter, python"] = lambda r: ds.shuffle(seed=r).iter(batch_size=BATCH)
        epochs["datasets shuffle().iter, numpy"] = lambda r: ds.with_format("numpy").shuffle(seed=r).iter(batch_size=BATCH)
    best, first = {name: 0.0 for name in epochs}, {name: float("inf") for name in epochs}
    try:
        for r in range(rounds):
            for name, epoch in epochs.items():
                rate, start = epoch_rate(epoch(r), n, labels)
                best[name], first[name] = max(best[name], rate), min(first[name], start)
    finally:
        for loader in loaders.values():
            loader.close()
    out: dict[str, Any] = {"items_per_s": best, "first_batch_s": first, "ray": ray_epoch(root, n, labels) if ray else None}
    return out


def ray_epoch(root: str, n: int, labels: int) -> dict:
    """Ray Data's shuffled epoch (one round: it starts a cluster of its own), or why it did not run."""
    try:
        import ray
        import ray.data
    except Exception as e:  # whatever stops the import is said on its row
        return {"failed": f"import ray.data: {type(e).__name__}: {e}"}
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        data = ray.data.read_parquet(root, columns=["image", "label", "text"])
        rate, start = epoch_rate(iter(data.iter_batches(batch_size=BATCH, local_shuffle_buffer_size=WINDOW * 1000,
                                                        local_shuffle_seed=0)), n, labels)
        return {"items_per_s": rate, "first_batch_s": start}
    except Exception as e:  # said on its row, the bench goes on
        return {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        ray.shutdown()


def part_c(root: str, paths: list[str], n: int, seed: int = 0) -> dict:
    """One random row of every row group, row groups in a random order, over a server answering after LATENCY."""
    local = lazyseq.parquet(root)
    rng = np.random.default_rng(seed)
    starts, rows = [0, *local.cuts], local.block_rows
    order = [int(starts[b] + rng.integers(rows[b])) for b in rng.permutation(local.blocks)]
    want = [plain(local[i]) for i in order]
    out: dict[str, Any] = {"reads": len(order)}
    server = Server(root, LATENCY)
    try:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        lazyseq.parquet(urls, block_cache=0)[order[-1]]  # the HTTP client's one-off start (~0.5 s), not timed
        for name, read in [("plain loop", lambda v: [v[i] for i in order]),
                           (f"prefetch, {THREADS} threads", lambda v: list(lazyseq.prefetch(
                               lazyseq.gather(v, order), nworkers=THREADS, method="thread")))]:
            v = lazyseq.parquet(urls, block_cache=0)  # footers read now, not timed; no bytes kept between reads
            before = server.requests()
            t = time.perf_counter()
            got = read(v)
            seconds = time.perf_counter() - t
            if [plain(x) for x in got] != want:
                raise AssertionError(f"bench formats: (c) {name} gives other rows than the local files")
            out[name] = {"seconds": seconds, "rows_per_s": len(order) / seconds,
                         "requests_per_read": (server.requests() - before) / len(order)}
        out.update(transfer_only(urls, paths, local, order))
    finally:
        server.close()
    out["server_exit_code"] = server.proc.returncode
    return out


def transfer_only(urls: list[str], paths: list[str], local: Any, order: list[int]) -> dict:
    """The bytes a read of each row of ``order`` fetches when it decodes its row group (the group's
    column chunks, one set of requests per read), fetched through lazyseq's files layer without
    decoding, in a plain loop and by THREADS threads: the ceiling of (c) on this machine."""
    import concurrent.futures

    import pyarrow.parquet as pq_

    from lazyseq.formats.sources import Remotes, open_source

    remotes = Remotes({"storage_options": None, "block_cache": 0, "cache_dir": None, "cache_dir_bytes": None,
                       "timeout": 30.0})
    files = [open_source(u, "a Parquet file", remotes) for u in urls]
    metas = [pq_.ParquetFile(p).metadata for p in paths]
    reads = []
    for i in order:
        b, _ = local._where(i)
        k, r = local._block_of[b]
        group = metas[k].row_group(r)
        cols = [group.column(c) for c in range(group.num_columns)]
        reads.append((k, [(min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset),
                           min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
                           + c.total_compressed_size) for c in cols]))
    files[reads[0][0]].read_many(reads[0][1])  # the client's start, not timed

    def fetch(read: tuple[int, list]) -> int:
        return sum(len(x) for x in files[read[0]].read_many(read[1]))

    def threads() -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(fetch, reads))

    out = {}
    for name, run in [("ranges only, plain loop", lambda: [fetch(r) for r in reads]),
                      (f"ranges only, {THREADS} threads", threads)]:
        t = time.perf_counter()
        got = run()
        out[name] = {"seconds": time.perf_counter() - t, "mb_per_read": sum(got) / len(got) / 1e6}
        out[name]["rows_per_s"] = len(reads) / out[name]["seconds"]
    return out


def part_d(ds: Any, n: int, keys: int, rounds: int) -> dict:
    """``arrow(ds)[i]`` against ``ds.with_format('numpy')[i]`` on random rows; the values compared."""
    arrow = arrow_of()
    if ds is None or arrow is None:
        return {"skipped": "datasets not installed" if ds is None else "lazyseq.formats.arrow not available"}
    mine, theirs = arrow(ds), ds.with_format("numpy")
    order = np.random.default_rng(1).integers(0, n, keys).tolist()
    us = per_read({"lazyseq arrow(ds)": mine.__getitem__, "datasets numpy ds[i]": theirs.__getitem__}, order, rounds)
    for i in order:
        a, b = plain(mine[i]), plain(theirs[i])
        if a != b:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise AssertionError(f"bench formats: arrow(ds)[{i}] and ds.with_format('numpy')[{i}] differ in {fields}")
    return {"us_per_read": us, "keys": keys}


# -- printing and targets ---------------------------------------------------------------------------
def show_a(a: dict, hf_build: float | None, rounds: int) -> None:
    orders = list(a["us_per_read"])
    print(f"\n(a) single-row reads, us per read (x: this reader's time / lazyseq's); best of {rounds}; keys: "
          + ", ".join(f"{o} {a['keys'][o]}" for o in orders))
    print(f"{'':40s}" + "".join(f"{o:>26s}" for o in orders))
    for name in ["lazyseq", *HAND, ALL, HF]:
        cells = []
        for o in orders:
            v, mine = a["us_per_read"][o].get(name), a["us_per_read"][o]["lazyseq"]
            cells.append(f"{'not installed':>26s}" if v is None else f"{v:16.1f} us {v / mine:6.2f}x")
        print(f"{name:40s}" + "".join(cells))
    print(f"lazyseq: parquet(dir)[i], cache={CACHE} decoded row groups; pyarrow by hand: the last {CACHE} "
          "read_row_group(rg, use_threads=False)\n  tables kept (LRU), then the row by slice or by column; "
          "datasets: load_dataset('parquet', ...)[i], python format;\n  "
          f"'{HELD}': random rows of the first {CACHE} row groups (both readers hold them after their first reads); "
          f"'{ALL}':\n  parquet(dir, cache=<row groups>), every row group decoded once (its first round) and held")
    if hf_build is not None:
        print(f"  (datasets' one-off conversion of the files to its Arrow cache, load_dataset: {hf_build:.1f} s, apart)")


def show_b(b: dict, rounds: int) -> None:
    rates, first = dict(b["items_per_s"]), dict(b["first_batch_s"])
    ray = b["ray"]
    mine = rates[LAZY[1]]
    print(f"\n(b) one shuffled epoch in batches of {BATCH}, items/s timed from the first batch; best of {rounds} "
          f"(Ray: 1)\n{'':40s}{'items/s':>10s}{'first s':>9s}{'lazyseq cache=8 x':>19s}")
    for name in [ITER, *LAZY, IN_READER, "datasets shuffle().iter, python", "datasets shuffle().iter, numpy", RAY]:
        if name == RAY and ray is not None:
            if "failed" in ray:
                print(f"{name:40s}  failed: {ray['failed']}")
                continue
            rates[name], first[name] = ray["items_per_s"], ray["first_batch_s"]
        v = rates.get(name)
        if v is None:
            why = "not run (--quick)" if name == RAY and ray is None and "quick" in b else "not installed"
            print(f"{name:40s}{why:>28s}")
        else:
            print(f"{name:40s}{v:10.0f}{first[name]:9.2f}{mine / v:19.2f}")
    print(f"pyarrow: ParquetFile(f).iter_batches({BATCH}) file after file, each batch's image and text to_pylist(), "
          f"label to_numpy()\nlazyseq: DataLoader(block_shuffle(pq, pq.cuts, seed=0), batch_size={BATCH}, "
          f"num_workers={NWORKERS}, to_tensor=False), default_collate\n  (images and texts as lists, labels an array), "
          f"block_shuffle's window {WINDOW} row groups; datasets: ds.shuffle(seed).iter({BATCH});\n"
          f"  Ray Data: read_parquet(dir).iter_batches({BATCH}, local_shuffle_buffer_size={WINDOW * 1000}), numpy batches")


def show_c(c: dict, files: str) -> None:
    loop = c["plain loop"]["rows_per_s"]
    print(f"\n(c) {files}:\n  {c['reads']} rows, one random row of each row group, row groups in a random order, over "
          f"lazyseq.files.serve\n  answering after {LATENCY * 1e3:.0f} ms (a child process); a fresh "
          f"parquet(urls, block_cache=0) per row, its footers read before the timing\n  (and the HTTP client "
          "started by an untimed read)")
    print(f"{'':40s}{'rows/s':>10s}{'requests/read':>15s}{'x loop':>8s}")
    for name in ("plain loop", f"prefetch, {THREADS} threads"):
        r = c[name]
        print(f"{name:40s}{r['rows_per_s']:10.1f}{r['requests_per_read']:15.2f}{r['rows_per_s'] / loop:8.1f}")
    plain_ranges, threads_ranges = c["ranges only, plain loop"], c[f"ranges only, {THREADS} threads"]
    print(f"the bytes a row-group read fetches ({plain_ranges['mb_per_read']:.2f} MB), fetched alone (no decode): "
          f"plain loop {plain_ranges['rows_per_s']:.1f}/s, {THREADS} threads {threads_ranges['rows_per_s']:.1f}/s: "
          f"{threads_ranges['rows_per_s'] / plain_ranges['rows_per_s']:.1f}x, the ceiling of a row-group read's ratio here")


def show_d(d: dict, rounds: int) -> None:
    if "skipped" in d:
        print(f"\n(d) arrow(ds)[i] against ds.with_format('numpy')[i]: not available ({d['skipped']})")
        return
    us = d["us_per_read"]
    print(f"\n(d) {d['keys']} random rows of the datasets table of (a), us per read; best of {rounds}; the values "
          "compared")
    for name, v in us.items():
        print(f"{name:40s}{v:10.1f} us{v / us['lazyseq arrow(ds)']:8.2f}x")


def targets(values: dict[str, float | None], why: dict[str, str], wanted: dict = TARGETS, issue: int = 32) -> dict:
    out = {}
    print(f"\ntargets (issue #{issue})")
    for key, (what, op, threshold) in wanted.items():
        v = values.get(key)
        met = None if v is None else {">=": v >= threshold, "<=": v <= threshold, ">": v > threshold,
                                      "<": v < threshold}[op]
        out[key] = {"value": v, "target": f"{op} {threshold}", "met": met}
        shown = f"  n/a ({why.get(key, 'not measured')})" if v is None else f"{v:8.2f}  {op} {threshold:<5g} " \
            + ("met" if met else "MISSED")
        print(f"  {what:66s}{shown}")
    return out


def target_values(res: dict) -> tuple[dict, dict]:
    a, b, c, d = res["random"]["us_per_read"]["random"], res["epoch"], res["remote"], res["arrow"]
    mine, rates, ray = b["items_per_s"][LAZY[1]], b["items_per_s"], b["ray"] or {}
    hf = [rates[k] for k in rates if k.startswith("datasets")]
    held = res["random"]["us_per_read"][HELD]
    values = {"random_vs_pyarrow": a["lazyseq"] / min(a[h] for h in HAND),
              "random_vs_datasets": a[HF] / a["lazyseq"] if HF in a else None,
              "held_vs_pyarrow": held["lazyseq"] / min(held[h] for h in HAND),
              "held_vs_datasets": held[HF] / held["lazyseq"] if HF in held else None,
              "all_held_vs_datasets": a[HF] / a[ALL] if HF in a else None,
              "epoch_vs_iter_batches": mine / rates[ITER], "epoch_vs_datasets": mine / max(hf) if hf else None,
              "epoch_vs_ray": mine / ray["items_per_s"] if "items_per_s" in ray else None,
              "remote_prefetch_vs_loop": c[f"prefetch, {THREADS} threads"]["rows_per_s"] / c["plain loop"]["rows_per_s"],
              "remote_paged_prefetch_vs_loop": (res["remote_paged"][f"prefetch, {THREADS} threads"]["rows_per_s"]
                                                / res["remote_paged"]["plain loop"]["rows_per_s"]),
              "arrow_vs_datasets": (d["us_per_read"]["datasets numpy ds[i]"] / d["us_per_read"]["lazyseq arrow(ds)"]
                                    if "us_per_read" in d else None)}
    no_hf = "datasets not installed"
    why = {"random_vs_datasets": no_hf, "held_vs_datasets": no_hf, "all_held_vs_datasets": no_hf,
           "epoch_vs_datasets": no_hf, "arrow_vs_datasets": d.get("skipped", ""),
           "epoch_vs_ray": ray.get("failed", "not run with --quick" if res["quick"] else "ray not installed")}
    return values, why


# -- the run ----------------------------------------------------------------------------------------
def run_parquet(root: str, res: dict, quick: bool) -> None:
    """Write the Parquet files under ``root``, run (a) to (d), print their tables; results into ``res``."""
    rows, files, group, rounds = res["rows"], res["files"], res["group_rows"], 1 if quick else 3
    sizes = {"random": 100, HELD: 400, f"window {WINDOW}": 100, f"window {CACHE}": 400} if quick else \
        {"random": 500, HELD: 8_000, f"window {WINDOW}": 500, f"window {CACHE}": 8_000}
    hf, ray = res["datasets_installed"], not quick and importlib.util.find_spec("ray") is not None
    for name, have in (("datasets", hf), ("ray", ray or quick)):
        if not have:
            print(f"({name} is not installed: its rows are skipped; pip install 'lazyseq[bench]' to compare with it)")
    res["skipped"] = [k for k, v in (("datasets", hf), ("ray", ray or quick)) if not v]
    data = os.path.join(root, "data")
    os.mkdir(data)
    paths = write_files(data, rows, files, group)
    res["bytes"] = sum(os.path.getsize(p) for p in paths)
    print(f"{rows} rows (image bytes 2.5-3.5 KB, label, text) in {files} Parquet files, row groups of {group} "
          f"rows: {res['bytes'] / 1e6:.0f} MB")
    ds, res["datasets_build_seconds"] = load_hf(paths, root) if hf else (None, None)
    res["random"] = part_a(data, paths, ds, rows, sizes, rounds)
    show_a(res["random"], res["datasets_build_seconds"], rounds)
    res["epoch"] = part_b(data, paths, ds, rows, 1 if quick else 2, ray)
    show_b({**res["epoch"], **({"quick": True} if quick else {})}, 1 if quick else 2)
    res["remote"] = part_c(data, paths, rows)
    show_c(res["remote"], "files as above (no page index: a read fetches its row group's columns)")
    paged = os.path.join(root, "paged")
    os.mkdir(paged)
    # pages of PAGE bytes: pyarrow cuts a page only between batches of write_batch_size rows (1,024 by
    # default: one page per row group here), and a dictionary-encoded image column keeps every image
    # in its dictionary page (random bytes: 3 MB), so the images are written plain, 16 rows a batch
    paged_paths = write_files(paged, rows, files, group, write_page_index=True, data_page_size=PAGE,
                              use_dictionary=["label", "text"], write_batch_size=16)
    res["remote_paged"] = part_c(paged, paged_paths, rows)
    show_c(res["remote_paged"], f"the same rows written with a page index and pages of {PAGE // 1024} KiB, images plain (a "
           "read fetches one page per column)")
    res["arrow"] = part_d(ds, rows, 100 if quick else 2_000, rounds)
    show_d(res["arrow"], rounds)
    del ds  # its memory maps, before the folder goes


def run(quick: bool = False, only: list[str] | None = None) -> dict:
    """Write the files, run the Parquet parts (a) to (d) and the shard parts (e) to (h) (``only``:
    ``['parquet']`` or ``['shards']``), print their tables and the targets; returns the results."""
    parts = only or list(PARTS)
    if set(parts) - set(PARTS):
        raise ValueError(f"bench formats: the parts are {', '.join(PARTS)}, got {', '.join(parts)}")
    rows, files, group = (2_000, 2, 100) if quick else (100_000, 8, 1_000)
    res: dict[str, Any] = {"scenario": "formats", "quick": quick, "parts": parts, "rows": rows, "files": files,
                           "group_rows": group, "cache": CACHE, "window": WINDOW, "machine": machine(),
                           "datasets_installed": importlib.util.find_spec("datasets") is not None, "skipped": []}
    m = res["machine"]
    print(f"{m['cores']} cores, {m['cpu']}; load average {' / '.join(f'{x:.2f}' for x in m['load_before'] or [])} "
          "before the run")
    root = tempfile.mkdtemp(prefix="lazyseq-bench-formats-")
    try:
        if "parquet" in parts:
            run_parquet(root, res, quick)
        if "shards" in parts:
            os.mkdir(os.path.join(root, "shards"))
            res["shards"] = shards.run(os.path.join(root, "shards"), quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    m["load_after"] = _load()
    print(f"\nmachine: {m['cores']} cores, {m['cpu']}; load average (1 / 5 / 15 min) "
          f"{' / '.join(f'{x:.2f}' for x in m['load_before'] or [])} before, "
          f"{' / '.join(f'{x:.2f}' for x in m['load_after'] or [])} after (other work on the machine shows there)")
    res["targets"] = {}
    if "parquet" in parts:
        res["targets"].update(targets(*target_values(res)))
    if "shards" in parts:
        res["targets"].update(targets(res["shards"].pop("values"), res["shards"].pop("why"), shards.TARGETS, 33))
    return res


if __name__ == "__main__":  # python -m lazyseq.bench formats is the entry point; this also works
    run()
