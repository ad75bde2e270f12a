"""UniversalDataModule: data in whatever form, a TaskSpec, and out come correct, reproducible loaders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning
from torch.utils.data import BatchSampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.batching import batch_sampler_for, resolve_batching
from engine.collate import build_collator
from engine.config import DataLoaderConfig
from engine.device import DeviceNormalize
from engine.distributed import check_trainer_keeps_our_samplers, resolve_world
from engine.factory import DataLoaderFactory, check_workers_can_start
from engine.inputs import check_inputs
from engine.module_state import ResumableState
from engine.options import check_data_arguments, check_stream_batching, device_normalize_kwargs
from engine.preprocess import prepare_source, prepare_stream
from engine.samplers import ShardedEvalBatchSampler
from engine.sources import MapSource, TorchSource, as_source, is_hf_dataset_dict, unpack_dataset_dict
from engine.splits import SplitPlan, plan_splits
from engine.state import data_fingerprint
from engine.streams import EpochStream, check_stream_options, is_hf_stream, peek_rows, stream_fingerprint
from engine.summary import render_html, render_text
from engine.validation import validate_first_batch
from task_spec import TaskSpec


class UniversalDataModule(ResumableState, lightning.LightningDataModule):
    """A LightningDataModule that builds its collator from a TaskSpec and its loaders from a seed.

    Also usable without a Trainer: ``dm.train_dataloader()`` works in a plain loop (setup runs on demand),
    and iterating the same train loader again gives the next epoch's order.

    Args:
        train_data: A ``datasets.Dataset`` or ``DatasetDict`` (splits ``train``/``validation``/``test``), a
            ``datasets.IterableDataset`` (a stream), a map-style torch ``Dataset``, or a list of tensors (stored as
            one flat buffer). A dict ``{name: data}`` builds an :class:`engine.multi_module.MultiDataModule`.
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
        batching: 'plain', 'grouped' (rows of similar length share a batch) or 'token_budget' (at most
            ``max_tokens`` padded tokens per batch); None reads ``spec.preprocessing_config['batching']``.
        max_tokens: Padded-token budget per batch for 'token_budget' (else the spec's 'max_tokens').
        device_normalize: Vision: keep images uint8 through the loader and normalize them on the device,
            in ``on_after_batch_transfer`` (plain loops: ``dm.on_after_batch_transfer(batch_on_device, 0)``).
        validate: At setup, check the first training batch against the spec (keys, dtypes, shapes, NaN/Inf,
            label ranges, masks) and raise naming the key and the fix; the report is ``dm.validation_report``.

    Example:
        >>> import torch
        >>> from task_spec import TaskSpec
        >>> rows = [torch.randint(0, 100, (n,)) for n in range(5, 25)]
        >>> dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2)
        >>> sorted(next(iter(dm.train_dataloader())))
        ['attention_mask', 'input_ids', 'labels']
    """

    def __new__(cls, train_data: Any = None, *args: Any, **kwargs: Any) -> UniversalDataModule:
        if cls is UniversalDataModule and isinstance(train_data, Mapping) and not is_hf_dataset_dict(train_data):
            from engine.multi_module import MultiDataModule  # several named datasets: a child module per name

            return super().__new__(MultiDataModule)
        return super().__new__(cls)

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
        batching: str | None = None,
        max_tokens: int | None = None,
        device_normalize: bool = False,
        validate: bool = False,
    ) -> None:
        super().__init__()
        if task_spec is not None and not isinstance(task_spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
        if is_hf_dataset_dict(train_data):
            train_data, val_data, test_data = unpack_dataset_dict(train_data, val_data, test_data)
        check_data_arguments(has_train=train_data is not None, has_predict=predict_data is not None,
                             val_data=val_data, test_data=test_data, val_split=val_split, test_split=test_split,
                             uneven=uneven)
        self._stream = train_data if is_hf_stream(train_data) else None
        if self._stream is not None:
            check_stream_options(val_split=val_split, test_split=test_split, shuffle=shuffle)
            train_data = None
        self.task_spec, self.tokenizer, self.seed = task_spec, tokenizer, seed
        self.val_split, self.test_split, self.uneven, self.validate = val_split, test_split, uneven, validate
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
        self.batching, self.max_tokens, self.batching_reason = resolve_batching(task_spec, batching, max_tokens,
                                                                                self.train_config.shuffle)
        check_stream_batching(self._stream is not None, self.batching)
        self.collator, self.collator_resolution = build_collator(
            task_spec, tokenizer, collate_fn, collator_name,
            device_normalize_kwargs(device_normalize, collate_fn, task_spec, collator_kwargs),
        )
        self.train_config.collate_fn = self.eval_config.collate_fn = self.collator
        self.device_normalize = DeviceNormalize.from_collator(self.collator)  # also for collator_kwargs keep_uint8
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
        for role, source in sources.items():  # spawned workers must be able to receive data and collator
            check_workers_can_start(source, self.train_config if role == "train" else self.eval_config)
        if self.validate and "train" in sources:  # a throwaway loader: the real one's state is untouched
            probe = self._factory.create_dataloader(sources["train"], self.train_config, rank=self.rank,
                                                    num_replicas=self.world_size, uneven=self.uneven)
            self.validation_report = validate_first_batch(
                probe, self.task_spec, pad_token_id=getattr(self.tokenizer, "pad_token_id", None))

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
            train, key = self._split("train"), self.task_spec.input_fields[0] if self.task_spec else None
            sampler = batch_sampler_for(
                train, batching=self.batching, batch_size=self.train_config.batch_size, max_tokens=self.max_tokens,
                key=key, seed=self.seed, drop_last=self.train_config.drop_last, num_replicas=self.world_size,
                rank=self.rank, uneven=self.uneven,
            )
            self._train_loader = self._factory.create_dataloader(
                train, self.train_config, batch_sampler=sampler, rank=self.rank, num_replicas=self.world_size,
                uneven=self.uneven,
            )
            if self._pending_loader_state is not None:
                if isinstance(self._train_loader.dataset, EpochStream):  # the epoch is set here, in the parent
                    self._train_loader.dataset.set_epoch(self._pending_epoch)
                self._train_loader.load_state_dict(self._pending_loader_state)
                self._pending_loader_state = None
        return self._train_loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning hook, on the device: finish uint8 image batches (``device_normalize``); others unchanged."""
        return self.device_normalize(batch) if self.device_normalize is not None else batch

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

    # -- notebook summary ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return render_text(self)

    __str__ = __repr__  # LightningDataModule's own __str__ lists loader sizes only

    def _repr_html_(self) -> str:
        return render_html(self)
