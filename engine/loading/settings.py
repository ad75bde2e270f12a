"""One home per setting: each keyword of ``UniversalDataModule`` declared once, in :data:`SETTINGS`.

A declaration holds the setting's name, type, default, the values it is checked against, a one-line doc, and what
a checkpoint does with it (records it in the module's configuration; checks it when a saved state is resumed).
Derived from it, so that adding a setting touches this table and ``UniversalDataModule``'s signature only:

- the checks: :class:`~engine.loading.config.DataLoaderConfig` checks its fields, the module its own settings
  (:func:`check_module_settings`), in torch's form ("batch_size should be a positive integer, but got
  batch_size=0");
- :class:`~engine.loading.config.DataLoaderConfig`'s fields (:func:`loader_fields`) and the settings the module
  hands to both of its loaders;
- the checkpoint: the configuration a checkpoint records (:data:`NOT_RECORDED` are given again) and the settings
  a resumed state must match (:data:`RESUMED`, with the reason each matters);
- the loader line of ``repr(dm)`` (``shown``);
- the settings table and the two signatures in ``docs/api.md`` (``python -m engine.datamodule.settings_doc``).

``tests/docs/test_settings_table.py`` fails when the signature, ``DataLoaderConfig`` or ``docs/api.md`` differ
from the declarations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.core.checks import check_int


@dataclass(frozen=True)
class Check:
    """The values a setting takes, and the error that refuses any other (a wrong type TypeError, a wrong value
    ValueError), naming the setting and the value it got."""

    kind: str
    """'int', 'number' (an int or float), 'bool', 'choice' (one of ``choices``) or 'callable'."""
    minimum: int | None = None
    """The least value of an 'int' or 'number'."""
    choices: tuple[Any, ...] = ()
    """The values of a 'choice'."""
    none: bool = False
    """None is taken too (it means "decide automatically")."""

    def __call__(self, name: str, value: Any, owner: str = "") -> Any:
        """``value``, an integer as a Python int; raises otherwise. ``owner`` prefixes the name in the error
        (``"DataLoaderConfig."``); integers are named alone, in torch's form."""
        if value is None and self.none:
            return value
        if self.kind == "int":
            return check_int(name, value, minimum=self.minimum)
        if self.kind == "bool" and not isinstance(value, bool):
            if self.none:
                raise TypeError(f"{owner}{name} should be True, False or None (auto), but got {value!r}")
            raise TypeError(f"{owner}{name} should be a bool, but got {name}={value!r}")
        if self.kind == "number" and (not isinstance(value, (int, float)) or value < (self.minimum or 0)):
            raise ValueError(f"{owner}{name} should be a number >= {self.minimum or 0}, but got {name}={value!r}")
        if self.kind == "choice" and value not in self.choices:
            if self.none:
                raise ValueError(f"{owner}{name} should be one of {self.choices} or None, but got {value!r}")
            raise ValueError(f"{owner}{name} should be {self.describe()}, but got {name}={value!r}")
        if self.kind == "callable" and not callable(value):
            raise TypeError(f"{owner}{name} should be callable, but got {value!r}")
        return value

    def describe(self) -> str:
        """The values taken, in words: ``"an integer >= 1 or None"``, ``"'pad' or 'drop'"``."""
        if self.kind == "choice":
            words = [repr(choice) for choice in self.choices] + (["None"] if self.none else [])
            return ", ".join(words[:-1]) + f" or {words[-1]}"
        if self.kind == "bool":
            return "True, False or None" if self.none else "True or False"
        words = {"int": f"an integer >= {self.minimum}" if self.minimum is not None else "an integer",
                 "number": f"a number >= {self.minimum or 0}", "callable": "a callable"}[self.kind]
        return f"{words} or None" if self.none else words


