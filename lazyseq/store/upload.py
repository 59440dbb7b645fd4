"""``lazyseq.save`` to a URL of object storage (``s3://bucket/train``, ``gs://...``, ``memory://``).

The same store as a local save (the same shards, the same manifest), written in place:

- ``<url>/shard-KKKKK-RUN-ATTEMPT.bin``: each worker writes its shard to a local temporary file
  (in a directory the parent makes, removed at the end), uploads it (:func:`~lazyseq.files.writes.put_file`)
  under a name no earlier run used, so a shard of a store already at the URL is never replaced;
- ``<url>/.lazyseq-partial/``: the job file and one record per uploaded shard (what a local
  save keeps in its partial directory), each written after the data it names;
- ``<url>/.lazyseq-lock.json``: the lock (:mod:`.lease`);
- ``<url>/manifest.json``: written last, in one PUT, so a reader sees the whole store or none.
  Then the objects the new manifest does not name (the old store's shards, other attempts at a
  shard, the partial area) are deleted, and the lock: nothing else is left under the URL.

A rerun of the same job resumes: one listing gives the shards' sizes, the records are read at
once, and a shard whose object has its recorded size is kept (its checksum is not read again:
its name is new to the run that wrote it and its record was written after its upload ended).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from typing import Any

from ..errors import RemoteReadError, StoreError
from ..files import Remote, redact
from ..files.writes import delete, listing, put_bytes, put_file, read_many, read_small
from . import format as fmt
from .job import ShardWriter, default_fingerprint, finite_length, make_manifest, prepare, progress_bar, resume_note, run_job
from .lease import LOCK, Lease
from .remote import remote_manifest
from .shardfile import write_shard

__all__ = ["save_url", "Uploader", "Area", "PARTIAL"]

PARTIAL = ".lazyseq-partial"  # the job file and the records, under the store's URL
_SHARD = re.compile(r"shard-\d{5}-[0-9a-f]+(-[0-9a-f]+)?\.bin")  # a shard a save wrote (local or here)
_RECORD = re.compile(r"shard-(\d{5})\.json")
_READ_ONLY = ("http", "https")


class Uploader:
    """Where a :class:`~.write.ShardWriter` puts its shards when saving to a URL: uploaded from a
    local temporary file, then recorded. ``kept``: the records of the shards an earlier run
    uploaded (the writer returns them as they are). Pickles to process workers and Ray actors."""

    def __init__(self, remote: Remote, tmpdir: str, run: str, kept: dict[int, dict]):
        self.remote, self.tmpdir, self.run, self.kept = remote, tmpdir, run, kept

    def write(self, k: int, r: range, fields: list[dict], cols: list[list]) -> dict:
        name = fmt.shard_name(k, f"{self.run}-{uuid.uuid4().hex[:8]}")  # new per attempt (a shard may run twice)
        # A Ray actor on another node has no such directory: its system's temporary directory then.
        local = os.path.join(self.tmpdir if os.path.isdir(self.tmpdir) else tempfile.gettempdir(), name)
        try:
            size, crc, layouts = write_shard(local, fields, cols, r.start)
            put_file(self.remote, local, self.remote.join(name, "a shard"),
                     f"shard {k} (items {r.start}-{r.stop - 1}, {size} bytes)", size)
        finally:
            try:
                os.remove(local)
            except FileNotFoundError:
                pass
        rec = {"shard": k, "start": r.start, "stop": r.stop, "file": name, "bytes": size, "crc32": crc,
               "fields": layouts}
        put_bytes(self.remote, f"{self.remote.url}/{PARTIAL}/{fmt.record_name(k)}",
                  json.dumps(rec, separators=(",", ":")).encode(), f"the record of shard {k}")
        return rec


class Area:
    """The partial area ``<url>/.lazyseq-partial/`` of a save, as :func:`~.job.prepare` uses it."""

    def __init__(self, remote: Remote):
        self.remote, self.url = remote, f"{remote.url}/{PARTIAL}"
        self.where = redact(self.url)

    def read_job(self) -> Any:
        raw = read_small(self.remote, f"{self.url}/{fmt.JOB}", "the job file")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return {}

    def write_job(self, job: dict) -> None:
        put_bytes(self.remote, f"{self.url}/{fmt.JOB}", json.dumps(job, separators=(",", ":")).encode(), "the job file")

    def discard(self) -> None:
        """Another job's records and job file (its shards go when this save ends: they are not named)."""
        delete(self.remote, [f"{self.url}/{name}" for name in listing(self.remote, self.url)], "an earlier job's records")

    def kept(self, writer: ShardWriter, objects: dict[str, int]) -> dict[int, dict]:
        """The records of the shards an earlier run uploaded whole (``objects``: the listing)."""
        names = {int(m.group(1)): f"{self.url}/{n[len(PARTIAL) + 1:]}" for n in objects
                 if n.startswith(PARTIAL + "/") and (m := _RECORD.fullmatch(n[len(PARTIAL) + 1:]))}
        got = read_many(self.remote, [names[k] for k in sorted(names) if k < len(writer)], "the records")
        kept = {}
        for k in sorted(names):
            try:
                rec = json.loads(got[names[k]])
                r = writer._range(k)
                if (rec["shard"], rec["start"], rec["stop"]) == (k, r.start, r.stop) and isinstance(rec["file"], str) \
                        and _SHARD.fullmatch(rec["file"]) and objects.get(rec["file"]) == rec["bytes"]:
                    kept[k] = rec
            except (KeyError, TypeError, ValueError, IndexError):
                continue
        return kept


