"""lazyseq.litdata on a stranger's dataset, written here by hand (no litdata needed): an index.json
whose chunk sizes, item counts, formats, spec or names lie, chunks missing, truncated or with
offset tables that lie, an unknown serializer, a pickle leaf, huge counts, an index too large or
not JSON: each a StoreError naming the file (and the item or field), within a bound of time,
never a read outside the file, never an unpickle. Then a bounded fuzz of mutated index.json
fields and chunk headers: every outcome an error of those kinds or a correct read."""

import json
import os
import struct

import numpy as np
import pytest
from hostile import raised_within as raised_at_all

import lazyseq
from lazyseq import StoreError

STRUCTURE = (StoreError, ValueError, FileNotFoundError)
LEAF = {"type": None, "context": None, "children_spec": []}
SPEC = json.dumps([1, {"type": "builtins.dict", "context": json.dumps(["x", "s", "a"]), "children_spec": [LEAF] * 3}])


def raised_within(seconds, fn):
    e = raised_at_all(seconds, fn)
    return e.__cause__ if isinstance(e, lazyseq.EvaluationError) else e


def chunk_of(items: list[bytes]) -> bytes:
    head = 4 * (len(items) + 2)
    ends = [head + sum(map(len, items[:k])) for k in range(len(items) + 1)]
    return struct.pack(f"<{len(ends) + 1}I", len(items), *ends) + b"".join(items)


def items_of(n: int, first: int = 0) -> list[bytes]:
    """Items {x: int, s: str, a: int32 array}: a u32 size per leaf, then the leaves."""
    out = []
    for i in range(first, first + n):
        s, a = f"item {i}".encode() * (i % 3), np.arange(i % 4, dtype=np.int32).tobytes()
        out.append(struct.pack("<III", 8, len(s), len(a)) + struct.pack("<q", i) + s + a)
    return out


def dataset(root, counts=(5, 4), zstd=False) -> dict:
    """A dataset of chunks of ``counts`` items (``zstd``: each a zstd file); its index."""
    os.makedirs(root, exist_ok=True)
    chunks, first = [], 0
    for k, n in enumerate(counts):
        data, name = chunk_of(items_of(n, first)), f"chunk-0-{k}.bin"
        if zstd:
            import zstandard

            (root / name).write_bytes(zstandard.ZstdCompressor().compress(data))
        else:
            (root / name).write_bytes(data)
        chunks.append({"chunk_bytes": len(data), "chunk_size": n, "dim": None, "filename": name})
        first += n
    index = {"chunks": chunks, "config": {"chunk_bytes": None, "chunk_size": 5, "compression": "zstd" if zstd else None,
                                          "data_format": ["int", "str", "no_header_numpy:2"], "data_spec": SPEC,
                                          "encryption": None, "item_loader": "PyTreeLoader"}}
    (root / "index.json").write_text(json.dumps(index))
    return index


