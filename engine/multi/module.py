"""Several named training datasets behind one data module: :class:`MultiDataModule`, a composite of one
``UniversalDataModule`` per name, trained through one :class:`~engine.multi.loader.MultiDataLoader`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from engine.core.compat import lightning
from engine.core.locks import ModuleLock
from engine.core.rng import derive_seed, drawn_seed
from engine.core.stateful import SHARED_LEAF, SavedAsOneLeaf
from engine.datamodule.checkpointing import read_configuration
from engine.datamodule.options import checkpoint_configuration, record_configuration, restore_configuration
from engine.datamodule.universal import NOT_CHECKPOINTED, UniversalDataModule
from engine.loading.state import (
    CHILDREN,
    EPOCH,
    MULTI,
    STATE_VERSION,
    TRAIN_LOADER,
    VERSION,
    check_compatible,
    check_structure,
)
from engine.multi.config import MultiDataLoaderConfig
from engine.multi.loader import MultiDataLoader, build_multi_loader
from engine.sources.kinds import DATASETS, is_hf_dataset_dict, is_named_datasets
from engine.tools.report import DataReport
from task_spec import TaskSpec

PER_NAME_OPTIONS = ("val_data", "test_data", "predict_data")
"""Options that may be given per name as ``{name: data}``; every other option applies to every child."""


def child_arguments(train_data: Mapping[str, Any], task_spec: Any, seed: int,
                    options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The keyword arguments of each named child module: its data, its spec and a seed derived from its name."""
    names = list(train_data)
    if not names or any(not isinstance(name, str) or not name for name in names):
        raise ValueError(f"several train datasets need non-empty string names, but got {names!r}")
    specs = _per_name(task_spec, names, "task_spec")
    per_name = {key: _per_name(options[key], names, key) for key in PER_NAME_OPTIONS
                if isinstance(options.get(key), Mapping) and not is_hf_dataset_dict(options[key])}
    shared = {key: value for key, value in options.items() if key not in per_name}
    return {
        name: {"train_data": train_data[name], "task_spec": specs[name], "seed": derive_seed(seed, name) % 2**31,
               **shared, **{key: values[name] for key, values in per_name.items()}}
        for name in names
    }


