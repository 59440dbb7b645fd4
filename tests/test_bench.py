"""The benchmarks run end to end (``--quick``) and write the JSON they promise; peers that are not
installed (seqtools, torch) are skipped by the benchmark itself, which says so.

Each scenario with peers runs twice: ``no-peers`` with them made unimportable, and ``installed-peers``
with the peers this environment has. The test extra installs seqtools and torch (.ci/run); where one
is missing, an ``installed-peers`` variant that compares with it is skipped, saying which."""

import importlib.util
import json
import subprocess
import sys

import pytest

# Runs the bench as `python -m lazyseq.bench` does, with the peers made unimportable.
HIDE_PEERS = ("import sys; sys.modules['seqtools'] = sys.modules['torch'] = sys.modules['datasets'] = None; "
              "from lazyseq.bench.__main__ import main; sys.exit(main(sys.argv[1:]))")


def installed_peers(*names: str):
    """The ``installed-peers`` variant of a test: measures the peers ``names`` as installed here, or is
    skipped, saying which are missing."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    reason = f"needs {', '.join(missing)} installed (pip install -e '.[test]' brings them)"
    return pytest.param(False, id="installed-peers", marks=pytest.mark.skipif(bool(missing), reason=reason))


NO_PEERS = pytest.param(True, id="no-peers")


def run_bench(scenario: str, tmp_path, hide_peers: bool = False) -> dict:
    out = tmp_path / f"{scenario}.json"
    head = ["-c", HIDE_PEERS] if hide_peers else ["-m", "lazyseq.bench"]
    proc = subprocess.run([sys.executable, *head, scenario, "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    for name in res.get("skipped", []) if hide_peers else ():  # a missing peer is said so, not just left out
        assert f"({name} is not installed" in proc.stdout, (name, proc.stdout)
    return res


def test_bench_views(tmp_path):
    res = run_bench("views", tmp_path)
    assert res["scenario"] == "views"
    assert {"hand-written", "lazyseq"} <= set(res["us_per_read"]) == set(res["ratio_to_hand"])


@pytest.mark.parametrize("hide_peers", [installed_peers("seqtools", "torch"), NO_PEERS])
def test_bench_prefetch(tmp_path, hide_peers):
    res = run_bench("prefetch", tmp_path, hide_peers)
    assert res["scenario"] == "prefetch" and res["quick"] is True
    assert set(res["peers"]) | set(res["skipped"]) == {"seqtools", "torch"}
    if hide_peers:
        assert res["peers"] == []
    assert {"large", "tiny", "compute", "startup", "targets"} <= set(res)
    assert {"lazyseq copy", "lazyseq empty"} <= set(res["large"]["gb_per_s"]) == set(res["large"]["steady_gb_per_s"])
    assert "lazyseq" in res["tiny"]["us_per_item"]
    assert {"plain loop", "lazyseq"} <= set(res["compute"]["items_per_s"])
    assert {"lazyseq", "lazyseq shm"} <= set(res["startup"]["ms"])
    for peer in res["peers"]:  # an installed peer is measured in every scenario
        assert any(k.startswith(peer) for k in res["large"]["gb_per_s"])
        assert peer in res["tiny"]["us_per_item"] and peer in res["compute"]["items_per_s"]
        assert peer in res["startup"]["ms"]
    assert set(res["targets"]) == {"large_copy_vs_seqtools_shm", "large_copy_vs_torch", "large_empty_vs_seqtools_shm",
                                   "tiny_us_per_item", "compute_vs_plain_loop", "startup_ms"}
    for t in res["targets"].values():
        assert {"value", "target", "met"} <= set(t)


# installed-peers: datasets, the peer here, is not in the test extra (too large): without it the
# scenario's own rows are checked, as in no-peers, so the variant is not skipped
@pytest.mark.parametrize("hide_peers", [False, True], ids=["installed-peers", "no-peers"])
def test_bench_store(tmp_path, hide_peers):
    res = run_bench("store", tmp_path, hide_peers)
    assert res["scenario"] == "store" and res["quick"] is True and res["nworkers"] == 2
    readers = {"lazyseq.load", "np.memmap"} | ({"datasets"} if res["datasets_installed"] else set())
    if hide_peers:
        assert res["datasets_installed"] is False and res["datasets_build_seconds"] is None
    assert set(res["save_seconds"]) == {"single-process loop", "lazyseq.save"}
    assert res["save_ratio_to_loop"]["single-process loop"] == 1.0 and res["shards"] > 2
    assert set(res["random_us_per_item"]) == readers
    assert set(res["epoch_items_per_s"]) == readers | {"lazyseq, 2 processes"}  # (c) through prefetch too
    assert all(v > 0 for v in [*res["random_us_per_item"].values(), *res["epoch_items_per_s"].values()])
    assert set(res["targets"]) == {"save_vs_loop", "random_vs_memmap", "random_vs_datasets", "epoch_vs_memmap"}
    assert (res["targets"]["random_vs_datasets"]["value"] is None) == (not res["datasets_installed"])
    for t in res["targets"].values():
        assert {"value", "target", "met"} <= set(t)


def test_bench_prefetch_runs_only_the_parts_asked(tmp_path):
    out = tmp_path / "part.json"
    proc = subprocess.run([sys.executable, "-c", HIDE_PEERS, "prefetch", "--only", "tiny,startup", "--rounds", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert "large" not in res and "compute" not in res
    assert res["startup"]["tries"] == 2 and len(res["tiny"]["rounds"]["lazyseq"]["seconds"]) == 2
    assert set(res["targets"]) == {"tiny_us_per_item", "startup_ms"}
    bad = subprocess.run([sys.executable, "-m", "lazyseq.bench", "prefetch", "--only", "huge"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown part" in bad.stderr
    other = subprocess.run([sys.executable, "-m", "lazyseq.bench", "views", "--rounds", "2"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "prefetch" in other.stderr
    for rounds in (["--rounds", "0"], ["--rounds", "-1"], ["--rounds", "2", "--quick"]):
        bad = subprocess.run([sys.executable, "-m", "lazyseq.bench", "prefetch", *rounds],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and ">= 1" in bad.stderr, rounds


@pytest.mark.parametrize("hide_peers", [installed_peers("seqtools", "torch"), NO_PEERS])
def test_bench_report_writes_the_page_and_its_plots(tmp_path, hide_peers):
    docs = tmp_path / "docs"
    out = tmp_path / "report.json"
    head = ["-c", HIDE_PEERS] if hide_peers else ["-m", "lazyseq.bench"]
    proc = subprocess.run([sys.executable, *head, "report", "--quick", "--out", str(docs), "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    libs = {"lazyseq"} | set(res["peers"])
    if hide_peers:
        assert res["peers"] == []
        assert "(seqtools is not installed" in proc.stdout and "(torch is not installed" in proc.stdout
    t = res["throughput"]
    assert t["sizes"][0] == 4096 and t["sizes"][-1] == 16 * 2**20 and set(t["gb_per_s"]) == libs
    assert all(len(v) == len(t["sizes"]) and min(v) > 0 for v in t["gb_per_s"].values())
    assert set(res["overhead"]["prefetch_us_per_item"]) == libs
    assert {"hand-written", "lazyseq"} <= set(res["overhead"]["view_us_per_read"])
    rows = res["workers"].get("rows", {})
    if rows:  # Pillow installed
        assert {"plain loop", "lazyseq 1", "lazyseq 2"} <= set(rows) and rows["plain loop"]["speedup"] == 1
        assert ("torch 2" in rows) == ("torch" in res["peers"])
    page = (docs / "benchmarks.md").read_text()
    m = res["machine"]
    for needle in ("# Benchmarks", f"{m['cores']} cores", m["cpu"], "load average", f"python {m['versions']['python']}",
                   f"numpy {m['versions']['numpy']}", "## Throughput by item size", "| 16 MiB |", "## Per-item overhead",
                   "## Speed-up with workers", "(img/bench_throughput.png)"):
        assert needle in page, needle
    assert ("seqtools GB/s" in page) != hide_peers and ("| not installed | seqtools, torch" in page) == hide_peers
    assert res["images"] and all((docs / "img" / name).read_bytes()[:4] == b"\x89PNG" for name in res["images"])
    for name in res["images"]:
        assert f"(img/{name})" in page
    bad = subprocess.run([sys.executable, "-m", "lazyseq.bench", "views", "--out", str(docs)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "report" in bad.stderr


@pytest.mark.parametrize("hide_peers", [installed_peers("torch"), NO_PEERS])
def test_bench_spdl(tmp_path, hide_peers):
    import os
    import tempfile

    def image_dirs():
        return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("lazyseq-spdl-")}

    before = image_dirs()
    res = run_bench("spdl", tmp_path, hide_peers)
    assert image_dirs() == before  # the generated JPEGs are deleted
    assert res["scenario"] == "spdl" and res["quick"] is True
    assert ("torch" in res["skipped"]) == hide_peers
    assert {"lazyseq async", "lazyseq async unordered", "lazyseq 64 threads"} <= set(res["async"]["seconds"])
    assert res["async"]["seconds"]["lazyseq async"] < 1.0  # 200 x 10 ms, 64 at once: ~0.05 s
    if importlib.util.find_spec("PIL") is None:  # the decode part needs Pillow (matplotlib, in the test extra, brings it)
        assert res["decode_skipped"] == "Pillow not installed" and "images_per_s" not in res
        pytest.skip("the decode part needs Pillow: only the async part ran")
    assert res["images"] == 128
    lazy = {f"lazyseq {k}{u}" for k in ("threads", "processes") for u in ("", " unordered")}
    assert lazy <= set(res["images_per_s"]) == set(res["ratio_to_lazyseq_threads"])
    assert res["ratio_to_lazyseq_threads"]["lazyseq threads"] == 1.0
    assert all(v > 0 for v in res["images_per_s"].values())
    assert any(k.startswith("torch") for k in res["images_per_s"]) == (not hide_peers)
    assert any(k.startswith("spdl") for k in res["images_per_s"]) == ("spdl" in res["peers"])


def test_bench_remote(tmp_path):
    """Issue #25's scenario: a store served with 50 ms per request (lazyseq.files.serve in a child process),
    read by lazyseq's rows and fsspec's whole-file reads; nothing is left behind (temporary files, the
    server's process, threads)."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    import os
    import tempfile

    def bench_dirs():
        return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("lazyseq-bench-remote-")}

    before = bench_dirs()
    res = run_bench("remote", tmp_path)
    assert bench_dirs() == before
    assert res["scenario"] == "remote" and res["quick"] is True and res["latency"] == 0.05
    assert res["threads_left"] == [] and res["server_exit_code"] == 0
    rows = res["rows"]
    assert [k[:3] for k in rows] == ["(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)"]
    assert all(r["items_per_s"] > 0 and r["mb_per_s"] > 0 and r["first_item_s"] > 0 for r in rows.values())
    loop, threads = rows["(a) plain loop"], rows["(b) prefetch, 32 threads"]
    assert 1 <= loop["lazyseq_requests_per_item"] <= 2  # a ranged GET per field, neighbours joined
    assert loop["server_requests_per_item"] >= loop["lazyseq_requests_per_item"]  # + the HEADs of shard opens
    assert threads["items_per_s"] > 3 * loop["items_per_s"]  # threads overlap the latency, even in a smoke run
    assert threads["prefetch"]["chunk"] == 1 and threads["prefetch"]["max_buffered"] == 64
    assert rows["(e) local disk, plain loop"]["server_requests_per_item"] == 0
    assert rows["(f) fsspec, whole shard per item"]["fetched_bytes_per_item"] > 100 * res["item_bytes"]
    t = res["targets"]["prefetch_vs_loop"]
    assert t["target"] == ">= 20.0" and t["met"] == (t["value"] >= 20)


