"""Hugging Face datasets as :func:`~lazyseq.formats.arrow.arrow` reads them: a *plan* (the files
or tables in memory, the rows and columns taken of each, the row mapping) from a folder written by
``save_to_disk`` (its ``state.json``, read without importing ``datasets``) or from a
``datasets.Dataset`` (its table's structure and its ``_indices``).

A folder's listings are a stranger's data: read bounded, every file name a plain name of the
folder. A Dataset's memory-mapped tables carry *replays* (what ``datasets`` did to a file's table);
those that only choose rows and columns (``select``, ``drop``, ``rename_columns``, ``slice``, a
``cast`` that changes no type) are followed, anything else is refused with what to do.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import StoreError
from ..files import urls
from ..files.local import read_data
from .ipc import SUFFIXES, WHAT, index_file
from .sources import Remotes, need, open_source, shown

__all__ = ["plan_folder", "plan_dataset", "is_saved"]

JSON_BYTES = 16 * 2**20  # state.json, dataset_dict.json


def _join(folder: str, name: str) -> str:
    return urls.join(folder, name) if urls.is_url(folder) else os.path.join(folder, name)


def _json(path: str, what: str, remotes: Remotes) -> dict | None:
    """The JSON object in the file ``path`` (local or a URL; read bounded), None if there is none."""
    try:
        if urls.is_url(path):
            data = remotes.of(path).read_whole(path, JSON_BYTES, what)
        else:
            data = read_data(path, what, root=os.path.dirname(os.path.abspath(path)), max_bytes=JSON_BYTES)
    except FileNotFoundError:
        return None
    try:
        out = json.loads(data)
    except ValueError as e:
        raise StoreError(f"{shown(path)} ({what}) is not valid JSON: {e}") from None
    if not isinstance(out, dict):
        raise StoreError(f"{shown(path)} ({what}) is not a JSON object")
    return out


def _plain(name: Any, listed: str, what: str) -> str:
    """``name`` from a stranger's listing, refused unless it names a plain file of the listing's folder."""
    if not isinstance(name, str) or not urls.PLAIN_NAME.fullmatch(name):
        raise StoreError(f"{listed} lists {what} {name!r:.80}: only plain names of files in its own folder are read")
    return name


def is_saved(source: Any, remotes: Remotes) -> bool:
    """Whether ``source`` is a folder (or URL prefix) written by ``save_to_disk``."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    source = os.fspath(source)
    if urls.is_url(source):
        return not source.endswith(SUFFIXES) and any(
            _json(_join(source, n), "a datasets listing", remotes) is not None for n in ("dataset_dict.json", "state.json"))
    return os.path.isdir(source) and any(os.path.lexists(os.path.join(source, n)) for n in ("state.json", "dataset_dict.json"))


def plan_folder(folder: str, split: str | None, remotes: Remotes) -> dict:
    """A ``save_to_disk`` folder (a Dataset, or with ``split`` a DatasetDict): its state.json's files."""
    folder = os.fspath(folder)
    listing = _join(folder, "dataset_dict.json")
    listed_splits = _json(listing, "a DatasetDict's split list", remotes)
    if listed_splits is not None:
        splits = listed_splits.get("splits")
        if not isinstance(splits, list):
            raise StoreError(f"{shown(listing)} (a DatasetDict's split list) has no list of splits")
        splits = [_plain(s, shown(listing), "a split") for s in splits]
        if split not in splits:
            raise ValueError(f"lazyseq.arrow: {shown(folder)} holds a DatasetDict: give split=, one of {splits}"
                             + (f" (not {split!r})" if split is not None else ""))
        folder = _join(folder, split)
    elif split is not None:
        raise ValueError(f"lazyseq.arrow: split={split!r} is for a DatasetDict folder; {shown(folder)} holds no "
                         "dataset_dict.json")
    listed = _join(folder, "state.json")
    state = _json(listed, "a dataset's state", remotes)
    if state is None:
        raise StoreError(f"{shown(listed)} (a dataset's state) is missing: save_to_disk writes it")
    listed = f"{shown(listed)} (a dataset's state)"
    files = state.get("_data_files")
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
        raise StoreError(f"{listed} lists no data files (_data_files)")
    if any(state.get(key) for key in ("_indices_data_files", "_indices_files")):
        raise StoreError(f"{listed} lists an indices file (an older datasets wrote it): load it with "
                         "datasets.load_from_disk and give lazyseq.arrow the Dataset")
    names = [_plain(f.get("filename"), listed, "a data file") for f in files]
    fmt = state.get("_format_columns")
    plain_list = isinstance(fmt, list) and all(isinstance(c, str) for c in fmt)
    default = fmt if plain_list and not state.get("_output_all_columns") else None
    return {"names": names, "paths": [_join(folder, n) for n in names], "parts": [(k, None) for k in range(len(names))],
            "listed": listed, "default_columns": default}