def _refuse(url: str, method: str) -> None:
    protocol = url.split("://", 1)[0].lower()
    if protocol in _READ_ONLY:
        raise ValueError(f"lazyseq.save: {redact(url)}: save needs a writable store (s3://, gs://, az://, memory://, ...); "
                         f"{protocol}:// is read-only")
    if "?" in url or "#" in url:
        raise ValueError(f"lazyseq.save: {redact(url)}: a URL with a query string or a fragment cannot be saved to")
    if protocol == "memory" and method != "thread":
        raise ValueError(f"lazyseq.save: {redact(url)}: memory:// lives in this process only; save to it with "
                         "method='thread'")


def _owned(remote: Remote, objects: dict[str, int], overwrite: bool) -> set[str]:
    """The objects under the URL that a save may delete once its manifest is in place: the shards of
    the store there (named by its manifest, or by a save's pattern), another attempt's, the partial
    area. A finished store is refused unless ``overwrite``; an object of anything else, always."""
    shown = remote.shown
    if fmt.MANIFEST in objects and not overwrite:
        raise FileExistsError(f"lazyseq.save: {shown} is a finished store; pass overwrite=True to replace it")
    named: set[str] = set()
    if fmt.MANIFEST in objects:
        try:
            named = {r["file"] for r in remote_manifest(remote)["shards"] if isinstance(r, dict) and "file" in r}
        except (StoreError, RemoteReadError, KeyError, TypeError):
            named = set()  # a manifest this lazyseq cannot read: only the shards of a save's pattern are its
    ours = {n for n in objects if n in named or _SHARD.fullmatch(n) or n.startswith(PARTIAL + "/")}
    other = sorted(set(objects) - ours - {fmt.MANIFEST, LOCK})
    if other:
        raise FileExistsError(f"lazyseq.save: {shown} holds objects that are not a lazyseq store's "
                              f"({', '.join(repr(n) for n in other[:3])}{', ...' * (len(other) > 3)}); refusing to "
                              "write there")
    return ours


def save_url(seq: Any, url: str, *, nworkers: int, method: str, shard_bytes: int, overwrite: bool,
             progress: bool | None, allow_pickle: bool, fingerprint: Any, storage_options: dict | None,
             timeout: float) -> None:
    """:func:`lazyseq.save` to ``url`` (see the module's docstring and docs/remote.md)."""
    _refuse(url, method)
    remote = Remote(url, storage_options, block_cache=0, timeout=timeout)  # no cache: every read is news
    n, dest = finite_length(seq), remote.shown
    objects = listing(remote)
    _owned(remote, objects, overwrite)
    with Lease(remote, quiet=progress is False) as lease:
        objects = listing(remote)  # again, now that no other save writes here
        owned = _owned(remote, objects, overwrite)
        fingerprint = default_fingerprint(seq, fingerprint)
        area = Area(remote)
        ref, per_shard, resumed = prepare(area, seq, n, shard_bytes, allow_pickle, fingerprint, overwrite, dest)
        writer = ShardWriter(seq, area.where, n, per_shard, ref, allow_pickle, dest if resumed else None)
        kept = area.kept(writer, objects) if resumed else {}
        done = resume_note(writer, kept, dest, progress) if resumed else 0
        tmpdir = tempfile.mkdtemp(prefix="lazyseq-save-")
        try:
            writer.sink = Uploader(remote, tmpdir, uuid.uuid4().hex[:8], kept)  # the workers' (pickled with the view)
            records = run_job(writer, nworkers, method, progress_bar(progress, n, dest, done), set(kept)) if n else []
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        manifest = make_manifest(n, per_shard, ref, fingerprint, records)
        lease.check()  # never a manifest without the lock: another save may have taken it over
        if not overwrite and read_small(remote, remote.join(fmt.MANIFEST), "the manifest") is not None:
            raise FileExistsError(f"lazyseq.save: {dest} became a finished store while this save ran (written by "
                                  "another program); the shards uploaded are kept: pass overwrite=True to replace it")
        put_bytes(remote, remote.join(fmt.MANIFEST), json.dumps(manifest, separators=(",", ":")).encode(), "the manifest")
        late = {n for n in listing(remote) if _SHARD.fullmatch(n) or n.startswith(PARTIAL + "/")}  # other attempts'
        clean(remote, owned | late, {r["file"] for r in records})


def clean(remote: Remote, names: set[str], keep: set[str]) -> None:
    """Delete ``names`` but the manifest, the lock and the shards in ``keep``: after the manifest,
    the old store's shards and other attempts', then the partial area."""
    gone = sorted(n for n in names if n not in keep and n not in (fmt.MANIFEST, LOCK) and not n.startswith(PARTIAL + "/"))
    gone += sorted(n for n in names if n.startswith(PARTIAL + "/"))
    delete(remote, [f"{remote.url}/{n}" for n in gone], "the objects the new manifest does not name")
