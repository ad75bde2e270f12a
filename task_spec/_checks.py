"""Validation of a TaskSpec's values: each field on its own, then the mappings, then how the fields fit together."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from task_spec._freeze import freeze
from task_spec._keys import check_keys
from task_spec._replace import REMOVE
from task_spec.choices import (
    DEFAULT_INPUT_FIELDS,
    KNOWN_KEYS,
    LANGUAGE_MODELLING_TASK_TYPES,
    LOSS_TYPES,
    MAPPING_FIELDS,
    MODALITIES,
    POSITIVE_INT_KEYS,
    SUPERVISED_TASK_TYPES,
    TASK_TYPES,
)

IDS_WRITTEN_INTO_INPUTS = ("pad_token_id", "mask_token_id", "image_token_id")
"""Special token ids the collators write into ``input_ids``, so they must lie inside the vocabulary."""


class ModalityDefault(tuple):
    """Input fields that came from the modality's default, so a replaced modality brings its own default."""

    __slots__ = ()


def _choice_error(field_name: str, value: Any, allowed: tuple[str, ...]) -> ValueError:
    return ValueError(
        f"TaskSpec.{field_name} should be one of {', '.join(repr(a) for a in allowed)}, "
        f"but got {field_name}={value!r}"
    )


def check_scalars(spec: Any) -> None:
    """The enumerated and string fields, in declaration order of importance (name first)."""
    if not isinstance(spec.name, str) or not spec.name.strip():
        raise ValueError(f"TaskSpec.name should be a non-empty string, but got name={spec.name!r}")
    if spec.modality not in MODALITIES:
        raise _choice_error("modality", spec.modality, MODALITIES)
    if spec.task_type not in TASK_TYPES:
        raise _choice_error("task_type", spec.task_type, TASK_TYPES)
    if spec.loss_type not in LOSS_TYPES:
        raise _choice_error("loss_type", spec.loss_type, LOSS_TYPES)
    if not isinstance(spec.model_family, str) or not spec.model_family:
        raise ValueError(
            f"TaskSpec.model_family should be a non-empty string, but got model_family={spec.model_family!r}"
        )


def input_fields(spec: Any) -> tuple[str, ...]:
    """``spec.input_fields`` as a tuple, or the modality's default (marked, so a new modality brings its own)."""
    if isinstance(spec.input_fields, str):
        raise TypeError(
            f"TaskSpec.input_fields should be a sequence of field names, but got the string "
            f"{spec.input_fields!r}; write input_fields=({spec.input_fields!r},)"
        )
    if isinstance(spec.input_fields, ModalityDefault) or not spec.input_fields:
        return ModalityDefault(DEFAULT_INPUT_FIELDS[spec.modality])
    fields = tuple(spec.input_fields)
    if any(not isinstance(name, str) or not name for name in fields):
        raise ValueError(f"TaskSpec.input_fields should hold non-empty strings, but got {fields!r}")
    return fields


def check_target(spec: Any) -> None:
    if spec.target_field is not None and (not isinstance(spec.target_field, str) or not spec.target_field):
        raise ValueError(
            f"TaskSpec.target_field should be a non-empty string or None, but got {spec.target_field!r}"
        )
    if spec.target_field is None and spec.task_type in SUPERVISED_TASK_TYPES and spec.loss_type != "contrastive":
        pairs = (", or loss_type='contrastive' for pairs whose pairing is the target"
                 if spec.task_type == "classification" else "")
        raise ValueError(
            f"TaskSpec.target_field is None, but task_type={spec.task_type!r} needs a target; "
            f"set target_field='labels' (or the key your rows use){pairs}"
        )


def frozen_mappings(spec: Any) -> dict[str, Any]:
    """The mapping fields, type-checked and frozen (numpy ints become ints), with their keys and values checked."""
    for name in MAPPING_FIELDS:
        value = getattr(spec, name)
        if not isinstance(value, Mapping):
            raise TypeError(f"TaskSpec.{name} should be a mapping, but got {type(value).__name__}: {value!r}")
    mappings = {name: freeze(getattr(spec, name)) for name in MAPPING_FIELDS}
    for name, mapping in mappings.items():
        for key, value in mapping.items():
            if value is REMOVE:
                raise ValueError(
                    f"TaskSpec.{name}[{key!r}] should be a value, but got REMOVE, which only works in "
                    f"spec.replace({name}={{{key!r}: REMOVE}}) to delete a key the spec holds"
                )
    for name in KNOWN_KEYS:
        check_keys(name, mappings[name])
    for key, token_id in mappings["special_tokens"].items():
        _check_int(f"special_tokens[{key!r}]", token_id, "a non-negative int token id", minimum=0)
    for name, keys in POSITIVE_INT_KEYS.items():
        for key in keys:
            if mappings[name].get(key) is not None:
                _check_int(f"{name}[{key!r}]", mappings[name][key], "a positive int", minimum=1)
    probability = mappings["preprocessing_config"].get("mlm_probability")
    if probability is not None:
        if isinstance(probability, bool) or not isinstance(probability, (int, float)):
            raise TypeError(f"TaskSpec.preprocessing_config['mlm_probability'] should be a probability in [0, 1], "
                            f"but got {type(probability).__name__}: {probability!r}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"TaskSpec.preprocessing_config['mlm_probability'] should be a probability in [0, 1], "
                             f"but got {probability!r}")
    return mappings


def _check_int(where: str, value: Any, what: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TaskSpec.{where} should be {what}, but got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"TaskSpec.{where} should be {what}, but got {value!r}")


def check_consistency(spec: Any, fields: tuple[str, ...], mappings: dict[str, Any]) -> None:
    """Refuse fields that contradict each other."""
    if spec.task_type in LANGUAGE_MODELLING_TASK_TYPES and spec.modality in ("vision", "audio"):
        raise ValueError(
            f"TaskSpec.task_type should be a task that {spec.modality} inputs can serve, but got "
            f"task_type={spec.task_type!r} with modality={spec.modality!r}: language modelling predicts token ids, "
            f"which {spec.modality} rows do not have; use modality='text' (or 'multimodal' for images with text), "
            f"or a task_type such as 'classification'"
        )
    if spec.task_type == "regression" and spec.loss_type == "cross_entropy":
        raise ValueError(
            "TaskSpec.loss_type should be a regression loss ('mse' or 'l1') for task_type='regression', but got "
            "loss_type='cross_entropy' (the default, a classification loss); pass loss_type='mse'"
        )
    if spec.target_field is not None and spec.target_field in fields:
        raise ValueError(
            f"TaskSpec.target_field should not be one of the input_fields, but got target_field="
            f"{spec.target_field!r} with input_fields={tuple(fields)!r}: the model would read its own target; "
            f"name the target another key, or drop it from input_fields"
        )
    vocab_size = mappings["additional_config"].get("vocab_size")
    for name in IDS_WRITTEN_INTO_INPUTS if vocab_size is not None else ():
        token_id = mappings["special_tokens"].get(name)
        if token_id is not None and token_id >= vocab_size:
            raise ValueError(
                f"TaskSpec.special_tokens[{name!r}] should be below additional_config['vocab_size']={vocab_size}, "
                f"but got {name}={token_id}: the id would index past the embedding table; raise vocab_size to "
                f"at least {token_id + 1}, or set {name} to an id inside the vocabulary"
            )
