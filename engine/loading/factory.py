"""DataLoaderFactory: the one place where batch samplers and loaders (:class:`ResumableLoader`) are built.

Stage 4 of a batch's path: a source (stage 1, split in stage 2) and a sampler (stage 3) become a resumable,
reproducible loader whose collate function (stage 5) gets each batch's seed.
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, Sampler, SequentialSampler

from collators.default import DefaultCollator
from engine.collation.handoff import WorkerCollate
from engine.collation.seeded_collate import SeededCollate
from engine.core.rng import derive_seed, generator_from, seed_worker
from engine.loading.config import DataLoaderConfig
from engine.loading.loader import ResumableLoader
from engine.loading.pipeline import Threads
from engine.loading.starting import worker_context
from engine.sampling.base import EpochBatchSampler, EpochHandle
from engine.sampling.blocks import BlockOrder, EpochOrder
from engine.sampling.eval import ShardedEvalBatchSampler
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler
from engine.sources.adapt import as_source
from engine.sources.lengths import lengths_of
from engine.sources.protocol import epoch_blocks_of


class DataLoaderFactory:
    """Creates loaders whose order and randomness are functions of the seed and the epoch.

    Map-style data is adapted to a source with batched fetch and sampled by a
    :class:`engine.sampling.seeded.SeededBatchSampler` (new seeded order each epoch, resumable state);
    the loader is a :class:`engine.loading.loader.ResumableLoader` (torchdata's ``StatefulDataLoader``) whose
    executor loads in this process, in worker processes (``num_workers``) or in background threads (``num_threads``).

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
    ) -> ResumableLoader:
        """Build a loader over ``dataset`` (map-style or iterable) configured by ``config``.

        ``batch_sampler`` replaces the seeded sampler (its own order is then used as it is); ``rank`` and
        ``num_replicas`` shard the seeded sampler's order, with ``uneven`` ('pad' or 'drop') equalizing ranks.
        """
        config = config or DataLoaderConfig()
        if not isinstance(config, DataLoaderConfig):
            raise TypeError(f"config should be a DataLoaderConfig, but got {type(config).__name__}")
        kwargs, _ = config.resolve()
        seed = config.seed  # drawn and recorded by the config when it was given None
        # in worker processes, the batch's tensors cross to the parent in one shared buffer (see WorkerCollate)
        collate = (WorkerCollate if kwargs["num_workers"] else SeededCollate)(
            config.collate_fn if config.collate_fn is not None else DefaultCollator(),
            content_seed_from=seed if isinstance(dataset, IterableDataset) else None,
        )
        common = dict(
            collate_fn=collate,
            worker_init_fn=seed_worker,
            generator=generator_from(derive_seed(seed, "workers")),
            **kwargs,
        )
        started = worker_context(_start_method(kwargs)) if kwargs["num_workers"] else None
        if started is not None:  # spawn, forkserver: the workers start together (see engine.loading.starting)
            common["multiprocessing_context"] = started
        if isinstance(dataset, IterableDataset):
            if config.num_threads:
                raise ValueError(
                    f"num_threads={config.num_threads} loads map-style data through its batch sampler, but the data "
                    f"is an IterableDataset (a stream); set num_threads=0, or num_workers > 0 to read it in workers"
                )
            if config.shuffle:
                raise ValueError(
                    "shuffle=True cannot reorder an IterableDataset; shuffle it at the source "
                    "(e.g. datasets' IterableDataset.shuffle(seed=..., buffer_size=...)) and pass shuffle=False"
                )
            check_picklable(dataset, collate, kwargs)
            return ResumableLoader(dataset, batch_size=config.batch_size, drop_last=config.drop_last, **common)
        source = as_source(dataset)
        if kwargs["num_workers"] and _forks(kwargs) and not source.fork_safe:
            # e.g. Azure: forked workers would share the parent's connections
            kwargs["multiprocessing_context"] = not_forked(kwargs["multiprocessing_context"], source)
            common["multiprocessing_context"] = worker_context(kwargs["multiprocessing_context"])
        if collate.reads_columns:  # fetched as columns where the source can, padded from them
            source = source.handing_columns()
        check_picklable(source, collate, kwargs)
        if batch_sampler is not None:
            return _attach_epoch_handle(_map_loader(source, batch_sampler, config, common))
        sampler = SeededBatchSampler(
            len(source),
            config.batch_size,
            shuffle=config.shuffle,
            seed=seed,
            drop_last=config.drop_last,
            num_replicas=num_replicas,
            rank=rank,
            uneven=uneven,
            order=block_order(source) if config.shuffle else None,  # sharded data: row groups in a seeded order
        )
        return _attach_epoch_handle(_map_loader(source, sampler, config, common))

    def train_dataloader(self, source: Any, config: DataLoaderConfig, *, batching: str = "plain",
                         max_tokens: int | None = None, key: str | None = None, rank: int = 0, num_replicas: int = 1,
                         uneven: str = "pad", order: EpochOrder | None = None, balance: str = "tokens",
                         attention_weight: float | None = None) -> ResumableLoader:
        """A training loader over ``source`` with the sampler of ``batching`` (a stream keeps its own order);
        ``order``: the epoch order to draw from (a mixture's), else sharded data's block order or a shuffle;
        ``balance``, ``attention_weight``: how packed and token-budget steps are dealt to ranks (see
        :mod:`engine.sampling.balance`)."""
        sampler = None if isinstance(source, IterableDataset) else batch_sampler_for(
            source, batching=batching, batch_size=config.batch_size, max_tokens=max_tokens, key=key,
            seed=config.seed, shuffle=config.shuffle, drop_last=config.drop_last, num_replicas=num_replicas,
            rank=rank, uneven=uneven, max_length=getattr(config.collate_fn, "max_length", None), order=order,
            balance=balance, attention_weight=attention_weight,
            measure=getattr(config.collate_fn, "row_length", None))
        return self.create_dataloader(source, config, batch_sampler=sampler, rank=rank, num_replicas=num_replicas,
                                      uneven=uneven)

    def eval_dataloader(self, source: Any, config: DataLoaderConfig, *, role: str = "val", rank: int = 0,
                        num_replicas: int = 1) -> ResumableLoader:
        """A loader that reads every row of ``source`` once across ranks, in storage order.

        Prediction uses torch's own ``BatchSampler``, which Lightning wraps to track prediction indices.
        """
        if role == "predict":
            sampler: Sampler[list[int]] = BatchSampler(SequentialSampler(source), config.batch_size, drop_last=False)
        else:
            sampler = ShardedEvalBatchSampler(len(source), config.batch_size, seed=config.seed,
                                              num_replicas=num_replicas, rank=rank)
        return self.create_dataloader(source, config, batch_sampler=sampler)