class MultiDataModule(SavedAsOneLeaf, lightning().LightningDataModule):
    """Several named datasets trained through one seeded, resumable schedule: a composite of one
    :class:`~engine.datamodule.universal.UniversalDataModule` per name (``dm.children``), each with its own spec,
    split, collator and a seed derived from its name.

    Training yields ``(name, batch)`` from one :class:`~engine.multi.loader.MultiDataLoader`; validation, test and
    prediction give ``{name: loader}`` (Lightning passes ``dataloader_idx``). ``state_dict`` holds every child's
    identity and the schedule with each child's position.

    Args:
        train_data: ``{name: data}``, each value any data ``UniversalDataModule`` takes.
        task_spec: One spec for every dataset, or ``{name: spec}``.
        seed: Seeds the schedule's random choices and, through each name, every child (``derive_seed(seed, name)``).
            ``None`` draws one at construction and records it (``dm.seed``, the state, the checkpoint).
        multi_config: How the children's batches interleave (round robin over the sum of lengths by default). Its
            ``choice_rng_seed`` and ``dataloader_names`` are this module's seed and names: leave them unset, or give
            the same values.
        **options: Any other ``UniversalDataModule`` keyword, applied to every child; ``val_data``, ``test_data``
            and ``predict_data`` may also be ``{name: data}``.

    Example:
        >>> import torch
        >>> from task_spec import TaskSpec
        >>> rows = [torch.arange(1, n) for n in range(3, 13)]
        >>> dm = MultiDataModule({"a": rows, "b": rows[:4]}, task_spec=TaskSpec.lm_tiny(), batch_size=2)
        >>> [name for name, _ in dm.train_dataloader()]
        ['a', 'b', 'a', 'b', 'a', 'a', 'a']
    """

    def __init__(self, train_data: Mapping[str, Any], *, task_spec: Any = None, seed: int | None = 42,
                 multi_config: MultiDataLoaderConfig | None = None, **options: Any) -> None:
        super().__init__()
        if not is_named_datasets(train_data, task_spec if isinstance(task_spec, TaskSpec) else None,
                                 ambiguous=DATASETS):
            raise TypeError(f"MultiDataModule takes train_data={{name: data}}, but got {type(train_data).__name__}; "
                            f"use UniversalDataModule for a single dataset")
        seed = drawn_seed(seed)  # recorded below, so a checkpoint holds the seed drawn
        configuration = {"task_spec": task_spec, "seed": seed, "multi_config": multi_config, **options}
        record_configuration(self, checkpoint_configuration(configuration, NOT_CHECKPOINTED))
        self.seed, self.task_spec = seed, task_spec
        self.multi_config = schedule_config(multi_config, seed=seed, names=list(train_data))
        self.children: dict[str, UniversalDataModule] = {
            name: UniversalDataModule(**kwargs)
            for name, kwargs in child_arguments(train_data, task_spec, seed, options).items()}
        self._train_loader: MultiDataLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None
        self._lock = ModuleLock()  # the first train loader is built once, whichever threads ask

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, **data: Any) -> MultiDataModule:
        """A module configured as the one in a Lightning checkpoint; pass the data (and tokenizer) again, e.g.
        ``MultiDataModule.load_from_checkpoint(path, train_data={"a": rows, "b": other})``."""
        arguments = restore_configuration(read_configuration(checkpoint_path, map_location), data)
        config = arguments.get("multi_config")
        if isinstance(config, Mapping):
            # A module built before its schedule seed had one home recorded the seed it was given, but its
            # schedule ran on the module's seed: rebuild that schedule.
            arguments["multi_config"] = MultiDataLoaderConfig(**{**config, "choice_rng_seed": None})
        return cls(**arguments)

    def prepare_data(self) -> None:
        """Tokenize each child's raw text into the on-disk cache (Lightning: once per machine)."""
        for child in self.children.values():
            child.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        """Set up every child (its splits, once), under this module's trainer."""
        for child in self.children.values():
            child.trainer = self.trainer
            child.setup(stage)

    def teardown(self, stage: str | None = None) -> None:
        """Tear down every child (each gives the trainer back what its setup changed)."""
        for child in self.children.values():
            child.teardown(stage)

    @property
    def split_sizes(self) -> dict[str, dict[str, int | None]]:
        """``{name: the child's split sizes}``."""
        return {name: child.split_sizes for name, child in self.children.items()}

    def train_dataloader(self) -> MultiDataLoader:
        """The schedule over the children's train loaders; the same object on every call (from any thread: the
        first calls build one loader together)."""
        with self._lock:  # the loader is handed out only once built, with any loaded state
            if self._train_loader is None:
                loaders = {name: child.train_dataloader() for name, child in self.children.items()}
                loader = build_multi_loader(loaders, self.multi_config)
                if self._pending_loader_state is not None:
                    loader.load_state_dict(self._pending_loader_state)
                    self._pending_loader_state = None
                self._train_loader = loader
            return self._train_loader

    def val_dataloader(self) -> dict[str, Any] | list[Any]:
        """``{name: loader}`` of the children that have validation data; ``[]`` when none has."""
        return self._named("val_dataloader")

    def test_dataloader(self) -> dict[str, Any] | list[Any]:
        """``{name: loader}`` of the children that have test data; ``[]`` when none has."""
        return self._named("test_dataloader")

    def predict_dataloader(self) -> dict[str, Any] | list[Any]:
        """``{name: loader}`` of the children that have prediction data; ``[]`` when none has."""
        return self._named("predict_dataloader")

    def _named(self, method: str) -> dict[str, Any] | list[Any]:
        loaders = {name: getattr(child, method)() for name, child in self.children.items()}
        loaders = {name: loader for name, loader in loaders.items() if not isinstance(loader, list)}
        return loaders or []

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning hook, on the device: a ``(name, batch)`` is finished by that child's hook."""
        if isinstance(batch, tuple) and len(batch) == 2 and batch[0] in self.children:
            name, inner = batch
            return name, self.children[name].on_after_batch_transfer(inner, dataloader_idx)
        return batch

    def identity(self) -> dict[str, Any]:
        """What a saved state must match: every child's identity."""
        return {VERSION: STATE_VERSION, CHILDREN: {name: child.identity() for name, child in self.children.items()}}

    def data_state(self) -> dict[str, Any]:
        """Each child's identity, and the schedule with every child's loader position."""
        loader = self._train_loader.data_state() if self._train_loader is not None else self._pending_loader_state
        return {**self.identity(), MULTI: loader}

    def state_leaf(self) -> str:
        """``"state"``, the same on every rank, unless a child reads a stream (then this rank's own leaf)."""
        streams = [child for child in self.children.values() if child.per_rank_state]
        return streams[0].state_leaf() if streams else SHARED_LEAF

    def load_data_state(self, state_dict: Mapping[str, Any]) -> None:
        """Check every child's data against the state, then continue the schedule where it stopped. Thread-safe: it
        waits for a train loader being built, and the next ``train_dataloader()`` continues from this state."""
        check_structure(state_dict, required=(VERSION, CHILDREN, MULTI))
        check_compatible(state_dict, {VERSION: STATE_VERSION})
        saved = state_dict[CHILDREN]
        if sorted(saved) != sorted(self.children):
            raise ValueError(f"the checkpoint has datasets {sorted(saved)}, but this module has "
                             f"{sorted(self.children)}; resume with the same named datasets")
        with self._lock:
            for name, child in self.children.items():  # their positions are in the multi-loader's state
                check_compatible(saved[name], child.identity())  # not elastic: same ranks and workers
                child.load_state_dict({**saved[name], EPOCH: 0, TRAIN_LOADER: None})
            self._train_loader = None
            self._pending_loader_state = state_dict.get(MULTI)

    def report(self, name: str | None = None) -> DataReport:
        """The report of the child ``name`` (see ``UniversalDataModule.report``); every child has its own."""
        if name not in self.children:
            raise ValueError(f"report() describes one dataset: pass name= one of {sorted(self.children)} (e.g. "
                             f"dm.report({next(iter(self.children))!r})), but got name={name!r}")
        return self.children[name].report()

    def __repr__(self) -> str:
        body = "\n".join(f"  {name}: " + repr(child).replace("\n", "\n  ") for name, child in self.children.items())
        return f"MultiDataModule(schedule={self.multi_config.sampling_strategy.value},\n{body}\n)"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        return "".join(f"<h4>{name}</h4>{child._repr_html_()}" for name, child in self.children.items())


