"""DataLoaderFactory: builds resumable, reproducible ``torchdata`` StatefulDataLoaders from a config."""

from __future__ import annotations

import multiprocessing
import pickle
import secrets
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from collators.default import DefaultCollator
from engine.collate import SeededCollate
from engine.config import DataLoaderConfig
from engine.distributed import stop_together
from engine.rng import derive_seed, generator_from, seed_worker
from engine.samplers import EpochHandle, SeededBatchSampler
from engine.sources import as_source


class DataLoaderFactory:
    """Creates loaders whose order and randomness are functions of the seed and the epoch.

    Map-style data is adapted to a source with batched fetch and sampled by a
    :class:`engine.samplers.SeededBatchSampler` (new seeded order each epoch, resumable state);
    the loader is a ``torchdata.stateful_dataloader.StatefulDataLoader``.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoaderFactory().create_dataloader(
        ...     TensorDataset(torch.arange(10.0)), DataLoaderConfig(batch_size=4, shuffle=True, seed=1))
        >>> [len(batch[0]) for batch in loader]
        [4, 4, 2]
    """

    def create_dataloader(
        self,
        dataset: Any,
        config: DataLoaderConfig | None = None,
        *,
        batch_sampler: Sampler[list[int]] | None = None,
        rank: int = 0,
        num_replicas: int = 1,
        uneven: str = "pad",
    ) -> StatefulDataLoader:
        """Build a loader over ``dataset`` (map-style or iterable) configured by ``config``.

        ``batch_sampler`` replaces the seeded sampler (its own order is then used as it is); ``rank`` and
        ``num_replicas`` shard the seeded sampler's order, with ``uneven`` ('pad' or 'drop') equalizing ranks.
        """
        config = config or DataLoaderConfig()
        if not isinstance(config, DataLoaderConfig):
            raise TypeError(f"config should be a DataLoaderConfig, but got {type(config).__name__}")
        kwargs, _ = config.resolve()
        seed = config.seed if config.seed is not None else secrets.randbits(31)
        collate = SeededCollate(
            config.collate_fn if config.collate_fn is not None else DefaultCollator(),
            content_seed_from=seed if isinstance(dataset, IterableDataset) else None,
        )
        common = dict(
            collate_fn=collate,
            worker_init_fn=seed_worker,
            generator=generator_from(derive_seed(seed, "workers")),
            **kwargs,
        )
        if isinstance(dataset, IterableDataset):
            if config.shuffle:
                raise ValueError(
                    "shuffle=True cannot reorder an IterableDataset; shuffle it at the source "
                    "(e.g. datasets' IterableDataset.shuffle(seed=..., buffer_size=...)) and pass shuffle=False"
                )
            check_picklable(dataset, collate, kwargs)
            loader_class = PassAwareLoader if callable(getattr(dataset, "begin_pass", None)) else StatefulDataLoader
            return loader_class(dataset, batch_size=config.batch_size, drop_last=config.drop_last, **common)
        source = as_source(dataset)
        check_picklable(source, collate, kwargs)
        if batch_sampler is not None:
            return _attach_epoch_handle(StatefulDataLoader(source, batch_sampler=batch_sampler, **common))
        sampler = SeededBatchSampler(
            len(source),
            config.batch_size,
            shuffle=config.shuffle,
            seed=seed,
            drop_last=config.drop_last,
            num_replicas=num_replicas,
            rank=rank,
            uneven=uneven,
        )
        return _attach_epoch_handle(StatefulDataLoader(source, batch_sampler=sampler, **common))


class PassAwareLoader(StatefulDataLoader):
    """A loader that tells its iterable dataset, in this (the parent) process, that a pass starts: state such as
    the epoch that ``datasets`` shares with worker processes must be set here, never in the workers. When the
    dataset is one rank's share of a stream, every rank ends the pass together (see ``stop_together``)."""

    def __iter__(self) -> Any:
        self.dataset.begin_pass()
        batches = super().__iter__()
        if getattr(self.dataset, "world_size", 1) > 1 and dist.is_available() and dist.is_initialized():
            return stop_together(batches)
        return batches


def _attach_epoch_handle(loader: StatefulDataLoader) -> StatefulDataLoader:
    handle = getattr(loader.batch_sampler, "sampler", None)
    if isinstance(handle, EpochHandle):  # Lightning's per-epoch set_epoch then reaches the datasets too
        handle.attach(loader)
    return loader


def check_workers_can_start(dataset: Any, config: DataLoaderConfig) -> None:
    """Raise now, at setup, if worker processes under this config could not receive ``dataset`` and its collator."""
    kwargs, _ = config.resolve()
    collate = SeededCollate(config.collate_fn if config.collate_fn is not None else DefaultCollator())
    check_picklable(dataset, collate, kwargs)


def check_picklable(dataset: Any, collate_fn: Any, kwargs: dict[str, Any]) -> None:
    """Fail now, not inside a worker, when spawned workers would have to pickle what cannot be pickled."""
    if kwargs["num_workers"] == 0:
        return
    method = kwargs["multiprocessing_context"] or multiprocessing.get_start_method(allow_none=True) or (
        multiprocessing.get_context().get_start_method()
    )
    if method == "fork" and torch.multiprocessing.get_start_method(allow_none=True) in (None, "fork"):
        return
    for what, value in (("dataset", dataset), ("collate_fn", collate_fn)):
        try:
            pickle.dumps(value)
        except Exception as error:  # pickle raises several types; all mean the same here
            raise TypeError(
                f"num_workers={kwargs['num_workers']} with the '{method}' start method sends the {what} to each "
                f"worker by pickling, but it cannot be pickled ({type(error).__name__}: {error}). Define it at "
                f"module level (no lambdas or local classes), or use num_workers=0"
            ) from error