def batch_sampler_for(source: Any, *, batching: str, batch_size: int, seed: int, key: str | None = None,
                      max_tokens: int | None = None, shuffle: bool = True, drop_last: bool = False,
                      num_replicas: int = 1, rank: int = 0, uneven: str = "pad",
                      max_length: int | None = None, order: EpochOrder | None = None, balance: str = "tokens",
                      attention_weight: float | None = None,
                      measure: Callable[[Any], int] | None = None) -> EpochBatchSampler:
    """The training batch sampler of a resolved ``batching`` mode (see :mod:`engine.sampling.modes`).

    ``measure`` (a collator's ``row_length``) gives each row's length where the stored field's does not (a
    vision-language row's image tokens count too).
    ``max_length`` (packed only) is the collator's truncation, so rows are packed at the length they will have.
    ``order`` (a mixture's) replaces the sampler's own shuffle; by default sharded data gets its block order.
    ``balance='compute'`` (packed and token budgets) balances each step's ranks by the cost model of
    ``attention_weight``.
    """
    order = order if order is not None else block_order(source)
    ranks = {"num_replicas": num_replicas, "rank": rank, "uneven": uneven, "order": order}
    if batching == "plain":
        rows = order.size if order is not None and order.varies else len(source)
        return SeededBatchSampler(rows, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, **ranks)
    lengths = lengths_of(source, key, measure)
    if batching == "grouped":
        return LengthGroupedBatchSampler(lengths, batch_size, seed=seed, drop_last=drop_last, **ranks)
    if batching == "packed":
        return PackedBatchSampler(lengths, int(max_tokens), seed=seed, max_length=max_length, balance=balance,
                                  attention_weight=attention_weight, **ranks)
    return TokenBudgetBatchSampler(lengths, int(max_tokens), seed=seed, balance=balance,
                                   attention_weight=attention_weight, **ranks)


