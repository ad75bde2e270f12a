"""HDF5Dataset: rows of one or more equally long HDF5 datasets, as dicts of tensors, in any loading mode."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np
import torch

from engine.datasets.base import DEFAULT_BLOCK_ROWS, DEFAULT_CACHE_BYTES, FileDataset
from engine.datasets.modes import LoadingMode
from engine.datasets.sizes import sizeof
from engine.datasets.streaming import StreamingMixin

__all__ = ["HDF5Dataset", "StreamingHDF5Dataset"]


class HDF5Dataset(FileDataset):
    """Row ``i`` is ``{row_key: tensor}`` holding element ``i`` (along the first axis) of each chosen HDF5 dataset.

    The file is opened lazily, once per process, on first access (so each DataLoader worker opens its own handle,
    under fork or spawn); an open handle is never pickled. Batched fetches (``__getitems__``) read each dataset
    once per batch: a slice for consecutive indices, else one sorted fancy-index read.

    Args:
        path: The HDF5 file.
        keys: Which datasets to read: a sequence of dataset names (paths such as ``'group/x'`` work; each is also
            its row key), or a mapping ``{dataset_name: row_key}``. None takes every dataset at the file's top
            level, in sorted order.
        mode: A :class:`LoadingMode` (or its name); STREAMING returns a :class:`StreamingHDF5Dataset`.
        cache_bytes: CACHED mode's byte budget per process.
        block_rows: STREAMING's rows per block (set it to the batch size for batches in file order with workers).

    Attributes:
        columns: ``{dataset_name: row_key}`` of the datasets read, as resolved from ``keys``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        OSError: ``path`` is not an HDF5 file.
        KeyError: A dataset in ``keys`` is not in the file (the message lists those that are).
        ValueError: The datasets have different lengths, are scalars, or hold non-numeric data.

    Example:
        >>> ds = HDF5Dataset("train.h5", keys={"images": "pixel_values", "y": "labels"})  # doctest: +SKIP
        >>> ds[0]["pixel_values"].shape  # doctest: +SKIP
        torch.Size([3, 32, 32])
    """

    _process_local = ("_file", "_open")

    def __init__(
        self,
        path: str | os.PathLike[str],
        keys: Sequence[str] | Mapping[str, str] | None = None,
        *,
        mode: LoadingMode | str = LoadingMode.LAZY,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        block_rows: int = DEFAULT_BLOCK_ROWS,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"HDF5 file not found: {str(self.path)!r}; check the path")
        try:
            file = h5py.File(self.path, "r")
        except OSError as error:
            raise OSError(f"cannot open {str(self.path)!r} as an HDF5 file: {error}") from error
        with file:
            self.columns = self._resolve_keys(file, keys)
            num_rows = self._check_datasets(file)
        self._init_mode(num_rows, mode, cache_bytes, block_rows)

    def _resolve_keys(self, file: h5py.File, keys: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
        available = sorted(name for name, item in file.items() if isinstance(item, h5py.Dataset))
        if keys is None:
            if not available:
                raise ValueError(f"{str(self.path)!r} has no datasets at its top level; name them with keys=[...]")
            return {name: name for name in available}
        if isinstance(keys, str):
            raise TypeError(f"keys should be a sequence of dataset names or a mapping, but got keys={keys!r}; "
                            f"for one dataset pass keys=[{keys!r}]")
        resolved = dict(keys) if isinstance(keys, Mapping) else {name: name for name in keys}
        if not resolved:
            raise ValueError("keys is empty; name at least one dataset, or pass keys=None for all of them")
        for name in resolved:
            if not isinstance(file.get(name), h5py.Dataset):
                raise KeyError(
                    f"{str(self.path)!r} has no dataset {name!r}; its datasets are {available} "
                    f"(nested ones are named by path, e.g. 'group/name')"
                )
        if len(set(resolved.values())) != len(resolved):
            raise ValueError(f"keys maps two datasets to one row key: {resolved}; give each a distinct row key")
        return resolved

    def _check_datasets(self, file: h5py.File) -> int:
        lengths = {}
        for name in self.columns:
            dataset = file[name]
            if dataset.shape is None or len(dataset.shape) == 0:
                raise ValueError(f"dataset {name!r} is a scalar; HDF5Dataset needs rows along the first axis")
            if dataset.dtype.kind not in "biuf":
                raise ValueError(
                    f"dataset {name!r} has dtype {dataset.dtype}, but rows are tensors, so only numeric and bool "
                    f"datasets can be read; leave it out of keys"
                )
            lengths[name] = dataset.shape[0]
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{name!r} has {length}" for name, length in lengths.items())
            raise ValueError(f"the datasets have different lengths ({detail} rows); rows pair element i of each, "
                             f"so choose datasets of one length with keys=[...]")
        return next(iter(lengths.values()))

    def _datasets(self) -> dict[str, h5py.Dataset]:
        """``{row_key: h5py.Dataset}`` of this process's handle, opened on first use in the process."""
        datasets = self._owned("_open")
        if datasets is None:  # first access in this process (a worker, or after unpickling or fork)
            self._file = h5py.File(self.path, "r")
            datasets = self._open = {key: self._file[name] for name, key in self.columns.items()}
            self._pid = os.getpid()
        return datasets

    def _read_rows(self, indices: np.ndarray) -> list[dict[str, torch.Tensor]]:
        if len(indices) == 0:
            return []
        start = int(indices[0])
        if np.array_equal(indices, np.arange(start, start + len(indices))):
            return self._read_range(start, start + len(indices))
        # h5py fancy indexing needs increasing, unique indices: read those, then put the rows back in order.
        unique, inverse = np.unique(indices, return_inverse=True)
        columns = {key: torch.from_numpy(np.asarray(data[unique])) for key, data in self._datasets().items()}
        return _rows(columns, None if np.array_equal(unique, indices) else torch.from_numpy(inverse.reshape(-1)))

    def _read_range(self, start: int, stop: int) -> list[dict[str, torch.Tensor]]:
        columns = {key: torch.from_numpy(np.asarray(data[start:stop])) for key, data in self._datasets().items()}
        return _rows(columns)

    def _cache_rows(self, indices: np.ndarray, rows: list[dict[str, torch.Tensor]]) -> None:
        # The rows view the column arrays of one read: cache them as they are, each counted by its own bytes
        # (every row of a read has the same shapes); a row is copied out only if it outlives a neighbour.
        self.cache.put_shared(list(zip(indices.tolist(), rows)), _own_row, [sizeof(rows[0])] * len(rows))

    def _load_all(self) -> None:
        self._columns = {key: torch.from_numpy(np.asarray(data[()])) for key, data in self._datasets().items()}
        self.close()  # everything is in memory now; workers need no handle

    def _memory_rows(self, indices: np.ndarray) -> list[dict[str, torch.Tensor]]:
        return _rows(self._columns, torch.from_numpy(indices))

    def close(self) -> None:
        """Close this process's file handle (reopened on the next access)."""
        if self._owned("_file") is not None:
            self._file.close()
        self._file = self._open = None

    def _describe(self) -> str:
        return f"{str(self.path)!r}, keys={self.columns}"


def _rows(columns: dict[str, torch.Tensor], positions: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
    """Row dicts of ``columns`` (or of their rows at ``positions``, gathered into a new batch): views of the batch."""
    if positions is not None:
        columns = {key: column[positions] for key, column in columns.items()}
    keys = list(columns)
    return [dict(zip(keys, values)) for values in zip(*(column.unbind(0) for column in columns.values()))]


def _own_row(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``row`` whose tensors hold their own memory, not the buffer of the read they came from."""
    return {key: value.clone() for key, value in row.items()}


class StreamingHDF5Dataset(StreamingMixin, HDF5Dataset):
    """:class:`HDF5Dataset` with ``mode=STREAMING``: an ``IterableDataset`` reading blocks of rows as slices,
    in file order, each row once across workers and ranks. Constructed by ``HDF5Dataset(..., mode='streaming')``
    (or directly, where it always streams)."""


HDF5Dataset._streaming_class = StreamingHDF5Dataset
