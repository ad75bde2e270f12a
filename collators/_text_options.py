"""Resolving a text collator's options: explicit argument, then the tokenizer, then the TaskSpec, then a default."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from task_spec import TaskSpec
from task_spec.spec import TASK_TYPES

_log = logging.getLogger("collators.text")

TOKEN_KEYS = {"attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1}
"""Per-token keys a row may carry beside ``input_ids``, with the value their padding gets (as ``tokenizer.pad``)."""


class TextOptions(Protocol):
    """The resolved options of a text collator that the label and check helpers read (``TextCollator`` has them).

    The helpers take the collator as this protocol instead of importing it, so no module imports its caller.
    """

    tokenizer: Any
    task_type: str
    pad_token_id: int
    label_pad_token_id: int
    pad_to_multiple_of: int | None
    padding_side: str
    padding: str
    max_length: int | None
    max_target_length: int | None
    target_field: str
    target_text_field: str
    vocab_size: int | None
    vocab_source: str
    num_classes: int | None
    check_values: bool
    _generator: torch.Generator
    # masked_lm only:
    mlm_probability: float
    mask_token_id: int
    special_token_ids: tuple[int, ...]


class Unset:
    """Marks an option that was not given, so an explicit ``None`` can still override the spec."""

    def __repr__(self) -> str:
        return "<from task_spec>"

    def __reduce__(self) -> str:
        return "UNSET"


UNSET: Any = Unset()


def check_int(name: str, value: Any, *, minimum: int | None = None, optional: bool = False) -> Any:
    """Return ``value`` if it is an int (>= ``minimum``), or None when ``optional``; else raise naming ``name``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        none = " or None" if optional else ""
        raise ValueError(f"{name} should be an int{bound}{none}, but got {name}={value!r}")
    return value


def resolve_task_type(task_type: str | None, spec: TaskSpec | None) -> str:
    task_type = task_type if task_type is not None else (spec.task_type if spec is not None else "causal_lm")
    if task_type not in TASK_TYPES:
        raise ValueError(
            f"task_type should be one of {', '.join(repr(t) for t in TASK_TYPES)}, but got task_type={task_type!r}"
        )
    return task_type


def resolve_token_id(name: str, explicit: int | None, tokenizer: Any, spec: TaskSpec | None, why: str) -> int:
    """``name`` (e.g. 'pad_token_id'): explicit > ``tokenizer.<name>`` > ``spec.special_tokens[name]`` > error."""
    if explicit is not None:
        return check_int(name, explicit, minimum=0)
    from_tokenizer = getattr(tokenizer, name, None) if tokenizer is not None else None
    if from_tokenizer is not None:
        return int(from_tokenizer)
    if spec is not None and name in spec.special_tokens:
        return int(spec.special_tokens[name])
    where = f"tokenizer {type(tokenizer).__name__} has no {name}" if tokenizer is not None else "no tokenizer was given"
    raise ValueError(
        f"{name} is needed {why}, but {where} and the task spec has none; pass {name}=..., a tokenizer= that "
        f"defines it, or a TaskSpec with special_tokens={{{name!r}: ...}}"
    )


def resolve_pad_token_id(explicit: int | None, tokenizer: Any, spec: TaskSpec | None,
                         task_type: str) -> tuple[int, str]:
    """The pad id and where it came from ('given', 'tokenizer', 'eos' or 'spec').

    Explicit > ``tokenizer.pad_token_id`` > for causal LM, ``tokenizer.eos_token_id`` > the spec's > error. A
    causal-LM tokenizer often has an eos token and no pad token (GPT-2, Llama): padding with eos is safe because
    the labels of padded positions are set by position, never by id, so the eos that ends a row keeps its label.
    The tokenizer itself is never changed.
    """
    if explicit is not None:
        return check_int("pad_token_id", explicit, minimum=0), "given"
    if tokenizer is not None and getattr(tokenizer, "pad_token_id", None) is not None:
        return int(tokenizer.pad_token_id), "tokenizer"
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if task_type == "causal_lm" and eos is not None:
        _log.info("the tokenizer has no pad token, so causal_lm rows are padded with its eos token (id %d); padded "
                  "positions get label -100 by position, so a real eos keeps its label; pass pad_token_id=... to "
                  "choose another id", eos)
        return int(eos), "eos"
    return resolve_token_id("pad_token_id", None, tokenizer, spec, "to pad rows"), "spec"


def check_id_in_vocab(name: str, token_id: int, explicit: int | None, tokenizer: Any, vocab_size: int | None,
                      vocab_source: str) -> None:
    """Refuse, at construction, an id the collator writes into ``input_ids`` that came from the TaskSpec because
    the tokenizer lacks that special token, and that lies outside the vocabulary.

    A preset's ids belong to the preset's vocabulary, not the tokenizer's: the model's embedding would be indexed
    past its end, a device-side assert far from its cause. An id passed explicitly is the caller's choice (a pad id
    no real token uses is legitimate: padded positions are masked), so it is left alone.
    """
    if explicit is not None or tokenizer is None or getattr(tokenizer, name, None) is not None:
        return
    if vocab_size is None or token_id < vocab_size:
        return
    raise ValueError(
        f"{name} should be an id of the vocabulary (0..{vocab_size - 1}, {vocab_source}={vocab_size}), but got "
        f"{name}={token_id} from spec.special_tokens[{name!r}]: the tokenizer has no "
        f"{name.removesuffix('_token_id')} token, so the id came from the TaskSpec, whose vocabulary is not the "
        f"tokenizer's; pass {name}=... (an id of the tokenizer), or spec.replace(special_tokens={{{name!r}: ...}}) "
        f"with one"
    )


