"""lazyseq.webdataset over a stranger's tar files (issue #33, "Files from strangers"): links, devices,
FIFOs, names with ``..`` or absolute, sizes past the end, truncated headers, bad checksums, long-name
and PAX headers that lie; each is a StoreError naming the file and the member, raised within a bound
of time, never another exception, a hang or a read outside the file. Then a fuzz of mutated headers
and of mutated index-cache entries, in a child process (a crash or a hang fails the test, not the
run)."""

import io
import os
import subprocess
import sys
import tarfile

import pytest

import lazyseq
from tests.hostile import raised_within


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def tar_bytes(members, fmt=tarfile.GNU_FORMAT) -> bytes:
    """A tar of ``members``: ``(name, data)`` or ``(TarInfo, data)``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for m, data in members:
            info = m if isinstance(m, tarfile.TarInfo) else tarfile.TarInfo(m)
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def fix_checksum(data: bytearray, at: int) -> bytearray:
    """The header at ``at`` given the checksum of its bytes as they are now."""
    data[at + 148:at + 156] = b" " * 8
    data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
    return data


def store_error(tmp_path, data: bytes, name: str = "x.tar") -> lazyseq.StoreError:
    """The StoreError that reading the tar ``data`` raises (within 10 s), checked to name the file."""
    path = tmp_path / name
    path.write_bytes(data)

    def read():
        v = lazyseq.webdataset(path)
        for i in range(len(v)):
            v[i]

    err = raised_within(10, read)
    if isinstance(err, lazyseq.EvaluationError):
        err = err.__cause__
    assert isinstance(err, lazyseq.StoreError), repr(err)
    assert name in str(err)
    return err


def special(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("kind, what", [(tarfile.SYMTYPE, "a symbolic link"), (tarfile.LNKTYPE, "a hard link"),
                                        (tarfile.CHRTYPE, "a character device"), (tarfile.BLKTYPE, "a block device"),
                                        (tarfile.FIFOTYPE, "a FIFO")])
def test_links_devices_and_fifos_are_refused(tmp_path, kind, what):
    data = tar_bytes([("k.jpg", b"1"), (special("k.cls", kind, "/etc/passwd"), None)])
    err = store_error(tmp_path, data)
    assert what in str(err) and "'k.cls'" in str(err) and "byte 1024" in str(err)


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/passwd.txt", "a/../../b.txt", "a/..", "x/../y.jpg"])
def test_names_outside_the_archive_are_refused(tmp_path, name):
    err = store_error(tmp_path, tar_bytes([("ok.txt", b"1"), (name, b"2")], tarfile.PAX_FORMAT))
    assert "absolute name or one with '..'" in str(err)


def test_dots_inside_a_name_are_fine(tmp_path):
    path = tmp_path / "t.tar"
    path.write_bytes(tar_bytes([("a..b.txt", b"1"), ("c/...d.txt", b"2")]))
    assert [s["__key__"] for s in lazyseq.webdataset(path)] == ["a", "c/"]


def test_a_size_past_the_end_of_the_file(tmp_path):
    data = tar_bytes([("a.bin", b"x" * 5000)])
    err = store_error(tmp_path, data[:3000])
    assert "passes the end of the file" in str(err) and "'a.bin'" in str(err)


def test_a_truncated_header(tmp_path):
    data = tar_bytes([("a.bin", b"x" * 10), ("b.bin", b"y")])
    err = store_error(tmp_path, data[:1024 + 300])
    assert "truncated header" in str(err) and "byte 1024" in str(err)


def test_a_bad_checksum(tmp_path):
    data = bytearray(tar_bytes([("a.bin", b"x"), ("b.bin", b"y")]))
    data[1024 + 3] ^= 0x01  # the second header's name
    err = store_error(tmp_path, bytes(data))
    assert "bad header checksum" in str(err) and "byte 1024" in str(err)


def test_a_size_that_is_not_a_number(tmp_path):
    data = bytearray(tar_bytes([("a.bin", b"x")]))
    data[124:136] = b"12z4567\0\0\0\0\0"
    err = store_error(tmp_path, bytes(fix_checksum(data, 0)))
    assert "is not a number" in str(err)


def rec(kv: bytes) -> bytes:
    """A PAX record ``"%d %s\n"`` whose length is right."""
    n = len(kv) + 3
    while len(str(n)) + len(kv) + 2 != n:
        n += 1
    return b"%d %s\n" % (n, kv)


def _pax(records: bytes, then: bytes = b"") -> bytes:
    """A tar whose first member has a PAX header holding exactly ``records``."""
    info = tarfile.TarInfo("pax")
    info.type = tarfile.XHDTYPE
    head = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    head[124:136] = b"%011o\0" % len(records)
    fix_checksum(head, 0)
    body = records + bytes(-len(records) % 512)
    return bytes(head) + body + tar_bytes([("m.txt", b"data")], tarfile.USTAR_FORMAT)[:1024] + then


@pytest.mark.parametrize("records, why", [
    (b"99 path=x.txt\n", "malformed or passes the header's end"),
    (b"12 path=x.txt\n", "malformed"),
    (b"3 path=a.txt\n", "malformed"),
    (rec(b"path=\xff\xfe.txt"), "not UTF-8"),
    (rec(b"path=a\0.txt"), "NUL"),
    (rec(b"size=1x"), "is not a number"),
    (rec(b"size=9999"), "passes the end"),
    (rec(b"GNU.sparse.map=0,1,2,3,4"), "sparse"),
])
def test_pax_headers_that_lie(tmp_path, records, why):
    err = store_error(tmp_path, _pax(records))
    assert why in str(err)


def test_two_pax_headers_for_one_member_and_a_global_path(tmp_path):
    one = _pax(rec(b"path=a.txt"))
    err = store_error(tmp_path, one[:1024] + one)
    assert "two PAX headers" in str(err)
    glob = bytearray(one)
    glob[156:157] = b"g"
    err = store_error(tmp_path, bytes(fix_checksum(glob, 0)), "g.tar")
    assert "global PAX header" in str(err)


def test_gnu_long_names_that_lie(tmp_path):
    data = bytearray(tar_bytes([("l" * 200 + ".txt", b"1")]))
    assert data[156:157] == b"L"
    data[124:136] = b"%011o\0" % (10**9)  # past the end
    err = store_error(tmp_path, bytes(fix_checksum(data, 0)))
    assert "GNU long-name header says it holds 1000000000 bytes" in str(err)
    bad = bytearray(tar_bytes([("l" * 200 + ".txt", b"1")]))
    bad[512:514] = b"\xff\xfe"  # the long name, not UTF-8
    err = store_error(tmp_path, bytes(bad), "u.tar")
    assert "not UTF-8" in str(err)
    cut = tar_bytes([("l" * 200 + ".txt", b"1")])[:1024] + bytes(1024)  # ends after the long name
    assert "ends after a long-name or PAX header" in str(store_error(tmp_path, cut, "c.tar"))


def test_two_members_of_one_extension_in_a_sample(tmp_path):
    err = store_error(tmp_path, tar_bytes([("k.jpg", b"1"), ("k.JPG", b"2")]))
    assert "two members with the extension 'jpg'" in str(err)


def test_a_link_or_a_fifo_in_place_of_a_shard(tmp_path):
    (tmp_path / "real.tar").write_bytes(tar_bytes([("a.txt", b"1")]))
    os.symlink(tmp_path / "real.tar", tmp_path / "link.tar")
    err = raised_within(10, lambda: len(lazyseq.webdataset(tmp_path / "link.tar")))
    assert isinstance(err, lazyseq.StoreError) and "symbolic link" in str(err)
    os.mkfifo(tmp_path / "fifo.tar")
    err = raised_within(10, lambda: len(lazyseq.webdataset(tmp_path / "fifo.tar")))
    assert isinstance(err, lazyseq.StoreError) and "FIFO" in str(err)


def test_control_characters_in_a_name_never_reach_a_message(tmp_path):
    err = store_error(tmp_path, tar_bytes([("a\x1b[31m/../x.txt", b"1")], tarfile.PAX_FORMAT))
    assert "\x1b" not in str(err) and "\\x1b" in str(err)


def test_not_a_tar_file(tmp_path):
    err = store_error(tmp_path, b"hello, not a tar file\n" * 40)
    assert "checksum" in str(err) or "not a number" in str(err)


# -- fuzz ---------------------------------------------------------------------------------------------------
FUZZ = r"""
import io, os, random, sys, tarfile
import numpy as np
from lazyseq.errors import StoreError
from lazyseq.formats.tar import index_tar, TarIndex
from lazyseq.formats import tarcache

