"""``set_epoch`` for a whole loader: its samplers, its dataset and the datasets that dataset wraps.

Curriculum datasets change their rows with the epoch, and distributed samplers their order. A loader holds
both, several layers deep (the engine's sources wrap the user's dataset in ``.dataset``), so one call reaches
every object on the path that defines ``set_epoch``.

Persistent workers hold their own copy of the dataset, made when they started, so a ``set_epoch`` in the parent
never reaches them (datasets #6673) and every epoch would repeat the first. Samplers run in the parent and are
not affected. When a dataset's epoch changes and the loader keeps persistent workers from an epoch that has
finished, :func:`set_epoch` shuts those workers down; the next ``iter(loader)`` starts new ones, which copy the
dataset with its new epoch. That costs one worker start per epoch, only for loaders whose dataset takes an epoch.
Workers in the middle of an epoch are left running (restarting them would drop the batches they prepared), and
a warning says so: call ``set_epoch`` between epochs, before ``iter(loader)``. Such a loader is remembered, and
the next ``set_epoch`` on it (between epochs) restarts its workers even if the epoch did not change again.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from engine.core.checks import check_int
from engine.core.compat import forget_iterator, live_iterator, pass_finished, shutdown_workers, worker_processes

_UNKNOWN = object()
_STALE_WORKERS: weakref.WeakSet[DataLoader] = weakref.WeakSet()
"""Loaders whose live workers hold a dataset from before a ``set_epoch`` that could not restart them."""


def _epoch_objects(loader: DataLoader) -> Iterator[tuple[str, Any, bool]]:
    """``(path, object, is_dataset)`` for the loader's samplers and its dataset chain, each object once."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    yield "sampler", getattr(loader, "sampler", None), False
    yield "batch_sampler", batch_sampler, False
    yield "batch_sampler.sampler", getattr(batch_sampler, "sampler", None), False
    pending = [("dataset", getattr(loader, "dataset", None))]
    while pending:
        path, dataset = pending.pop(0)
        if dataset is None:
            continue
        yield path, dataset, True
        pending.append((f"{path}.dataset", getattr(dataset, "dataset", None)))
        children = getattr(dataset, "datasets", None)  # ConcatDataset and friends
        if isinstance(children, (list, tuple)):
            pending += [(f"{path}.datasets[{i}]", child) for i, child in enumerate(children)]


def set_epoch(loader: DataLoader, epoch: int, *, restart_workers: bool = True) -> list[str]:
    """Call ``set_epoch(epoch)`` on every sampler and (wrapped) dataset of ``loader`` that defines it.

    Args:
        loader: A torch or torchdata ``DataLoader``.
        epoch: The epoch about to start (an int >= 0).
        restart_workers: When a dataset's epoch changed and persistent workers from a finished epoch are alive,
            shut them down so the next ``iter(loader)`` starts workers that see the new epoch. False keeps them
            (and their stale copy of the dataset).

    Returns:
        The paths reached, e.g. ``["batch_sampler", "dataset.dataset"]``, plus ``"workers restarted"`` when
        persistent workers were shut down.

    Raises:
        ValueError: ``epoch`` is not an int >= 0.

    Example:
        >>> import torch
        >>> from engine import DataLoaderConfig, DataLoaderFactory
        >>> loader = DataLoaderFactory().create_dataloader(list(torch.arange(8.0)), DataLoaderConfig(shuffle=True))
        >>> set_epoch(loader, 3), loader.batch_sampler.epoch
        (['batch_sampler'], 3)
    """
    epoch = check_int("epoch", epoch, minimum=0)
    if not isinstance(loader, DataLoader):
        raise TypeError(f"set_epoch takes a DataLoader, but got {type(loader).__name__}; for a data module pass "
                        f"dm.train_dataloader()")
    reached, seen, dataset_changed = [], set(), False
    for path, obj, is_dataset in _epoch_objects(loader):
        method = getattr(obj, "set_epoch", None)
        if obj is None or id(obj) in seen or id(getattr(obj, "owner", None)) in seen or not callable(method):
            continue  # (an ``owner`` already reached: the engine's EpochHandle forwards to its batch sampler)
        seen.add(id(obj))
        before = getattr(obj, "epoch", _UNKNOWN)
        method(epoch)
        reached.append(path)
        # A dataset without a readable epoch counts as changed: better one restart too many than stale rows.
        dataset_changed |= is_dataset and (before is _UNKNOWN or before != getattr(obj, "epoch", _UNKNOWN))
    if (dataset_changed or loader in _STALE_WORKERS) and _restart_workers(loader, epoch, restart_workers):
        reached.append("workers restarted")
    return reached


def reach_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch`` for any loader a multi-loader holds: a DataLoader through :func:`set_epoch` (samplers, datasets,
    stale workers); another iterable through its own ``set_epoch`` and its samplers' and dataset's, if defined."""
    if isinstance(loader, DataLoader):
        set_epoch(loader, epoch)
        return
    batch_sampler = getattr(loader, "batch_sampler", None)
    targets = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None),
               getattr(loader, "dataset", None))
    for target in {id(t): t for t in targets if t is not None}.values():
        if callable(getattr(target, "set_epoch", None)):
            target.set_epoch(epoch)


def _restart_workers(loader: DataLoader, epoch: int, allowed: bool) -> bool:
    """Shut down persistent workers that hold a stale dataset; whether it did."""
    iterator = live_iterator(loader)
    if iterator is None or loader.num_workers == 0 or not worker_processes(iterator):
        _STALE_WORKERS.discard(loader)
        return False  # no live workers: the next iter() copies the dataset as it is now
    _STALE_WORKERS.add(loader)
    if not allowed:
        warnings.warn(f"set_epoch({epoch}) reached the dataset, but the loader's persistent workers keep the copy "
                      f"they started with (restart_workers=False), so their rows stay at the old epoch",
                      UserWarning, stacklevel=3)
        return False
    if not _epoch_finished(loader, iterator):
        warnings.warn(f"set_epoch({epoch}) was called while the loader's persistent workers are in the middle of an "
                      f"epoch; they keep the dataset's old epoch until they are restarted. Call set_epoch between "
                      f"epochs, before iter(loader)", UserWarning, stacklevel=3)
        return False
    shutdown_workers(iterator)
    _STALE_WORKERS.discard(loader)
    forget_iterator(loader)  # the next iter() starts workers from the updated dataset; samplers keep their state
    return True


def _epoch_finished(loader: DataLoader, iterator: Any) -> bool:
    try:
        planned = len(loader)
    except TypeError:  # no length (IterableDataset): only a StopIteration tells, so do not drop prepared batches
        planned = None
    return pass_finished(iterator, planned)