def resolve_vocab_size(explicit: int | None, tokenizer: Any, spec: TaskSpec | None,
                       required: bool = True) -> tuple[int | None, str]:
    """Vocabulary size and where it came from: explicit > ``len(tokenizer)`` > ``spec.vocab_size``.

    Without any of them: an error when ``required`` (masked LM draws random ids below it), else ``(None, '')``.
    """
    if explicit is not None:
        return check_int("vocab_size", explicit, minimum=1), "vocab_size"
    if tokenizer is not None:
        return len(tokenizer), "len(tokenizer)"
    if spec is not None and spec.vocab_size is not None:
        return spec.vocab_size, "TaskSpec.additional_config['vocab_size']"
    if not required:
        return None, ""
    raise ValueError(
        "vocab_size is needed to draw random replacement tokens for masked_lm, but no tokenizer was given and the "
        "task spec has none; pass vocab_size=..., tokenizer=..., or additional_config={'vocab_size': ...}"
    )


def resolve_num_classes(explicit: int | None, spec: TaskSpec | None) -> int | None:
    """Number of classes labels are checked against: explicit > the spec's (with a cross-entropy loss) > None."""
    if explicit is not None:
        return check_int("num_classes", explicit, minimum=1)
    if spec is not None and spec.loss_type == "cross_entropy":
        return spec.num_classes
    return None


def resolve_special_ids(explicit: Any, tokenizer: Any, spec: TaskSpec | None, *extra: int) -> tuple[int, ...]:
    """Ids never masked: explicit > ``tokenizer.all_special_ids`` > the spec's special token ids; plus ``extra``."""
    if explicit is not None:
        ids = [check_int("special_token_ids item", token_id, minimum=0) for token_id in explicit]
    elif tokenizer is not None:
        ids = list(tokenizer.all_special_ids)
    else:
        ids = list(spec.special_tokens.values()) if spec is not None else []
    return tuple(sorted({int(token_id) for token_id in [*ids, *extra]}))


def resolve_probability(name: str, explicit: float | None, spec: TaskSpec | None, default: float) -> float:
    value = explicit if explicit is not None else (
        spec.preprocessing_config.get(name, default) if spec is not None else default
    )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} should be a probability in [0, 1], but got {name}={value!r}")
    return float(value)


def resolve_static_shapes(padding: str | None, buckets: Any, max_length: int | None,
                          spec: TaskSpec | None) -> tuple[str, tuple[int, ...] | None]:
    """``(padding, buckets)``: explicit, else the spec's ``padding`` / ``pad_to_buckets``, else 'longest' and None."""
    padding = padding if padding is not None else preprocessing(spec, "padding", "longest")
    if padding not in ("longest", "max_length"):
        raise ValueError(f"padding should be 'longest' or 'max_length', but got padding={padding!r}")
    if padding == "max_length" and max_length is None:
        raise ValueError("padding='max_length' pads every batch to max_length, but max_length is None; pass "
                         "max_length=... (or set the spec's max_seq_len)")
    buckets = buckets if buckets is not None else preprocessing(spec, "pad_to_buckets", None)
    if buckets is None:
        return padding, None
    if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
        raise TypeError(f"pad_to_buckets should be a sequence of widths, but got pad_to_buckets={buckets!r}")
    widths = tuple(sorted({check_int("pad_to_buckets item", width, minimum=1) for width in buckets}))
    if not widths or padding == "max_length":
        raise ValueError(f"pad_to_buckets should be a non-empty sequence of widths used with padding='longest', "
                         f"but got pad_to_buckets={buckets!r} with padding={padding!r}")
    return padding, widths


def preprocessing(spec: TaskSpec | None, key: str, default: Any) -> Any:
    """``spec.preprocessing_config[key]``, or ``default`` without a spec or key."""
    return spec.preprocessing_config.get(key, default) if spec is not None else default


def describe_tokenizer(tokenizer: Any) -> str:
    if tokenizer is None:
        return "None"
    try:
        return f"{type(tokenizer).__name__}(len={len(tokenizer)})"
    except TypeError:
        return type(tokenizer).__name__


def resolve_masked_lm(mlm_probability: Any, mask_token_id: Any, special_token_ids: Any, tokenizer: Any,
                      spec: TaskSpec | None, *extra_special: int | None) -> tuple[float, int, Any]:
    """``(mlm_probability, mask_token_id, special_token_ids)`` of a masked-LM collator: arguments, else the
    tokenizer's, else the spec's; ``extra_special`` ids (the pad id) are never masked either."""
    probability = resolve_probability("mlm_probability", mlm_probability, spec, 0.15)
    mask_id = resolve_token_id("mask_token_id", mask_token_id, tokenizer, spec, "to mask tokens for masked_lm")
    return probability, mask_id, resolve_special_ids(special_token_ids, tokenizer, spec, *extra_special, mask_id)
