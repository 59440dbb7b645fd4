"""The readers' packages are extras: ``import lazyseq`` imports none of them, and a function whose
package is missing raises ImportError naming the extra that installs it, when it is called."""

import subprocess
import sys
import textwrap

import pytest

CASES = [
    ("pyarrow", "lazyseq.parquet('x.parquet')", "lazyseq[parquet]"),
    ("pyarrow", "lazyseq.arrow('x.arrow')", "lazyseq[parquet]"),
    ("lance", "lazyseq.lance('x.lance')", "lazyseq[lance]"),
]


@pytest.mark.parametrize("blocked, call, extra", CASES, ids=["parquet", "arrow", "lance"])
def test_a_missing_package_names_its_extra_when_called(blocked, call, extra):
    code = textwrap.dedent(f"""
        import sys
        sys.modules[{blocked!r}] = None  # as if not installed: import raises ImportError
        import lazyseq
        assert not any(sys.modules.get(m) for m in ("pyarrow", "datasets", "lance")), "imported at import lazyseq"
        try:
            {call}
        except ImportError as e:
            print("ImportError:", e)
        else:
            print("no error")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ImportError:" in r.stdout and extra in r.stdout, r.stdout


def test_webdataset_reads_local_shards_with_none_of_the_readers_packages(tmp_path):
    """lazyseq.webdataset needs no extra: local shards read with pyarrow, fsspec and webdataset missing."""
    code = textwrap.dedent(f"""
        import sys, io, tarfile
        for m in ("pyarrow", "fsspec", "webdataset", "datasets", "lance"):
            sys.modules[m] = None
        import lazyseq
        with tarfile.open({str(tmp_path / "a.tar")!r}, "w") as t:
            for name in ("k.jpg", "k.cls"):
                info = tarfile.TarInfo(name); info.size = 1; t.addfile(info, io.BytesIO(b"1"))
        print(lazyseq.webdataset({str(tmp_path)!r}, cache_dir={str(tmp_path / "c")!r})[0])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "{'__key__': 'k', 'jpg': b'1', 'cls': b'1'}"


def test_mds_needs_zstandard_only_for_a_zstd_shard_and_says_which_extra(tmp_path):
    """lazyseq.mds reads raw shards with none of the readers' packages; a zstd shard without zstandard
    is an ImportError naming lazyseq[mds], raised at its first read, not at import lazyseq."""
    code = textwrap.dedent(f"""
        import sys, json, os, struct
        for m in ("pyarrow", "fsspec", "zstandard", "PIL", "datasets", "lance"):
            sys.modules[m] = None
        import lazyseq
        root = {str(tmp_path)!r}
        row = struct.pack("<I", 2) + b"hi"
        shard = struct.pack("<3I", 1, 12, 12 + len(row)) + row  # a count, 2 offsets, the sample
        def info(comp, zipped):
            return {{"column_encodings": ["str"], "column_names": ["t"], "column_sizes": [None], "format": "mds",
                    "compression": comp, "hashes": [], "raw_data": {{"basename": "s.mds", "bytes": len(shard)}},
                    "samples": 1, "size_limit": 1 << 20, "version": 2, "zip_data": zipped}}
        open(os.path.join(root, "s.mds"), "wb").write(shard)
        open(os.path.join(root, "s.mds.zstd"), "wb").write(b"\\0" * 9)
        json.dump({{"version": 2, "shards": [info(None, None)]}}, open(os.path.join(root, "index.json"), "w"))
        print(lazyseq.mds(root)[0])
        json.dump({{"version": 2, "shards": [info("zstd", {{"basename": "s.mds.zstd", "bytes": 9}})]}},
                  open(os.path.join(root, "index.json"), "w"))
        v = lazyseq.mds(root)
        try:
            v[0]
        except Exception as e:
            print(type(e.__cause__ or e).__name__, e.__cause__ or e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = r.stdout.strip().splitlines()
    assert first == "{'t': 'hi'}"
    assert second.startswith("ImportError") and "lazyseq[mds]" in second, second
