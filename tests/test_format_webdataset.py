"""lazyseq.webdataset (issue #33) against webdataset's own reader: shards written by
``webdataset.TarWriter`` and by Python's ``tarfile`` (GNU and PAX formats, long and non-ASCII names,
directories, meta names, members without an extension), every sample compared with what
``webdataset.WebDataset(urls, shardshuffle=False)`` yields. Then indexing semantics, folders and
compressed shards, the index cache (reuse, invalidation, a corrupted entry), ``lengths=``, pickling
and fingerprints, thread and process workers, the DataLoader, save/load, and URLs (the local HTTP
server, moto's S3). Every wait is bounded; every index cache goes under the test's own folder."""

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lazyseq
from lazyseq.formats import tar as tarmod
from lazyseq.formats import tarcache

wds = pytest.importorskip("webdataset")


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    """The default index cache (``$XDG_CACHE_HOME/lazyseq``) of every test in its own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def reference(*paths) -> list[dict]:
    """The samples of ``paths`` as webdataset's own reader yields them (without __url__, __local_path__)."""
    out = []
    for s in wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False):
        out.append({k: v for k, v in s.items() if k not in ("__url__", "__local_path__")})
    return out


def write_wds(path, n: int, first: int = 0, seed: int = 0) -> str:
    """A shard of ``n`` samples written by webdataset's TarWriter."""
    rng = np.random.default_rng(seed)
    with wds.TarWriter(str(path)) as w:
        for i in range(first, first + n):
            sample = {"__key__": f"dir/s{i:05d}", "jpg": rng.bytes(int(rng.integers(0, 3000))),
                      "cls": str(i % 10).encode(), "seg.png": rng.bytes(int(rng.integers(0, 40)))}
            if i % 3 == 0:
                sample["json"] = b'{"i": %d}' % i
            w.write(sample)
    return str(path)


def write_tar(path, members, fmt=tarfile.PAX_FORMAT) -> str:
    """A tar of ``members`` (``(name, bytes)``; bytes None: a directory) written by Python's tarfile."""
    with tarfile.open(path, "w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return str(path)


def shards(root, k: int = 3, n: int = 7) -> list[str]:
    os.makedirs(root, exist_ok=True)
    return [write_wds(os.path.join(root, f"part-{j:03d}.tar"), n + j, first=100 * j, seed=j) for j in range(k)]


# -- items against webdataset's own reader ------------------------------------------------------------------
def test_tarwriter_shards_read_as_webdataset_reads_them(tmp_path):
    paths = shards(tmp_path / "ds")
    v = lazyseq.webdataset(tmp_path / "ds")
    want = reference(*paths)
    assert len(v) == len(want) == 7 + 8 + 9
    assert list(v) == want
    assert v.cuts == [7, 15] and v.shard_samples == (7, 8, 9) and v.names == [os.path.basename(p) for p in paths]
    assert v[3]["__key__"] == "dir/s00003" and set(v[3]) == {"__key__", "jpg", "cls", "seg.png", "json"}


LONG = "d" * 60 + "/" + "e" * 70 + "/sample.with.dots"


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT],
                         ids=["gnu", "pax", "ustar"])
def test_tarfile_shards_in_every_format(tmp_path, fmt):
    members = [("a/x.jpg", b"1" * 700), ("a/x.CLS", b"2"), ("a/", None), ("b.txt", b""), ("__meta__", b"m"),
               ("noext", b"skipped"), ("__key__/c.txt", b"meta dir"), (f"{LONG}.jpg", b"long"),
               (f"{LONG}.json", b"{}"), ("c.tar.gz", b"gz"), ("d/.hidden", b"h")]
    if fmt != tarfile.USTAR_FORMAT:
        members += [("é/ünï.txt", b"utf8"), ("f" * 150 + ".bin", b"x" * 1025)]
    path = write_tar(tmp_path / "t.tar", members, fmt)
    v = lazyseq.webdataset(path)
    assert list(v) == reference(path)
    assert v[0] == {"__key__": "a/x", "jpg": b"1" * 700, "cls": b"2"}


