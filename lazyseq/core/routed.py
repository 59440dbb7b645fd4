"""The base of views whose item ``i`` is item ``j`` of part ``k`` of several sequences
(concatenate, interleave, mixtures, the DataLoader's epochs): single reads route through
``_where``, bulk reads group the indices by part and read each part once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import View
from .node import each, into, read_each, read_many

__all__ = ["Routed"]


class Routed(View):
    """A view whose item ``i`` is item ``j`` of part ``k``, for ``(k, j) = _where(i)``.

    The parts are ``seqs`` (with their readers in ``_rds``), or whatever ``_part(k)`` returns for
    views that make their parts on demand (override ``_part`` and ``_reader``). Bulk reads group
    the indices by part and read each part once."""

    seqs: tuple
    _rds: tuple

    def _where(self, i: int) -> tuple[int, int]:
        raise NotImplementedError

    def _part(self, k: int) -> Any:
        return self.seqs[k]

    def _reader(self, k: int) -> Callable[[int], Any]:
        return self._rds[k]

    def _get(self, i: int) -> Any:
        k, j = self._where(i)
        return self._reader(k)(j)

    def _grouped(self, idx: Sequence[int], read: Callable[[Any, Sequence[int]], list]) -> list:
        where = [self._where(i) for i in idx]
        parts: dict[int, list[int]] = {}
        for k, j in where:
            parts.setdefault(k, []).append(j)
        got = {k: iter(self._read_part(k, read, js)) for k, js in parts.items()}
        return [next(got[k]) for k, _ in where]

    def _read_part(self, k: int, read: Callable[[Any, Sequence[int]], list], js: list[int]) -> list:
        """Items ``js`` of part ``k`` by ``read`` (``read_many`` or ``read_each``): one call per part."""
        return read(self._part(k), js)

    def _get_many(self, idx: Sequence[int]) -> list:
        return self._grouped(idx, read_many)

    def _get_each(self, idx: Sequence[int], out: list | None = None) -> list:
        try:
            items = self._grouped(idx, read_each)
        except Exception:  # _where itself failed for some index: item by item
            return each(self._get, idx, out)
        return into(out, items)

    def _set(self, i: int, value: Any) -> None:
        k, j = self._where(i)
        self._part(k)[j] = value

    def children(self) -> tuple:
        return self.seqs
