"""Object storage (issue #25): a saved store read over HTTP from a server that answers each request
after 50 ms, by lazyseq and by fsspec's whole-file reads.

The store: N items ``{"image": 128x128 uint8 (16 KiB), "label": int}`` saved by ``lazyseq.save`` into
shards of 128 items (2.1 MB) in a temporary directory, served by ``lazyseq.files.serve(dir,
latency=0.05)`` in a child process (``python -m lazyseq.files.httpserver``): a remote store's server
takes none of the reader's CPU, where in this process its ``http.server`` would take ~1 ms of the
GIL per request from the threads being measured. Every row reads the same K items in a random
order (the first K of ``shuffle(range(N), seed=0)``):

- (a) a plain loop ``[store[i] for i in order]`` over ``lazyseq.load(url, block_cache=0)``: an
  item costs its two fields' ranged GETs, sent at once: one round trip (the baseline);
- (b), (c) ``prefetch(shuffle(store, 0)[:K], nworkers=32 | 64, method='thread')``;
- (d) ``batch(shuffle(store, 0), 64, collate_fn=default_collate)`` read in a loop: one bulk read
  per batch (neighbouring ranges joined, the rest sent concurrently);
- (e) the same store on local disk, plain loop;
- (f) fsspec, as a user without lazyseq reads a shard format: ``fsspec.open(shard_url).read()`` the
  whole shard of each item, then decode the item with numpy (from the manifest's layout);
- (g) fsspec, every shard downloaded first (``fs.get``, concurrent; as litdata or MosaicML
  streaming do before an item is read), then the items decoded from the local files.

Each lazyseq row starts from a fresh ``load`` (the manifest read is not timed; a shard's first read
costs one HEAD). Per row: items/s, MB/s of item payload, time to the first item, requests per item
(the server's count, HEADs included, and lazyseq's ``store.remote.requests``), bytes fetched per item.
Every row's items are checked against the saved ones after it is timed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import lazyseq

LATENCY = 0.05
SHAPE = (128, 128)
ITEM_BYTES = int(np.prod(SHAPE)) + 8  # the image and the label (int64)
PER_SHARD = 128
BATCH = 64
SEED = 0
TARGET = ("(b) 32 prefetch threads / (a) plain loop, items/s", ">=", 20.0)


def make(i: int) -> dict:
    """Item ``i``: a 16 KiB uint8 image of random values (its own seed) and its label."""
    return {"image": np.random.default_rng(i).integers(0, 256, SHAPE, dtype=np.uint8), "label": i}


class Server:
    """``lazyseq.files.serve(root, latency)`` in a child process; :meth:`requests` asks it how many
    requests it has answered; :meth:`close` ends it (SIGTERM: it exits with status 0)."""

    def __init__(self, root: str, latency: float):
        here = str(Path(lazyseq.__file__).resolve().parents[1])  # the child imports this lazyseq
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "lazyseq.files.httpserver", root, "--latency", str(latency)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.url = (self.proc.stdout.readline() if self.proc.stdout else "").strip()
        if not self.url.startswith("http://"):
            self.close()
            raise RuntimeError("bench remote: the server process did not start (python -m lazyseq.files.httpserver)")

    def requests(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the readers: each yields the items (or batches) of ``order``, in order -----------------------
def loop(store: Any, order: list[int]) -> Iterator[Any]:
    for i in order:
        yield store[i]


def prefetched(store: Any, k: int, nworkers: int, stats: dict) -> Iterator[Any]:
    with lazyseq.prefetch(lazyseq.shuffle(store, seed=SEED)[:k], nworkers=nworkers, method="thread") as p:
        yield from p
        stats.update(p.stats())


def batches(store: Any, k: int) -> Iterator[Any]:
    b = lazyseq.batch(lazyseq.shuffle(store, seed=SEED), BATCH, collate_fn=lazyseq.default_collate)
    for n in range(k // BATCH):
        yield b[n]


def decode(buf: Any, manifest: dict, rec: dict, j: int) -> dict:
    """Item ``j`` of a shard's bytes, with numpy alone (the layout its manifest record gives)."""
    m = rec["stop"] - rec["start"]
    image, label = rec["fields"]
    images = np.frombuffer(buf, manifest["fields"][0]["dtype"], m * int(np.prod(SHAPE)), image["data"][0])
    labels = np.frombuffer(buf, "<i8", m, label["data"][0])
    return {"image": images.reshape(m, *SHAPE)[j], "label": int(labels[j])}