@dataclass(frozen=True)
class LoaderField:
    """A setting that is also a field of :class:`~engine.loading.config.DataLoaderConfig`."""

    type: str
    """The field's annotation."""
    default: Any
    """The field's default (a config made directly; the module passes its own value)."""
    doc: str = ""
    """The field's doc where it differs from the module's (``""``: the setting's doc)."""
    to_dataloader: bool = False
    """Passed to torch's ``DataLoader`` as given, by :meth:`DataLoaderConfig.resolve`."""


@dataclass(frozen=True)
class Setting:
    """One keyword of ``UniversalDataModule``, declared once."""

    name: str
    type: str
    """The annotation in ``UniversalDataModule``'s signature."""
    default: Any
    """The default in ``UniversalDataModule``'s signature."""
    doc: str
    """One line: what it is and what None means."""
    check: Check | None = None
    """The values taken; run by ``DataLoaderConfig`` for a loader setting, by the module for the others. None: the
    setting is checked with the others it depends on (the spec, the data) where it is resolved."""
    recorded: bool = True
    """A checkpoint's configuration records it (``load_from_checkpoint`` rebuilds the module from it; a value that is
    not plain is named there, to be given again); False for the data, the tokenizer and ``collate_fn``, which
    ``load_from_checkpoint`` takes again without being asked."""
    resume: str = ""
    """Why a resumed training state must have been saved with the same value (``""``: it need not). An elastic
    resume of map-style data takes another ``num_workers``, and another ``batch_size`` with the same global batch
    (:func:`engine.loading.state.check_compatible`)."""
    loader: LoaderField | None = None
    """Its ``DataLoaderConfig`` field, for a loader setting."""
    shown: str = ""
    """In the loader line of ``repr(dm)``: 'always', 'changed' (when not the field's default), or ``""``."""


POSITIVE, NON_NEGATIVE = Check("int", minimum=1), Check("int", minimum=0)
BOOL, AUTO_BOOL = Check("bool"), Check("bool", none=True)
SAME = "the saved position counts batches of the old size, so rows would be lost or repeated"