def framed_of(items: list[bytes], k: int = 2) -> bytes:
    """A framed zstd chunk (litdata's compression_level='batch'): a prefix, the items' offsets in the
    bytes decompressed, a frame table, then a zstd frame per ``k`` items."""
    import zstandard

    n, frames = len(items), -(-len(items) // k)
    offsets = [sum(map(len, items[:j])) for j in range(n + 1)]
    at = 24 + 4 * (n + 1) + 24 * frames
    table, payload = b"", b""
    for f in range(frames):
        raw = b"".join(items[f * k:f * k + k])
        z = zstandard.ZstdCompressor().compress(raw)
        table += struct.pack("<IIQII", f * k, len(items[f * k:f * k + k]), at + len(payload), len(z), len(raw))
        payload += z
    return struct.pack("<8sHHIII", b"LDFZ01\0\0", 1, 0, n, k, frames) + struct.pack(f"<{n + 1}I", *offsets) + table + payload


def framed_dataset(root, counts=(5, 4)) -> None:
    os.makedirs(root, exist_ok=True)
    chunks, first = [], 0
    for k, n in enumerate(counts):
        data, name = framed_of(items_of(n, first)), f"chunk-0-{k}.bin"
        (root / name).write_bytes(data)
        chunks.append({"chunk_bytes": len(data), "chunk_size": n, "dim": None, "filename": name})
        first += n
    index = {"chunks": chunks, "config": {"compression": "zstd", "compression_level": "batch", "compression_batch_size": 2,
                                          "data_format": ["int", "str", "no_header_numpy:2"], "data_spec": SPEC,
                                          "encryption": None, "item_loader": "PyTreeLoader"}}
    (root / "index.json").write_text(json.dumps(index))


def expect(i: int) -> dict:
    return {"x": i, "s": f"item {i}" * (i % 3), "a": np.arange(i % 4, dtype=np.int32)}


def correct(v, rows=None) -> bool:
    rows = range(len(v)) if rows is None else rows
    return len(v) == len(rows) and all(s["x"] == e["x"] and s["s"] == e["s"] and np.array_equal(s["a"], e["a"])
                                       for s, e in zip(v, map(expect, rows)))


def change(root, fn) -> None:
    index = json.loads((root / "index.json").read_text())
    fn(index)
    (root / "index.json").write_text(json.dumps(index))


def read_all(root, **kw):
    v = lazyseq.litdata(root, **kw)
    return [v[i] for i in range(len(v))] and v


@pytest.mark.parametrize("zstd", [False, True])
def test_a_good_dataset_reads(tmp_path, zstd):
    pytest.importorskip("zstandard") if zstd else None
    dataset(tmp_path / "ds", zstd=zstd)
    v = lazyseq.litdata(tmp_path / "ds")
    assert correct(v) and v.cuts == [5]


LIES = {
    "chunk_size": (lambda ix: ix["chunks"][0].update(chunk_size=6), r"chunk-0-0.bin.*holds 5 items.*says 6"),
    "chunk_bytes": (lambda ix: ix["chunks"][1].update(chunk_bytes=10**6), r"chunk-0-1.bin.*holds \d+ bytes.*says 1000000"),
    "huge count": (lambda ix: ix["chunks"][0].update(chunk_size=2**40), r"index.json.*chunk_size"),
    "huge count in bytes": (lambda ix: ix["chunks"][0].update(chunk_size=2**32 - 2, chunk_bytes=2**34),
                            r"chunk-0-0.bin.*holds"),
    "a path": (lambda ix: ix["chunks"][0].update(filename="../x.bin"), r"index.json.*file name"),
    "two chunks one file": (lambda ix: ix["chunks"][1].update(filename="chunk-0-0.bin"), r"index.json.*two chunks"),
    "unknown serializer": (lambda ix: ix["config"]["data_format"].__setitem__(1, "video"), r"index.json.*'video'"),
    "bad dtype": (lambda ix: ix["config"]["data_format"].__setitem__(2, "no_header_numpy:14"), r"index.json.*dtype"),
    "formats and spec disagree": (lambda ix: ix["config"]["data_format"].append("int"), r"index.json.*3 leaves.*4"),
    "spec not JSON": (lambda ix: ix["config"].update(data_spec="torch.load me"), r"index.json.*data_spec"),
    "spec of a class": (lambda ix: ix["config"].update(data_spec=SPEC.replace("builtins.dict", "os.system")),
                        r"index.json.*os.system"),
    "encrypted": (lambda ix: ix["config"].update(encryption={"level": "chunk"}), r"index.json.*encrypt"),
    "tokens": (lambda ix: ix["config"].update(item_loader="TokensLoader"), r"index.json.*TokensLoader"),
    "parquet": (lambda ix: ix["config"].update(item_loader="ParquetLoader"), r"index.json.*ParquetLoader"),
    "per item": (lambda ix: ix["config"].update(compression="zstd", compression_level="sample"), r"index.json.*sample"),
    "framed, not": (lambda ix: ix["config"].update(compression="zstd", compression_level="batch"),
                    r"chunk-0-0.bin.*not a version 1 framed"),
    "brotli": (lambda ix: ix["config"].update(compression="brotli"), r"index.json.*brotli"),
    "a missing chunk": (lambda ix: ix["chunks"][1].update(filename="chunk-9.bin"), r"chunk-9.bin.*missing"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_an_index_that_lies_is_a_store_error_naming_it(tmp_path, lie):
    fn, pattern = LIES[lie]
    dataset(tmp_path / "ds")
    change(tmp_path / "ds", fn)
    e = raised_within(10, lambda: read_all(tmp_path / "ds"))
    assert isinstance(e, StoreError) and __import__("re").search(pattern, str(e)), repr(e)


def test_not_json_or_too_large_an_index(tmp_path):
    dataset(tmp_path / "ds")
    (tmp_path / "ds" / "index.json").write_bytes(b"{not json")
    with pytest.raises(StoreError, match=r"index.json.*not JSON"):
        lazyseq.litdata(tmp_path / "ds")
    with open(tmp_path / "ds" / "index.json", "wb") as f:
        f.truncate(64 * 2**20 + 1)
    with pytest.raises(StoreError, match=r"index.json.*more than"):
        lazyseq.litdata(tmp_path / "ds")


def test_a_pickle_leaf_is_refused_naming_its_field(tmp_path):
    dataset(tmp_path / "ds")
    change(tmp_path / "ds", lambda ix: ix["config"]["data_format"].__setitem__(1, "pickle"))
    with pytest.raises(StoreError, match=r"index.json.*field 's'.*allow_pickle"):
        lazyseq.litdata(tmp_path / "ds")


@pytest.mark.parametrize("how", ["truncated", "count", "offset past the end", "offset back", "first offset"])
def test_chunks_and_offset_tables_that_lie(tmp_path, how):
    index = dataset(tmp_path / "ds")
    path = tmp_path / "ds" / "chunk-0-0.bin"
    b = bytearray(path.read_bytes())
    if how == "truncated":
        b = b[:-3]
        change(tmp_path / "ds", lambda ix: ix["chunks"][0].update(chunk_bytes=len(b)))
    elif how == "count":
        b[0:4] = struct.pack("<I", 4)
    elif how == "offset past the end":
        b[4 * 6:4 * 7] = struct.pack("<I", len(b) + 100)
    elif how == "offset back":
        b[4 * 3:4 * 4] = struct.pack("<I", 0)
    else:
        b[4:8] = struct.pack("<I", 0)
    path.write_bytes(bytes(b))
    assert index["chunks"][0]["filename"] == "chunk-0-0.bin"
    e = raised_within(10, lambda: read_all(tmp_path / "ds"))
    assert isinstance(e, StoreError) and "chunk-0-0.bin" in str(e), repr(e)


def test_a_zstd_chunk_that_decompresses_to_more_or_less(tmp_path):
    pytest.importorskip("zstandard")
    dataset(tmp_path / "ds", zstd=True)
    for size in (40, 10**5):
        change(tmp_path / "ds", lambda ix, size=size: ix["chunks"][0].update(chunk_bytes=size))
        e = raised_within(10, lambda: read_all(tmp_path / "ds"))
        assert isinstance(e, StoreError) and "chunk-0-0.bin" in str(e) and "decompresses" in str(e), repr(e)


def test_a_lying_leaf_size_names_the_item_and_field(tmp_path):
    dataset(tmp_path / "ds")
    path = tmp_path / "ds" / "chunk-0-0.bin"
    b = bytearray(path.read_bytes())
    b[28:32] = struct.pack("<I", 7)  # item 0's int leaf: 7 bytes (the str's then fills the rest)
    b[32:36] = struct.pack("<I", 1)
    path.write_bytes(bytes(b))
    e = raised_within(10, lambda: lazyseq.litdata(tmp_path / "ds")[0])
    assert isinstance(e, StoreError) and "item 0" in str(e) and "'x'" in str(e), repr(e)


def _set(d, path, value):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


def test_fuzz_mutated_index_and_chunk_headers(tmp_path):
    """Random mutations of index.json's fields and of the chunks' first bytes: a StoreError, a
    ValueError or a correct read, each within a bound, never another exception."""
    rng = np.random.default_rng(33)
    fields = [("chunks", 0, "chunk_size"), ("chunks", 1, "chunk_bytes"), ("chunks", 0, "filename"),
              ("config", "data_format"), ("config", "data_spec"), ("config", "compression"), ("config", "item_loader"),
              ("config", "encryption"), ("chunks",), ("config",), ("config", "compression_level")]
    values = [0, 1, -1, 5, 2**31, 2**64, None, "", "..", "x/y", [], [None], ["str"], {}, 3.5, True, "zstd",
              ["int", "str", "str"], "[1, {}]", SPEC.replace("[\\\"x\\\"", "[1")]
    for trial in range(300):
        root = tmp_path / f"t{trial}"
        dataset(root)
        formats_kept = True
        if trial % 3:
            path = list(fields[int(rng.integers(len(fields)))])
            value = values[int(rng.integers(len(values)))]
            formats_kept = path[-1] not in ("data_format", "data_spec", "config", "chunks")
            change(root, lambda ix, path=path, value=value: _set(ix, path, value))
        else:
            chunk = root / "chunk-0-0.bin"
            b = bytearray(chunk.read_bytes())
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, 28))] = int(rng.integers(256))
            chunk.write_bytes(bytes(b))
        out = []
        e = raised_within(10, lambda root=root, out=out: out.append(read_all(root)))
        assert e is None or isinstance(e, STRUCTURE), f"trial {trial}: {e!r}"
        if e is None and formats_kept:  # (a chunk the index says is empty is never opened)
            said = [c["chunk_size"] for c in json.loads((root / "index.json").read_text())["chunks"]]
            rows = [i for i in range(9) if said[0 if i < 5 else 1] != 0]
            assert correct(out[0], rows), f"trial {trial}: a mutation read wrong values"


