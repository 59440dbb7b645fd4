"""``lazyseq.save``: a finite sequence written as a store, in shards that workers write themselves.

The work is a view (:class:`~.job.ShardWriter`, :mod:`.job`) whose item ``k`` evaluates the items
of shard ``k``, writes the shard file and its record, and returns the record; ``save`` reads it
through ``lazyseq.prefetch``, so only the records reach the caller. The shards are written in a
sibling directory ``.NAME.lazyseq-partial`` that becomes ``NAME`` when the manifest is written. A
URL: :mod:`.upload` (the same job, its shards uploaded in place; a lock object: :mod:`.lease`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

from ..files import is_url, local_path
from . import format as fmt
from .job import (
    OtherJob,
    ShardWriter,
    default_fingerprint,
    finite_length,
    make_manifest,
    prepare,
    progress_bar,
    resume_note,
    run_job,
)

__all__ = ["save", "ShardWriter", "OtherJob"]


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


class Folder:
    """The partial directory of a local save, as :func:`prepare` uses it (a URL's: upload.Area)."""

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
    n = finite_length(seq)
    dest = local_path(path)
    _check_dest(dest, overwrite)
    root = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.lazyseq-partial")
    with _locked(root):
        fingerprint = default_fingerprint(seq, fingerprint)
        ref, per_shard, resumed = prepare(Folder(root), seq, n, shard_bytes, allow_pickle, fingerprint, overwrite, dest)
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
        records = run_job(writer, nworkers, method, progress_bar(progress, n, dest, done), kept) if n else []
        manifest = make_manifest(n, per_shard, ref, fingerprint, records)
        keep = {r["file"] for r in records}
        for name in os.listdir(root):  # other attempts at a shard, and shards of an earlier layout
            if (name.endswith(".bin") and name not in keep) or name.endswith(".tmp"):
                os.remove(os.path.join(root, name))
        fmt.write_json_atomic(os.path.join(root, fmt.MANIFEST), manifest)
        _check_dest(dest, overwrite)  # another save may have finished there meanwhile
        _swap(root, dest)


