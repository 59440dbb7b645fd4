"""``lazyseq.save``: a finite sequence written as a store, in shards that workers write themselves.

The work is a view (:class:`ShardWriter`) whose item ``k`` evaluates the items of shard ``k``,
writes the shard file and its record, and returns the record; ``save`` reads it through
``lazyseq.prefetch``, so only the records reach the caller. The shards are written in a sibling
directory ``.NAME.lazyseq-partial`` that becomes ``NAME`` when the manifest is written. A URL:
:mod:`.upload` (the same writer, its shards uploaded in place; a lock object: :mod:`.lease`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np

from .. import tree
from ..base import View
from ..errors import EvaluationError, WorkerCrashed, wrap_error
from ..files import RemoteWriteError, is_url, local_path
from ..fingerprints import NotResumable, difference
from ..fingerprints import fingerprint as pipeline_fingerprint
from ..helpers import span, usable_cores
from ..node import Failed, length, read_each, reader
from . import format as fmt
from .shardfile import finished, write_shard

__all__ = ["save", "ShardWriter"]

_SAMPLES = 4  # items evaluated first to size the shards: item 0 and a few spread over the sequence


class ShardWriter(View):
    """Item ``k``: shard ``k`` of ``seq`` evaluated and written under ``root``; its record."""

    def __init__(self, seq: Any, root: str, n: int, per_shard: int, first: tuple, allow_pickle: bool,
                 resumed_for: str | None = None, sink: Any = None):
        self.src, self.root, self.n, self.per_shard = seq, root, n, per_shard
        self.first, self.allow_pickle = first, allow_pickle  # item 0's (structure, fields)
        self.resumed_for = resumed_for  # the destination, when the schema is an interrupted job's
        # Where shards go when not into files under root (save to a URL: upload.Uploader, whose
        # `kept` holds the records of the shards an earlier run uploaded, checked by the parent).
        self.sink = sink

    def _len(self) -> int:
        return -(-self.n // self.per_shard)

    def children(self) -> tuple:
        return ()

    def describe(self) -> str:
        return f"save-shards({self.per_shard} items per shard)"

    def _range(self, k: int) -> range:
        return range(k * self.per_shard, min(self.n, (k + 1) * self.per_shard))

    def _get(self, k: int) -> dict:
        r = self._range(k)
        rec = finished(self.root, k, r) if self.sink is None else self.sink.kept.get(k)
        if rec is not None:
            return {**rec, "resumed": True}
        fields = self.first[1]
        cols: list[list] = [[] for _ in fields]
        for i, x in zip(r, read_each(self.src, r)):
            if type(x) is Failed:
                e = x.error
                raise e if isinstance(e, EvaluationError) else wrap_error(e, i, self.src)
            try:
                same = fmt.schema(x, self.allow_pickle) == self.first
            except fmt.SchemaError as e:
                raise fmt.SchemaError(f"item {i}, {e}") from None
            if not same:
                why = fmt.mismatch(self.first, x, self.allow_pickle)
                if self.resumed_for is not None:  # the pipeline changed since the interrupted run
                    raise _other_job(self.root, self.resumed_for, f"item {i}'s fields differ from its item 0's: {why}")
                raise fmt.SchemaError(f"items 0 and {i} have different structures: {why}")
            for col, leaf in zip(cols, tree.leaves(x)):
                col.append(leaf)
        if self.sink is not None:
            return self.sink.write(k, r, fields, cols)
        # Prefetch may run a shard twice (a job that looks stuck goes to a second worker): each
        # attempt writes its own file, so a record always matches the data it names.
        name = fmt.shard_name(k, uuid.uuid4().hex[:8])
        size, crc, layouts = write_shard(os.path.join(self.root, name), fields, cols, r.start)
        rec = {"shard": k, "start": r.start, "stop": r.stop, "file": name, "bytes": size, "crc32": crc,
               "fields": layouts}
        fmt.write_json_atomic(os.path.join(self.root, fmt.PROGRESS, fmt.record_name(k)), rec)
        return rec


# -- the job -----------------------------------------------------------------------------------------
def _nbytes(x: Any) -> int:
    n = 0
    for v in tree.leaves(x):
        if isinstance(v, np.ndarray):
            n += v.nbytes
        elif isinstance(v, (str, bytes, bytearray)):
            n += len(v) + 8  # and its offset
        else:
            n += 8
    return n


def _item(seq: Any, i: int) -> Any:
    try:
        return reader(seq)(i)
    except EvaluationError:
        raise
    except Exception as e:
        raise wrap_error(e, i, seq) from e


def _plan(seq: Any, n: int, shard_bytes: int, allow_pickle: bool) -> tuple[tuple, int]:
    """Item 0's schema, checked against a few more items, and the number of items per shard."""
    first = _item(seq, 0)
    try:
        ref = fmt.schema(first, allow_pickle)
    except fmt.SchemaError as e:
        raise fmt.SchemaError(f"item 0, {e}") from None
    sizes = [_nbytes(first)]
    for i in sorted({n * s // _SAMPLES for s in range(1, _SAMPLES)} - {0}):
        x = _item(seq, i)
        why = fmt.mismatch(ref, x, allow_pickle)
        if why is not None:
            raise fmt.SchemaError(f"items 0 and {i} have different structures: {why}")
        sizes.append(_nbytes(x))
    est = max(1, sum(sizes) // len(sizes))
    return ref, max(1, min(n, shard_bytes // est))


@contextlib.contextmanager
def _locked(root: str) -> Iterator[None]:
    """Hold ``root``'s lock file: two saves into one directory would overwrite each other's shards."""
    os.makedirs(os.path.join(root, fmt.PROGRESS), exist_ok=True)
    f = open(os.path.join(root, fmt.PROGRESS, "lock"), "a+")
    try:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no fcntl (Windows): no lock
            pass
        except OSError:
            raise RuntimeError(f"lazyseq.save: another save is writing {root}; wait for it or stop it") from None
        yield
    except BaseException:
        if not os.path.exists(os.path.join(root, fmt.PROGRESS, fmt.JOB)):  # nothing worth resuming
            shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        f.close()


class OtherJob(FileExistsError):
    """The interrupted save in a partial directory is of another job than the one asked for."""


def _other_job(root: str, dest: str, why: str) -> OtherJob:
    return OtherJob(f"lazyseq.save: {root} holds an interrupted save of another job ({why}), which a rerun can resume; "
                    f"to save this job to {dest} instead, pass overwrite=True or delete that directory")


class Folder:
    """The partial directory of a local save, as :func:`_prepare` uses it (a URL's: upload.Area)."""

    def __init__(self, root: str):
        self.root = self.where = root

    def read_job(self) -> Any:
        """The job file's content; None if there is none, ``{}`` if it cannot be read."""
        try:
            return fmt.read_json(os.path.join(self.root, fmt.PROGRESS, fmt.JOB), "the job file")
        except FileNotFoundError:
            return None
        except OSError:
            return {}

    def write_job(self, job: dict) -> None:
        fmt.write_json_atomic(os.path.join(self.root, fmt.PROGRESS, fmt.JOB), job)

    def discard(self) -> None:
        """Another job's shards and records: start afresh, keeping the lock."""
        for name in os.listdir(self.root):
            if name != fmt.PROGRESS:
                os.remove(os.path.join(self.root, name))
        for name in os.listdir(os.path.join(self.root, fmt.PROGRESS)):
            if name != "lock":
                os.remove(os.path.join(self.root, fmt.PROGRESS, name))


def _prepare(area: Any, seq: Any, n: int, shard_bytes: int, allow_pickle: bool, fingerprint: Any,
             overwrite: bool, dest: str) -> tuple[tuple, int, bool]:
    """Item 0's schema, the items per shard, and whether they are an interrupted job's. An interrupted
    job with the same length and fingerprint is resumed from its job file, evaluating no item (its
    shards check each item against the schema as they write it); another is refused, or discarded
    with ``overwrite=True``. ``area``: where the job file is (a :class:`Folder`, or upload.Area)."""
    old = area.read_job()
    same = {"format": fmt.FORMAT, "version": fmt.VERSION, "length": n, "fingerprint": fingerprint}
    if isinstance(old, dict):
        diff = [k for k, v in same.items() if old.get(k) != v]
        if not diff and isinstance(old.get("per_shard"), int) and old["per_shard"] >= 1 \
                and "structure" in old and isinstance(old.get("fields"), list):
            return (old["structure"], old["fields"]), old["per_shard"], True
    ref, per_shard = _plan(seq, n, shard_bytes, allow_pickle) if n else ((None, []), 1)
    if old is not None:
        if not overwrite:
            what = f"its {', '.join(diff)} differ{'s' if len(diff) == 1 else ''}" if isinstance(old, dict) and diff \
                else "its job file cannot be read"
            if isinstance(old, dict) and diff == ["fingerprint"] and isinstance(old["fingerprint"], dict) \
                    and isinstance(fingerprint, dict):  # both lazyseq's: say what changed in the pipeline
                what = f"its pipeline differs: {difference(old['fingerprint'], fingerprint)}"
            raise _other_job(area.where, dest, what)
        area.discard()
    area.write_job({**same, "structure": ref[0], "fields": ref[1], "per_shard": per_shard})
    return ref, per_shard, False


def _check_dest(dest: str, overwrite: bool) -> None:
    if not os.path.lexists(dest):
        return
    if not os.path.isdir(dest):
        raise FileExistsError(f"lazyseq.save: {dest} exists and is not a directory")
    if os.path.exists(os.path.join(dest, fmt.MANIFEST)):
        if not overwrite:
            raise FileExistsError(f"lazyseq.save: {dest} is a finished store; pass overwrite=True to replace it")
    elif os.listdir(dest):
        raise FileExistsError(f"lazyseq.save: {dest} exists and is not a lazyseq store; refusing to replace it")


def _swap(root: str, dest: str) -> None:
    """Put the finished store at ``dest``; a store already there is removed only after."""
    old = None
    if os.path.lexists(dest):
        old = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.lazyseq-old-{uuid.uuid4().hex}")
        os.rename(dest, old)
    os.rename(root, dest)
    fmt.fsync_path(os.path.dirname(dest))
    for name in os.listdir(os.path.dirname(dest)):  # this one, and any a crash left between the renames
        if name.startswith(f".{os.path.basename(dest)}.lazyseq-old-"):
            shutil.rmtree(os.path.join(os.path.dirname(dest), name), ignore_errors=True)
    shutil.rmtree(os.path.join(dest, fmt.PROGRESS), ignore_errors=True)


def _progress_bar(progress: bool | None, n: int, dest: str, done: int = 0) -> Any:
    """A tqdm bar over the ``n`` items, from ``done`` (the items of the shards a resumed save keeps)."""
    if progress is None:
        progress = sys.stderr is not None and sys.stderr.isatty()
    if not progress:
        return None
    from tqdm.auto import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no monitor thread left running after the save

    desc = f"save {os.path.basename(dest)}" + (" (resumed)" if done else "")
    return Bar(total=n, initial=done, unit="item", desc=desc, dynamic_ncols=True)


def _run(writer: ShardWriter, nworkers: int, method: str, bar: Any, kept: Collection[int] = ()) -> list[dict]:
    """Every shard's record, written (or checked and kept: the shards in ``kept``, already on the bar)."""
    from ..evaluation import prefetch

    records, ours = [], [writer.describe()]
    try:
        workers = max(1, usable_cores() + nworkers) if nworkers <= 0 and method != "ray" else nworkers
        with prefetch(writer, nworkers=workers, method=method, max_buffered=2 * max(workers, 1)) as p:  # all busy
            ours.append(p.describe())
            for rec in p:
                records.append(rec)
                if bar is not None and rec["shard"] not in kept:
                    bar.update(rec["stop"] - rec["start"])
    except WorkerCrashed as e:
        doing = ""
        if e.items is not None and len(e.items):
            first, last = writer._range(min(e.items)), writer._range(max(e.items))
            doing = f" while writing {span(e.items, 'shard')} ({span(range(first.start, last.stop))})"
        elif e.starting:
            doing = " while starting, before its first shard"
        raise e.reworded(f"lazyseq.save: {e.worker}{doing}; the shards finished so far are kept: run the same save "
                         f"again to resume (it writes only the shards not finished){f'. {e.hint}' if e.hint else ''}") \
            from None
    except EvaluationError as e:
        cause = e.__cause__
        if isinstance(cause, (fmt.SchemaError, OtherJob)):  # raised as it is: it names the items
            raise type(cause)(str(cause)) from None
        if isinstance(cause, RemoteWriteError):  # it names the shard and the URL: a failed upload, not an item
            raise RemoteWriteError(f"lazyseq.save: {cause}; the shards uploaded so far are kept: run the same save again "
                                   "to resume", cause.url) from None
        notes = getattr(e, "__notes__", [])
        while notes and any(notes[-1].endswith(f" of {d}") for d in ours):  # the user's pipeline's notes stay
            notes.pop()
        raise
    finally:
        if bar is not None:
            bar.close()
    return records


def save(seq: Any, path: str | os.PathLike, *, nworkers: int = 0, method: str = "process",
         shard_bytes: int = 256 * 2**20, overwrite: bool = False, progress: bool | None = None,
         allow_pickle: bool = False, fingerprint: Any = None, storage_options: dict | None = None,
         block_cache: int = 64 * 2**20, cache_dir: str | os.PathLike | None = None, cache_dir_bytes: int | None = None,
         timeout: float = 30.0) -> None:
    """Evaluate every item of the finite sequence ``seq`` and write them to the directory ``path``.

    Read it back with :func:`lazyseq.load`. Items are nested tuples, lists, dicts and namedtuples
    of numpy arrays and scalars, Python numbers, ``str``, ``bytes`` and ``None``; other objects
    are pickled with ``allow_pickle=True``, refused otherwise. Fields of the same shape in every
    item of a shard are stored as one fixed-stride array, others as flat data with offsets.

    - ``nworkers``, ``method``: the workers that evaluate and write the shards, as for
      :func:`lazyseq.prefetch` (``0``: every usable core); each holds one shard in memory. With
      ``method='ray'`` Ray actors write their shards straight to ``path``, which must then be on a
      filesystem every node sees; only the manifest's entries reach this process.
    - ``shard_bytes``: about how large each shard file is (items per shard are estimated first).
    - ``overwrite``: replace a finished store at ``path``, once the new one is complete.
    - ``progress``: a tqdm bar; ``None`` shows one when stderr is a terminal.
    - ``fingerprint``: what a rerun must match to resume: by default the pipeline's
      :func:`lazyseq.fingerprint`, with functions digested by their code (a save resumes on the
      same Python; a rerun whose pipeline or item function changed refuses, naming what changed),
      or a string of the caller's (a config hash). It is recorded in the manifest.

    An interrupted save (Ctrl-C, a killed worker, an item that raises: :class:`EvaluationError`)
    resumes when run again: the shards already written are checked and kept.

    ``path`` may be a URL of writable object storage (``s3://bucket/train``, ``gs://...``,
    ``memory://`` with threads; ``https://`` is read-only and refused): each worker writes its
    shard to a local temporary file and uploads it under a name of its own, the manifest is
    written last (one PUT), and with ``overwrite=True`` the old store's shards are deleted only
    after it; a lock object with a lease refuses a second save to the same URL while one runs.
    ``storage_options`` go to fsspec (credentials, endpoint; never shown in a message);
    ``timeout``: the seconds a write may take, retries included (an upload: ``timeout`` more per
    32 MiB). ``block_cache``, ``cache_dir`` and ``cache_dir_bytes`` apply to reads
    (:func:`lazyseq.load`) and are accepted here for symmetry. See docs/remote.md.

    >>> import lazyseq, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> lazyseq.save([{'x': np.arange(3) * i, 'y': str(i)} for i in range(5)], os.path.join(d, 's'), method='thread')
    >>> lazyseq.load(os.path.join(d, 's'))[2]
    {'x': array([0, 2, 4]), 'y': '2'}
    """
    if method not in ("thread", "process", "ray"):
        raise ValueError(f"lazyseq.save: method must be 'thread', 'process' or 'ray', got {method!r}")
    if shard_bytes < 1:
        raise ValueError(f"lazyseq.save: shard_bytes must be >= 1, got {shard_bytes}")
    if is_url(path):
        from .upload import save_url  # fsspec is imported only for a URL

        return save_url(seq, str(path), nworkers=nworkers, method=method, shard_bytes=shard_bytes, overwrite=overwrite,
                        progress=progress, allow_pickle=allow_pickle, fingerprint=fingerprint,
                        storage_options=storage_options, timeout=timeout)
    n = _length(seq)
    dest = local_path(path)
    _check_dest(dest, overwrite)
    root = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.lazyseq-partial")
    with _locked(root):
        fingerprint = _default_fingerprint(seq, fingerprint)
        ref, per_shard, resumed = _prepare(Folder(root), seq, n, shard_bytes, allow_pickle, fingerprint, overwrite, dest)
        for d in (root, os.path.join(root, fmt.PROGRESS)):  # what a killed writer left half written
            for name in os.listdir(d):
                if name.endswith(".tmp"):
                    os.remove(os.path.join(d, name))
        writer = ShardWriter(seq, root, n, per_shard, ref, allow_pickle, dest if resumed else None)
        kept: set[int] = set()
        if resumed:  # the shards an earlier run finished: a record and a file of its size (checksums: as they are read)
            for k in range(len(writer)):
                try:
                    rec = fmt.read_json(os.path.join(root, fmt.PROGRESS, fmt.record_name(k)), "record")
                    if os.path.getsize(os.path.join(root, rec["file"])) == rec["bytes"]:
                        kept.add(k)
                except (OSError, KeyError, TypeError):
                    continue
        done = resume_note(writer, kept, dest, progress) if resumed else 0
        records = _run(writer, nworkers, method, _progress_bar(progress, n, dest, done), kept) if n else []
        manifest = make_manifest(n, per_shard, ref, fingerprint, records)
        keep = {r["file"] for r in records}
        for name in os.listdir(root):  # other attempts at a shard, and shards of an earlier layout
            if (name.endswith(".bin") and name not in keep) or name.endswith(".tmp"):
                os.remove(os.path.join(root, name))
        fmt.write_json_atomic(os.path.join(root, fmt.MANIFEST), manifest)
        _check_dest(dest, overwrite)  # another save may have finished there meanwhile
        _swap(root, dest)


def _length(seq: Any) -> int:
    n = length(seq)
    if n is None:
        raise TypeError("lazyseq.save: the sequence must be finite, with a len()")
    return n


def _default_fingerprint(seq: Any, fingerprint: Any) -> Any:
    """The caller's fingerprint, or the pipeline's with functions digested by their code (an
    edited item function refuses to resume)."""
    if fingerprint is not None:
        return fingerprint
    try:
        return pipeline_fingerprint(seq, code=True)
    except NotResumable:
        return None  # (an iterator in the pipeline: only length and structure are checked)


def resume_note(writer: ShardWriter, kept: Collection[int], dest: str, progress: bool | None) -> int:
    """Say on stderr which shards a resumed save keeps (unless ``progress=False``); their items."""
    runs: list[range] = []  # their items, consecutive shards joined
    for k in sorted(kept):
        r = writer._range(k)
        runs[-1:] = [range(runs[-1].start, r.stop)] if runs and runs[-1].stop == r.start else [*runs[-1:], r]
    done = sum(map(len, runs))
    if progress is not False:
        print(f"lazyseq.save: resuming {dest}: kept {len(kept)} of {len(writer)} shards finished before "
              f"(items {', '.join(f'{r[0]}-{r[-1]}' if len(r) > 1 else f'{r[0]}' for r in runs) or 'none'}: "
              f"{done} of {writer.n}); writing the rest", file=sys.stderr)
    return done


def make_manifest(n: int, per_shard: int, ref: tuple, fingerprint: Any, records: list[dict]) -> dict:
    for rec in records:
        rec.pop("resumed", None)
    return {"format": fmt.FORMAT, "version": fmt.VERSION, "length": n, "per_shard": per_shard,
            "structure": ref[0], "fields": _summary(ref[1], records), "fingerprint": fingerprint, "shards": records}


def _summary(fields: list[dict], records: list[dict]) -> list[dict]:
    """The fields, each with ``shape``: the same in every item, or None (variable)."""
    out = []
    for k, f in enumerate(fields):
        shapes = {tuple(r["fields"][k]["shape"]) if "shape" in r["fields"][k] else None for r in records}
        shape = None
        if f["kind"] == "array" and len(shapes) == 1 and None not in shapes:
            shape = list(shapes.pop())
        elif f["kind"] not in ("array", *fmt.BYTES_LIKE):
            shape = []
        out.append({**f, "shape": shape})
    return out