def test_framed_chunks_read_and_their_lies_are_store_errors(tmp_path):
    pytest.importorskip("zstandard")
    framed_dataset(tmp_path / "ds")
    v = lazyseq.litdata(tmp_path / "ds")
    assert correct(v) and correct(lazyseq.litdata(tmp_path / "ds")[[8, 0, 3, 2]], [8, 0, 3, 2])
    good = (tmp_path / "ds" / "chunk-0-0.bin").read_bytes()
    n, frames = 5, 3
    table = 24 + 4 * (n + 1)
    lies = {"count": (16, struct.pack("<I", 4)), "frames": (20, struct.pack("<I", 9)),
            "an offset back": (24 + 8, struct.pack("<I", 0)), "a frame past the end": (table + 24 + 8, struct.pack("<Q", 10**6)),
            "a frame's size": (table + 24 + 20, struct.pack("<I", 3)), "a frame's first item": (table + 24, struct.pack("<I", 1)),
            "a frame's bytes": (table + 24 * frames + 5, b"\xff\xff")}
    for what, (at, patch) in lies.items():
        b = bytearray(good)
        b[at:at + len(patch)] = patch
        (tmp_path / "ds" / "chunk-0-0.bin").write_bytes(bytes(b))
        e = raised_within(10, lambda: read_all(tmp_path / "ds"))
        assert isinstance(e, StoreError) and "chunk-0-0.bin" in str(e), f"{what}: {e!r}"