def block_order(source: Any) -> BlockOrder | None:
    """The source's own epoch order (:meth:`~engine.sources.protocol.Source.epoch_blocks`; sharded data: row groups
    in a seeded order, rows shuffled within a window), which keeps a batch's reads within a few blocks; None for
    data shuffled with a full permutation (and for data not yet adapted to a source, which has no order of its own)."""
    blocks = epoch_blocks_of(source)
    return None if blocks is None else BlockOrder(blocks.block_of_row, blocks.shuffle_window)


def _map_loader(source: Any, sampler: Sampler[list[int]], config: DataLoaderConfig, common: dict[str, Any]
                ) -> ResumableLoader:
    """The loader of map-style data, with the executor of ``config``: background threads (``num_threads``) when the
    sampler is one of the engine's resumable ones, else torchdata's iterators (in this process, or in worker
    processes). Prediction keeps torch's ``BatchSampler``, which Lightning wraps to track indices, so it loads on
    the step's path. Over sharded data, each batch also names the rows of the batch that the executor will ask for
    next once this one is taken, so their row groups are fetched while the step runs."""
    if source.reads_ahead and isinstance(sampler, EpochBatchSampler):
        in_flight = max(1, config.num_workers or config.num_threads or 1) * (config.prefetch_factor or 2)
        sampler.look_ahead = in_flight + 1
    if config.num_threads and isinstance(sampler, EpochBatchSampler):
        threads = Threads(config.num_threads, config.prefetch_factor or 2)
        return ResumableLoader(source, batch_sampler=sampler, collate_fn=common["collate_fn"], num_workers=0,
                               pin_memory=common["pin_memory"], executor=threads)
    return ResumableLoader(source, batch_sampler=sampler, **common)


def _attach_epoch_handle(loader: Any) -> Any:
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
    for what, value in (("dataset", dataset), ("collate_fn", collate_fn)):
        _check_sendable(what, value, kwargs)


def check_transforms_can_start(transforms: Mapping[str, Any], *, train: DataLoaderConfig,
                               evaluation: DataLoaderConfig) -> None:
    """Raise now if a split's per-row transform could not run under its config: worker processes could not
    receive it (it travels with the data), or background threads would run a transform that draws from the global
    random generators beside the training step. The train split's under the ``train`` config, the others' under
    ``evaluation``."""
    for role, transform in transforms.items():
        config = train if role == "train" else evaluation
        if config.num_threads and not transform.uses_generator:
            name = getattr(transform.transform, "__name__", None) or type(transform.transform).__name__
            raise ValueError(
                f"{transform.argument}={name} draws from torch's global random generator (it takes no generator= "
                f"keyword, as torchvision.transforms.v2 transforms), which the training step shares: "
                f"num_threads={config.num_threads} would run it in a background thread beside the step, changing "
                f"the step's random numbers and its own. Load with num_workers > 0 instead of num_threads (each "
                f"worker process has its own generators), or pass a transform that takes generator= (it is called "
                f"with a torch.Generator seeded for each row; one that draws nothing can ignore it)"
            )
        _check_sendable(transform.argument, transform.transform, config.resolve()[0])


def not_forked(asked: Any, source: Any) -> str:
    """'forkserver', the start method of a loader whose source forked workers cannot read (its
    :attr:`~engine.sources.protocol.Source.fork_safe` is False); refuses ``multiprocessing_context='fork'`` asked
    for explicitly."""
    names = [name or type(part).__name__ for name, part in source.parts() if not part.fork_safe]
    if asked is not None and str(getattr(asked, "_name", asked)) == "fork":
        raise ValueError(f"multiprocessing_context='fork' cannot read {names}: its store client keeps one pool of "
                         f"connections per process, which forked workers would share, reading each other's "
                         f"responses; pass multiprocessing_context='forkserver' or 'spawn' (or leave it unset: "
                         f"'forkserver' is then used)")
    return "forkserver"


