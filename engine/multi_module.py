"""Several named training datasets, each with its own task spec and collator, behind one data module.

``UniversalDataModule({"lm": rows, "cls": labelled}, task_spec={"lm": ..., "cls": ...})`` returns a
:class:`MultiDataModule`: one child module per name (own split, collator and seed derived from the name),
one :class:`~engine.multi.MultiDataLoader` for training that yields ``(name, batch)``, and a dict of loaders
for validation and testing (Lightning passes ``dataloader_idx``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from engine.module import UniversalDataModule
from engine.multi import MultiDataLoader, build_multi_loader
from engine.multi_config import MultiDataLoaderConfig
from engine.rng import derive_seed
from engine.state import STATE_VERSION
from task_spec import TaskSpec


class MultiDataModule(UniversalDataModule):
    """Named child modules trained through one seeded, resumable schedule.

    Args:
        train_data: ``{name: data}``; each value is anything UniversalDataModule accepts.
        task_spec: One spec for all, or ``{name: spec}`` with a spec per name.
        multi_config: How batches of the children interleave (round robin over the sum of lengths by default).
        **options: The UniversalDataModule options, applied to every child (``val_data``/``test_data`` may be
            ``{name: data}`` too); each child's seed is derived from ``seed`` and its name.
    """

    def __init__(self, train_data: Mapping[str, Any], *, task_spec: TaskSpec | Mapping[str, TaskSpec] | None = None,
                 multi_config: MultiDataLoaderConfig | None = None, seed: int = 42, **options: Any) -> None:
        import lightning  # the parent's __init__ is skipped: children own the data

        lightning.LightningDataModule.__init__(self)
        names = list(train_data)
        if not names or any(not isinstance(name, str) or not name for name in names):
            raise ValueError(f"several train datasets need non-empty string names, but got {names!r}")
        specs = _per_name(task_spec, names, "task_spec")
        per_name = {key: _per_name(options.pop(key), names, key) for key in ("val_data", "test_data")
                    if isinstance(options.get(key), Mapping)}
        self.children = {
            name: UniversalDataModule(train_data[name], task_spec=specs[name], seed=derive_seed(seed, name) % 2**31,
                                      **options, **{key: values[name] for key, values in per_name.items()})
            for name in names
        }
        config = multi_config if multi_config is not None else MultiDataLoaderConfig()
        self.multi_config = dataclasses.replace(config, dataloader_names=None, choice_rng_seed=seed)
        self.seed, self.task_spec = seed, None
        self._train_loader: MultiDataLoader | None = None
        self._pending_loader_state: dict[str, Any] | None = None

    def setup(self, stage: str | None = None) -> None:
        for child in self.children.values():
            child.trainer = self.trainer
            child.setup(stage)

    @property
    def split_sizes(self) -> dict[str, dict[str, int | None]]:  # type: ignore[override]
        return {name: child.split_sizes for name, child in self.children.items()}

    def train_dataloader(self) -> MultiDataLoader:  # type: ignore[override]
        if self._train_loader is None:
            loaders = {name: child.train_dataloader() for name, child in self.children.items()}
            self._train_loader = build_multi_loader(loaders, self.multi_config)
            if self._pending_loader_state is not None:
                self._train_loader.load_state_dict(self._pending_loader_state)
                self._pending_loader_state = None
        return self._train_loader

    def val_dataloader(self) -> dict[str, Any] | list[Any]:  # type: ignore[override]
        return self._named("val_dataloader")

    def test_dataloader(self) -> dict[str, Any] | list[Any]:  # type: ignore[override]
        return self._named("test_dataloader")

    def predict_dataloader(self) -> dict[str, Any] | list[Any]:  # type: ignore[override]
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

    def state_dict(self) -> dict[str, Any]:
        """Each child's data fingerprints, and the schedule with every child's loader position."""
        self.setup()
        children = {name: child.identity() for name, child in self.children.items()}  # positions are in "multi"
        loader = self._train_loader.state_dict() if self._train_loader is not None else self._pending_loader_state
        return {"version": STATE_VERSION, "children": children, "multi": loader}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check every child's data against the state, then continue the schedule where it stopped."""
        saved = state_dict.get("children", {})
        if sorted(saved) != sorted(self.children):
            raise ValueError(f"the checkpoint has datasets {sorted(saved)}, but this module has "
                             f"{sorted(self.children)}; resume with the same named datasets")
        for name, child in self.children.items():
            child.load_state_dict(saved[name])
        self._train_loader = None
        self._pending_loader_state = state_dict.get("multi")

    def __repr__(self) -> str:
        body = "\n".join(f"  {name}: " + repr(child).replace("\n", "\n  ") for name, child in self.children.items())
        return f"MultiDataModule(schedule={self.multi_config.sampling_strategy.value},\n{body}\n)"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        return "".join(f"<h4>{name}</h4>{child._repr_html_()}" for name, child in self.children.items())


def _per_name(value: Any, names: list[str], what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    if sorted(value) != sorted(names):
        raise ValueError(f"{what} names {sorted(value)} do not match the train datasets {sorted(names)}; "
                         f"give one {what} per name, or a single {what} for all")
    return dict(value)
