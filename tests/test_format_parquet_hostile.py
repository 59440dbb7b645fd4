"""A stranger's Parquet files: whatever their bytes say, lazyseq.parquet raises StoreError naming
the file (and the row group, at a read), or reads what is there; never a raw pyarrow exception, a
crash, a hang, a read outside the file or an allocation sized by a footer."""

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import lazyseq  # noqa: E402
from lazyseq import StoreError  # noqa: E402
from tests.hostile import raised_within  # noqa: E402
from tests.parquet_footer import patch, read  # noqa: E402

TABLE = pa.table({"a": np.arange(100, dtype=np.int64), "s": [f"row {i}" for i in range(100)]})


def _bytes(**kw):
    buf = io.BytesIO()
    pq.write_table(TABLE, buf, row_group_size=40, **kw)
    return buf.getvalue()


def _file(tmp_path, data, name="x.parquet"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("data", [b"", b"{\"not\": \"parquet\"}", b"PAR1" + b"\0" * 100, _bytes()[:700], _bytes()[:-3]],
                         ids=["empty", "json", "zeros", "truncated", "cut-footer"])
def test_not_parquet_is_named_at_construction(tmp_path, data):
    path = _file(tmp_path, data)
    with pytest.raises(StoreError, match=r"x\.parquet \(a Parquet file\) is (not a Parquet file|corrupted)") as e:
        lazyseq.parquet(path)
    assert e.value.__cause__ is None  # no raw pyarrow exception behind it either


def test_a_footer_total_that_disagrees_with_its_row_groups(tmp_path):
    data = _bytes()
    assert read(data, [3]) == 100
    path = _file(tmp_path, patch(data, [3], 120))
    with pytest.raises(StoreError, match=r"x\.parquet.*footer says 120 rows.*3 row groups hold 100"):
        lazyseq.parquet(path)
    negative = _file(tmp_path, patch(patch(data, [4, 1, 3], -5), [3], 55), "neg.parquet")
    with pytest.raises(StoreError, match="neg.parquet"):
        lazyseq.parquet(negative)


def test_a_row_group_whose_rows_disagree_with_its_pages(tmp_path):
    data = patch(patch(_bytes(), [4, 0, 3], 39), [3], 99)  # row group 0 says 39 rows, its pages hold 40
    v = lazyseq.parquet(_file(tmp_path, data))
    assert len(v) == 99
    assert v[50] == {"a": 51, "s": "row 51"}  # row group 1 is sound: it reads (rows shift by one, as the footer says)
    with pytest.raises(lazyseq.EvaluationError) as e:
        v[0]
    cause = e.value.__cause__
    assert isinstance(cause, StoreError)
    assert "x.parquet" in str(cause) and "row group 0" in str(cause) and "40 values" in str(cause)


def test_a_footer_claiming_huge_row_groups_allocates_nothing(tmp_path):
    big = 10**15
    data = patch(patch(_bytes(), [4, 0, 3], big), [3], big + 60)
    v = lazyseq.parquet(_file(tmp_path, data))
    assert len(v) == big + 60  # what the footer says, until a read shows otherwise
    err = raised_within(20, lambda: v[big - 1])
    assert isinstance(err.__cause__, StoreError) and "row group 0" in str(err.__cause__)


@pytest.mark.parametrize("field, value", [(9, 10**12), (9, -4), (9, 1), (7, 10**12), (7, -1)],
                         ids=["offset-past-end", "offset-negative", "offset-in-magic", "size-past-end", "size-negative"])
def test_a_column_chunk_outside_the_file_is_never_read(tmp_path, field, value):
    data = _bytes()
    path = _file(tmp_path, patch(data, [4, 1, 1, 0, 3, field], value))
    v = lazyseq.parquet(path)
    assert v[0]["a"] == 0  # row group 0 is sound
    err = raised_within(20, lambda: v[45])
    assert isinstance(err, lazyseq.EvaluationError), err
    assert isinstance(err.__cause__, StoreError)
    assert "x.parquet" in str(err.__cause__) and "row group 1" in str(err.__cause__)


def test_links_and_special_files_are_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = _file(outside, _bytes(), "secret.parquet")
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(secret, data / "part-0.parquet")
    with pytest.raises(StoreError, match="symbolic link"):
        lazyseq.parquet(str(data / "part-0.parquet"))
    with pytest.raises(StoreError, match="symbolic link"):
        lazyseq.parquet(str(data))  # listing a folder does not follow it either
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "a.parquet")
    err = raised_within(10, lambda: lazyseq.parquet(str(fifo)))
    assert isinstance(err, StoreError) and "not a regular file" in str(err) and "FIFO" in str(err)


