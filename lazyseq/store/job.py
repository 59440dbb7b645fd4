"""A save's job, wherever it writes: the view whose item ``k`` writes shard ``k``
(:class:`ShardWriter`), the plan from the first items, the job file a rerun resumes from, the run
through ``lazyseq.prefetch`` and the manifest. :mod:`.write` puts it in a local folder,
:mod:`.upload` under a URL."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Collection
from typing import Any

import numpy as np

from ..core import tree
from ..core.base import View
from ..core.fingerprints import NotResumable, difference
from ..core.fingerprints import fingerprint as pipeline_fingerprint
from ..core.node import Failed, length, read_each, reader
from ..errors import EvaluationError, WorkerCrashed, wrap_error
from ..files import RemoteWriteError
from ..helpers import span, usable_cores
from . import format as fmt
from .shardfile import finished, write_shard

__all__ = ["ShardWriter", "OtherJob", "make_manifest", "resume_note"]

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


class OtherJob(FileExistsError):
    """The interrupted save in a partial directory is of another job than the one asked for."""


def _other_job(root: str, dest: str, why: str) -> OtherJob:
    return OtherJob(f"lazyseq.save: {root} holds an interrupted save of another job ({why}), which a rerun can resume; "
                    f"to save this job to {dest} instead, pass overwrite=True or delete that directory")


def prepare(area: Any, seq: Any, n: int, shard_bytes: int, allow_pickle: bool, fingerprint: Any,
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


def progress_bar(progress: bool | None, n: int, dest: str, done: int = 0) -> Any:
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


def run_job(writer: ShardWriter, nworkers: int, method: str, bar: Any, kept: Collection[int] = ()) -> list[dict]:
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


def finite_length(seq: Any) -> int:
    n = length(seq)
    if n is None:
        raise TypeError("lazyseq.save: the sequence must be finite, with a len()")
    return n


def default_fingerprint(seq: Any, fingerprint: Any) -> Any:
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