SETTINGS: tuple[Setting, ...] = (
    # The data and the task.
    Setting("train_data", "Any", None, "The training data (a dataset, a stream, tensors, columns, files or Shards); "
            "{name: data} with mix=", recorded=False),
    Setting("task_spec", "TaskSpec | None", None, "What the task is; picks the collator (None: the default collator)"),
    Setting("tokenizer", "Any", None, "Tokenizes raw text (once, at setup) and gives the pad and mask ids",
            recorded=False),
    Setting("val_data", "Any", None, "Validation data, of the kinds train_data takes", recorded=False),
    Setting("test_data", "Any", None, "Test data, of the kinds train_data takes", recorded=False),
    Setting("predict_data", "Any", None, "Prediction data, of the kinds train_data takes", recorded=False),
    Setting("val_split", "float | int", 0.0, "Fraction in [0, 1) or row count cut from train_data for validation"),
    Setting("test_split", "float | int", 0.0, "Fraction in [0, 1) or row count cut from train_data for testing"),
    Setting("stratify", "bool", False, "Cut val_split and test_split from every class in proportion (a "
            "classification task: the spec's target_field)", BOOL),
    # The loader settings: DataLoaderConfig's fields, in its order.
    Setting("batch_size", "int | None", None, "Rows per training batch (None: 32); under token_budget or packed "
            "batching it sizes only the evaluation batches", POSITIVE, resume=SAME, shown="always",
            loader=LoaderField("int", 32, "Rows per batch")),
    Setting("shuffle", "bool | None", None, "Seeded shuffle with a new order each epoch (None: on, except for a "
            "stream)", BOOL, resume="the order of the epoch differs, so the rest of the saved epoch would lose or "
            "repeat rows", shown="always", loader=LoaderField(
                "bool", False, "Seeded shuffle with a new order each epoch (derived from seed and the epoch)")),
    Setting("num_workers", "int", 0, "Worker processes; 0 loads in the main process", NON_NEGATIVE, shown="always",
            resume="a stream's position, or a schedule over several datasets, is held per worker process and cannot "
            "be dealt to other workers", loader=LoaderField("int", 0)),
    Setting("pin_memory", "bool | None", None, "Page-locked host memory for faster GPU copies (None: when CUDA is "
            "available)", AUTO_BOOL, loader=LoaderField("bool | None", None)),
    Setting("prefetch_factor", "int", 2, "Batches each worker prepares ahead; applies only with workers",
            Check("int", minimum=1, none=True), loader=LoaderField("int | None", 2)),
    Setting("persistent_workers", "bool | None", None, "Keep workers between epochs (None: when num_workers > 0)",
            AUTO_BOOL, loader=LoaderField("bool | None", None)),
    Setting("seed", "int | None", 42, "Seed of the split, the order and every random choice; None draws one "
            "(secrets.randbits(31)) and records it", Check("int", minimum=0, none=True),
            resume="the seed decides the split, the order and every random choice",
            loader=LoaderField("int | None", 0, "Seed of the shuffle, of per-batch randomness and of workers; None "
                               "draws one (secrets.randbits(31)) and records it")),
    Setting("collate_fn", "Callable[..., Any] | None", None, "A collate function instead of the registry's "
            "collator", Check("callable", none=True), recorded=False, loader=LoaderField(
                "Callable[..., Any] | None", None, "Turns a list of rows into a batch (None: the default collator)")),
    Setting("drop_last", "bool", False, "Drop the last incomplete training batch (evaluation never drops rows)",
            BOOL, resume="the epoch has another number of batches, so the saved position points elsewhere",
            shown="always", loader=LoaderField("bool", False, "Drop the last incomplete batch")),
    Setting("timeout", "float", 0, "Seconds to wait for a worker's batch (0 waits forever)", Check("number"),
            loader=LoaderField("float", 0, to_dataloader=True)),
    Setting("multiprocessing_context", "str | None", None, "How workers start: 'fork', 'spawn' or 'forkserver' "
            "(None: the platform's default)", Check("choice", choices=("fork", "spawn", "forkserver"), none=True),
            loader=LoaderField("str | None", None)),
    Setting("num_threads", "int", 0, "Background threads of this process that load the next batches while the step "
            "runs; not combined with num_workers", NON_NEGATIVE, shown="changed", loader=LoaderField("int", 0)),
    # The module's own settings.
    Setting("eval_batch_size", "int | None", None, "Rows per validation, test and prediction batch (None: "
            "batch_size)", Check("int", minimum=1, none=True)),
    Setting("uneven", "str", "pad", "How ranks get as many training batches: 'pad' repeats a few rows, 'drop' leaves "
            "a few out", Check("choice", choices=("pad", "drop")),
            resume="ranks are equalized another way, so each rank's rows differ"),
    Setting("collator_name", "str | None", None, "The registry's collator of this name, instead of the spec's choice"),
    Setting("collator_kwargs", "dict[str, Any] | None", None, "Keyword arguments for the collator's factory; they "
            "may not contradict the spec"),
    Setting("batching", "str | None", None, "'plain', 'grouped', 'token_budget' or 'packed' (None: the spec's "
            "preprocessing_config['batching'], else 'plain')",
            resume="the batching mode cuts the epoch into other batches, so rows would be lost or repeated"),
    Setting("max_tokens", "int | None", None, "Tokens per batch under token_budget and packed batching (None: the "
            "spec's)", resume="the token budget cuts the epoch into other batches, so rows would be lost or repeated"),
    Setting("balance", "str | None", None, "Packed and token_budget batching: 'tokens' (every rank the same token "
            "budget) or 'compute' (each step's documents dealt to ranks by tokens + attention_weight * sum(len**2), "
            "padded under token budgets); None: the spec's, else 'tokens'"),
    Setting("attention_weight", "float | None", None, "balance='compute': the cost of one len**2 term in tokens' "
            "worth, about 1 / (12 * model width) (None: the spec's)"),
    Setting("device_normalize", "bool", False, "Vision: keep images uint8 in the loader, normalize on the device"),
    Setting("validate", "bool", False, "At setup, check the first training batch against the spec"),
    Setting("on_error", "str", "raise", "A row that fails to read: 'raise', 'skip' (left out, in dm.skipped) or "
            "'warn' (the same, warned once)"),
    Setting("max_skipped", "int | float | None", None, "The most rows one pass may leave out: a count, or a fraction "
            "of the split"),
    Setting("train_transform", "Callable[..., Any] | None", None, "Per-row callable for training rows, seeded by "
            "(seed, epoch, index)"),
    Setting("eval_transform", "Callable[..., Any] | None", None, "Per-row callable for val, test and predict rows, "
            "seeded without the epoch"),
    Setting("long_rows", "str | None", None, "Rows longer than max_length: 'truncate', 'split' or 'drop' (None: "
            "the spec's, else 'truncate')"),
    Setting("stride", "int | None", None, "Tokens the windows of long_rows='split' overlap by (None: the spec's)"),
    Setting("cache_dir", "str | None", None, "Where raw text tokenized once per machine is cached (None: beside the "
            "datasets cache)"),
    Setting("num_proc", "int | None", None, "Processes that tokenize raw text into the cache"),
    Setting("mix", "Any", None, "With train_data={name: data}: a Mixture, or its weights {name: weight}, mixed inside "
            "every training batch"),
)
"""Every keyword of ``UniversalDataModule``: the data, the loader settings, then the module's own."""

