"""Checks of UniversalDataModule's arguments against each other, made before any data is touched."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from engine.core.compat import record_hparams
from engine.loading.config import DataLoaderConfig
from engine.loading.settings import LOADER_SETTINGS
from engine.sampling.modes import BUDGET_MODES
from task_spec import TaskSpec


def check_data_arguments(*, has_train: bool, has_predict: bool, val_data: Any, test_data: Any,
                         val_split: float | int, test_split: float | int) -> None:
    """Refuse arguments that contradict each other, naming both and the fix."""
    if not has_train and not has_predict:
        raise ValueError("UniversalDataModule needs train_data (or predict_data for prediction only)")
    if val_data is not None and val_split:
        raise ValueError(
            f"both val_data and val_split={val_split!r} were given; pass one: val_split cuts validation rows "
            f"out of train_data, val_data supplies them"
        )
    if test_data is not None and test_split:
        raise ValueError(f"both test_data and test_split={test_split!r} were given; pass one")


def check_stratify(stratify: Any, task_spec: TaskSpec | None, *, val_split: float | int, test_split: float | int,
                   stream: bool, mixture: bool) -> bool:
    """``stratify`` (a bool: its setting's check) checked against the others: for a classification task whose spec
    names its label, with rows to cut."""
    if not stratify:
        return False
    if task_spec is None or task_spec.task_type != "classification" or task_spec.target_field is None:
        task = "no task_spec" if task_spec is None else f"task_type={task_spec.task_type!r}"
        raise ValueError(f"stratify=True cuts val_split/test_split from every class in proportion, so it needs a "
                         f"classification task whose spec names its label (target_field), but got {task}; pass "
                         f"stratify=False")
    if not val_split and not test_split:
        raise ValueError(f"stratify=True stratifies the rows val_split and test_split cut from train_data, but got "
                         f"val_split={val_split!r} and test_split={test_split!r}; pass val_split=... (a fraction or a "
                         f"row count), or stratify=False")
    if stream or mixture:
        raise ValueError(f"stratify=True reads every row's class before the split, which "
                         f"{'a stream' if stream else 'a mixture (mix=)'} does not allow here; pass stratify=False")
    return True


def device_normalize_kwargs(device_normalize: bool, collate_fn: Any, task_spec: TaskSpec | None,
                            collator_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The collator options with ``keep_uint8=True`` when images are to be normalized on the device."""
    kwargs = dict(collator_kwargs or {})
    if device_normalize:
        if collate_fn is not None or task_spec is None or task_spec.modality != "vision":
            raise ValueError("device_normalize=True keeps images uint8 in the registry's vision collator, so it "
                             "needs a vision task_spec and no collate_fn (a collate_fn that returns uint8 "
                             "can be finished with engine.tools.device.DeviceNormalize)")
        kwargs["keep_uint8"] = True
    return kwargs


def check_stream_batching(is_stream: bool, batching: str, num_threads: int = 0) -> None:
    """Refuse, at construction, what a stream cannot do: length-aware batching, and background threads (which load
    through a batch sampler; the loader factory refuses them too, but only once the train loader is built)."""
    if is_stream and batching != "plain":
        raise ValueError(f"batching={batching!r} needs every row's length up front, which a stream "
                         f"(datasets.IterableDataset) does not have; use batching='plain' or a map-style Dataset")
    if is_stream and num_threads:
        raise ValueError(f"num_threads={num_threads} loads map-style data through its batch sampler, but the data "
                         f"is an IterableDataset (a stream); set num_threads=0, or num_workers > 0 to read it in "
                         f"workers")


DEFAULT_BATCH_SIZE = 32


PER_LOADER = ("batch_size", "shuffle", "drop_last", "collate_fn")
"""Loader settings the module chooses per loader (evaluation never shuffles or drops rows; the collator is set once
it is built); every other loader setting goes to both loaders as given."""


def loader_configs(values: Mapping[str, Any], *, shuffle: bool) -> tuple[DataLoaderConfig, DataLoaderConfig]:
    """The training and evaluation loader configs of a module from ``values``, its settings by name, and the
    ``shuffle`` resolved for its data; evaluation never shuffles or drops rows."""
    shared = {setting.name: values[setting.name] for setting in LOADER_SETTINGS if setting.name not in PER_LOADER}
    batch_size = DEFAULT_BATCH_SIZE if values["batch_size"] is None else values["batch_size"]
    train = DataLoaderConfig(batch_size=batch_size, shuffle=shuffle, drop_last=values["drop_last"], **shared)
    return train, DataLoaderConfig(batch_size=values["eval_batch_size"] or batch_size, shuffle=False, **shared)


def check_batch_size_is_used(batching: str, batch_size: int | None, eval_batch_size: int | None) -> None:
    """Refuse a ``batch_size`` nothing would use: under a token budget (``token_budget``, ``packed``) training
    batches are cut by ``max_tokens``, so ``batch_size`` only sizes the evaluation batches, which
    ``eval_batch_size`` then sets instead."""
    if batching in BUDGET_MODES and batch_size is not None and eval_batch_size is not None:
        raise ValueError(f"batch_size={batch_size} is used by no loader: batching={batching!r} cuts training batches "
                         f"by max_tokens, and eval_batch_size={eval_batch_size} sizes the evaluation batches; drop "
                         f"batch_size")


def check_pad_id(collator: Any, tokenizer: Any) -> None:
    """Refuse a pad id the tokenizer does not have (a tokenizer without a pad token, plus a preset's id): the
    model's embedding would be indexed past its end, a device-side assert far from its cause."""
    pad_id = getattr(collator, "pad_token_id", None)
    if tokenizer is None or pad_id is None or not hasattr(tokenizer, "__len__"):
        return
    if not 0 <= pad_id < len(tokenizer):
        raise ValueError(
            f"pad_token_id should be an id of the tokenizer (0..{len(tokenizer) - 1}), but got pad_token_id={pad_id}"
            f", which the tokenizer does not have (its pad_token is {getattr(tokenizer, 'pad_token', None)!r}, so "
            f"the id came from the TaskSpec). Set tokenizer.pad_token (e.g. tokenizer.pad_token = "
            f"tokenizer.eos_token) or spec.replace(special_tokens={{'pad_token_id': ...}})"
        )


def plain(value: Any) -> Any:
    """``value`` as plain Python values (dicts, lists, str, numbers, bool, None), so a checkpoint that holds it
    loads with ``torch.load(weights_only=True)``; a TaskSpec or config dataclass becomes a dict of its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, os.PathLike):  # cache_dir=Path(...)
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} cannot be stored in a checkpoint's configuration")


NOT_PLAIN = "not_checkpointed"
"""Key listing the given arguments that could not be stored as plain values; they must be passed again."""


def checkpoint_configuration(arguments: Mapping[str, Any], leave_out: Sequence[str]) -> dict[str, Any]:
    """The module's arguments as plain values for ``datamodule_hyper_parameters``, without data or tokenizer.
    An argument that is not plain (a collator option holding an object) is named under ``NOT_PLAIN`` instead, so
    that rebuilding the module from the checkpoint asks for it rather than silently going without it."""
    configuration: dict[str, Any] = {NOT_PLAIN: []}
    for name, value in arguments.items():
        if name in leave_out:
            continue
        try:
            configuration[name] = plain(value)
        except TypeError:
            configuration[NOT_PLAIN].append(name)
    return configuration


def record_configuration(module: Any, configuration: Mapping[str, Any]) -> None:
    """Store ``configuration`` where Lightning's checkpoints read a module's hyperparameters (``hparams_initial``).

    ``save_hyperparameters()`` would also walk the caller's frames, and reading a frame's locals keeps a snapshot
    of them alive: the caller's earlier loaders, and their worker processes, would outlive their names.
    """
    record_hparams(module, dict(configuration))


def restore_configuration(configuration: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The module's arguments back from :func:`checkpoint_configuration`, specs rebuilt, updated with the ``given``
    ones (the data, the tokenizer); an argument that was not checkpointed must be given."""
    arguments = dict(configuration)
    missing = [name for name in arguments.pop(NOT_PLAIN, []) if name not in given]
    if missing:
        raise ValueError(f"the checkpoint's module was built with {missing}, which a checkpoint cannot hold as plain "
                         f"values; pass {', '.join(f'{name}=...' for name in missing)} to load_from_checkpoint "
                         f"(or from_configuration)")
    spec = arguments.get("task_spec")
    if isinstance(spec, Mapping) and "task_type" in spec:
        arguments["task_spec"] = TaskSpec(**spec)
    elif isinstance(spec, Mapping):  # several named datasets: {name: spec}
        arguments["task_spec"] = {name: TaskSpec(**fields) for name, fields in spec.items()}
    return {**arguments, **given}