def _start_method(kwargs: dict[str, Any]) -> str:
    return kwargs["multiprocessing_context"] or multiprocessing.get_start_method(allow_none=True) or (
        multiprocessing.get_context().get_start_method()
    )


def _forks(kwargs: dict[str, Any]) -> bool:
    """Whether the loader's workers are forked from this process (they then inherit its objects)."""
    return _start_method(kwargs) == "fork" and torch.multiprocessing.get_start_method(allow_none=True) in (
        None, "fork")


def _check_sendable(what: str, value: Any, kwargs: dict[str, Any]) -> None:
    if kwargs["num_workers"] == 0:
        return
    method = _start_method(kwargs)
    if _forks(kwargs):
        return
    try:
        _SendCheck(_Discard()).dump(value)
    except _DefinedInMain as found:
        name = found.args[0]
        raise TypeError(
            f"the {what} should be importable by the workers that num_workers={kwargs['num_workers']} starts with "
            f"the '{method}' start method, but it refers to {name}, defined in __main__, which has no file here (a "
            f"notebook, python -c or stdin): a started worker imports what it is sent by module and name, cannot "
            f"find __main__.{name}, and dies at its first batch. Move {name} into a module (a .py file beside the "
            f"notebook) and import it from there, or use the 'fork' start method (multiprocessing_context='fork', "
            f"not on macOS or Windows), or num_workers=0"
        ) from None
    except _HoldsGenerator:
        raise TypeError(
            f"num_workers={kwargs['num_workers']} with the '{method}' start method sends the {what} to each "
            f"worker by pickling, but it holds a torch.Generator, which torch.multiprocessing cannot send to a "
            f"worker it starts (the generator's state travels as a temporary shared-memory tensor, freed before "
            f"the worker opens it: 'unable to resize file'). Keep a seed and build the generator in the worker, "
            f"pickle the generator's state as bytes (__getstate__), or use the 'fork' start method"
        ) from None
    except Exception as error:  # pickle raises several types; all mean the same here
        raise TypeError(
            f"num_workers={kwargs['num_workers']} with the '{method}' start method sends the {what} to each "
            f"worker by pickling, but it cannot be pickled ({type(error).__name__}: {error}). Define it at "
            f"module level (no lambdas or local classes), or use num_workers=0"
        ) from error


class _HoldsGenerator(Exception):
    """Raised by :class:`_SendCheck` at the first ``torch.Generator`` it meets."""


class _DefinedInMain(Exception):
    """Raised by :class:`_SendCheck` at the first function or class of a ``__main__`` that a started worker cannot
    import; its argument is the object's qualified name."""


def _main_has_no_file() -> bool:
    """Whether ``__main__`` is a notebook, ``python -c`` or stdin: a process that multiprocessing starts (spawn,
    forkserver) runs the main module again from its name or file, as ``multiprocessing.spawn`` does, and this one
    has neither."""
    main = sys.modules.get("__main__")
    return main is not None and getattr(getattr(main, "__spec__", None), "name", None) is None and getattr(
        main, "__file__", None) is None


class _SendCheck(pickle.Pickler):
    """Pickles what a started worker would receive, stopping at a ``torch.Generator``, which torch pickles with its
    state as a tensor that ``torch.multiprocessing`` shares by a descriptor closed before the worker opens it, and
    at a function or class of a ``__main__`` without a file, which pickles by reference but does not import there.
    A plain tensor (or a storage) is not pickled: a worker receives it as a descriptor of shared memory, which any
    pickles to, and writing its bytes (a copy of all the data, seconds for a large dataset) would delay every
    worker's start; a tensor subclass or a tensor with attributes of its own is pickled, for what it holds."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Generator):
            raise _HoldsGenerator
        if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)) or (
                type(obj) is torch.Tensor and not obj.__dict__):
            return bytes, ()
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__" and (
                "<" not in obj.__qualname__ and _main_has_no_file()):  # a lambda or local one: pickle's own error
            raise _DefinedInMain(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented


class _Discard:
    """A file that drops what is written: the check needs the pickling, not its bytes."""

    def write(self, data: bytes) -> int:
        return len(data)
