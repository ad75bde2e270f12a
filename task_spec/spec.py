"""The TaskSpec dataclass: a validated, immutable description of a training task."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from task_spec._freeze import freeze
from task_spec.presets import TaskSpecPresets

MODALITIES = ("text", "vision", "audio", "multimodal", "tabular")
TASK_TYPES = (
    "causal_lm",
    "masked_lm",
    "classification",
    "regression",
    "seq2seq",
    "token_classification",
)
LOSS_TYPES = ("cross_entropy", "mse", "l1", "bce", "ctc", "none")
SUPERVISED_TASK_TYPES = ("classification", "regression", "seq2seq", "token_classification")
"""Task types whose rows must carry a target; language modelling derives its labels from the inputs."""

DEFAULT_INPUT_FIELDS = {
    "text": ("input_ids",),
    "vision": ("pixel_values",),
    "audio": ("input_values",),
    "multimodal": ("pixel_values", "input_ids"),
    "tabular": ("features",),
}
"""Input fields used when a spec names none: the conventional key for each modality."""


class _ModalityDefault(tuple):
    """Input fields that came from the modality's default, so a replaced modality brings its own default."""

    __slots__ = ()


def _choice_error(field_name: str, value: Any, allowed: tuple[str, ...]) -> ValueError:
    return ValueError(
        f"TaskSpec.{field_name} should be one of {', '.join(repr(a) for a in allowed)}, "
        f"but got {field_name}={value!r}"
    )


@dataclass(frozen=True)
class TaskSpec(TaskSpecPresets):
    """What the task is, so every stage of the data path can choose its behaviour from one value.

    A spec is immutable: mappings are frozen on construction and lists become tuples. Derive a variant
    with :meth:`replace`. Two specs with the same field values compare (and hash) equal.

    Example:
        >>> spec = TaskSpec(name="sentiment", task_type="classification", modality="text",
        ...                 additional_config={"num_classes": 3})
        >>> spec.input_fields, spec.target_field, spec.num_classes
        (('input_ids',), 'labels', 3)
    """

    name: str
    """Human-readable name, shown in summaries and errors."""
    task_type: str
    """One of TASK_TYPES; decides labels (causal LM shifts inside the model, masked LM masks, ...)."""
    model_family: str = "generic"
    """Free-form family of the model the batches feed (``decoder``, ``encoder``, ``cnn``, ...)."""
    input_fields: tuple[str, ...] = ()
    """Keys the model reads from a batch; empty means the modality's default (``input_ids``, ...)."""
    target_field: str | None = "labels"
    """Key of the target in rows and batches; None for tasks without one."""
    loss_type: str = "cross_entropy"
    """One of LOSS_TYPES."""
    metrics: tuple[str, ...] = ()
    """Names of the metrics the task reports; informational for the data path."""
    special_tokens: Mapping[str, int] = field(default_factory=dict)
    """Token ids such as ``pad_token_id``, ``mask_token_id``; used when no tokenizer is given."""
    additional_config: Mapping[str, Any] = field(default_factory=dict)
    """Limits and sizes: ``max_seq_len``, ``vocab_size``, ``num_classes``, ``image_size``, ``sample_rate``."""
    modality: str = "text"
    """One of MODALITIES; the registry's first key when choosing a collator."""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    """Expected per-field shapes/dtypes of rows (informational; validated by later stages)."""
    output_schema: Mapping[str, Any] = field(default_factory=dict)
    """Expected shapes/dtypes of model outputs (informational)."""
    preprocessing_config: Mapping[str, Any] = field(default_factory=dict)
    """Collator options: ``text_field``, ``padding_side``, ``normalization``, ``mlm_probability``, ..."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"TaskSpec.name should be a non-empty string, but got name={self.name!r}")
        if self.modality not in MODALITIES:
            raise _choice_error("modality", self.modality, MODALITIES)
        if self.task_type not in TASK_TYPES:
            raise _choice_error("task_type", self.task_type, TASK_TYPES)
        if self.loss_type not in LOSS_TYPES:
            raise _choice_error("loss_type", self.loss_type, LOSS_TYPES)
        if not isinstance(self.model_family, str) or not self.model_family:
            raise ValueError(
                f"TaskSpec.model_family should be a non-empty string, but got model_family={self.model_family!r}"
            )
        if isinstance(self.input_fields, str):
            raise TypeError(
                f"TaskSpec.input_fields should be a sequence of field names, but got the string "
                f"{self.input_fields!r}; write input_fields=({self.input_fields!r},)"
            )
        if isinstance(self.input_fields, _ModalityDefault) or not self.input_fields:
            fields: tuple[str, ...] = _ModalityDefault(DEFAULT_INPUT_FIELDS[self.modality])
        else:
            fields = tuple(self.input_fields)
        if any(not isinstance(name, str) or not name for name in fields):
            raise ValueError(f"TaskSpec.input_fields should hold non-empty strings, but got {fields!r}")
        if self.target_field is not None and (not isinstance(self.target_field, str) or not self.target_field):
            raise ValueError(
                f"TaskSpec.target_field should be a non-empty string or None, but got {self.target_field!r}"
            )
        if self.target_field is None and self.task_type in SUPERVISED_TASK_TYPES:
            raise ValueError(
                f"TaskSpec.target_field is None, but task_type={self.task_type!r} needs a target; "
                f"set target_field='labels' (or the key your rows use)"
            )
        for name in ("special_tokens", "additional_config", "input_schema", "output_schema",
                     "preprocessing_config"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TypeError(f"TaskSpec.{name} should be a mapping, but got {type(value).__name__}: {value!r}")
        for key, token_id in self.special_tokens.items():
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                raise ValueError(
                    f"TaskSpec.special_tokens[{key!r}] should be a non-negative int token id, but got {token_id!r}"
                )
        for key in ("max_seq_len", "vocab_size", "num_classes", "sample_rate", "max_target_len"):
            value = self.additional_config.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ValueError(
                    f"TaskSpec.additional_config[{key!r}] should be a positive int, but got {value!r}"
                )
        object.__setattr__(self, "input_fields", fields)
        object.__setattr__(self, "metrics", tuple(self.metrics))
        for name in ("special_tokens", "additional_config", "input_schema", "output_schema",
                     "preprocessing_config"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def replace(self, **changes: Any) -> TaskSpec:
        """Return a new spec with ``changes`` applied and validated; this spec is left unchanged."""
        return dataclasses.replace(self, **changes)

    @property
    def is_supervised(self) -> bool:
        """Whether rows must carry ``target_field`` (language modelling derives labels from inputs)."""
        return self.task_type in SUPERVISED_TASK_TYPES

    @property
    def max_seq_len(self) -> int | None:
        """Longest input sequence the task allows (``additional_config['max_seq_len']``)."""
        return self.additional_config.get("max_seq_len")

    @property
    def vocab_size(self) -> int | None:
        """Vocabulary size (``additional_config['vocab_size']``)."""
        return self.additional_config.get("vocab_size")

    @property
    def num_classes(self) -> int | None:
        """Number of classes for classification (``additional_config['num_classes']``)."""
        return self.additional_config.get("num_classes")
