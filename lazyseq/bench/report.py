"""The benchmarks page: ``python -m lazyseq.bench report [--quick] [--out DIR]`` runs the scenarios
below and writes ``DIR/benchmarks.md`` (a markdown page with tables) and ``DIR/img/bench_*.png``
(matplotlib plots); DIR is ``docs`` by default, so run it from the repository's root.

- throughput by item size, 4 KiB to 16 MiB float32 arrays, through ``prefetch`` with 2 process
  workers and shared memory, against seqtools' ``prefetch`` with ``shm_size`` and PyTorch's
  DataLoader (its workers send tensors through shared memory): GB/s, the best of a few rounds;
- per-item overhead: tiny items through the same loaders (``bench prefetch``'s ``tiny`` part) and
  a random read through a 5-view pipeline against hand-written code (``bench views``);
- speed-up with workers on a decode-bound pipeline (``bench dataloader``'s JPEG dataset: Pillow
  decode, random crop, flip, normalise) with 0, 1 and 2 worker processes, lazyseq and torch.

The page's header says when, on which machine (cores, CPU model, load average before and after)
and with which versions the figures were taken: a busy machine shows in the load average.
seqtools, torch and Pillow are optional (``pip install 'lazyseq[bench]'``): a missing one is skipped.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import lazyseq

from . import prefetch as pf
from . import views

KIB, MIB = 1024, 1024**2
SIZES = [4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB]
LIBS = ("lazyseq", "seqtools", "torch")
COLORS = {"lazyseq": "tab:blue", "seqtools": "tab:orange", "torch": "tab:red", "plain loop": "tab:gray"}


class Full:
    """Item ``i``: a float32 array of ``nbytes`` filled with ``i`` (module level: torch pickles it)."""

    def __init__(self, nbytes: int):
        self.n = nbytes // 4

    def __call__(self, i: int) -> np.ndarray:
        return np.full(self.n, i, np.float32)


def check_ends(i: int, x: Any) -> None:
    """The reader looks at both ends of each item (numpy or torch): the data arrived, and no more work."""
    flat = x.reshape(-1)
    if float(flat[0]) != i or float(flat[-1]) != i:
        raise AssertionError(f"item {i} arrived as {flat[0]}..{flat[-1]}")


def ignore(i: int, x: Any) -> None:
    pass


def size_name(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def items_for(nbytes: int, quick: bool) -> int:
    """Items per round: ~512 MiB (quick: 24 MiB), between 32 and 4000 (quick: 12 and 200)."""
    budget, lo, hi = (24 * MIB, 12, 200) if quick else (512 * MIB, 32, 4000)
    return max(lo, min(hi, budget // nbytes))


# -- the scenarios ---------------------------------------------------------------------------------
def throughput(quick: bool, peers: set[str]) -> dict:
    rounds = 1 if quick else 3
    gbps: dict[str, list[float]] = {name: [] for name in LIBS if name == "lazyseq" or name in peers}
    counts = []
    for nbytes in SIZES:
        n, f = items_for(nbytes, quick), Full(nbytes)
        shm = pf.MAX_BUFFERED * (nbytes + max(nbytes // 8, 64 * KIB))  # one slot per buffered item
        loaders: dict[str, tuple[pf.Opener, Callable]] = {"lazyseq": (pf.open_lazyseq(f, n, shm), check_ends)}
        if "seqtools" in peers:
            loaders["seqtools"] = (pf.open_seqtools(f, n, shm), check_ends)
        if "torch" in peers:
            loaders["torch"] = (pf.open_torch(f, n), check_ends)
        runs = pf.alternate(loaders, rounds)
        for name, r in runs.items():
            gbps[name].append(r.rate() * nbytes / 1e9)
        counts.append(n)
        print(f"  {size_name(nbytes):>7s} x {n:4d}: " + "  ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in gbps.items()))
    return {"sizes": SIZES, "items": counts, "rounds": rounds, "gb_per_s": gbps}


def overhead(quick: bool, peers: set[str]) -> dict:
    tiny = pf.tiny(quick, peers)
    read = views.run(quick)
    return {"prefetch_us_per_item": tiny["us_per_item"], "prefetch_items": tiny["items"],
            "view_us_per_read": read["us_per_read"]}


def open_workers(lib: str, ds: Any, k: int) -> pf.Opener:
    """A loader of ``ds``'s items with ``k`` worker processes (0: a plain loop in the reader)."""
    n = len(ds)
    if k == 0:
        return pf.open_plain(ds.__getitem__, n)
    if lib == "torch":
        def open_torch() -> tuple[Iterator, Callable[[], dict]]:
            from torch.utils.data import DataLoader

            it = iter(DataLoader(ds, batch_size=None, num_workers=k, multiprocessing_context="fork"))
            box = [it]

            def close() -> dict:
                shutdown = getattr(box.pop(), "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
                return {}

            return it, close

        return open_torch

    def open_lazyseq() -> tuple[Iterator, Callable[[], dict]]:
        p = lazyseq.prefetch(lazyseq.smap(ds.__getitem__, range(n)), nworkers=k, method="process",
                             max_buffered=pf.MAX_BUFFERED, shm_size=pf.MAX_BUFFERED * 600 * KIB, mp_context="fork")

        def close() -> dict:
            p.close()
            return {}

        return iter(p), close

    return open_lazyseq


def workers(quick: bool, peers: set[str]) -> dict:
    if not pf.have("PIL"):
        print("(Pillow is not installed: the decode-bound part is skipped; pip install 'lazyseq[bench]')")
        return {"skipped": "Pillow not installed"}
    from . import dataloader as dl

    n, rounds = (48, 1) if quick else (400, 3)
    folder = tempfile.mkdtemp(prefix="lazyseq-bench-report-")
    try:
        ds = dl.ImageDataset(dl.write_images(folder, n))
        loaders = {"plain loop": (open_workers("plain", ds, 0), ignore)}
        for lib in ("lazyseq", "torch"):
            if lib == "lazyseq" or lib in peers:
                for k in (1, 2):
                    loaders[f"{lib} {k}"] = (open_workers(lib, ds, k), ignore)
        runs = pf.alternate(loaders, rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rate = {name: r.rate() for name, r in runs.items()}
    base = rate["plain loop"]
    table = {name: {"workers": 0 if name == "plain loop" else int(name.rsplit(" ", 1)[1]), "items_per_s": v,
                    "speedup": v / base} for name, v in rate.items()}
    for name, row in table.items():
        print(f"  {name:12s}{row['items_per_s']:8.0f} images/s  x{row['speedup']:.2f}")
    return {"images": n, "rounds": rounds, "image": f"{dl.SIZE}x{dl.SIZE} RGB JPEG", "crop": dl.CROP, "rows": table}


# -- the machine, the versions ---------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit (and whether it has local changes), if lazyseq runs from one."""
    import subprocess

    root = Path(lazyseq.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" with local changes" if dirty.stdout.strip() else "")


def machine() -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": cores, "cpu": cpu_model(), "system": f"{platform.system()} {platform.release()}",
            "load_before": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "commit": git_commit(),
            "versions": {"python": platform.python_version(), "numpy": np.__version__,
                         **{d: version(d) for d in ("lazyseq", "seqtools", "torch", "pillow", "matplotlib")}}}


# -- plots -----------------------------------------------------------------------------------------
def plots(res: dict, img: Path) -> list[str]:
    """Write the PNG plots into ``img``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    names = []
    t = res["throughput"]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for lib, values in t["gb_per_s"].items():
        ax.plot(t["sizes"], values, "o-", label=lib, color=COLORS[lib])
    ax.set(xscale="log", yscale="log", xlabel="item size", ylabel="GB/s (best round)",
           title=f"prefetch, {pf.NWORKERS} process workers, shared memory")
    ax.set_xticks(t["sizes"], [size_name(s) for s in t["sizes"]])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    names.append(_save(fig, img / "bench_throughput.png"))
    o = res["overhead"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))
    us = o["prefetch_us_per_item"]
    a1.barh(list(us), list(us.values()), color=[COLORS.get(k, "tab:gray") for k in us])
    a1.set(xscale="log", xlim=(1, None), xlabel="µs per item", title=f"tiny items, prefetch ({pf.NWORKERS} workers)")
    v = o["view_us_per_read"]
    a2.barh(list(v), list(v.values()), color=[COLORS.get(k, "tab:gray") for k in v])
    a2.set(xlabel="µs per read", title="random read, 5 views")
    names.append(_save(fig, img / "bench_overhead.png"))
    w = res["workers"]
    if "rows" in w:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        base = w["rows"]["plain loop"]["items_per_s"]
        for lib in ("lazyseq", "torch"):
            rows = [r for name, r in w["rows"].items() if name.startswith(lib)]
            if rows:
                ax.plot([0] + [r["workers"] for r in rows], [1.0] + [r["speedup"] for r in rows], "o-",
                        label=lib, color=COLORS[lib])
        ax.plot([0, 1, 2], [1, 1, 2], ":", color="gray", label="ideal (a worker per core)")
        ax.set(xticks=[0, 1, 2], xlabel="worker processes (0: a plain loop)", ylabel=f"speed-up over {base:.0f} images/s",
               title=f"JPEG decode + augment, {res['machine']['cores']} cores")
        ax.grid(True, alpha=0.3)
        ax.legend()
        names.append(_save(fig, img / "bench_workers.png"))
    return names


def _save(fig: Any, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


# -- the page --------------------------------------------------------------------------------------
HAND_WRITTEN = "Not written by `report`"  # how a section of the page that report keeps as it is begins


def kept_sections(text: str) -> list[str]:
    """The ``## `` sections of an existing page that were not written by ``report`` (their first
    line says so: the figures of other scenarios, with their machine): a new page keeps them.

    >>> kept_sections("# B\\n## Throughput\\nfigures\\n## Tokens\\n\\nNot written by `report`: ...\\n")
    ['## Tokens\\n\\nNot written by `report`: ...\\n']
    """
    parts = text.split("\n## ")
    return ["## " + part for part in parts[1:] if part.split("\n", 1)[-1].lstrip().startswith(HAND_WRITTEN)]


def page(res: dict) -> str:
    m, v = res["machine"], res["machine"]["versions"]
    before, after = m["load_before"], m["load_after"]
    load = "unknown" if before is None else (f"{before[0]:.2f} / {before[1]:.2f} / {before[2]:.2f} before the run, "
                                             f"{after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f} after (1 / 5 / 15 min)")
    lines = [
        "# Benchmarks",
        "",
        f"Written by `python -m lazyseq.bench report{' --quick' if res['quick'] else ''}` "
        f"on {m['date']} in {res['seconds']:.0f} s; rerun it to refresh this page and its plots. Absolute figures "
        "depend on the machine: compare the libraries within one run.",
        "",
        "To reproduce: `pip install -e \".[bench,test]\"`, then `python -m lazyseq.bench report` from the "
        "repository's root (`--quick`: a smoke run of a few seconds; `--out DIR`: write elsewhere; `--json FILE`: "
        "the raw figures). `python -m lazyseq.bench prefetch`, `views` and `dataloader` run their scenarios in "
        "more detail (CPU time per item, lazyseq's `empty` path, start-up, targets).",
        "",
        "| | |", "|---|---|",
        f"| machine | {m['cores']} cores, {m['cpu']}, {m['system']} |",
        f"| load average | {load} |",
        "| versions | " + ", ".join(f"{k} {x}" for k, x in v.items() if x) + " |",
        f"| lazyseq checkout | {m.get('commit') or 'not a git checkout'} |",
        "| not installed | " + (", ".join(k for k, x in v.items() if not x) or "-") + " |",
        "",
    ]
    if before is not None and before[0] > 0.5 * m["cores"]:
        lines += [f"The machine was busy (load {before[0]:.1f} on {m['cores']} cores): wall-clock figures suffer, "
                  "the ratios between libraries less so.", ""]
    return "\n".join(lines + _throughput_md(res) + _overhead_md(res) + _workers_md(res)) + "\n"


def _throughput_md(res: dict) -> list[str]:
    t = res["throughput"]
    libs = list(t["gb_per_s"])
    lines = ["## Throughput by item size", "",
             f"float32 arrays of 4 KiB to 16 MiB made by `np.full` in {pf.NWORKERS} worker processes and read in "
             "order; the reader looks at both ends of every item. Each library's shared-memory path: "
             "`lazyseq.prefetch(..., method='process', shm_size=...)`, `seqtools.prefetch(..., method='process', "
             "shm_size=...)`, PyTorch's `DataLoader(num_workers=2, batch_size=None)` (its workers move tensors "
             f"into shared memory). GB/s, the best of {t['rounds']} round(s), the libraries alternating round by "
             "round.", "", "![throughput by item size](img/bench_throughput.png)", "",
             "| item size | items | " + " | ".join(f"{k} GB/s" for k in libs)
             + "".join(f" | lazyseq / {k}" for k in libs[1:]) + " |",
             "|---" * (2 + 2 * len(libs) - 1) + "|"]
    for j, size in enumerate(t["sizes"]):
        row = [t["gb_per_s"][k][j] for k in libs]
        lines.append(f"| {size_name(size)} | {t['items'][j]} | " + " | ".join(f"{x:.3g}" for x in row)
                     + "".join(f" | {row[0] / x:.1f}x" for x in row[1:]) + " |")
    return [*lines, ""]


def _overhead_md(res: dict) -> list[str]:
    o = res["overhead"]
    us, lazy = o["prefetch_us_per_item"], o["prefetch_us_per_item"]["lazyseq"]
    v, hand = o["view_us_per_read"], o["view_us_per_read"]["hand-written"]
    lines = ["## Per-item overhead", "",
             f"Small ints through the same loaders ({pf.NWORKERS} worker processes), read in order: what a loader "
             "costs per item when the item costs nothing. And a random read through "
             "`smap -> gather -> batch(4) -> smap -> slice` against the same calls written by hand in one function.",
             "", "![per-item overhead](img/bench_overhead.png)", "",
             "| prefetch, tiny items | items | µs per item | x lazyseq |", "|---|---|---|---|"]
    lines += [f"| {k} | {o['prefetch_items'][k]} | {x:.2f} | {x / lazy:.1f} |" for k, x in us.items()]
    lines += ["", "| 5 views, random read | µs per read | x hand-written |", "|---|---|---|"]
    lines += [f"| {k} | {x:.2f} | {x / hand:.2f} |" for k, x in v.items()]
    return [*lines, ""]


def _workers_md(res: dict) -> list[str]:
    w, cores = res["workers"], res["machine"]["cores"]
    lines = ["## Speed-up with workers on a decode-bound pipeline", ""]
    if "rows" not in w:
        return [*lines, f"Skipped: {w['skipped']}.", ""]
    lines += [f"{w['images']} {w['image']} files (~20 kB each): Pillow decode, random {w['crop']}x{w['crop']} crop, "
              "flip, normalise to float32 CHW (`bench dataloader`'s dataset); item by item with 0 (a plain loop "
              f"in the reader), 1 and 2 worker processes; images/s, the best of {w['rounds']} round(s). This machine "
              f"has {cores} cores: the reader and the workers share them, so 2 workers cannot reach 2x when the "
              "reader also has work (here it only receives the images), and other work on the machine takes "
              "its share. One worker only moves the work to another process, and each image then crosses over "
              "to the reader: expect a little under 1x.", "", "![speed-up with workers](img/bench_workers.png)", "",
              "| loader | workers | images/s | speed-up |", "|---|---|---|---|"]
    lines += [f"| {k} | {r['workers']} | {r['items_per_s']:.0f} | {r['speedup']:.2f}x |" for k, r in w["rows"].items()]
    return [*lines, ""]


# -- the entry point -------------------------------------------------------------------------------
def run(quick: bool = False, out: str | None = None) -> dict:
    """Run every part, then write ``out/benchmarks.md`` and ``out/img/bench_*.png`` (``out``:
    ``docs`` by default); returns the results."""
    import time

    folder = Path(out or "docs")
    try:
        import matplotlib  # noqa: F401 - checked before minutes of benchmarks, not after
    except ImportError:
        raise SystemExit("bench report: the plots need matplotlib: pip install matplotlib") from None
    start = time.perf_counter()
    res: dict[str, Any] = {"scenario": "report", "quick": quick, "machine": machine()}
    peers = {name for name in ("seqtools", "torch") if pf.have(name)}
    for name in sorted({"seqtools", "torch"} - peers):
        print(f"({name} is not installed: skipped; pip install 'lazyseq[bench]' to compare with it)")
        res["machine"]["versions"][name] = None  # not importable here: the page says not installed
    if "torch" in peers:
        import torch

        torch.set_num_threads(1)  # the reader works on one core, as numpy does
    res["peers"] = sorted(peers)
    for part in (throughput, overhead, workers):
        print(f"\n== {part.__name__}")
        res[part.__name__] = part(quick, peers)
        pf.no_children(part.__name__)
    res["machine"]["load_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    res["seconds"] = time.perf_counter() - start
    res["images"] = plots(res, folder / "img")
    target = folder / "benchmarks.md"
    kept = kept_sections(target.read_text() if target.exists() else "")
    target.write_text(page(res) + "".join(f"\n{k}" for k in kept))
    print(f"\nwrote {folder / 'benchmarks.md'} and {', '.join(str(folder / 'img' / n) for n in res['images'])}",
          file=sys.stderr)
    return res