BY_NAME = {setting.name: setting for setting in SETTINGS}
LOADER_SETTINGS = tuple(setting for setting in SETTINGS if setting.loader is not None)
"""The settings that are ``DataLoaderConfig``'s fields, in its order."""
NOT_RECORDED = tuple(setting.name for setting in SETTINGS if not setting.recorded)
"""Settings a checkpoint's configuration leaves out: passed again to ``load_from_checkpoint``."""
RESUMED = {setting.name: setting.resume for setting in SETTINGS if setting.resume}
"""The settings a resumed state must have been saved with, and why each matters."""


def check_module_settings(values: dict[str, Any]) -> None:
    """Check the module's own settings in ``values`` (its keyword arguments); ``DataLoaderConfig`` checks the loader
    settings once the module has resolved them (``batch_size=None`` is 32, ``shuffle=None`` follows the data)."""
    for setting in SETTINGS:
        if setting.check is not None and setting.loader is None:
            setting.check(setting.name, values[setting.name])


def loader_fields(cls: type) -> type:
    """``cls`` as a dataclass with a field per loader setting (:data:`LOADER_SETTINGS`, in order); the class
    decorator of :class:`~engine.loading.config.DataLoaderConfig`."""
    cls.__annotations__ = {setting.name: setting.loader.type for setting in LOADER_SETTINGS}
    for setting in LOADER_SETTINGS:
        setattr(cls, setting.name, setting.loader.default)
    fields = "".join(f"\n        {setting.name} ({setting.loader.type}, default {setting.loader.default!r}): "
                     f"{loader_field_doc(setting)}." for setting in LOADER_SETTINGS)
    cls.__doc__ = f"{cls.__doc__.rstrip()}\n\n    Attributes:{fields}\n    "
    return dataclasses.dataclass(cls)


def check_loader_fields(config: Any) -> None:
    """Check (and normalize: numpy integers become ints) ``config``'s fields against their declarations."""
    for setting in LOADER_SETTINGS:
        if setting.check is not None:
            value = setting.check(setting.name, getattr(config, setting.name), owner="DataLoaderConfig.")
            setattr(config, setting.name, value)


def loader_field_doc(setting: Setting) -> str:
    """The doc of ``setting``'s ``DataLoaderConfig`` field."""
    return (setting.loader.doc if setting.loader is not None and setting.loader.doc else setting.doc)
