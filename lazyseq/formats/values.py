"""Arrow columns as the values of a row: how every format of this package turns a decoded block
(a Parquet row group, an Arrow record batch, a Lance take) into items.

A block is converted once, column by column, into *getters* (``getter(j)`` is row ``j``'s value);
an item is then a dict built from them, with no Arrow object per value:

- integers, floats, bools: numpy scalars of the column's type (``np.int64(3)``);
- lists (variable or fixed size) of numbers: 1-D numpy arrays, read-only views of the decoded
  block (no copy); a list holding a null, and lists of other values: Python lists of their
  values by these rules;
- strings: ``str``; binary: ``bytes``; structs: dicts by these rules; nulls: ``None``;
- dictionary-encoded columns: the values they encode; extension types (an HF ``Array2D``, a
  ``uuid``): their storage, so nothing registered by another library decides what is read;
- any other type (timestamps, decimals, maps): the Python value pyarrow gives (``.as_py()``).

>>> import pyarrow as pa
>>> b = pa.record_batch({"x": [1, None], "t": ["a", "bc"], "v": [[1.0, 2.0], []]})
>>> rows = Rows(b)
>>> rows.row(0)
{'x': np.int64(1), 't': 'a', 'v': array([1., 2.])}
>>> rows.row(1)["x"] is None, rows.row(1)["v"].shape
(True, (0,))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Rows", "getter", "gatherer", "collate"]

Getter = Callable[[int], Any]


_PA: list[Any] = []


def _pa() -> Any:
    if not _PA:
        import pyarrow as pa

        _PA.append(pa)
    return _PA[0]


def _numeric(t: Any) -> bool:
    pa = _pa()
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _valid(arr: Any) -> np.ndarray | None:
    """Row ``j`` is not null where the result is True; None when no row is null."""
    return arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None


def _with_nulls(arr: Any, get: Getter) -> Getter:
    valid = _valid(arr)
    if valid is None:
        return get
    return lambda j: get(j) if valid[j] else None


def _numbers(arr: Any) -> np.ndarray:
    """The values of a numeric array as numpy, nulls as zeros (the getter answers None for them)."""
    if arr.null_count:
        arr = arr.fill_null(False if _pa().types.is_boolean(arr.type) else 0)
    out = arr.to_numpy(zero_copy_only=False)
    out.flags.writeable = False  # a view of the decoded block, which other reads share
    return out


def _offsets(arr: Any) -> np.ndarray:
    """The ``len + 1`` offsets of a variable-size array (strings, binary, lists), its slice applied."""
    pa = _pa()
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) or pa.types.is_large_list(arr.type)
    return np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32, len(arr) + 1, arr.offset * (8 if wide else 4))


def _int_offsets(arr: Any) -> memoryview | np.ndarray:
    """The offsets of :func:`_offsets` as a memoryview of the buffer, whose items are Python ints
    (a numpy scalar costs an ``int()`` per use; a list, a conversion per block however few rows are read)."""
    off = _offsets(arr)
    return memoryview(off).cast("B").cast(off.dtype.char) if len(off) else off


def _text(arr: Any, as_str: bool) -> Getter:
    data = arr.buffers()[2]
    data = memoryview(data) if data is not None else memoryview(b"")
    off = _int_offsets(arr)
    if as_str:
        return _with_nulls(arr, lambda j: str(data[off[j] : off[j + 1]], "utf-8"))
    return _with_nulls(arr, lambda j: bytes(data[off[j] : off[j + 1]]))


def _fixed_binary(arr: Any) -> Getter:
    w, data = arr.type.byte_width, arr.buffers()[1]
    data, base = (memoryview(data) if data is not None else memoryview(b"")), arr.offset * arr.type.byte_width
    return _with_nulls(arr, lambda j: bytes(data[base + j * w : base + (j + 1) * w]))


def _list(arr: Any) -> Getter:
    if _pa().types.is_fixed_size_list(arr.type):
        w = arr.type.list_size
        values, off = arr.values.slice(arr.offset * w, len(arr) * w), range(0, (len(arr) + 1) * w, w)
    else:
        values, off = arr.values, _int_offsets(arr)
    inner = getter(values)
    if not _numeric(_storage_type(values.type)):
        return _with_nulls(arr, lambda j: [inner(k) for k in range(off[j], off[j + 1])])
    flat = _numbers(_storage(values))
    if not _storage(values).null_count:
        return _with_nulls(arr, lambda j: flat[off[j] : off[j + 1]])
    holes = np.concatenate([[0], np.cumsum(~_valid(_storage(values)))])  # null values before each
    return _with_nulls(arr, lambda j: flat[off[j] : off[j + 1]] if holes[off[j + 1]] == holes[off[j]]
                       else [inner(k) for k in range(off[j], off[j + 1])])  # a row holding a null: a list


def _struct(arr: Any) -> Getter:
    fields = [(arr.type.field(k).name, getter(arr.field(k))) for k in range(arr.type.num_fields)]
    return _with_nulls(arr, lambda j: {name: get(j) for name, get in fields})


def _dictionary(arr: Any) -> Getter:
    codes, values = _numbers(arr.indices), getter(arr.dictionary)
    return _with_nulls(arr, lambda j: values(int(codes[j])))


def _storage(arr: Any) -> Any:
    while isinstance(arr.type, _pa().BaseExtensionType):
        arr = arr.storage
    return arr


def _storage_type(t: Any) -> Any:
    while isinstance(t, _pa().BaseExtensionType):
        t = t.storage_type
    return t


_KINDS: dict[Any, str] = {}  # Arrow type -> how its values are read (types are few; looked up per block)


def _kind(t: Any) -> str:
    kind = _KINDS.get(t)
    if kind is None:
        pa = _pa()
        kind = ("null" if pa.types.is_null(t) else "number" if _numeric(t)
                else "str" if pa.types.is_string(t) or pa.types.is_large_string(t)
                else "bytes" if pa.types.is_binary(t) or pa.types.is_large_binary(t)
                else "fixed" if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t)
                else "list" if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
                else "struct" if pa.types.is_struct(t) else "dictionary" if pa.types.is_dictionary(t) else "other")
        if len(_KINDS) < 4096:
            _KINDS[t] = kind
    return kind


def getter(arr: Any) -> Getter:
    """``get(j)``: row ``j`` of the Arrow array ``arr`` (a ChunkedArray is combined first) as this
    module's rules say."""
    pa = _pa()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = _storage(arr)
    kind = _kind(arr.type)
    if kind == "number":
        return _with_nulls(arr, _numbers(arr).__getitem__)
    if kind in ("str", "bytes"):
        return _text(arr, kind == "str")
    if kind == "null":
        return lambda j: None
    if kind == "fixed":
        return _fixed_binary(arr)
    if kind == "list":
        return _list(arr)
    if kind == "struct":
        return _struct(arr)
    if kind == "dictionary":
        return _dictionary(arr)
    return lambda j: arr[j].as_py()  # timestamps, decimals, maps, views, unions: as pyarrow gives them