def test_a_pax_size_and_path_override_the_header(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("ignored.txt")
        info.pax_headers = {"path": "k1.txt", "comment": "hi"}
        info.size = 5
        t.addfile(info, io.BytesIO(b"hello"))
        big = tarfile.TarInfo("k2.bin")
        big.size = 3
        big.pax_headers = {"mtime": "1.5"}
        t.addfile(big, io.BytesIO(b"abc"))
    (tmp_path / "p.tar").write_bytes(buf.getvalue())
    v = lazyseq.webdataset(tmp_path / "p.tar")
    assert list(v) == reference(tmp_path / "p.tar") == [{"__key__": "k1", "txt": b"hello"}, {"__key__": "k2", "bin": b"abc"}]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_indexing_follows_list_semantics(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("idx")
    paths = [write_wds(root / "a.tar", 5), write_wds(root / "b.tar", 4, first=5, seed=1)]
    v = lazyseq.webdataset(paths, cache_dir=root / "cache")
    want = reference(*paths)
    i = data.draw(st.integers(-len(want), len(want) - 1))
    assert v[i] == want[i] and v[np.int64(i)] == want[i]
    s = slice(data.draw(st.none() | st.integers(-12, 12)), data.draw(st.none() | st.integers(-12, 12)),
              data.draw(st.none() | st.integers(-4, 4).filter(bool)))
    assert list(v[s]) == want[s]
    idx = data.draw(st.lists(st.integers(-len(want), len(want) - 1), max_size=12))
    assert list(v[np.asarray(idx, dtype=np.int64)]) == [want[k] for k in idx]
    with pytest.raises(IndexError):
        v[len(want)]
    with pytest.raises(IndexError):
        v[-len(want) - 1]


def test_threads_reading_a_new_view_at_once_index_each_shard_once(tmp_path, monkeypatch):
    import concurrent.futures

    paths = shards(tmp_path / "ds", k=3)
    built = _count_builds(monkeypatch)
    v = lazyseq.webdataset(paths, lengths=[7, 8, 9])
    want = reference(*paths)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: v[i], [i % 24 for i in range(200)]))
    assert got == [want[i % 24] for i in range(200)] and sorted(built) == sorted(paths)


def test_bulk_reads_give_the_items_in_the_order_asked(tmp_path):
    paths = shards(tmp_path / "ds")
    v = lazyseq.webdataset(paths)
    want = reference(*paths)
    order = [20, 0, 3, 19, 8, 8, -1]
    assert v._get_many([k % len(want) for k in order]) == [want[k] for k in order]
    assert lazyseq.batch(v, 5)[2] == want[10:15]


# -- naming shards -----------------------------------------------------------------------------------------
def test_a_folder_is_its_tar_files_directly_in_it_sorted(tmp_path):
    write_wds(tmp_path / "b.tar", 2)
    write_wds(tmp_path / "a.tar", 3, first=2)
    write_wds(tmp_path / "_skip.tar", 1)
    write_wds(tmp_path / ".hidden.tar", 1)
    (tmp_path / "notes.txt").write_text("not a shard")
    (tmp_path / "sub").mkdir()
    write_wds(tmp_path / "sub" / "c.tar", 1)
    v = lazyseq.webdataset(tmp_path)
    assert v.names == ["a.tar", "b.tar"] and len(v) == 5
    assert list(v) == reference(tmp_path / "a.tar", tmp_path / "b.tar")
    assert lazyseq.webdataset([tmp_path / "sub", tmp_path / "b.tar"]).names == ["c.tar", "b.tar"]


@pytest.mark.parametrize("suffix, compress", [(".tar.gz", "gzip"), (".tgz", "gzip"), (".tar.bz2", "bz2"),
                                             (".tar.xz", "lzma")])