def schedule_config(config: MultiDataLoaderConfig | None, *, seed: int, names: list[str]) -> MultiDataLoaderConfig:
    """``config`` with the module's seed and names filled in; a field that contradicts them is refused."""
    config = config if config is not None else MultiDataLoaderConfig()
    if not isinstance(config, MultiDataLoaderConfig):
        raise TypeError(f"multi_config should be a MultiDataLoaderConfig, but got {type(config).__name__}")
    if config.choice_rng_seed is not None and config.choice_rng_seed != seed:
        raise ValueError(f"multi_config.choice_rng_seed={config.choice_rng_seed} contradicts seed={seed}: a "
                         f"MultiDataModule seeds its schedule with its seed; drop choice_rng_seed, or pass "
                         f"seed={config.choice_rng_seed}")
    if config.dataloader_names is not None and config.dataloader_names != names:
        raise ValueError(f"multi_config.dataloader_names={config.dataloader_names} contradicts the names of "
                         f"train_data {names} (in that order: weights and patterns follow it); drop "
                         f"dataloader_names")
    return dataclasses.replace(config, choice_rng_seed=seed, dataloader_names=None)


def _per_name(value: Any, names: list[str], what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    if sorted(value) != sorted(names):
        raise ValueError(f"{what} names {sorted(value)} do not match the train datasets {sorted(names)}; "
                         f"give one {what} per name, or a single {what} for all")
    return dict(value)