root, cases, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)

def base(fmt, long=True):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for i in range(6):
            for ext, data in (("jpg", os.urandom(rng.randrange(0, 1500))), ("cls", b"%d" % i)):
                name = (("d" * 120 + "/") if i == 2 and long else "") + f"s{i}.{ext}"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                if i == 3:
                    info.pax_headers = {"comment": "x" * 30}
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()

def headers(data):
    out, pos = [], 0
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t.getmembers():
            out.append(m.offset)
            out.append(m.offset_data - 512)
    return sorted(set(out))

def peer(data):
    # what webdataset reads of data, or None where it raises (lazyseq, stricter, may refuse more)
    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander
    try:
        files = tar_file_expander([{"url": "fuzz.tar", "stream": io.BytesIO(data)}])
        return [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(files)]
    except Exception:
        return None

def same_as_the_walk(data):
    # where the scan finds the headers at once, the walk finds the same, without an error
    from lazyseq.formats import tar as walker
    from lazyseq.formats.tarscan import scan
    got = scan(data, len(data))
    if got is not None:
        w = walker._Walk(data, len(data), "fuzz.tar")
        w.run()
        at, regular, sizes = got
        assert (w.at, w.offsets, w.sizes) == (at.tolist(), (at[regular] + 512).tolist(), sizes.tolist())
        return 1
    return 0