def test_compressed_shards_need_cache_dir_and_are_decompressed_there_once(tmp_path, monkeypatch, suffix, compress):
    import importlib

    paths = shards(tmp_path / "plain", k=2)
    (tmp_path / "z").mkdir()
    for p in paths:
        packed = importlib.import_module(compress).compress(open(p, "rb").read())
        (tmp_path / "z" / (os.path.basename(p)[:-4] + suffix)).write_bytes(packed)
    for bad in (tmp_path / "z", tmp_path / "z" / f"part-000{suffix}"):
        with pytest.raises(ValueError, match="compressed tar.*decompress it.*or give cache_dir="):
            lazyseq.webdataset(bad)
    cache = tmp_path / "cache"
    v = lazyseq.webdataset(tmp_path / "z", cache_dir=cache)
    assert v.names == [f"part-000{suffix}", f"part-001{suffix}"]
    assert list(v) == reference(*paths)
    copies = sorted(n for n in os.listdir(cache) if n.endswith(".tar"))
    assert len(copies) == 2
    built = _count_builds(monkeypatch)
    again = lazyseq.webdataset(tmp_path / "z", cache_dir=cache)
    assert list(pickle.loads(pickle.dumps(again))) == reference(*paths) and built == []  # copies and indices reused
    assert sorted(n for n in os.listdir(cache) if n.endswith(".tar")) == copies
    with open(cache / copies[0], "r+b") as f:  # a copy changed on disk: decompressed again, never served
        f.seek(700)
        f.write(b"X")
    from lazyseq.formats import untar

    untar._verified.clear()
    assert list(lazyseq.webdataset(tmp_path / "z", cache_dir=cache)) == reference(*paths)
    with pytest.raises(lazyseq.StoreError, match="decompresses to more than cache_dir_bytes"):
        len(lazyseq.webdataset(tmp_path / "z", cache_dir=tmp_path / "small", cache_dir_bytes=1000))


def test_compressed_shards_that_cannot_be_read(tmp_path):
    import gzip

    path = write_wds(tmp_path / "a.tar", 2)
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "cut.tar.gz").write_bytes(gzip.compress(open(path, "rb").read())[:-30])
    with pytest.raises(lazyseq.StoreError, match="cut.tar.gz.*truncated"):
        len(lazyseq.webdataset(tmp_path / "z" / "cut.tar.gz", cache_dir=tmp_path / "c"))
    (tmp_path / "z" / "a.tar.zst").write_bytes(b"zstd")
    with pytest.raises(ValueError, match="compressed tar.*decompress it"):
        lazyseq.webdataset(tmp_path / "z" / "a.tar.zst", cache_dir=tmp_path / "c")
    disguised = tmp_path / "y" / "a.tar"
    disguised.parent.mkdir()
    disguised.write_bytes(gzip.compress(open(path, "rb").read()))
    with pytest.raises(lazyseq.StoreError, match="gzip-compressed.*decompress it"):
        len(lazyseq.webdataset(disguised))


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.tar"):
        lazyseq.webdataset(tmp_path)
    with pytest.raises(ValueError, match="no shards"):
        lazyseq.webdataset([])
    with pytest.raises(TypeError):
        lazyseq.webdataset([3])
    path = write_wds(tmp_path / "a.tar", 2)
    with pytest.raises(ValueError, match="one count"):
        lazyseq.webdataset(path, lengths=[1, 2])
    with pytest.raises(ValueError, match="timeout"):
        lazyseq.webdataset(path, timeout=0)
    with pytest.raises(FileNotFoundError, match="missing"):
        len(lazyseq.webdataset(tmp_path / "gone.tar"))


# -- the index cache -----------------------------------------------------------------------------------------
def _count_builds(monkeypatch) -> list:
    built = []
    real = tarmod.index_tar

    def counting(*a, **k):
        built.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr("lazyseq.formats.tar.index_tar", counting)
    return built


def test_the_index_is_built_once_and_kept_under_the_cache_never_beside_the_data(tmp_path, monkeypatch):
    paths = shards(tmp_path / "ds", k=2)
    built = _count_builds(monkeypatch)
    assert len(lazyseq.webdataset(tmp_path / "ds")) == 15 and len(built) == 2
    assert sorted(os.listdir(tmp_path / "ds")) == ["part-000.tar", "part-001.tar"]  # nothing beside the data
    home = tmp_path / "xdg" / "lazyseq"
    assert len([n for n in os.listdir(home) if n.endswith(".wds-index")]) == 2
    v = lazyseq.webdataset(tmp_path / "ds")
    assert list(v) == reference(*paths) and len(built) == 2  # read from the cache
    w = lazyseq.webdataset(tmp_path / "ds", cache_dir=tmp_path / "mine")
    assert len(w) == 15 and len(built) == 4 and len(os.listdir(tmp_path / "mine")) == 2


