"""The TaskSpec dataclass: a validated, immutable description of a training task."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import task_spec.presets as _presets
from task_spec import _checks
from task_spec._replace import REMOVE, merge_changes
from task_spec.choices import (
    DEFAULT_INPUT_FIELDS,
    KNOWN_KEYS,
    LOSS_TYPES,
    MODALITIES,
    SUPERVISED_TASK_TYPES,
    TASK_TYPES,
)

__all__ = [
    "DEFAULT_INPUT_FIELDS", "KNOWN_KEYS", "LOSS_TYPES", "MODALITIES", "REMOVE", "SUPERVISED_TASK_TYPES",
    "TASK_TYPES", "TaskSpec",
]


@dataclass(frozen=True)
class TaskSpec:
    """What the task is, so every stage of the data path can choose its behaviour from one value.

    A spec is immutable: mappings are frozen on construction and lists become tuples. Derive a variant
    with :meth:`replace`, which merges mappings. Two specs with the same field values compare (and hash) equal.

    Example:
        >>> spec = TaskSpec(name="sentiment", task_type="classification", modality="text",
        ...                 additional_config={"num_classes": 3})
        >>> spec.input_fields, spec.target_field, spec.num_classes
        (('input_ids',), 'labels', 3)
    """

    REMOVE: ClassVar[Any] = REMOVE
    """In :meth:`replace`, deletes a mapping key (``{'max_seq_len': TaskSpec.REMOVE}``) or empties a mapping."""

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
    """One of LOSS_TYPES; task_type='regression' needs 'mse' or 'l1'."""
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
        _checks.check_scalars(self)
        fields = _checks.input_fields(self)
        _checks.check_target(self)
        mappings = _checks.frozen_mappings(self)
        _checks.check_consistency(self, fields, mappings)
        object.__setattr__(self, "input_fields", fields)
        object.__setattr__(self, "metrics", tuple(self.metrics))
        for name, value in mappings.items():
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> TaskSpec:
        """Return a new spec with ``changes`` applied and validated; this spec is left unchanged.

        Mapping fields are merged: ``spec.replace(additional_config={"num_classes": 3})`` keeps the other keys.
        A key given :data:`REMOVE` is deleted, and ``field=REMOVE`` empties that mapping.
        ``dataclasses.replace`` still replaces whole mappings.
        """
        names = tuple(f.name for f in dataclasses.fields(self))
        return dataclasses.replace(self, **merge_changes(self, names, changes))

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

    @classmethod
    def lm_tiny(cls) -> TaskSpec:
        """Causal language modelling: GPT-2 sized vocabulary, 128-token sequences, pad shares the eos id."""
        return cls(**_presets.lm_tiny())

    @classmethod
    def mlm_tiny(cls) -> TaskSpec:
        """Masked language modelling: BERT ids, 15% masking with the 80/10/10 replacement rule."""
        return cls(**_presets.mlm_tiny())

    @classmethod
    def cls_tiny(cls) -> TaskSpec:
        """Sequence classification into 2 classes from token ids (label key ``labels``)."""
        return cls(**_presets.cls_tiny())

    @classmethod
    def seq2seq_tiny(cls) -> TaskSpec:
        """Sequence to sequence (T5 sized vocabulary): inputs up to 128 tokens, targets up to 64."""
        return cls(**_presets.seq2seq_tiny())

    @classmethod
    def vision_tiny(cls) -> TaskSpec:
        """Image classification: 3x32x32 images, 4 classes, CIFAR-10 normalization."""
        return cls(**_presets.vision_tiny())

    @classmethod
    def audio_tiny(cls) -> TaskSpec:
        """Audio classification: 16 kHz mono waveforms up to 1 s, 4 classes, 40-band log-mel features."""
        return cls(**_presets.audio_tiny())

    @classmethod
    def vlm_tiny(cls) -> TaskSpec:
        """Vision-language causal LM: 32x32 images of 16 image tokens before 64-token captions, placeholder id 1."""
        return cls(**_presets.vlm_tiny())
