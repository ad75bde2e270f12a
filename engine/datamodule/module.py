"""DataModule: data in whatever form, a TaskSpec, and out come correct, reproducible loaders, without Lightning.

:class:`DataModule` imports no Lightning: a torchrun, FSDP or DCP loop uses it as it is. Its Lightning subclass,
:class:`engine.datamodule.universal.UniversalDataModule`, adds only what a ``Trainer`` calls (hooks, hyperparameters,
the trainer's ranks); every batch and every state is the plain class's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.core.distributed import resolve_world
from engine.core.locks import ModuleLock
from engine.core.rng import drawn_seed
from engine.core.skipped_rows import SkipReport
from engine.core.stateful import SHARED_LEAF, rank_leaf
from engine.datamodule import options
from engine.datamodule.checkpointing import CheckpointedModule
from engine.datamodule.collator import check_collator_kwargs, module_collator
from engine.datamodule.given import log_long_rows, prepare_inputs, prepare_tokens, take_inputs, take_mixture
from engine.datamodule.mixing import check_mixture_batching, mixture_order
from engine.loading.factory import (
    DataLoaderFactory,
    check_transforms_can_start,
    check_workers_can_start,
)
from engine.loading.settings import BY_NAME, NOT_RECORDED, check_module_settings
from engine.loading.state import TrainPosition
from engine.sampling.mixtures.mixture import as_mixture
from engine.sampling.modes import resolve_balance, resolve_batching
from engine.sources.inputs import check_length_batching, check_same_classes, class_maps
from engine.sources.kinds import is_named_datasets
from engine.sources.long_rows import LongRows, check_sources
from engine.sources.rows import MapSource
from engine.sources.splits import SplitPlan
from engine.sources.tokenizing.token_cache import TokenCache
from engine.sources.transforms import split_transforms
from engine.tools.device import DeviceDecode, DeviceNormalize
from engine.tools.report import DataReport, build_report
from engine.tools.summary import render_html, render_text
from engine.tools.transfer import move_to_device
from engine.tools.validation import first_batch, validate_first_batch
from engine.tools.verify_resume import ResumeCheck, verify_resume
from task_spec import TaskSpec

NOT_CHECKPOINTED = NOT_RECORDED
"""Keywords a checkpoint's configuration leaves out: the data, the tokenizer and ``collate_fn``, given again to
``load_from_checkpoint`` (declared in :data:`engine.loading.settings.SETTINGS`)."""


class DataModule(CheckpointedModule):
    """A data module that builds its collator from a TaskSpec and its loaders from a seed, and imports no Lightning.

    For a plain loop (torchrun, FSDP, DCP): ``dm.train_dataloader()`` sets up on demand, reads its rank and world
    size from ``torch.distributed`` (else 1 process), and iterating the same train loader again gives the next
    epoch's order. ``dm.state_dict()`` / ``dm.load_state_dict()`` resume it; ``dm.configuration`` and
    :meth:`from_configuration` rebuild it. :class:`~engine.datamodule.universal.UniversalDataModule` is the same
    module as a ``LightningDataModule``, with the same arguments, batches and states.

    Args:
        train_data: A ``datasets.Dataset`` or ``DatasetDict``, a ``datasets.IterableDataset`` (a stream), a map-style
            torch ``Dataset``, a list of tensors (one flat buffer), a dict of columns, or paths to files. Several
            named datasets, ``{name: data}``, are mixed inside every batch with ``mix=``, or are a
            :class:`engine.multi.module.MultiDataModule` (a loader per name).
        task_spec: What the task is; picks the collator through the registry. None uses the default collator.
        tokenizer: Tokenizer for raw text (tokenized once at setup) and for pad/mask ids.
        val_data, test_data, predict_data: Optional separate datasets of the same kinds.
        val_split, test_split: Fraction in [0, 1) or row count cut from ``train_data`` (seeded, disjoint).
        stratify: Cut ``val_split``/``test_split`` from every class in proportion (a classification task: the
            spec's ``target_field``), as ``datasets``' ``train_test_split(stratify_by_column=...)``; still a seeded
            function of ``seed``. See docs/concepts.md.
        batch_size: Rows per training batch (default 32); ``eval_batch_size`` (default the same) for the others.
            Under ``batching='token_budget'`` or ``'packed'`` training batches are cut by ``max_tokens``, so
            ``batch_size`` is then the evaluation loaders' size, and giving both it and ``eval_batch_size`` is refused.
        num_workers, pin_memory, ...: Every loader setting, a field of :class:`DataLoaderConfig` given to both
            loaders. Each keyword is declared once, with its type, default, checked values and doc, in
            :data:`engine.loading.settings.SETTINGS`; ``docs/api.md`` tabulates them.
        seed: Seed of the split, the shuffle and every random choice in the collators. ``None`` draws one
            (``secrets.randbits(31)``) at construction and records it: ``dm.seed``, ``dm.state_dict()["seed"]``
            and a checkpoint's hyperparameters hold it, so a resume reproduces the run.
        shuffle: Seeded shuffle with a new order each epoch; default on, except for a stream (read in its order).
        drop_last: Drop the last incomplete training batch (evaluation loaders never shuffle or drop).
        uneven: ``pad`` (repeat a few rows) or ``drop`` (leave a few out) so every rank gets the same number of
            training batches; evaluation always reads every row exactly once.
        collate_fn, collator_name, collator_kwargs: A collate function instead of the registry's choice; or the
            registry's collator of this name; extra keyword arguments for the collator factory.
        batching: 'plain', 'grouped' (rows of similar length share a batch), 'token_budget' (at most
            ``max_tokens`` padded tokens per batch) or 'packed' (whole documents concatenated into one ``[1, T]``
            sequence of at most ``max_tokens``, no padding); None reads ``spec.preprocessing_config['batching']``.
        max_tokens: Token budget per batch for 'token_budget' and 'packed' (else the spec's 'max_tokens').
        balance, attention_weight: Under 'packed' and 'token_budget' batching, ``balance='compute'`` deals each
            step's documents to ranks so their estimated compute, ``tokens + attention_weight * sum(len**2)``
            (padded tokens under token budgets), is about the same (with ``'tokens'``, the default, only their
            tokens are); see docs/distributed.md. None reads the spec's
            ``preprocessing_config``.
        device_normalize: Vision: keep images uint8 in the loader, normalize on the device: Lightning's
            ``on_after_batch_transfer`` does it; a plain loop copies its batches with ``dm.transfer(batch, device)``
            (or calls ``dm.device_normalize(batch)`` once on the device).
        validate: At setup, check the first training batch against the spec; the report is ``dm.validation_report``.
        on_error, max_skipped: A row whose read, decode or transform raises: 'raise' names it in an error, 'skip'
            leaves it out of its batch and records it in ``dm.skipped``, 'warn' also warns once per row.
            ``max_skipped`` caps the rows one pass over a split may leave out (a count, or a fraction per rank).
        train_transform, eval_transform: Per-row callables applied where rows are read (workers too), after any
            cache: training rows seeded by (seed, epoch, index), so augmentation is new every epoch; val/test/predict
            rows (also those cut by ``val_split``) seeded without the epoch. See docs/transforms.md.
        long_rows: Rows longer than the collator's ``max_length``: 'truncate' (keep the start), 'split' (windows
            overlapping by ``stride`` tokens) or 'drop'; counted in ``dm.long_rows_report``. None reads the spec's
            ``preprocessing_config['long_rows']`` (and ``'stride'``), else 'truncate'.
        cache_dir, num_proc: Where raw text tokenized once per machine is cached (default beside the datasets
            cache), and the processes that tokenize it.
        mix: With ``train_data={name: data}``: a :class:`engine.sampling.mixtures.mixture.Mixture` (or its weights
            ``{name: weight}``) that mixes the sources of one task inside every training batch at exact
            proportions, with an optional schedule; see docs/mixtures.md. ``val_split``/``test_split`` cut each
            source.

    Example:
        >>> import torch
        >>> from task_spec import TaskSpec
        >>> rows = [torch.randint(0, 100, (n,)) for n in range(5, 25)]
        >>> dm = DataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2)
        >>> sorted(next(iter(dm.train_dataloader())))
        ['attention_mask', 'input_ids', 'labels']
    """

    def __init__(
        self, train_data: Any = None, *, task_spec: TaskSpec | None = None, tokenizer: Any = None,
        val_data: Any = None, test_data: Any = None, predict_data: Any = None,
        val_split: float | int = 0.0, test_split: float | int = 0.0, stratify: bool = False,
        batch_size: int | None = None, eval_batch_size: int | None = None, num_workers: int = 0, seed: int | None = 42,
        shuffle: bool | None = None, drop_last: bool = False, uneven: str = "pad",
        pin_memory: bool | None = None, persistent_workers: bool | None = None, prefetch_factor: int = 2,
        collate_fn: Callable[..., Any] | None = None, collator_name: str | None = None,
        collator_kwargs: dict[str, Any] | None = None, batching: str | None = None, max_tokens: int | None = None,
        balance: str | None = None, attention_weight: float | None = None,
        device_normalize: bool = False, validate: bool = False,
        on_error: str = "raise", max_skipped: int | float | None = None, num_threads: int = 0,
        train_transform: Callable[..., Any] | None = None, eval_transform: Callable[..., Any] | None = None,
        long_rows: str | None = None, stride: int | None = None, cache_dir: str | None = None,
        num_proc: int | None = None, timeout: float = 0, multiprocessing_context: str | None = None,
        mix: Any = None,
    ) -> None:
        super().__init__()
        seed = drawn_seed(seed)  # before the configuration is recorded, so a checkpoint holds the seed drawn
        settings = {name: value for name, value in locals().items() if name in BY_NAME}  # the seed drawn
        check_module_settings(settings)
        self._record_configuration(options.checkpoint_configuration(settings, NOT_CHECKPOINTED))
        self.constructor_arguments = settings  # as given (the seed drawn): verify_resume builds twins from them
        self.mixture = as_mixture(mix) if mix is not None else None
        named = is_named_datasets(train_data, task_spec, mixed=self.mixture.names if self.mixture else None)
        if named and self.mixture is None:
            raise TypeError(f"train_data={{name: data}} holds several named datasets {sorted(train_data)}; pass "
                            f"mix={{name: weight}} to mix them inside every batch, use MultiDataModule(train_data, "
                            f"...) for a loader per name, or pass one dataset")
        if self.mixture is not None:
            if shuffle is False:  # the mixture's order is a seeded shuffle: shuffle=False would be recorded, not done
                raise ValueError("shuffle=False with mix=: a mixture draws its sources in a seeded order (each block's "
                                 "positions and each source's rows are shuffled), so it cannot serve rows in storage "
                                 "order; leave shuffle unset with mix=, or pass one dataset without mix= for "
                                 "storage order")
            if not named:
                names = ", ".join(f"{name!r}: ..." for name in self.mixture.names)
                raise TypeError(f"mix= mixes named sources, so train_data should be {{name: data}}, but got "
                                f"{type(train_data).__name__}; pass train_data={{{names}}}")
            train_data = take_mixture(train_data, self.mixture.names, task_spec=task_spec, tokenizer=tokenizer,
                                      on_error=on_error)
        check_collator_kwargs(task_spec, collator_kwargs)
        self._given, self._stream = take_inputs(
            train_data, val_data=val_data, test_data=test_data, predict_data=predict_data, task_spec=task_spec,
            tokenizer=tokenizer, val_split=val_split, test_split=test_split, shuffle=shuffle, seed=seed,
            on_error=on_error)
        self.id2label, self.label2id = class_maps(check_same_classes(self._given, task_spec))
        self.skipped = SkipReport.checked(on_error, max_skipped, is_stream=self._stream is not None)  # rows left out
        self.task_spec, self.tokenizer, self.seed = task_spec, tokenizer, seed
        self.val_split, self.test_split, self.uneven, self.validate = val_split, test_split, uneven, validate
        self.stratify = options.check_stratify(stratify, task_spec, val_split=val_split, test_split=test_split,
                                               stream=self._stream is not None, mixture=self.mixture is not None)
        self.rank, self.world_size = 0, 1
        self.train_config, self.eval_config = options.loader_configs(
            settings, shuffle=self._stream is None if shuffle is None else shuffle)
        # a stream is never shuffled here: its own refusal below names what it lacks (lengths up front), where
        # resolve_batching's would ask for shuffle=True, which a stream refuses in turn
        self.batching, self.max_tokens, self.batching_reason = resolve_batching(
            task_spec, batching, max_tokens, self.train_config.shuffle or self._stream is not None)
        options.check_batch_size_is_used(self.batching, batch_size, eval_batch_size)
        if self.mixture is not None:
            check_mixture_batching(self.mixture, self.batching)
        options.check_stream_batching(self._stream is not None, self.batching, self.train_config.num_threads)
        self.balance, self.attention_weight = resolve_balance(task_spec, balance, attention_weight, self.batching,
                                                              stream=self._stream is not None)
        self.collator, self.collator_resolution = module_collator(
            task_spec, tokenizer, collate_fn, collator_name, collator_kwargs, device_normalize=device_normalize,
            batching=self.batching, batching_reason=self.batching_reason)
        self.long_rows = LongRows.resolve(long_rows, stride, task_spec, getattr(self.collator, "max_length", None))
        check_sources(self._given, self._stream, self.long_rows)
        if "train" in self._given:
            check_length_batching(self._given["train"], task_spec, self.batching)
        self.token_cache = TokenCache.resolve(cache_dir, num_proc)
        self.train_config.collate_fn = self.eval_config.collate_fn = self.collator
        self.transforms = split_transforms(train_transform, eval_transform, seed=seed, stream=self._stream is not None)
        check_transforms_can_start(self.transforms, train=self.train_config, evaluation=self.eval_config)
        self.device_normalize = DeviceNormalize.from_collator(self.collator)  # also for collator_kwargs keep_uint8
        self.device_decode = DeviceDecode.from_collator(self.collator)  # a vision-language decode_device
        self.split_plan: SplitPlan | None = None
        self.datasets: dict[str, MapSource] = {}
        self.truncation: dict[str, int] | None = None  # rows and tokens that max_length cuts, after setup
        self.long_rows_report: dict[str, dict[str, Any]] = {}  # per split: what long_rows did, after setup
        self._factory, self._position, self._fingerprint = DataLoaderFactory(), TrainPosition(), None
        self._lock = ModuleLock()  # setup and the first train loader run once, whichever threads ask

    def prepare_data(self) -> None:
        """Tokenize raw text into the on-disk cache; Lightning runs this once per machine (local rank 0)."""
        prepare_tokens(self._given, self.task_spec, self.tokenizer, self.token_cache)

    def setup(self, stage: str | None = None) -> None:
        """Tokenize raw text and compute the splits, once; later calls (any stage) do nothing. Thread-safe: calls
        from several threads at once set up once, the others wait for it."""
        with self._lock:  # every call: cheap uncontended, and no caller sees a half-done setup
            if not self.datasets and self._given:
                self._setup()

    def _record_configuration(self, configuration: dict[str, Any]) -> None:
        """Keep the arguments as plain values (``dm.configuration``), for :meth:`from_configuration`."""
        self.configuration = configuration

    def _world(self) -> tuple[int, int]:
        """(rank, world size) of this process: ``torch.distributed``'s default group, else (0, 1)."""
        return resolve_world()

    def _setup(self) -> None:
        self.rank, self.world_size = self._world()
        sources, self._fingerprint, self.split_plan, self.long_rows_report = prepare_inputs(
            self._given, self._stream, self.task_spec, self.tokenizer, val_split=self.val_split,
            test_split=self.test_split, seed=self.seed, rank=self.rank, world_size=self.world_size,
            long_rows=self.long_rows, cache=self.token_cache, transforms=self.transforms, stratify=self.stratify)
        self.datasets = sources
        self.skipped.apply_to(sources.values())
        self.truncation = log_long_rows(self.long_rows_report)
        for role, source in sources.items():  # spawned workers must be able to receive data and collator
            check_workers_can_start(source, self.train_config if role == "train" else self.eval_config)
        if self.validate and "train" in sources:  # a throwaway loader: the real one's state is untouched
            probe = self._new_train_loader()
            self.validation_report = validate_first_batch(
                probe, self.task_spec, pad_token_id=getattr(self.tokenizer, "pad_token_id", None))

    def first_batch(self) -> Any:
        """The first training batch of a fresh pass (epoch 0), as the train loader builds it: its sampler (packing,
        token budgets, grouping), its rows and its seed. Made in this process; the train loader and the global
        random states are untouched. None without training data. Runs ``setup()``."""
        self.setup()
        return first_batch(self._new_train_loader()) if "train" in self.datasets else None

    @property
    def num_classes(self) -> int | None:
        """The spec's ``num_classes``, else the train data's ``ClassLabel`` count (``id2label``), else None."""
        spec_count = self.task_spec.num_classes if self.task_spec is not None else None
        return spec_count if spec_count is not None else (len(self.id2label) if self.id2label else None)

    @property
    def per_rank_state(self) -> bool:
        """Whether each rank's state is its own (a stream: each rank reads its share), rather than the same on every
        rank (map-style data: the position is the global step's), which ``state_dict()`` saves under one leaf
        that DCP writes once for all ranks."""
        return self._stream is not None

    def state_leaf(self) -> str:
        """``"state"``, shared by every rank; a stream's: ``"rank<r>"``, this rank's own (set up to know it)."""
        if not self.per_rank_state:
            return SHARED_LEAF
        self.setup()
        return rank_leaf(self.rank)

    @property
    def split_sizes(self) -> dict[str, int | None]:
        """Rows per split after setup (0 for a split that is absent, None for a stream of unknown length)."""
        self.setup()
        return {role: (len(self.datasets[role]) if hasattr(self.datasets[role], "__len__") else None)
                if role in self.datasets else 0 for role in ("train", "val", "test", "predict")}

    def train_dataloader(self) -> StatefulDataLoader:
        """The training loader; the same object on every call (from any thread: the first calls build one loader
        together), so its sampler carries the epoch forward and the module's state tracks it."""
        with self._lock:  # the loader is handed out only once attached, with any loaded state
            if self._position.loader is None:
                self.setup()
                if "train" not in self.datasets:
                    raise ValueError(f"there is no train data: pass train_data=... to {type(self).__name__}")
                self._position.attach(self.skipped.attach(self._new_train_loader()))
            return self._position.loader

    def _new_train_loader(self) -> StatefulDataLoader:
        key = self.task_spec.input_fields[0] if self.task_spec else None
        order = None
        if self.mixture is not None:
            order = mixture_order(self.mixture, self.datasets["train"], batching=self.batching, key=key,
                                  global_batch=self.train_config.batch_size * self.world_size, seed=self.seed)
        return self._factory.train_dataloader(
            self.datasets["train"], self.train_config, batching=self.batching, max_tokens=self.max_tokens, key=key,
            rank=self.rank, num_replicas=self.world_size, uneven=self.uneven, order=order, balance=self.balance,
            attention_weight=self.attention_weight)

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
        return self.skipped.attach(self._factory.eval_dataloader(self.datasets[role], self.eval_config, role=role,
                                                                 rank=self.rank, num_replicas=self.world_size))

    def transfer(self, batch: Any, device: torch.device | str, non_blocking: bool | None = None) -> Any:
        """``batch`` on ``device``, finished as the Lightning subclass's batch hooks finish it: the JPEGs a
        vision-language collator left encoded decoded (``device_decode``), every tensor moved
        (:func:`~engine.tools.transfer.move_to_device`, ``non_blocking`` as there), uint8 images normalized
        (``device_normalize``). A plain loop's copy to the device; ``monitor.wrap(loader, device=device,
        transfer=dm.transfer)`` times it as the ``transfer`` stage, outside the wait for the batch."""
        return self._after_transfer(move_to_device(self._before_transfer(batch), device, non_blocking))

    def _before_transfer(self, batch: Any) -> Any:
        """The work before the copy: decode the JPEGs left encoded (``device_decode``); other batches unchanged."""
        return self.device_decode(batch) if self.device_decode is not None else batch

    def _after_transfer(self, batch: Any) -> Any:
        """The work on the device: normalize uint8 images (``device_normalize``); other batches unchanged."""
        return self.device_normalize(batch) if self.device_normalize is not None else batch

    def verify_resume(self, *, steps: int = 8, at: int | None = None, world: int | None = 2,
                      to_world: int | None = 1) -> ResumeCheck:
        """Check that this configuration resumes exactly and on other ranks, in fresh modules built as this one;
        see :func:`engine.tools.verify_resume.verify_resume` and docs/reproducibility.md."""
        return verify_resume(self, steps=steps, at=at, world=world, to_world=to_world)

    def __repr__(self) -> str:
        return render_text(self)

    __str__ = __repr__  # ahead of LightningDataModule's own __str__ (loader sizes only) in the subclass

    def _repr_html_(self) -> str:
        """The notebook view: the report with its figures once set up (:meth:`report`), else the short table."""
        return build_report(self)._repr_html_() if self.datasets else render_html(self)

    def report(self) -> DataReport:
        """What to check before training, read from the columns: split sizes, the collator and why, lengths and
        padding, truncation, labels and the first batch, with figures (runs ``setup()``); see
        :class:`engine.tools.report.DataReport`."""
        return build_report(self)
