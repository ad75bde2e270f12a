"""UniversalDataModule: data in whatever form, a TaskSpec, and out come correct, reproducible loaders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning
from torch.utils.data import BatchSampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.collate import build_collator
from engine.config import DataLoaderConfig
from engine.distributed import check_trainer_keeps_our_samplers, resolve_world
from engine.factory import DataLoaderFactory
from engine.inputs import check_inputs
from engine.preprocess import prepare_source, prepare_stream
from engine.samplers import ShardedEvalBatchSampler
from engine.sources import MapSource, TorchSource, as_source, is_hf_dataset_dict, unpack_dataset_dict
from engine.splits import SplitPlan, plan_splits
from engine.state import STATE_VERSION, check_compatible, data_fingerprint
from engine.streams import (
    EpochStream,
    check_resumable,
    check_stream_options,
    is_hf_stream,
    peek_rows,
    stream_fingerprint,
)
from engine.summary import render_html, render_text
from task_spec import TaskSpec


class UniversalDataModule(lightning.LightningDataModule):
    """A LightningDataModule that builds its collator from a TaskSpec and its loaders from a seed.

    Also usable without a Trainer: ``dm.train_dataloader()`` works in a plain loop (setup runs on demand),
    and iterating the same train loader again gives the next epoch's order.

    Args:
        train_data: A ``datasets.Dataset`` or ``DatasetDict`` (splits ``train``/``validation``/``test``), a
            map-style torch ``Dataset``, or a list of tensors (stored as one flat buffer).
        task_spec: What the task is; picks the collator through the registry. None uses the default collator.
        tokenizer: Tokenizer for raw text (tokenized once at setup) and for pad/mask ids.
        val_data, test_data, predict_data: Optional separate datasets of the same kinds.
        val_split, test_split: Fraction in [0, 1) or row count cut from ``train_data`` (seeded, disjoint).
        batch_size: Rows per training batch; ``eval_batch_size`` (default the same) for the others.
        num_workers, pin_memory, persistent_workers, prefetch_factor: As in :class:`DataLoaderConfig`.
        seed: Seed of the split, the shuffle and every random choice in the collators.
        shuffle: Seeded shuffle with a new order each epoch; default on, except for a stream
            (``datasets.IterableDataset``), which is read in its own order and sharded by rank and worker.
        drop_last: Drop the last incomplete training batch (evaluation loaders never shuffle or drop).
        uneven: Across ranks, ``pad`` (repeat a few rows) or ``drop`` (leave a few out) so every rank gets the
            same number of training batches. Evaluation always reads every row exactly once.
        collate_fn: Use this collate function instead of the registry's choice.
        collator_name: Ask the registry for this collator by name.
        collator_kwargs: Extra keyword arguments for the collator factory.

    Example:
        >>> import torch
        >>> from task_spec import TaskSpec
        >>> rows = [torch.randint(0, 100, (n,)) for n in range(5, 25)]
        >>> dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2)
        >>> sorted(next(iter(dm.train_dataloader())))
        ['attention_mask', 'input_ids', 'labels']
    """

    def __init__(
        self,
        train_data: Any = None,
        *,
        task_spec: TaskSpec | None = None,
        tokenizer: Any = None,
        val_data: Any = None,
        test_data: Any = None,
        predict_data: Any = None,
        val_split: float | int = 0.0,
        test_split: float | int = 0.0,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 42,
        shuffle: bool | None = None,
        drop_last: bool = False,
        uneven: str = "pad",
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        prefetch_factor: int = 2,
        collate_fn: Callable[..., Any] | None = None,
        collator_name: str | None = None,
        collator_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if task_spec is not None and not isinstance(task_spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
        if is_hf_dataset_dict(train_data):
            train_data, val_data, test_data = unpack_dataset_dict(train_data, val_data, test_data)
        self._stream = train_data if is_hf_stream(train_data) else None
        if self._stream is not None:
            check_stream_options(val_split=val_split, test_split=test_split, shuffle=shuffle,
                                 num_workers=num_workers, persistent_workers=persistent_workers)
            train_data = None
        elif train_data is None and predict_data is None:
            raise ValueError("UniversalDataModule needs train_data (or predict_data for prediction only)")
        if val_data is not None and val_split:
            raise ValueError(
                f"both val_data and val_split={val_split!r} were given; pass one: val_split cuts validation rows "
                f"out of train_data, val_data supplies them"
            )
        if test_data is not None and test_split:
            raise ValueError(f"both test_data and test_split={test_split!r} were given; pass one")
        self.task_spec = task_spec
        self.tokenizer = tokenizer
        self.seed = seed
        self.val_split, self.test_split = val_split, test_split
        if uneven not in ("pad", "drop"):
            raise ValueError(f"uneven should be 'pad' or 'drop', but got uneven={uneven!r}")
        self.uneven = uneven
        self.rank, self.world_size = 0, 1
        key = task_spec.input_fields[0] if task_spec is not None else None
        self._given = {
            role: as_source(data, key=key)
            for role, data in (("train", train_data), ("val", val_data), ("test", test_data),
                               ("predict", predict_data))
            if data is not None
        }
        if self._stream is not None:
            self._given["train"] = TorchSource(peek_rows(self._stream, 1))  # checked below, replaced at setup
        for role, source in self._given.items():
            check_inputs(source, task_spec, tokenizer, f"{role}_data", require_target=role != "predict")
        if train_data is not None:  # validates the split arguments now, before any work
            plan_splits(len(self._given["train"]), val_split=val_split, test_split=test_split, seed=seed)
        shuffle = self._stream is None if shuffle is None else shuffle
        self.train_config = DataLoaderConfig(
            batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, seed=seed, drop_last=drop_last,
        )
        self.eval_config = DataLoaderConfig(
            batch_size=eval_batch_size or batch_size, shuffle=False, num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, seed=seed,
        )
        self.collator, self.collator_resolution = build_collator(
            task_spec, tokenizer, collate_fn, collator_name, dict(collator_kwargs or {})
        )
        self.train_config.collate_fn = self.eval_config.collate_fn = self.collator
        self.split_plan: SplitPlan | None = None
        self.datasets: dict[str, MapSource] = {}
        self._factory = DataLoaderFactory()
        self._train_loader: StatefulDataLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None
        self._fingerprint: str | None = None

    # -- setup ---------------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        """Tokenize raw text and compute the splits, once; later calls (any stage) do nothing."""
        if self.datasets or not self._given:
            return
        check_trainer_keeps_our_samplers(self.trainer)
        self.rank, self.world_size = resolve_world(self.trainer)
        sources = {role: prepare_source(src, self.task_spec, self.tokenizer) for role, src in self._given.items()}
        if self._stream is not None:
            self._fingerprint = stream_fingerprint(self._stream)
            sources["train"] = EpochStream(prepare_stream(self._stream, self.task_spec, self.tokenizer),
                                           rank=self.rank, world_size=self.world_size)
        elif "train" in sources:
            self._fingerprint = data_fingerprint(self._given["train"])
            train = sources["train"]
            self.split_plan = plan_splits(len(train), val_split=self.val_split, test_split=self.test_split,
                                          seed=self.seed)
            if self.val_split or self.test_split:
                sources["train"] = train.view(self.split_plan.train)
                if self.val_split:
                    sources["val"] = train.view(self.split_plan.val)
                if self.test_split:
                    sources["test"] = train.view(self.split_plan.test)
        self.datasets = sources

    @property
    def split_sizes(self) -> dict[str, int | None]:
        """Rows per split after setup (0 for a split that is absent, None for a stream of unknown length)."""
        self.setup()
        return {role: (len(self.datasets[role]) if hasattr(self.datasets[role], "__len__") else None)
                if role in self.datasets else 0 for role in ("train", "val", "test", "predict")}

    # -- loaders -------------------------------------------------------------------------------------

    def train_dataloader(self) -> StatefulDataLoader:
        """The training loader; the same object on every call, so its sampler carries the epoch forward."""
        if self._train_loader is None:
            self._train_loader = self._factory.create_dataloader(
                self._split("train"), self.train_config, rank=self.rank, num_replicas=self.world_size,
                uneven=self.uneven,
            )
            if self._pending_loader_state is not None:
                self._train_loader.load_state_dict(self._pending_loader_state)
                self._pending_loader_state = None
        return self._train_loader

    def val_dataloader(self) -> StatefulDataLoader | list[Any]:
        """The validation loader in storage order; ``[]`` when there is no validation data (Lightning skips it)."""
        return self._eval_loader("val")

    def test_dataloader(self) -> StatefulDataLoader | list[Any]:
        """The test loader in storage order; ``[]`` when there is no test data."""
        return self._eval_loader("test")

    def predict_dataloader(self) -> StatefulDataLoader | list[Any]:
        """The prediction loader in storage order; ``[]`` when there is no prediction data."""
        return self._eval_loader("predict")

    def _eval_loader(self, role: str) -> StatefulDataLoader | list[Any]:
        self.setup()
        if role not in self.datasets:
            return []
        source = self.datasets[role]
        if role == "predict":  # torch's own batch sampler, which Lightning wraps to track prediction indices
            sampler = BatchSampler(SequentialSampler(source), self.eval_config.batch_size, drop_last=False)
        else:
            sampler = ShardedEvalBatchSampler(len(source), self.eval_config.batch_size, seed=self.seed,
                                              num_replicas=self.world_size, rank=self.rank)
        return self._factory.create_dataloader(source, self.eval_config, batch_sampler=sampler)

    def _split(self, role: str) -> MapSource:
        self.setup()
        if role not in self.datasets:
            raise ValueError(f"there is no {role} data: pass {role}_data=... to UniversalDataModule")
        return self.datasets[role]

    # -- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Seed, fingerprints of the data and split, and the train loader's position (torchdata state).

        Saving costs microseconds at ``num_workers=0``: the fingerprints are computed once at setup.
        """
        self.setup()
        loader = self._train_loader
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "data_fingerprint": self._fingerprint,
            "split_fingerprint": self.split_plan.fingerprint if self.split_plan else None,
            "world_size": self.world_size,
            "epoch": self._epoch_of(loader),
            "train_loader": loader.state_dict() if loader is not None else self._pending_loader_state,
        }

    @staticmethod
    def _epoch_of(loader: StatefulDataLoader | None) -> int:
        if loader is None:
            return 0
        return loader.dataset.epoch if isinstance(loader.dataset, EpochStream) else loader.batch_sampler.epoch

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict``: the next training batch is the one after the last saved one.

        Raises if the state was saved from other data, seed, splits or number of ranks. A train loader
        already handed out is replaced; iterators still running over it raise rather than yield stale rows.
        """
        self.setup()
        check_compatible(state_dict, self.state_dict())
        if self._stream is not None and state_dict.get("train_loader"):
            check_resumable(self._stream)
        if self._train_loader is not None and hasattr(self._train_loader.batch_sampler, "retire"):
            self._train_loader.batch_sampler.retire(
                "UniversalDataModule.load_state_dict() replaced this train loader; call dm.train_dataloader() "
                "again and iterate the new loader to continue from the loaded state"
            )
        self._train_loader = None
        self._pending_loader_state = state_dict.get("train_loader")

    # -- notebook summary ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return render_text(self)

    __str__ = __repr__  # LightningDataModule's own __str__ lists loader sizes only

    def _repr_html_(self) -> str:
        return render_html(self)