@pytest.mark.parametrize("change", ["touched", "rewritten", "corrupted-entry", "entry-a-link", "other-entry"])
def test_a_stale_or_corrupted_cache_entry_is_never_used(tmp_path, monkeypatch, change):
    path = write_wds(tmp_path / "a.tar", 5)
    built = _count_builds(monkeypatch)
    cache = tmp_path / "c"
    assert len(lazyseq.webdataset(path, cache_dir=cache)) == 5
    entry = tarcache.entry(str(cache), os.path.abspath(path))
    if change == "touched":
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif change == "rewritten":
        write_wds(tmp_path / "a.tar", 6, seed=3)
    elif change == "corrupted-entry":
        data = bytearray(open(entry, "rb").read())
        data[-5] ^= 0xFF
        open(entry, "wb").write(bytes(data))
    elif change == "entry-a-link":
        os.replace(entry, entry + ".real")
        os.symlink(entry + ".real", entry)
    else:  # another shard's entry in its place: its record names another source
        other = write_wds(tmp_path / "b.tar", 5, seed=9)
        lazyseq.webdataset(other, cache_dir=cache)[0]
        os.replace(tarcache.entry(str(cache), os.path.abspath(other)), entry)
    v = lazyseq.webdataset(path, cache_dir=cache)
    assert list(v) == reference(path)
    assert len(built) == (3 if change == "other-entry" else 2)
    assert tarcache.load(str(cache), os.path.abspath(path), os.path.getsize(path),
                         os.stat(path).st_mtime_ns) is not None  # written again, and now it serves


def test_an_index_cache_in_a_folder_that_cannot_be_written_only_means_no_cache(tmp_path):
    path = write_wds(tmp_path / "a.tar", 3)
    (tmp_path / "ro").write_text("a file where the cache folder would be")
    assert list(lazyseq.webdataset(path, cache_dir=tmp_path / "ro")) == reference(path)


# -- lengths -------------------------------------------------------------------------------------------------
def test_lengths_make_len_free_and_are_checked(tmp_path, monkeypatch):
    paths = shards(tmp_path / "ds", k=3, n=4)
    built = _count_builds(monkeypatch)
    v = lazyseq.webdataset(paths, lengths=[4, 5, 6])
    assert len(v) == 15 and v.cuts == [4, 9] and built == []
    assert v[10] == reference(paths[2])[1] and len(built) == 1
    wrong = lazyseq.webdataset(paths, lengths=[4, 6, 5])
    assert wrong[0] == reference(paths[0])[0]
    with pytest.raises(lazyseq.EvaluationError) as e:
        wrong[5]
    assert isinstance(e.value.__cause__, lazyseq.StoreError)
    assert "part-001.tar" in str(e.value.__cause__) and "holds 5 samples, lengths= says 6" in str(e.value.__cause__)


# -- pickling, fingerprints, workers ------------------------------------------------------------------------------
def test_a_pickled_view_holds_no_data_and_reads_the_same(tmp_path):
    paths = shards(tmp_path / "ds")
    v = lazyseq.webdataset(tmp_path / "ds")
    v[0]
    blob = pickle.dumps(v)
    assert len(blob) < 4096
    assert list(pickle.loads(blob)) == reference(*paths)


@pytest.mark.parametrize("strict", [True, False])
def test_a_pickled_view_refuses_a_changed_shard(tmp_path, strict):
    paths = shards(tmp_path / "ds", k=2)
    v = lazyseq.webdataset(tmp_path / "ds", strict=strict)
    len(v)
    blob = pickle.dumps(v)
    st = os.stat(paths[1])
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    w = pickle.loads(blob)
    assert w[0] == v[0]
    if strict:
        with pytest.raises(lazyseq.EvaluationError) as e:
            w[-1]
        assert "changed since this view was made" in str(e.value.__cause__)
    else:
        assert w[-1] == v[-1]


def test_fingerprints_name_the_shards_by_identity(tmp_path):
    shards(tmp_path / "ds", k=2)
    fp = lazyseq.fingerprint(lazyseq.webdataset(tmp_path / "ds"))
    assert fp["files"] == ["part-000.tar", "part-001.tar"] and fp["samples"] == [7, 8]
    assert fp["stamps"] is not None and len(fp["bytes"]) == 2
    loose = lazyseq.fingerprint(lazyseq.webdataset(tmp_path / "ds", strict=False))
    assert loose["stamps"] is None
    assert lazyseq.webdataset(tmp_path / "ds").nbytes() == sum(fp["bytes"])


