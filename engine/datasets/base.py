"""FileDataset: the loading modes shared by the file-backed datasets (HDF5, image folder, text files).

A subclass says how to read rows from its files (``_read_rows``), optionally how to read a run of consecutive rows
faster (``_read_range``), and how to hold everything in memory (``_load_all`` / ``_memory_rows``); this base turns
that into LAZY, EAGER and CACHED map-style access with batched fetch (``__getitems__``), and, through its
streaming subclass, into STREAMING iteration. Process-local state (open file handles) is listed in
``_process_local``: it is dropped when the dataset is pickled and reopened on first use in each process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from engine.core import distributed
from engine.core.checks import check_int
from engine.datasets.cache import ByteBudgetLRU
from engine.datasets.modes import LoadingMode, resolve_mode

__all__ = ["DEFAULT_BLOCK_ROWS", "DEFAULT_CACHE_BYTES", "FileDataset"]

DEFAULT_CACHE_BYTES = 256 * 2**20
"""Byte budget of the CACHED mode's LRU cache (per process) unless ``cache_bytes`` is given."""
DEFAULT_BLOCK_ROWS = 64
"""Rows per block handed to one STREAMING worker unless ``block_rows`` is given."""


class FileDataset(Dataset):
    """Base of the file-backed datasets. ``FileDataset(..., mode=LoadingMode.STREAMING)`` constructs the
    subclass named by ``_streaming_class`` (an ``IterableDataset``) instead of the map-style class."""

    _streaming_class: ClassVar[type | None] = None
    _process_local: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, mode: LoadingMode | str = LoadingMode.LAZY, **kwargs: Any) -> FileDataset:
        if resolve_mode(mode) is LoadingMode.STREAMING and not issubclass(cls, IterableDataset):
            streaming = cls._streaming_class
            if streaming is None or not issubclass(streaming, cls):
                raise TypeError(
                    f"{cls.__name__} has no streaming class of its own, so mode=STREAMING cannot keep its behaviour; "
                    f"define `class Streaming{cls.__name__}(StreamingMixin, {cls.__name__})` and set "
                    f"{cls.__name__}._streaming_class to it"
                )
            cls = streaming
        return super().__new__(cls)

    def _init_mode(self, num_rows: int, mode: LoadingMode | str, cache_bytes: int, block_rows: int) -> None:
        """Record the mode (a streaming class always streams) and, for EAGER, read everything now."""
        self.mode = LoadingMode.STREAMING if isinstance(self, IterableDataset) else resolve_mode(mode)
        check_int("cache_bytes", cache_bytes, minimum=0)
        check_int("block_rows", block_rows, minimum=1)
        self.num_rows = num_rows
        self.block_rows = block_rows
        self.cache = ByteBudgetLRU(cache_bytes) if self.mode is LoadingMode.CACHED else None
        self._saved_rank = distributed.rank_and_world()
        for name in self._process_local:
            setattr(self, name, None)
        if self.mode is LoadingMode.EAGER:
            self._load_all()

    # -- what subclasses provide ----------------------------------------------------------------------

    def _read_rows(self, indices: np.ndarray) -> list[Any]:
        """The rows at ``indices`` (in that order, valid, possibly repeated), read from the files."""
        raise NotImplementedError

    def _read_range(self, start: int, stop: int) -> list[Any]:
        """Rows ``start..stop-1``, read sequentially (STREAMING); override when a run reads faster."""
        return self._read_rows(np.arange(start, stop, dtype=np.int64))

    def _load_all(self) -> None:
        """EAGER: read every row into memory (flat buffers, not a list of objects per row)."""
        raise NotImplementedError

    def _memory_rows(self, indices: np.ndarray) -> list[Any]:
        """EAGER: the rows at ``indices`` from memory."""
        raise NotImplementedError

    # -- map-style access -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The rows at ``indices`` in one batched read (the DataLoader and the engine's sources call this)."""
        positions = self._check_indices(indices)
        if self.mode is LoadingMode.EAGER:
            return self._memory_rows(positions)
        if self.mode is LoadingMode.CACHED:
            return self._cached_rows(positions)
        return self._read_rows(positions)

    def _check_indices(self, indices: Sequence[int]) -> np.ndarray:
        try:
            positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"indices should be ints, but got {indices!r}") from None
        positions = np.where(positions < 0, positions + self.num_rows, positions)
        bad = (positions < 0) | (positions >= self.num_rows)
        if bad.any():
            index = np.asarray(indices).reshape(-1)[int(np.flatnonzero(bad)[0])]
            raise IndexError(f"index {index} is out of range for {type(self).__name__} of {self.num_rows} rows")
        return positions

    def _cached_rows(self, positions: np.ndarray) -> list[Any]:
        keys = positions.tolist()
        rows = self.cache.get_many(keys)
        missing = [j for j, row in enumerate(rows) if row is None]
        if missing:
            wanted = sorted({keys[j] for j in missing})  # once each, in file order
            indices = np.array(wanted, dtype=np.int64)
            fresh = self._read_rows(indices)
            self._cache_rows(indices, fresh)
            by_index = dict(zip(wanted, fresh))
            for j in missing:
                rows[j] = by_index[keys[j]]
        # Fresh dicts, so a caller that adds or replaces a key does not change the cached row.
        return [dict(row) if isinstance(row, dict) else row for row in rows]

    def _cache_rows(self, indices: np.ndarray, rows: list[Any]) -> None:
        """Cache the freshly read ``rows`` at ``indices``; subclasses whose rows view one read's buffer override
        this to cache them with ``ByteBudgetLRU.put_shared`` (no copy per row, and the bytes held still counted)."""
        self.cache.put_many(list(zip(indices.tolist(), rows)))

    # -- process-local state --------------------------------------------------------------------------

    def _owned(self, name: str) -> Any:
        """The process-local value ``name`` if this process opened it, else None (after fork or unpickling)."""
        value = getattr(self, name, None)
        return value if value is not None and getattr(self, "_pid", None) == os.getpid() else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in (*self._process_local, "_pid"):
            state[name] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._describe()}, mode={self.mode.name}, rows={self.num_rows})"

    def _describe(self) -> str:
        return ""

