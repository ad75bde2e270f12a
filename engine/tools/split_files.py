"""Splits stored as index files: ``<dir>/{split}_idx.pt`` holds the row indices of one split of a dataset.

Indices are checked when they are loaded, not when a worker first fetches a bad row: each file must hold a 1-D
integer tensor of distinct indices in ``[0, dataset size)``, and the standard splits (train/val/test) present
in the directory must not share a row.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory
from engine.sampling.epochs import set_epoch
from engine.sources.adapt import as_source

SUFFIX = "_idx.pt"
STANDARD_SPLITS = ("train", "val", "test")
"""Splits checked against each other for overlap."""


def split_path(dataset_dir: str | Path, split: str) -> Path:
    """Where the indices of ``split`` live: ``<dataset_dir>/{split}_idx.pt``; a split named with a path separator,
    which would read a file outside ``dataset_dir`` (``../other/train``), is refused."""
    if not isinstance(split, str) or any(separator in split for separator in {"/", "\\", os.sep, os.altsep or "/"}):
        raise ValueError(f"split should be the name of a split file in dataset_dir (the file {{split}}{SUFFIX}), "
                         f"without a path separator, but got split={split!r}, which would read "
                         f"{Path(dataset_dir) / f'{split}{SUFFIX}'} outside {dataset_dir}; pass the folder that "
                         f"holds the file as dataset_dir and its name as split")
    return Path(dataset_dir) / f"{split}{SUFFIX}"


def available_splits(dataset_dir: str | Path) -> list[str]:
    """The splits that have an index file in ``dataset_dir``, sorted."""
    directory = Path(dataset_dir)
    return sorted(p.name[: -len(SUFFIX)] for p in directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []


def _read(path: Path, split: str, dataset_size: int | None) -> np.ndarray:
    """Load one index file and check its type, rank, range and uniqueness."""
    try:
        loaded: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling raises several types; all mean "not a plain tensor file"
        raise ValueError(f"could not read split file {path} with torch.load(weights_only=True) "
                         f"({type(error).__name__}: {error}); save the indices with torch.save(tensor, path)"
                         ) from error
    if isinstance(loaded, (list, tuple)):
        try:
            loaded = torch.as_tensor(loaded)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"split file {path} holds a {type(loaded).__name__} that is not a list of ints") from error
    if not isinstance(loaded, torch.Tensor):
        raise TypeError(f"split file {path} should hold a 1-D integer tensor of row indices, but holds a "
                        f"{type(loaded).__name__}; save it with torch.save(torch.tensor(indices), path)")
    if loaded.dtype == torch.bool or loaded.is_floating_point() or loaded.is_complex():
        raise TypeError(f"split file {path} should hold integer row indices, but its tensor has dtype {loaded.dtype}; "
                        f"convert with .long() (a bool tensor is a mask: use mask.nonzero().flatten())")
    if loaded.dim() != 1:
        raise ValueError(f"split file {path} should hold a 1-D tensor of row indices, but its tensor has shape "
                         f"{list(loaded.shape)}; flatten it or save one split per file")
    indices = loaded.to(torch.int64).numpy()
    if dataset_size is not None and indices.size:
        bad = indices[(indices < 0) | (indices >= dataset_size)]
        if bad.size:
            raise ValueError(f"split {split!r} ({path}) holds index {int(bad[0])}, but the dataset has {dataset_size} "
                             f"rows (valid indices 0..{dataset_size - 1}); {bad.size} index(es) out of range. Were the "
                             f"indices made for another dataset?")
    unique, counts = np.unique(indices, return_counts=True)
    if unique.size != indices.size:
        repeated = unique[counts > 1]
        raise ValueError(f"split {split!r} ({path}) repeats {repeated.size} index(es), e.g. {repeated[:5].tolist()}; "
                         f"each row should appear once per split (deduplicate with torch.unique)")
    return indices


def load_split_indices(
    dataset_dir: str | Path, split: str, *, dataset_size: int | None = None, check_overlap: bool = True
) -> np.ndarray:
    """The row indices of ``split``, read from ``<dataset_dir>/{split}_idx.pt`` and checked.

    Args:
        dataset_dir: Directory holding the ``*_idx.pt`` files.
        split: Name of the split (``train``, ``val``, ``test`` or any other file present).
        dataset_size: Rows in the dataset; indices outside ``[0, dataset_size)`` raise. None skips the check.
        check_overlap: For a standard split, also read the other standard splits present and raise if they share
            a row (a leak between train and evaluation).

    Returns:
        An int64 numpy array, in file order (as ``MapSource.view`` takes it).

    Raises:
        ValueError: A split named with a path separator, a missing file (naming the path and the splits present), an
            empty one, an index out of range (naming it and the size), not 1-D, repeated indices, or overlap between
            standard splits.
        TypeError: The file holds no integer tensor.

    Example:
        >>> import tempfile, torch
        >>> directory = tempfile.mkdtemp()
        >>> torch.save(torch.tensor([0, 2, 4]), f"{directory}/train_idx.pt")
        >>> load_split_indices(directory, "train", dataset_size=5).tolist()
        [0, 2, 4]
    """
    path = split_path(dataset_dir, split)
    if not path.is_file():
        present = available_splits(dataset_dir)
        raise ValueError(f"split file not found: {path}; the valid splits in {dataset_dir} are {present or 'none'} "
                         f"(files named {{split}}{SUFFIX})")
    indices = _read(path, split, dataset_size)
    if not indices.size:
        raise ValueError(f"split file {path} should hold at least one row index, but got an empty tensor: a loader "
                         f"over split {split!r} would give 0 batches; rebuild the file with the split's rows, or "
                         f"delete it and leave the split out")
    if check_overlap and split in STANDARD_SPLITS:
        for other in STANDARD_SPLITS:
            other_path = split_path(dataset_dir, other)
            if other == split or not other_path.is_file():
                continue
            shared = np.intersect1d(indices, _read(other_path, other, dataset_size))
            if shared.size:
                raise ValueError(f"splits {split!r} and {other!r} share {shared.size} row(s), e.g. "
                                 f"{shared[:5].tolist()}: rows in both would leak between training and evaluation; "
                                 f"rebuild the split files so they are disjoint")
    return indices


def create_loader(
    dataset_dir: str | Path,
    split: str,
    *,
    dataset: Any,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    drop_last: bool | None = None,
    shuffle: bool | None = None,
    collate_fn: Any = None,
    pin_memory: bool | None = None,
    epoch: int = 0,
    rank: int = 0,
    num_replicas: int = 1,
) -> StatefulDataLoader:
    """An engine loader over the rows of ``dataset`` listed in ``<dataset_dir>/{split}_idx.pt``.

    Args:
        dataset_dir, split: Where the split's indices are (see :func:`load_split_indices`).
        dataset: The full dataset the indices point into (anything ``engine.sources.adapt.as_source`` takes).
        batch_size, num_workers, seed, collate_fn, pin_memory: As in :class:`DataLoaderConfig`.
        drop_last: Drop the last incomplete batch; None means True for ``train`` and False otherwise.
        shuffle: Seeded shuffle per epoch; None means True for ``train`` only.
        epoch: The epoch the first iteration starts at (reaches the sampler and a curriculum dataset).
        rank, num_replicas: This process's share of the split under data parallelism.

    Returns:
        A ``StatefulDataLoader`` whose dataset is a view of the split (no rows are copied).
    """
    source = as_source(dataset)
    indices = load_split_indices(dataset_dir, split, dataset_size=len(source))
    train = split == "train"
    config = DataLoaderConfig(
        batch_size=batch_size, num_workers=num_workers, seed=seed, collate_fn=collate_fn, pin_memory=pin_memory,
        shuffle=train if shuffle is None else shuffle, drop_last=train if drop_last is None else drop_last,
    )
    loader = DataLoaderFactory().create_dataloader(source.view(indices), config, rank=rank, num_replicas=num_replicas)
    if epoch:
        set_epoch(loader, epoch)
    return loader