@pytest.mark.parametrize("method", ["thread", "process"])
def test_workers_read_the_same(tmp_path, method):
    paths = shards(tmp_path / "ds")
    v = lazyseq.webdataset(tmp_path / "ds")
    with lazyseq.prefetch(v, nworkers=2, method=method) as p:
        got = list(p)
    assert got == reference(*paths)


def test_the_dataloader_reads_every_sample_once_shuffled_by_shards(tmp_path):
    paths = shards(tmp_path / "ds", k=4, n=6)
    v = lazyseq.webdataset(tmp_path / "ds")
    order = lazyseq.block_shuffle(v, v.cuts, seed=0, window=2)
    with lazyseq.DataLoader(order, batch_size=5, num_workers=2, to_tensor=False,
                            collate_fn=lambda items: [s["__key__"] for s in items]) as loader:
        keys = [k for b in loader for k in b]
    want = [s["__key__"] for s in reference(*paths)]
    assert sorted(keys) == sorted(want) and keys != want


def test_save_then_load_gives_the_same_samples(tmp_path):
    (tmp_path / "in").mkdir()
    path = write_tar(tmp_path / "in" / "a.tar", [(f"k{i}.{e}", bytes([i]) * (i + 1)) for i in range(9) for e in ("bin", "txt")])
    v = lazyseq.webdataset(path)
    lazyseq.save(v, tmp_path / "saved", nworkers=2, method="thread")
    store = lazyseq.load(tmp_path / "saved")
    assert [dict(s) for s in store] == reference(path)


# -- URLs ----------------------------------------------------------------------------------------------------
def test_http_shards_read_the_same(http_files):
    paths = shards(http_files.root / "ds", k=2)
    urls = [f"{http_files.url}/ds/{os.path.basename(p)}" for p in paths]
    v = lazyseq.webdataset(urls)
    want = reference(*paths)
    assert list(v) == want and v.names == ["part-000.tar", "part-001.tar"]
    assert lazyseq.batch(v, 4)[1] == want[4:8]
    assert list(pickle.loads(pickle.dumps(v))[::-3]) == want[::-3]


def test_http_shards_with_cache_dir_are_kept_whole_and_read_locally(http_files, tmp_path):
    paths = shards(http_files.root / "ds", k=1)
    url = f"{http_files.url}/ds/{os.path.basename(paths[0])}"
    v = lazyseq.webdataset(url, cache_dir=tmp_path / "c")
    assert list(v) == reference(*paths)
    assert any(n.endswith(".bin") for n in os.listdir(tmp_path / "c"))  # the whole shard
    assert any(n.endswith(".wds-index") for n in os.listdir(tmp_path / "c"))


def test_s3_prefix_lists_every_tar_under_it(s3, tmp_path):
    pytest.importorskip("s3fs")
    paths = shards(tmp_path / "ds", k=2)
    (tmp_path / "ds" / "sub").mkdir()
    write_wds(tmp_path / "ds" / "sub" / "c.tar", 3, first=900)
    for p in [*paths, tmp_path / "ds" / "sub" / "c.tar"]:
        s3.client.upload_file(str(p), s3.bucket, f"ds/{os.path.relpath(p, tmp_path / 'ds')}")
    s3.client.put_object(Bucket=s3.bucket, Key="ds/_SUCCESS", Body=b"")
    v = lazyseq.webdataset(f"s3://{s3.bucket}/ds/", storage_options=s3.storage_options)
    assert v.names == ["part-000.tar", "part-001.tar", "sub/c.tar"]
    assert list(v) == reference(*paths, tmp_path / "ds" / "sub" / "c.tar")
    again = lazyseq.webdataset(f"s3://{s3.bucket}/ds/", storage_options=s3.storage_options)
    assert again.shard_samples == (7, 8, 3)