def test_fuzz_mutated_framed_headers(tmp_path):
    """Random bytes of a framed chunk's prefix, offsets and frame table changed: a StoreError or a
    correct read, each within a bound."""
    pytest.importorskip("zstandard")
    rng = np.random.default_rng(5)
    framed_dataset(tmp_path / "ds")
    path = tmp_path / "ds" / "chunk-0-0.bin"
    good = path.read_bytes()
    head = 24 + 4 * 6 + 24 * 3
    for trial in range(200):
        b = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, head))] = int(rng.integers(256))
        path.write_bytes(bytes(b))
        out = []
        e = raised_within(10, lambda out=out: out.append(read_all(tmp_path / "ds")))
        assert e is None or isinstance(e, STRUCTURE), f"trial {trial}: {e!r}"
        if e is None:
            assert correct(out[0]), f"trial {trial}: a mutation read wrong values"


def one_leaf_dataset(root, fmt: str, blobs: list[bytes]) -> None:
    """A dataset of one chunk whose items are a single leaf of format ``fmt``."""
    os.makedirs(root, exist_ok=True)
    data = chunk_of([struct.pack("<I", len(b)) + b for b in blobs])
    (root / "chunk-0-0.bin").write_bytes(data)
    index = {"chunks": [{"chunk_bytes": len(data), "chunk_size": len(blobs), "filename": "chunk-0-0.bin"}],
             "config": {"compression": None, "data_format": [fmt], "data_spec": None, "encryption": None,
                        "item_loader": "PyTreeLoader"}}
    (root / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("fmt", ["jpeg", "image:png"])
def test_encoded_images_decode_as_litdata_decodes_them(tmp_path, fmt):
    """jpeg and image leaves: an RGB (3, H, W) uint8 tensor, as litdata's torchvision decode gives."""
    import io

    PIL = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(3):
        out = io.BytesIO()
        PIL.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).save(out, format="JPEG" if fmt == "jpeg" else "PNG")
        blobs.append(out.getvalue())
    one_leaf_dataset(tmp_path / "ds", fmt, blobs)
    v = lazyseq.litdata(tmp_path / "ds")
    for x, b in zip(v, blobs):
        want = np.asarray(PIL.open(io.BytesIO(b)).convert("RGB")).transpose(2, 0, 1)
        got = x.numpy() if hasattr(x, "numpy") else x
        assert got.shape == (3, 6, 5) and got.dtype == np.uint8 and np.array_equal(got, want)
    one_leaf_dataset(tmp_path / "bad", fmt, [b"not an image"])
    e = raised_within(10, lambda: lazyseq.litdata(tmp_path / "bad")[0])
    assert isinstance(e, StoreError) and "item 0" in str(e) and "'item'" in str(e), repr(e)