@pytest.mark.parametrize("hide_peers", [False, True], ids=["installed-peers", "no-peers"])
def test_bench_formats(tmp_path, hide_peers):
    """Issues #32 and #33's scenario: Parquet files read by lazyseq, pyarrow by hand and datasets (Ray:
    not in --quick), then tar, MDS and litdata shards read by lazyseq and by webdataset, Mosaic and
    litdata; every part's rows there, values checked by the bench itself, nothing left behind."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    import os
    import tempfile

    def bench_dirs():
        return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("lazyseq-bench-formats-")}

    before = bench_dirs()
    res = run_bench("formats", tmp_path, hide_peers)
    assert bench_dirs() == before
    assert res["scenario"] == "formats" and res["quick"] is True and (res["rows"], res["files"]) == (2000, 2)
    hf = res["datasets_installed"]
    assert hf == (not hide_peers and importlib.util.find_spec("datasets") is not None)
    readers = {"lazyseq", "pyarrow by hand, slice().to_pylist()", "pyarrow by hand, column[j].as_py()",
               "lazyseq, cache = every row group"}
    readers |= {"datasets ds[i]"} if hf else set()
    a = res["random"]["us_per_read"]
    assert set(a) == {"random", "held row groups", "block_shuffle, window 8", "block_shuffle, window 4"}
    assert all(set(row) == readers and min(row.values()) > 0 for row in a.values())
    epoch = res["epoch"]["items_per_s"]
    hf_rows = {"datasets shuffle().iter, python", "datasets shuffle().iter, numpy"} if hf else set()
    assert set(epoch) == {"pyarrow iter_batches, sequential", "lazyseq DataLoader, cache=4 (default)",
                          "lazyseq DataLoader, cache=8", "lazyseq DataLoader, cache=8, num_workers=0"} | hf_rows
    assert min(epoch.values()) > 0 and res["epoch"]["ray"] is None  # no Ray in --quick
    for c in (res["remote"], res["remote_paged"]):
        assert c["reads"] == 20 and c["server_exit_code"] == 0
        for row in ("plain loop", "prefetch, 32 threads"):
            assert c[row]["rows_per_s"] > 0 and c[row]["requests_per_read"] >= 1  # each read went to the server
    d = res["arrow"]
    assert ("us_per_read" in d) == ("skipped" not in d)
    if not hf:
        assert d["skipped"] == "datasets not installed"
    s = res["shards"]  # issue #33's parts: tar shards (and MDS and litdata where their writers are installed)
    assert (s["samples"], s["shards"]) == (640, 4)
    peers = {"webdataset + torch DataLoader", "webdataset .batched(64) + torch DataLoader"} if not hide_peers else set()
    mine = {"lazyseq webdataset"} | ({"lazyseq mds"} if s["installed"]["streaming"] else set())
    assert mine | peers <= set(s["epoch"]) and all(r["items"] == 640 for k, r in s["epoch"].items() if k in mine)
    if hide_peers:
        assert not s["installed"]["torch"] and not set(s["epoch"]) - {"lazyseq webdataset", "lazyseq mds", "lazyseq litdata"}
    assert set(s["random"]["us_per_read"]) >= mine and min(s["random"]["us_per_read"].values()) > 0
    assert s["index"]["samples"] * 2 == s["index"]["members"] and s["index"]["build_s"] > s["index"]["cached_s"] > 0
    d = s["remote"]
    assert d["reads"] == 20 and d["server_exit_code"] == 0
    assert all(d[row]["requests_per_read"] >= 1 for row in ("plain loop", "prefetch, 32 threads"))  # each went to the server
    t = res["targets"]
    assert set(t) == {"random_vs_pyarrow", "random_vs_datasets", "held_vs_pyarrow", "held_vs_datasets",
                      "all_held_vs_datasets", "epoch_vs_iter_batches", "epoch_vs_datasets", "epoch_vs_ray",
                      "remote_prefetch_vs_loop", "remote_paged_prefetch_vs_loop", "arrow_vs_datasets",
                      "epoch_vs_webdataset", "epoch_vs_mosaic", "epoch_vs_litdata", "random_read_us", "index_seconds",
                      "shards_prefetch_vs_loop"}
    assert (t["epoch_vs_webdataset"]["value"] is None) == hide_peers
    for key in ("random_vs_datasets", "held_vs_datasets", "all_held_vs_datasets"):
        assert (t[key]["value"] is None) == (not hf)
    assert t["epoch_vs_ray"]["value"] is None
    for x in t.values():
        assert {"value", "target", "met"} <= set(x) and (x["met"] is None) == (x["value"] is None)