def test_extension_types_are_read_as_their_storage_never_loaded(tmp_path):
    """A file written with an extension type registered elsewhere reads as plain storage values,
    here where nobody registered it, and where a same-named type is registered."""
    path = tmp_path / "ext.parquet"
    code = textwrap.dedent(f"""
        import pyarrow as pa, pyarrow.parquet as pq
        class Ext(pa.ExtensionType):
            def __init__(self):
                super().__init__(pa.int64(), "stranger.ext")
            def __arrow_ext_serialize__(self):
                return b"__import__('os').system('touch {tmp_path}/pwned')"
            @classmethod
            def __arrow_ext_deserialize__(cls, storage, serialized):
                return cls()
        pa.register_extension_type(Ext())
        t = pa.table({{"e": pa.ExtensionArray.from_storage(Ext(), pa.array([1, 2, 3]))}})
        pq.write_table(t, {str(path)!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    v = lazyseq.parquet(str(path))
    assert [v[i]["e"] for i in range(3)] == [1, 2, 3]
    assert all(type(v[i]["e"]) is np.int64 for i in range(3))
    assert not (tmp_path / "pwned").exists()


FUZZ = textwrap.dedent("""
    import io, os, sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
    import lazyseq
    import lazyseq.formats.parquet as P
    from lazyseq import StoreError, EvaluationError
    d, cases = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(int(sys.argv[3]))
    t = pa.table({"a": np.arange(60, dtype=np.int32), "s": [f"v{i}" * (i % 4) for i in range(60)],
                  "l": [[float(i)] * (i % 3) for i in range(60)], "n": [None if i % 5 else i for i in range(60)]})
    sources = []
    for kw in ({"write_page_index": True, "data_page_size": 64}, {"compression": "zstd"},
               {"use_dictionary": False, "write_page_index": True, "data_page_size": 64}, {"compression": "none"}):
        buf = io.BytesIO(); pq.write_table(t, buf, row_group_size=25, **kw); sources.append(buf.getvalue())
    for case in range(cases):
        P.PAGE_READS = 0 if case % 8 < 4 else 1 << 60  # single reads from pages (offset indexes read), or row groups
        data = bytearray(sources[case % len(sources)])
        n = len(data)
        foot = n - 8 - int.from_bytes(data[-8:-4], "little")
        for _ in range(int(rng.integers(1, 6))):  # a few bytes changed: in the footer half the time, else anywhere
            at = int(rng.integers(max(foot, 0), n - 8)) if rng.random() < 0.5 else int(rng.integers(0, n))
            data[at] = int(rng.integers(0, 256))
        if rng.random() < 0.1:
            data = data[: int(rng.integers(0, n))]
        path = os.path.join(d, f"f{case}.parquet")
        with open(path, "wb") as f:
            f.write(data)
        try:
            v = lazyseq.parquet(path)
            for i in range(min(len(v), 80)):
                try:
                    v[i]
                except EvaluationError as e:
                    if not isinstance(e.__cause__, StoreError):
                        raise
            v[list(range(min(len(v), 80)))] if len(v) else None
        except (StoreError, EvaluationError) as e:
            if isinstance(e, EvaluationError) and not isinstance(e.__cause__, StoreError):
                print("case", case, "raised", type(e.__cause__).__name__, e.__cause__); sys.exit(1)
            if "f%d.parquet" % case not in str(e if isinstance(e, StoreError) else e.__cause__):
                print("case", case, "does not name the file:", e); sys.exit(1)
        except Exception as e:
            print("case", case, "raised", type(e).__name__, e); sys.exit(1)
        os.remove(path)
    print("ok", cases)
""")


def test_fuzz_mutated_footers_and_pages(tmp_path):
    """Mutated files (bytes changed in the footer or anywhere, truncations), each built and read
    whole in a child process: a crash or a hang fails the test, as does any error but StoreError."""
    cases = 150 if os.environ.get("CI") else 400
    r = subprocess.run([sys.executable, "-c", FUZZ, str(tmp_path), str(cases), "32"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    assert f"ok {cases}" in r.stdout