# -- importing -----------------------------------------------------------------------------------------------
def test_import_lazyseq_imports_no_tar_or_webdataset_package():
    import subprocess
    import sys

    code = ("import sys, lazyseq; bad = [m for m in ('webdataset', 'tarfile', 'fsspec', 'lazyseq.formats.tar', "
            "'lazyseq.formats.tarcache', 'lazyseq.formats.untar') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_urls_headers_are_read_in_windows_and_few_are_kept(tmp_path, monkeypatch):
    """Over a URL the headers come in windows of ranged reads; those kept for the checksums are
    checked and forgotten every BATCH headers, so a large shard's headers never all sit in memory."""
    data = open(write_wds(tmp_path / "a.tar", 300), "rb").read()

    class Ranges:  # what index_tar reads a URL through: a RemoteFile's request() and its remote's read_ranges()
        size, requests = len(data), 0

        def __init__(self):
            self.remote = self

        def request(self, a, b):
            return a, b

        def read_ranges(self, reqs, cache=True):
            Ranges.requests += 1
            return [data[a:b] for a, b in reqs]

    monkeypatch.setattr(tarmod, "BATCH", 16)
    monkeypatch.setattr(tarmod._Window.__init__, "__defaults__", (4096,))
    kept, have = [], tarmod._Window._have
    monkeypatch.setattr(tarmod._Window, "_have", lambda self, a, b: (kept.append(len(self.blocks)), have(self, a, b)))
    far, near = tarmod.index_tar(Ranges(), len(data), "r.tar"), tarmod.index_tar(data, len(data), "l.tar")
    assert [(far.key(j), far.members(j)) for j in range(len(far))] == [(near.key(j), near.members(j)) for j in range(300)]
    assert Ranges.requests > 100 and max(kept) < 40


def test_a_worker_opens_only_the_shards_it_reads(tmp_path, monkeypatch):
    shards(tmp_path / "ds", k=4, n=3)
    v = lazyseq.webdataset(tmp_path / "ds")
    assert len(v) == 3 + 4 + 5 + 6
    w = pickle.loads(pickle.dumps(v))  # as a process worker gets it
    built = _count_builds(monkeypatch)
    opened = []
    real = w._open
    monkeypatch.setattr(w, "_open", lambda k: (opened.append(k), real(k))[1])
    assert len(w) == 18 and w[9]["__key__"] == "dir/s00202" and opened == [2] and built == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("ab./_\nX", max_size=8), max_size=8))
