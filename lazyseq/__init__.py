"""lazyseq: lazy, random-access data pipelines for machine learning.

Every function returns a view: an indexable sequence that computes an item only when it is read.
The API is a superset of seqtools' (``import lazyseq as seqtools`` works).
"""

from . import instrument
from .core.base import View
from .core.fingerprints import fingerprint
from .core.moved import alias_earlier_names
from .core.moved import earlier_module as __getattr__  # noqa: F401 - lazyseq.base after import lazyseq.base
from .core.serialization import SerializableFunc
from .core.workerinfo import worker_info
from .errors import (
    EvaluationError,
    PrefetchClosed,
    PrefetchTimeout,
    RemoteReadError,
    RemoteWriteError,
    ResumeMismatch,
    StoreError,
    WorkerCrashed,
    WorkerStartError,
    seterr,
)
from .evaluation import empty, empty_like, prefetch, shutdown_ray
from .evaluation.filtering import filter  # (the builtin is not used in this module)
from .formats.array_record import array_record
from .formats.arrow import arrow
from .formats.lance import lance
from .formats.litdata import litdata
from .formats.mds import mds
from .formats.parquet import parquet
from .formats.webdataset import webdataset
from .loader.batching import pad_collate, varlen_collate
from .loader.dataloader import DataLoader, default_collate
from .loader.tensor import to_tensor
from .loader.tojax import to_jax
from .loader.totorch import to_torch
from .store import Store, load, save
from .views.bucketing import bucket
from .views.caching import add_cache
from .views.chunked import block_shuffle, chunks
from .views.epochs import at_epoch
from .views.faults import Skip, on_error
from .views.indexing import arange, case, cycle, gather, interleave, repeat, switch, take, uniter
from .views.mapping import smap, starmap
from .views.mixing import mix
from .views.order import shard, shuffle
from .views.packing import pack
from .views.schedules import schedule
from .views.shape import Pad, batch, collate, concatenate, split, unbatch

alias_earlier_names()  # pickles and fingerprints written before the layout by layer (lazyseq.core.moved)

__version__ = "0.1.0"

__all__ = [
    "DataLoader", "default_collate", "to_tensor", "to_torch", "to_jax", "worker_info",
    "Store", "StoreError", "RemoteReadError", "RemoteWriteError", "load", "save", "fingerprint", "ResumeMismatch",
    "EvaluationError", "Pad", "PrefetchClosed", "PrefetchTimeout", "View", "WorkerCrashed",
    "WorkerStartError", "add_cache", "arange", "batch", "case", "collate", "concatenate", "cycle", "empty",
    "empty_like", "filter", "gather", "instrument", "interleave", "prefetch", "repeat", "seterr", "shard", "shuffle",
    "smap", "split", "starmap", "switch", "take", "unbatch", "uniter",
    "Skip", "at_epoch", "block_shuffle", "chunks", "on_error",
    "SerializableFunc",
    "mix", "schedule",
    "shutdown_ray",
    "pack", "bucket", "pad_collate", "varlen_collate",
    "parquet", "arrow", "lance", "webdataset", "mds", "array_record", "litdata",
]
