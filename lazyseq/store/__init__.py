"""Datasets on disk: :func:`save` writes a sequence as shard files and a manifest, :func:`load`
reads them back as a :class:`Store` view (memory-mapped, zero-copy). Format: docs/store.md."""

from ..errors import StoreError
from .format import SchemaError
from .read import Store, load
from .write import save

__all__ = ["save", "load", "Store", "StoreError", "SchemaError"]