def test_names_split_as_webdatasets_base_plus_ext(names):
    from webdataset.tariterators import base_plus_ext, meta_prefix, meta_suffix

    from lazyseq.formats.tarindex import SKIP_META, _split

    prefixes, ids, exts = _split(names)
    names_of = {e: x for x, e in exts.items()}
    for name, prefix, e in zip(names, prefixes, ids):
        meta = ("/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix)) or SKIP_META.match(name)
        want = (None, None) if meta else base_plus_ext(name)
        assert (prefix, None if e < 0 else names_of[e]) == (want[0], None if want[1] is None else want[1].lower())


def _grouped_as_webdataset(names):
    # webdataset's group_by_keys over member names: [(key, [(extension, member)])], or ValueError
    from webdataset.tariterators import base_plus_ext, meta_prefix, meta_suffix

    from lazyseq.formats.tarindex import SKIP_META

    samples = []
    for m, name in enumerate(names):
        if ("/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix)) or SKIP_META.match(name):
            continue
        prefix, suffix = base_plus_ext(name)
        if prefix is None:
            continue
        if not samples or samples[-1][0] != prefix:
            samples.append((prefix, []))
        if suffix.lower() in [e for e, _ in samples[-1][1]]:
            raise ValueError(name)
        samples[-1][1].append((suffix.lower(), m))
    return samples


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text("ab./_\nXJé", max_size=7), max_size=12))
def test_members_group_into_webdatasets_samples(names):
    # the grouping in numpy (plain names) and by the regex (the rest) together give webdataset's samples
    from lazyseq.formats.tarindex import group

    offs = [512 * (2 * m + 1) for m in range(len(names))]
    raw = [n.encode() for n in names]
    bad = any(n.startswith("/") or ".." in n.split("/") for n in names)
    try:
        want = _grouped_as_webdataset(names)
    except ValueError:
        want = None
    if bad or want is None:
        with pytest.raises(lazyseq.StoreError, match="'..'|two members with the extension"):
            group(offs, [1] * len(names), raw, "h.tar")
        return
    ix = group(offs, [1] * len(names), raw, "h.tar")
    got = [(ix.key(j), [(e, (o // 512 - 1) // 2) for e, o, _ in ix.members(j)]) for j in range(len(ix))]
    assert got == want
    firsts = list(dict.fromkeys(e for _, members in want for e, _ in members))
    assert ix.exts == firsts  # extension ids in order of first appearance


def test_header_names_read_as_tarfile_reads_them():
    # a long path split into ustar's prefix field, and a name field with bytes after its first NUL
    buf = io.BytesIO()
    long = "d" * 90 + "/" + "e" * 60 + "/s1.jpg"
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name in (long, "s2.cls", "s3.cls"):
            info = tarfile.TarInfo(name)
            info.size = 3
            t.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(buf.getvalue())
    data[2048 + 2:2048 + 6] = b"\0xyz"  # the third header's name: "s3" then NUL then junk
    data[2048 + 148:2048 + 156] = b"%06o\0 " % (sum(data[2048:2048 + 148]) + sum(data[2048 + 156:2048 + 512]) + 256)
    names = [m.name for m in tarfile.open(fileobj=io.BytesIO(bytes(data))).getmembers()]
    assert names == [long, "s2.cls", "s3"]
    h = np.frombuffer(bytes(data), np.uint8)[:3 * 1024].reshape(-1, 512)[::2]
    assert [n.decode() for n in tarmod._names(h).tolist()] == names
    ix = tarmod.index_tar(bytes(data), len(data), "p.tar")  # "s3" has no extension: in no sample
    assert [ix.key(j) for j in range(len(ix))] == [long[:-4], "s2"]


@pytest.mark.parametrize("count", [3, 40])
def test_many_and_long_extensions_group_as_webdataset_groups_them(count):
    # past 16 distinct extensions the classes come from a sort; past 8 bytes an extension is no one word
    from lazyseq.formats.tarindex import group

    rng = np.random.default_rng(count)
    exts = [f"E{k}.Part" + "x" * int(rng.integers(0, 20)) for k in range(count)]
    names = []
    for s in range(200):  # a sample: a cls and one or two of the others, the others' case mixed
        picked = dict.fromkeys([exts[s % count], exts[int(rng.integers(count))]])
        names += [f"d/s{s:04d}.cls"] + [f"d/s{s:04d}.{e.upper() if s % 2 else e}" for e in picked]
    offs = [512 * (2 * m + 1) for m in range(len(names))]
    ix = group(offs, [1] * len(names), [n.encode() for n in names], "many.tar")
    want = _grouped_as_webdataset(names)
    assert [(ix.key(j), [(e, (o // 512 - 1) // 2) for e, o, _ in ix.members(j)]) for j in range(len(ix))] == want
    assert ix.exts == list(dict.fromkeys(e for _, members in want for e, _ in members))
    assert len(ix.exts) > (16 if count == 40 else 2)


def test_header_batches_in_two_threads_give_the_same_index_and_the_first_bad_header(monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for j in range(200):
            info = tarfile.TarInfo(f"s{j // 2:03d}.{'cls' if j % 2 else 'jpg'}")
            info.size = 5
            t.addfile(info, io.BytesIO(b"%05d" % j))
    data = bytearray(buf.getvalue())
    alone = tarmod.index_tar(bytes(data), len(data), "one.tar")
    monkeypatch.setattr(tarmod, "BATCH", 16)  # 13 batches: two threads
    threads = tarmod.index_tar(bytes(data), len(data), "two.tar")
    assert [(threads.key(j), threads.members(j)) for j in range(100)] == [(alone.key(j), alone.members(j)) for j in range(100)]
    for j in (150, 70):  # two bad checksums, in batches 9 and 4: the error names the first
        data[j * 1024 + 148:j * 1024 + 150] = b"77"
    with pytest.raises(lazyseq.StoreError, match=r"two\.tar \(a tar file\), the member at byte 71680: a bad header checksum"):
        tarmod.index_tar(bytes(data), len(data), "two.tar")