def _replay(replays: list, schema: Any, rows: int, where: str) -> tuple[list[tuple[str, str]], int, int]:
    """Follow a memory-mapped table's replays (what datasets did to the file's table) as far as
    they only choose rows and columns: ``([(column, file column)], first row, rows)``."""
    cols, first, n = [(c, c) for c in schema.names], 0, rows
    for name, args, kwargs in replays or ():
        a = dict(zip(_ARGS.get(name, ()), args), **kwargs)
        if name == "slice":
            off = min(int(a.get("offset", 0)), n)
            first, n = first + off, n - off if a.get("length") is None else min(int(a["length"]), n - off)
        elif name in ("select", "drop", "drop_columns", "remove_column"):
            named = [a["i"]] if name == "remove_column" else list(a["columns"])
            by_name = dict(cols)
            chosen = [cols[c] if isinstance(c, int) else (c, by_name[c]) for c in named]
            cols = chosen if name == "select" else [x for x in cols if x not in chosen]
        elif name == "rename_columns":
            new = a["names"]
            cols = [((new.get(c, c) if isinstance(new, dict) else new[j]), f) for j, (c, f) in enumerate(cols)]
        elif name == "cast":
            file_type = {c: schema.field(f).type for c, f in cols}
            changed = [fl.name for fl in a["target_schema"] if file_type.get(fl.name) != fl.type]
            if changed:
                raise ValueError(f"lazyseq.arrow: {where} has column {changed[0]!r} cast to another type after it was read "
                                 "(cast_column): lazyseq reads files as they are; save_to_disk the dataset and read the folder")
        elif name not in ("replace_schema_metadata", "combine_chunks"):
            raise ValueError(f"lazyseq.arrow: {where} was changed by {name!r} after it was read: lazyseq follows only "
                             "choices of rows and columns; save_to_disk the dataset and read the folder")
    return cols, first, n


_ARGS = {"slice": ("offset", "length"), "select": ("columns",), "drop": ("columns",), "drop_columns": ("columns",),
         "remove_column": ("i",), "rename_columns": ("names",), "cast": ("target_schema",)}


def plan_dataset(ds: Any, remotes: Remotes) -> dict:
    """A ``datasets.Dataset``: its table's files (or tables in memory), the rows and columns it
    takes of each, and its row mapping, so item ``i`` is ``ds[i]``'s row."""
    table_mod = need("datasets.table", "hf", "lazyseq.arrow of a datasets.Dataset")
    t = ds.data
    rows_of_blocks = t.blocks if isinstance(t, table_mod.ConcatenationTable) else [[t]]
    plan: dict = {"names": [], "paths": [], "parts": [], "segments": [], "opened": {}, "remotes": remotes}
    parts: dict = {}
    for row in rows_of_blocks:
        if len(row) != 1:
            raise ValueError("lazyseq.arrow: this dataset's columns come from several tables (add_column, "
                             "concatenate_datasets(axis=1)): save_to_disk it and read the folder")
        leaf = row[0]
        if isinstance(leaf, table_mod.MemoryMappedTable):
            k = _source(plan, leaf.path)
            schema, rows = plan["opened"][k][1].schema, sum(plan["opened"][k][1].rows)
            try:
                cols, first, n = _replay(leaf.replays, schema, rows, shown(leaf.path))
            except (KeyError, IndexError, TypeError) as e:
                raise ValueError(f"lazyseq.arrow: {shown(leaf.path)}'s changes could not be followed ({type(e).__name__}: "
                                 f"{e}): save_to_disk the dataset and read the folder") from None
        else:
            k = _source(plan, leaf.table)
            cols, first, n = [(c, c) for c in leaf.table.schema.names], 0, leaf.num_rows
        if [c for c, _ in cols] != leaf.column_names or n != leaf.num_rows:
            raise ValueError("lazyseq.arrow: this dataset's table could not be followed to its files (columns "
                             f"{leaf.column_names}, {leaf.num_rows} rows; followed: {[c for c, _ in cols]}, {n}): "
                             "save_to_disk it and read the folder")
        p = parts.setdefault((k, tuple(cols)), len(parts))
        if p == len(plan["parts"]):
            plan["parts"].append((k, dict(cols)))
        plan["segments"].append((p, first, n))
    plan["indices"] = _plan_indices(ds._indices, plan, table_mod)
    if getattr(ds, "_format_columns", None) is not None and not getattr(ds, "_output_all_columns", False):
        plan["default_columns"] = list(ds._format_columns)
    return plan


def _source(plan: dict, src: Any) -> int:
    """The index of a file (opened and indexed now) or a table in memory among the plan's sources."""
    if isinstance(src, str):
        if src in plan["paths"]:
            return plan["paths"].index(src)
        opened = open_source(src, WHAT, plan["remotes"])
        plan["opened"][len(plan["paths"])] = (opened, index_file(opened, f"{shown(src)} ({WHAT})"))
    plan["names"].append(os.path.basename(src) if isinstance(src, str) else None)
    plan["paths"].append(src)
    return len(plan["paths"]) - 1


def _plan_indices(indices: Any, plan: dict, table_mod: Any) -> Any:
    """A dataset's row mapping: an indices file read where it lies (a slice of it), else an array."""
    if indices is None:
        return None
    if isinstance(indices, table_mod.MemoryMappedTable) and all(r[0] == "slice" for r in indices.replays or ()):
        k = _source(plan, indices.path)
        _, first, n = _replay(indices.replays, plan["opened"][k][1].schema, sum(plan["opened"][k][1].rows),
                              shown(indices.path))
        return (k, first, n)
    out = indices.column(0).to_numpy().astype(np.int64)
    out.flags.writeable = False
    return ("memory", out)
