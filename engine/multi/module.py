"""Several named training datasets behind one data module, by composition.

``UniversalDataModule({"lm": rows, "cls": labelled}, task_spec={"lm": ..., "cls": ...})`` builds one child module
per name (own split, collator, and a seed derived from the name) and hands them to a :class:`NamedDatasets`, which
the module's public methods defer to: one :class:`~engine.multi.loader.MultiDataLoader` for training that yields
``(name, batch)``, and a dict of loaders for validation and testing (Lightning passes ``dataloader_idx``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from engine.core.rng import derive_seed
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
from engine.multi.loader import MultiDataLoader
from engine.sources.kinds import is_column_dict, is_hf_dataset_dict

PER_NAME_OPTIONS = ("val_data", "test_data", "predict_data")
"""Options that may be given per name as ``{name: data}``; every other option applies to every child."""


def defer_to_named(method: Callable[..., Any]) -> Callable[..., Any]:
    """A data module method that, on a module over several named datasets, runs on its :class:`NamedDatasets`."""

    @functools.wraps(method)
    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        named = self.__dict__.get("named")
        return getattr(named, method.__name__)(*args, **kwargs) if named is not None else method(self, *args, **kwargs)

    return dispatch


def is_named_datasets(train_data: Any, task_spec: Any = None) -> bool:
    """Whether ``train_data`` is ``{name: data}`` (several datasets): not a ``DatasetDict`` of splits, and not one
    dataset's columns (a dict whose keys are the spec's fields, such as ``{"input_ids": ..., "labels": ...}``)."""
    return (isinstance(train_data, Mapping) and not is_hf_dataset_dict(train_data)
            and not is_column_dict(train_data, task_spec))


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


class NamedDatasets:
    """The children of a module over several named datasets, trained through one seeded, resumable schedule.

    Args:
        owner: The data module these children belong to (its ``trainer`` reaches them at setup).
        children: ``{name: child module}``.
        multi_config: How batches of the children interleave (round robin over the sum of lengths by default).
        seed: Seed of the schedule's random choices.
    """

    def __init__(self, owner: Any, children: dict[str, Any], multi_config: MultiDataLoaderConfig | None,
                 seed: int) -> None:
        config = multi_config if multi_config is not None else MultiDataLoaderConfig()
        if not isinstance(config, MultiDataLoaderConfig):
            raise TypeError(f"multi_config should be a MultiDataLoaderConfig, but got {type(config).__name__}")
        self.owner, self.children = owner, children
        self.multi_config = dataclasses.replace(config, dataloader_names=None, choice_rng_seed=seed)
        self._train_loader: MultiDataLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None

    @classmethod
    def build(cls, owner: Any, child_class: type, *, train_data: Mapping[str, Any], task_spec: Any, seed: int,
              multi_config: MultiDataLoaderConfig | None, **options: Any) -> NamedDatasets:
        """Children of ``child_class`` (the data module class) built from the owner's arguments."""
        children = {name: child_class(**kwargs)
                    for name, kwargs in child_arguments(train_data, task_spec, seed, options).items()}
        return cls(owner, children, multi_config, seed)

    def setup(self, stage: str | None = None) -> None:
        for child in self.children.values():
            child.trainer = self.owner.trainer
            child.setup(stage)

    @property
    def split_sizes(self) -> dict[str, dict[str, int | None]]:
        return {name: child.split_sizes for name, child in self.children.items()}

    def train_dataloader(self) -> MultiDataLoader:
        if self._train_loader is None:
            loaders = {name: child.train_dataloader() for name, child in self.children.items()}
            self._train_loader = build_multi_loader(loaders, self.multi_config)
            if self._pending_loader_state is not None:
                self._train_loader.load_state_dict(self._pending_loader_state)
                self._pending_loader_state = None
        return self._train_loader

    def val_dataloader(self) -> dict[str, Any] | list[Any]:
        return self._named("val_dataloader")

    def test_dataloader(self) -> dict[str, Any] | list[Any]:
        return self._named("test_dataloader")

    def predict_dataloader(self) -> dict[str, Any] | list[Any]:
        return self._named("predict_dataloader")

    def _named(self, method: str) -> dict[str, Any] | list[Any]:
        loaders = {name: getattr(child, method)() for name, child in self.children.items()}
        loaders = {name: loader for name, loader in loaders.items() if not isinstance(loader, list)}
        return loaders or []

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, tuple) and len(batch) == 2 and batch[0] in self.children:
            name, inner = batch
            return name, self.children[name].on_after_batch_transfer(inner, dataloader_idx)
        return batch

    def identity(self) -> dict[str, Any]:
        """What a saved state must match: every child's identity."""
        return {VERSION: STATE_VERSION, CHILDREN: {name: child.identity() for name, child in self.children.items()}}

    def state_dict(self) -> dict[str, Any]:
        """Each child's data fingerprints, and the schedule with every child's loader position."""
        loader = self._train_loader.state_dict() if self._train_loader is not None else self._pending_loader_state
        return {**self.identity(), MULTI: loader}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check every child's data against the state, then continue the schedule where it stopped."""
        check_structure(state_dict, required=(VERSION, CHILDREN, MULTI))
        check_compatible(state_dict, {VERSION: STATE_VERSION})
        saved = state_dict[CHILDREN]
        if sorted(saved) != sorted(self.children):
            raise ValueError(f"the checkpoint has datasets {sorted(saved)}, but this module has "
                             f"{sorted(self.children)}; resume with the same named datasets")
        for name, child in self.children.items():  # their positions are in the multi-loader's state
            check_compatible(saved[name], child.identity())  # the schedule is not elastic: same ranks and workers
            child.load_state_dict({**saved[name], EPOCH: 0, TRAIN_LOADER: None})
        self._train_loader = None
        self._pending_loader_state = state_dict.get(MULTI)

    def __repr__(self) -> str:
        body = "\n".join(f"  {name}: " + repr(child).replace("\n", "\n  ") for name, child in self.children.items())
        return f"UniversalDataModule(schedule={self.multi_config.sampling_strategy.value},\n{body}\n)"

    def _repr_html_(self) -> str:
        return "".join(f"<h4>{name}</h4>{child._repr_html_()}" for name, child in self.children.items())


def _per_name(value: Any, names: list[str], what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    if sorted(value) != sorted(names):
        raise ValueError(f"{what} names {sorted(value)} do not match the train datasets {sorted(names)}; "
                         f"give one {what} per name, or a single {what} for all")
    return dict(value)


def build_multi_loader(
    named_loaders: Mapping[str, Any], config: MultiDataLoaderConfig | None = None
) -> MultiDataLoader:
    """A :class:`MultiDataLoader` over ``{name: loader}`` (e.g. one StatefulDataLoader per dataset and task spec).

    Example:
        >>> multi = build_multi_loader({"a": [1, 2, 3], "b": [10]}, MultiDataLoaderConfig(cycle_short_loaders=False))
        >>> list(multi)
        [('a', 1), ('b', 10), ('a', 2), ('a', 3)]
    """
    if not isinstance(named_loaders, Mapping) or not named_loaders:
        raise ValueError(f"named_loaders should be a non-empty dict of name -> loader, but got {named_loaders!r}")
    return MultiDataLoader(named_loaders, config)