def whole_shards(url: str, manifest: dict, order: list[int]) -> Iterator[dict]:
    """(f): each item's whole shard read by ``fsspec.open(...).read()``, then decoded."""
    import fsspec

    for i in order:
        rec = manifest["shards"][i // manifest["per_shard"]]
        with fsspec.open(f"{url}/{rec['file']}", "rb") as f:
            blob = f.read()
        yield decode(blob, manifest, rec, i - rec["start"])


def downloaded(url: str, manifest: dict, order: list[int], local: str) -> Iterator[dict]:
    """(g): every shard downloaded first (``fs.get``, concurrent), then the items decoded from the files."""
    import fsspec

    fs = fsspec.filesystem("http")
    recs = manifest["shards"]
    fs.get([f"{url}/{r['file']}" for r in recs], [os.path.join(local, r["file"]) for r in recs])
    maps: dict[int, np.ndarray] = {}
    for i in order:
        k = i // manifest["per_shard"]
        if k not in maps:
            maps[k] = np.memmap(os.path.join(local, recs[k]["file"]), np.uint8, "r")
        yield decode(maps[k], manifest, recs[k], i - recs[k]["start"])


# -- timing and checking -------------------------------------------------------------------------
def timed(items: Iterable[Any]) -> tuple[list, float, float]:
    """What ``items`` yields, the seconds it took and the seconds to its first value."""
    out: list = []
    t = time.perf_counter()
    first = None
    for x in items:
        out.append(x)
        if first is None:
            first = time.perf_counter() - t
    return out, time.perf_counter() - t, first or 0.0


def check(name: str, got: list, order: list[int]) -> None:
    """The items read are the items saved (batches: their columns)."""
    if got and isinstance(got[0]["label"], np.ndarray):  # batches
        got = [{"image": b["image"][r], "label": int(b["label"][r])} for b in got for r in range(len(b["label"]))]
    if len(got) != len(order):
        raise AssertionError(f"bench remote: {name} read {len(got)} items, not {len(order)}")
    for x, i in zip(got, order):
        want = make(i)
        if int(x["label"]) != i or not np.array_equal(x["image"], want["image"]):
            raise AssertionError(f"bench remote: {name} gives another item {i} than the one saved")


def measure(server: Server, name: str, reader: Callable[[], Iterable[Any]], order: list[int],
            store: Any = None, fetched: int | None = None) -> dict:
    """One row: ``reader()``'s items timed, checked, and what they cost in requests and bytes."""
    before, mine = server.requests(), (store.remote.requests, store.remote.bytes_read) if store is not None else (0, 0)
    got, seconds, first = timed(reader())
    served = server.requests() - before
    check(name, got, order)
    k = len(order)
    row = {"items": k, "seconds": seconds, "items_per_s": k / seconds, "mb_per_s": k * ITEM_BYTES / seconds / 1e6,
           "first_item_s": first, "server_requests_per_item": served / k}
    if store is not None and store.remote is not None:
        row["lazyseq_requests_per_item"] = (store.remote.requests - mine[0]) / k
        fetched = store.remote.bytes_read - mine[1]
    row["fetched_bytes_per_item"] = None if fetched is None else fetched / k
    return row


# -- the run --------------------------------------------------------------------------------------
def machine() -> dict:
    from lazyseq.bench.report import cpu_model

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"cores": cores, "cpu": cpu_model(), "load_before": _load()}


def _load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def threads_left(before: set[threading.Thread], wait: float = 5.0) -> list[str]:
    """Threads started since ``before`` still running (waiting up to ``wait`` s for closing ones), less
    fsspec's IO thread and its loop's executor, which live as long as the process by design."""
    deadline = time.monotonic() + wait
    while True:
        asyn = sys.modules.get("fsspec.asyn")
        lifelong = set()
        if asyn is not None and asyn.iothread[0] is not None:
            lifelong = {asyn.iothread[0], *getattr(getattr(asyn.loop[0], "_default_executor", None), "_threads", ())}
        left = [t for t in threading.enumerate() if t not in before and t not in lifelong and t.is_alive()]
        if not left or time.monotonic() > deadline:
            return [t.name for t in left]
        time.sleep(0.05)