def test_a_missing_extra_is_an_import_error_naming_it(tmp_path, monkeypatch):
    pytest.importorskip("zstandard")
    framed_dataset(tmp_path / "framed")
    dataset(tmp_path / "whole", zstd=True)
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)
    for name in ("framed", "whole"):
        v = lazyseq.litdata(tmp_path / name)  # (made without it: only a read needs it)
        e = raised_within(10, lambda v=v: v[0])
        assert isinstance(e, ImportError) and "lazyseq[litdata]" in str(e), repr(e)


def arrow_footer_dataset(root, n=4) -> bytes:
    """A chunk as litdata writes rows of strings: offsets all at the table's end, then an Arrow IPC
    file of the rows, its size (u32) and the magic ``LDARW01\\0``."""
    pa = pytest.importorskip("pyarrow")
    os.makedirs(root, exist_ok=True)
    head = 4 * (n + 2)
    sink = pa.BufferOutputStream()
    table = pa.Table.from_pylist([{"text": f"row {i}"} for i in range(n)])
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    ipc = sink.getvalue().to_pybytes()
    data = struct.pack(f"<{n + 2}I", n, *[head] * (n + 1)) + ipc + struct.pack("<I", len(ipc)) + b"LDARW01\0"
    (root / "chunk-0-0.bin").write_bytes(data)
    index = {"chunks": [{"chunk_bytes": len(data), "chunk_size": n, "filename": "chunk-0-0.bin"}],
             "config": {"compression": None, "data_format": ["str"], "data_spec": json.dumps(
                 [1, {"type": "builtins.dict", "context": json.dumps(["text"]), "children_spec": [LEAF]}]),
                 "encryption": None, "item_loader": "PyTreeLoader"}}
    (root / "index.json").write_text(json.dumps(index))
    return data


def test_an_arrow_footer_that_lies_is_a_store_error_naming_the_chunk(tmp_path):
    good = arrow_footer_dataset(tmp_path / "ds")
    assert [x["text"] for x in lazyseq.litdata(tmp_path / "ds")] == [f"row {i}" for i in range(4)]
    path = tmp_path / "ds" / "chunk-0-0.bin"
    for what, at, patch in [("size past the start", len(good) - 12, struct.pack("<I", 10**6)),
                            ("size zero", len(good) - 12, struct.pack("<I", 0)),
                            ("not Arrow", len(good) - 12 - 6, b"garbage"[:6]),
                            ("fewer rows", None, None)]:
        if at is None:
            arrow_footer_dataset(tmp_path / "ds", n=4)
            change(tmp_path / "ds", lambda ix: ix["chunks"][0].update(chunk_size=3))
            b = bytearray(path.read_bytes())
            b[0:24] = struct.pack("<5I", 3, *[20] * 4) + b[20:24]  # (the count 3, its 4 offsets: 16 + 4 bytes)
            change(tmp_path / "ds", lambda ix: None)
        else:
            b = bytearray(good)
            b[at:at + len(patch)] = patch
        path.write_bytes(bytes(b))
        e = raised_within(10, lambda: read_all(tmp_path / "ds"))
        assert isinstance(e, StoreError) and "chunk-0-0.bin" in str(e), f"{what}: {e!r}"
        arrow_footer_dataset(tmp_path / "ds")