Gather = Callable[[np.ndarray], Any]


def gatherer(arr: Any) -> Gather | None:
    """``gather(js)``: ``default_collate`` of rows ``js`` (an int64 array) of the Arrow array
    ``arr``, built from the decoded buffers without an Arrow ``take`` (numbers and lists of
    numbers: one numpy gather; strings and bytes: one slice of the data each); NotImplemented for
    lists of unequal lengths. None where the column is not gathered so (nulls, dictionaries,
    structs, other types: the caller takes the rows by Arrow, :func:`collate`)."""
    pa = _pa()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    arr = _storage(arr)
    kind = _kind(arr.type)
    if arr.null_count or not len(arr) or kind not in ("number", "str", "bytes", "list"):
        return None
    if kind == "number":
        return _numbers(arr).__getitem__  # a fancy index: a new array, as default_collate's
    if kind == "str":
        return _strings(arr)
    if kind == "bytes":  # images, mostly: a copy of each one asked for, never of the whole block
        data, off = memoryview(arr.buffers()[2] or b""), _int_offsets(arr)
        return lambda js: [bytes(data[off[j] : off[j + 1]]) for j in js.tolist()]
    values = _storage(arr.values)
    if not _numeric(values.type):
        return None
    if pa.types.is_fixed_size_list(arr.type):
        w = arr.type.list_size
        values = values.slice(arr.offset * w, len(arr) * w)
        if values.null_count:
            return None
        return _numbers(values).reshape(len(arr), w).__getitem__
    if values.null_count:
        return None
    flat, off = _numbers(values), _offsets(arr).astype(np.int64)

    def gather(js: np.ndarray) -> Any:
        first, n = off[js], off[js + 1] - off[js]
        if len(n) and (n != n[0]).any():
            return NotImplemented
        return flat[first[:, None] + np.arange(n[0] if len(n) else 0)]

    return gather