def rows(root: str, path: str, order: list[int], naive: int) -> tuple[dict, int | None]:
    """Every row, against one server process; the rows and the server's exit code (it is ended whatever happens)."""
    manifest = lazyseq.load(path).manifest
    k, out, stats = len(order), {}, {}
    server = Server(root, LATENCY)
    try:
        url = f"{server.url}/{os.path.basename(path)}"
        for key, read in [("(a) plain loop", lambda s: loop(s, order)),
                          ("(b) prefetch, 32 threads", lambda s: prefetched(s, k, 32, stats.setdefault("(b)", {}))),
                          ("(c) prefetch, 64 threads", lambda s: prefetched(s, k, 64, stats.setdefault("(c)", {}))),
                          (f"(d) batches of {BATCH}", lambda s: batches(s, k))]:
            store = lazyseq.load(url, block_cache=0)
            out[key] = measure(server, key, lambda s=store, r=read: r(s), order, store)
            if key[:3] in stats:
                out[key]["prefetch"] = {x: stats[key[:3]].get(x) for x in ("chunk", "max_buffered", "jobs", "waits",
                                                                            "wait_seconds")}
        local = lazyseq.load(path)
        out["(e) local disk, plain loop"] = measure(server, "(e)", lambda: loop(local, order), order)
        out["(f) fsspec, whole shard per item"] = measure(
            server, "(f)", lambda: whole_shards(url, manifest, order[:naive]), order[:naive],
            fetched=sum(manifest["shards"][i // PER_SHARD]["bytes"] for i in order[:naive]))
        files = tempfile.mkdtemp(prefix="lazyseq-bench-remote-get-")
        try:
            out["(g) fsspec, all shards downloaded first"] = measure(
                server, "(g)", lambda: downloaded(url, manifest, order, files), order,
                fetched=sum(r["bytes"] for r in manifest["shards"]))
        finally:
            shutil.rmtree(files, ignore_errors=True)
    finally:
        server.close()
    return out, server.proc.returncode


def show(res: dict) -> None:
    m, base = res["machine"], res["rows"]["(a) plain loop"]["items_per_s"]
    load = " / ".join(f"{x:.2f}" for x in m["load_before"]) if m["load_before"] else "unknown"
    after = " / ".join(f"{x:.2f}" for x in m["load_after"]) if m["load_after"] else "unknown"
    print(f"\n{res['items']} items of {ITEM_BYTES} bytes in {res['shards']} shards of {PER_SHARD} items "
          f"({res['store_bytes'] / 1e6:.1f} MB), served with {LATENCY * 1e3:.0f} ms per request by "
          f"lazyseq.files.serve in a child process;\n{res['read']} random items per row ((f): {res['naive']}), "
          "the same order; lazyseq rows: block_cache=0, a fresh load (manifest not timed)")
    print(f"{'':42s}{'items/s':>9s}{'MB/s':>8s}{'first ms':>10s}{'req/item':>9s}{'lazyseq':>8s}"
          f"{'kB/item':>9s}{'x (a)':>8s}")
    for name, r in res["rows"].items():
        mine = r.get("lazyseq_requests_per_item")
        fetched = r["fetched_bytes_per_item"]
        print(f"{name:42s}{r['items_per_s']:9.1f}{r['mb_per_s']:8.2f}{r['first_item_s'] * 1e3:10.1f}"
              f"{r['server_requests_per_item']:9.2f}{'-' if mine is None else f'{mine:.2f}':>8s}"
              f"{'-' if fetched is None else f'{fetched / 1e3:.1f}':>9s}{r['items_per_s'] / base:8.1f}")
    for key in ("(b) prefetch, 32 threads", "(c) prefetch, 64 threads"):
        p = res["rows"][key].get("prefetch", {})
        print(f"{key}: {p.get('jobs')} jobs of {p.get('chunk')} item(s), max_buffered {p.get('max_buffered')}, "
              f"the reader waited {p.get('waits')} times ({p.get('wait_seconds') or 0:.2f} s)")
    print("req/item: requests the server answered per item (HEADs of shards' first reads included); lazyseq: "
          "store.remote.requests\n  (ranged GETs); kB/item: bytes fetched per item; (g)'s first item waits for "
          "every shard's download")
    print(f"machine: {m['cores']} cores, {m['cpu']}; load average (1 / 5 / 15 min) {load} before, {after} after "
          "(other work on the machine shows there)")
    print(f"(g) downloads the whole store ({res['store_bytes'] / 1e6:.0f} MB) over the loopback, where bytes cost only "
          "CPU: its time grows with the\n  dataset (and the network's bandwidth), not with the items read")


def run(quick: bool = False) -> dict:
    """Save the store, read it every way, print the table and the target; returns the results."""
    n, k, naive = (512, 64, 8) if quick else (4096, 256, 32)
    res: dict[str, Any] = {"scenario": "remote", "quick": quick, "items": n, "read": k, "naive": naive,
                           "latency": LATENCY, "item_bytes": ITEM_BYTES, "machine": machine()}
    before = set(threading.enumerate())
    root = tempfile.mkdtemp(prefix="lazyseq-bench-remote-")
    try:
        path = os.path.join(root, "store")
        lazyseq.save(lazyseq.smap(make, range(n)), path, nworkers=2, method="thread",
                     shard_bytes=PER_SHARD * ITEM_BYTES, progress=False)
        store = lazyseq.load(path)
        assert store.per_shard == PER_SHARD, store.per_shard
        res["shards"], res["store_bytes"] = len(store.records), store.nbytes()
        order = [int(i) for i in lazyseq.shuffle(range(n), seed=SEED)[:k]]
        res["rows"], res["server_exit_code"] = rows(root, path, order, naive)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res["machine"]["load_after"] = _load()
    res["threads_left"] = threads_left(before)
    if res["threads_left"] or res["server_exit_code"] != 0:
        print(f"bench remote: threads left running {res['threads_left']}, server exit code {res['server_exit_code']}")
    show(res)
    what, op, bound = TARGET
    value = res["rows"]["(b) prefetch, 32 threads"]["items_per_s"] / res["rows"]["(a) plain loop"]["items_per_s"]
    met = value >= bound
    print(f"\ntarget{' (quick: few items, start-up weighs more)' if quick else ''}: {what} {op} {bound:g}x, "
          f"got {value:.1f}x  {'met' if met else 'MISSED'}")
    res["targets"] = {"prefetch_vs_loop": {"value": value, "target": f"{op} {bound}", "met": met}}
    return res


if __name__ == "__main__":  # python -m lazyseq.bench remote is the entry point; this also works
    run()