def check(data):
    outcomes["scanned"] += same_as_the_walk(data)
    try:
        ix = index_tar(data, len(data), "fuzz.tar")
    except StoreError:
        return "refused"
    theirs = peer(data)
    ours = [{"__key__": ix.key(j), **{e: data[o:o + n] for e, o, n in ix.members(j)}} for j in range(len(ix))]
    if theirs is not None:  # where webdataset reads without an error, the same samples
        assert ours == theirs, (ours[:3], theirs[:3])
    for j in range(len(ix)):
        ix.key(j)
        a, z = ix.span(j)
        assert 512 <= a <= z <= len(data), (a, z, len(data))
        for ext, o, n in ix.members(j):
            assert 512 <= o and o + n <= len(data) and len(data[o:o + n]) == n
    ix.check(len(data), "fuzz.tar")
    return "read"

outcomes = {"refused": 0, "read": 0, "scanned": 0}
for fmt, long in ((tarfile.GNU_FORMAT, True), (tarfile.PAX_FORMAT, True), (tarfile.PAX_FORMAT, False),
                  (tarfile.USTAR_FORMAT, False)):
    good = base(fmt, long)
    heads = headers(good)
    for _ in range(cases):
        data = bytearray(good)
        at = rng.choice(heads)
        for _ in range(rng.randrange(1, 4)):
            span = rng.choice([(0, 100), (124, 136), (148, 157), (156, 157), (345, 500), (512, 600), (0, 512)])
            p = at + rng.randrange(*span)
            if p < len(data):
                data[p] = rng.choice([0, 0x20, 0x30, 0x37, 0x2F, 0x2E, 0x80, 0xFF, rng.randrange(256)])
        if rng.random() < 0.7 and at + 512 <= len(data):  # a valid checksum: the mutation reaches the parser
            data[at + 148:at + 156] = b" " * 8
            data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
        if rng.random() < 0.1:
            data = data[:rng.randrange(len(data))]
        outcomes[check(bytes(data))] += 1

# index cache entries: any mutation is either ignored (None) or a valid index of the shard
good = base(tarfile.PAX_FORMAT)
ix = index_tar(good, len(good), "t.tar")
tarcache.store(root, "/x/t.tar", len(good), 5, ix)
entry = tarcache.entry(root, "/x/t.tar")
clean = open(entry, "rb").read()
for _ in range(cases):
    data = bytearray(clean)
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    if rng.random() < 0.2:
        data = data[:rng.randrange(len(data))]
    with open(entry, "wb") as f:
        f.write(bytes(data))
    got = tarcache.load(root, "/x/t.tar", len(good), 5)
    if got is not None:
        got.check(len(good), "entry")
        assert [got.members(j) for j in range(len(got))] == [ix.members(j) for j in range(len(ix))]
print(outcomes)
"""


def test_fuzz_mutated_headers_and_index_cache_entries(tmp_path):
    cases = int(os.environ.get("LAZYSEQ_FUZZ_CASES", "600"))
    r = subprocess.run([sys.executable, "-c", FUZZ, str(tmp_path), str(cases), "33"], capture_output=True, text=True,
                       timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-3000:]
    counts = eval(r.stdout.strip().splitlines()[-1])  # {'refused': n, 'read': m}
    assert counts["refused"] > 0 and counts["read"] > 0 and counts["scanned"] > 0, counts
