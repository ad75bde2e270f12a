"""A data module's collator: the registry's choice for its spec, or the packed collator for ``batching='packed'``,
with ``keep_uint8`` for ``device_normalize`` and its pad id checked against the tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from collators import Resolution
from engine.collation.seeded_collate import build_collator
from engine.datamodule import options
from engine.sampling.modes import packed_collator_name, with_packed_reason
from task_spec import TaskSpec

SPEC_HOMES: dict[str, tuple[str, Callable[[TaskSpec], Any]]] = {
    "task_type": ("spec.task_type", lambda spec: spec.task_type),
    "max_length": ("spec.max_seq_len", lambda spec: spec.max_seq_len),
    "max_target_length": ("spec.additional_config['max_target_len']",
                          lambda spec: spec.additional_config.get("max_target_len")),
    "vocab_size": ("spec.vocab_size", lambda spec: spec.vocab_size),
    "num_classes": ("spec.num_classes", lambda spec: spec.num_classes),
    "image_size": ("spec.additional_config['image_size']", lambda spec: spec.additional_config.get("image_size")),
    "target_field": ("spec.target_field", lambda spec: spec.target_field),
    "require_targets": ("spec.is_supervised", lambda spec: spec.is_supervised and spec.target_field is not None),
    "input_field": ("spec.input_fields[0]", lambda spec: spec.input_fields[0] if spec.input_fields else None),
    "pad_token_id": ("spec.special_tokens['pad_token_id']", lambda spec: spec.special_tokens.get("pad_token_id")),
    "mask_token_id": ("spec.special_tokens['mask_token_id']", lambda spec: spec.special_tokens.get("mask_token_id")),
    "mlm_probability": ("spec.preprocessing_config['mlm_probability']",
                        lambda spec: spec.preprocessing_config.get("mlm_probability")),
    **dict.fromkeys(("normalization", "mean", "std"), ("spec.preprocessing_config['normalization']",
                                                       lambda spec: spec.preprocessing_config.get("normalization"))),
}
"""Collator options the spec also describes: where the spec keeps each, and how to read it (None: not set)."""

MODULE_HOMES = {
    "keep_uint8": "device_normalize=True (it keeps images uint8 and normalizes them on the device)",
    "seed": "the module's seed= (every batch's generator derives from it, so a collator seed is never used)",
}
"""Collator options a data module sets itself, with the keyword that is their one home."""


def check_collator_kwargs(spec: TaskSpec | None, collator_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse ``collator_kwargs`` that set what the module sets, or contradict what the spec says, naming both
    places: every setting has one home, and none is silently overridden."""
    for key, value in (collator_kwargs or {}).items():
        if key in MODULE_HOMES:
            raise ValueError(f"collator_kwargs[{key!r}]={value!r} is set by the data module; use {MODULE_HOMES[key]}")
        if spec is None or key not in SPEC_HOMES:
            continue
        where, read = SPEC_HOMES[key]
        described = read(spec)
        if described is not None and described != value:
            raise ValueError(f"collator_kwargs[{key!r}]={value!r} contradicts {where}={described!r}; the spec "
                             f"describes the task, so set it there (spec.replace(...)) and drop it from "
                             f"collator_kwargs")


def module_collator(spec: TaskSpec | None, tokenizer: Any, collate_fn: Any, name: str | None,
                    kwargs: dict[str, Any] | None, *, device_normalize: bool, batching: str,
                    batching_reason: str) -> tuple[Callable[..., Any], Resolution | None]:
    """A data module's collator and how it was chosen: :func:`build_collator`, asking for the packed collator
    when ``batching='packed'`` (unless one was named or given), with ``keep_uint8`` for ``device_normalize``, and
    its pad id checked against the tokenizer."""
    asked = packed_collator_name(batching, name, collate_fn, spec.modality if spec is not None else None)
    collator, resolution = build_collator(spec, tokenizer, collate_fn, asked,
                                          options.device_normalize_kwargs(device_normalize, collate_fn, spec, kwargs))
    options.check_pad_id(collator, tokenizer)
    return collator, with_packed_reason(resolution, asked != name, batching_reason)