def _strings(arr: Any) -> Gather:
    """The gather of a string column: every string made at once by Arrow (~35 ns each, then shared)
    once a read asks for an eighth of the block or more; row by row before that, so that batches of
    rows scattered over many blocks (a random sampler) do not convert whole blocks."""
    data, off, n, made = memoryview(arr.buffers()[2] or b""), _int_offsets(arr), len(arr), [None]

    def gather(js: np.ndarray) -> list[str]:
        texts = made[0]
        if texts is None and len(js) * 8 >= n:
            texts = made[0] = arr.to_pylist()  # two threads may both make it: the same list, no harm
        if texts is not None:
            return [texts[j] for j in js.tolist()]
        return [str(data[off[j] : off[j + 1]], "utf-8") for j in js.tolist()]

    return gather


class Rows:
    """The rows of a decoded block (an Arrow Table or RecordBatch) as dicts ``{column: value}``, in
    the block's column order: ``row(j)``, ``rows(js)``, and by columns ``columns(js)``; ``table``
    is the block (for reads by Arrow). Built once per block, read many times."""

    __slots__ = ("names", "getters", "n", "table", "_gathers")

    def __init__(self, block: Any):
        self.names = list(block.schema.names)
        self.getters = [getter(block.column(k)) for k in range(block.num_columns)]
        self.n = block.num_rows
        self.table = block
        self._gathers: list | None = None  # made at the first read by columns: most blocks see none

    def columns(self, js: np.ndarray) -> list | None:
        """``default_collate`` of rows ``js`` column by column (:func:`gatherer`), in the block's
        column order; None where a column is not gathered so, NotImplemented where its rows would
        not stack."""
        if self._gathers is None:
            self._gathers = [gatherer(self.table.column(k)) for k in range(len(self.names))]
        if None in self._gathers:
            return None
        return [gather(js) for gather in self._gathers]

    def __len__(self) -> int:
        return self.n

    def row(self, j: int) -> dict:
        return {name: get(j) for name, get in zip(self.names, self.getters)}

    def rows(self, js: Sequence[int]) -> list[dict]:
        names, getters = self.names, self.getters
        return [{name: get(j) for name, get in zip(names, getters)} for j in js]


def _column(col: Any) -> Any:
    """``default_collate`` of a column's values, or NotImplemented where the items' values would not
    stack the same way (nulls, structs, lists of unequal lengths, other types)."""
    pa = _pa()
    col = _storage(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if col.null_count:
        return NotImplemented
    if _numeric(t):
        return np.array(col.to_numpy(zero_copy_only=False))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return col.to_pylist()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        values = _storage(col.flatten())
        if not _numeric(values.type) or values.null_count:
            return NotImplemented
        n = len(col)
        lengths = None if pa.types.is_fixed_size_list(t) else np.diff(_offsets(col))
        if lengths is None or (lengths == lengths[0]).all():
            return np.array(values.to_numpy(zero_copy_only=False)).reshape(n, len(values) // n)
        return NotImplemented
    return NotImplemented


def collate(table: Any) -> Any:
    """``lazyseq.default_collate`` of the rows of ``table`` (an Arrow Table) as items, built by
    columns: a dict of arrays (numbers, lists of numbers of one length) and lists (str, bytes);
    NotImplemented where a column's items would not stack so (the caller then reads the items).

    >>> import pyarrow as pa
    >>> collate(pa.table({"x": [1, 2], "v": [[1.0, 2.0], [3.0, 4.0]], "t": ["a", "b"]}))
    {'x': array([1, 2]), 'v': array([[1., 2.],
           [3., 4.]]), 't': ['a', 'b']}
    """
    out = {}
    for name, col in zip(table.schema.names, table.columns):
        if not len(col):
            return NotImplemented
        got = _column(col.combine_chunks() if isinstance(col, _pa().ChunkedArray) else col)
        if got is NotImplemented:
            return NotImplemented
        out[name] = got
    return out
