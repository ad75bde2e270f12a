"""The checks behind :func:`engine.tools.validation.validate_batch`: each takes the batch and returns its problems.

A problem is ``(key, text)``, where the text says what is wrong, what was expected and the likely fix. The
checks run in a deliberate order (keys, dtypes, shapes, finite values, label range, attention mask), so the
most basic problem is reported first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from task_spec import TaskSpec

Problem = tuple[str, str]
ID_KEYS = ("input_ids", "decoder_input_ids", "token_type_ids", "position_ids")
SIGNAL_KEYS = ("pixel_values", "input_values", "input_features")
TOKEN_LABEL_TASKS = ("causal_lm", "masked_lm", "seq2seq")
CLASS_LABEL_TASKS = ("classification", "token_classification")
BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k")
"""Packed batches' document boundaries: one entry per document plus one, not one per row."""
MASK_PAIRS = (("attention_mask", "input_ids"), ("decoder_attention_mask", "decoder_input_ids"))


@dataclass(frozen=True)
class Context:
    """What the checks know besides the batch."""

    spec: TaskSpec | None
    pad_token_id: int | None
    ignore_ids: frozenset[int]


def _integer(tensor: torch.Tensor) -> bool:
    return not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool


def _is_id_key(key: str) -> bool:
    return key in ID_KEYS or key.endswith("_ids")


def check_keys(batch: dict[str, Any], ctx: Context) -> list[Problem]:
    spec = ctx.spec
    if spec is None:
        return []
    expected = list(spec.input_fields) + ([spec.target_field] if spec.is_supervised else [])
    missing = [key for key in expected if key not in batch]
    problems: list[Problem] = []
    if missing:
        fixes = []
        if spec.target_field in missing:
            fixes.append(f"rows must carry the target under {spec.target_field!r} (TaskSpec.target_field), or set "
                         f"target_field to the key they use")
        if set(missing) & set(spec.input_fields):
            fixes.append("check TaskSpec.input_fields against the keys the collator returns")
        problems.append((missing[0], f"keys mismatch: expected {expected}, but got {sorted(batch)}; missing "
                                     f"{missing}: {'; '.join(fixes)}"))
    for key in expected:
        if key in batch and not isinstance(batch[key], torch.Tensor):
            problems.append((key, f"{key} is a {type(batch[key]).__name__}, expected a tensor: the collator should "
                                  f"stack/pad it (is the registry's collator for this spec in use?)"))
    return problems


def check_dtypes(batch: dict[str, torch.Tensor], ctx: Context) -> list[Problem]:
    spec, problems = ctx.spec, []
    signal_keys = set(SIGNAL_KEYS)
    if spec is not None and spec.modality in ("vision", "audio"):
        signal_keys.update(spec.input_fields)
    for key, tensor in batch.items():
        if _is_id_key(key) and not _integer(tensor):
            problems.append((key, f"{key} has dtype {tensor.dtype}, expected an integer dtype (token ids): keep ids "
                                  f"as torch.long; a float here usually means ids went through a float transform"))
        elif key in signal_keys and not (tensor.is_floating_point() or tensor.dtype == torch.uint8):
            problems.append((key, f"{key} has dtype {tensor.dtype}, expected float (or uint8 for images "
                                  f"normalized on the device): convert the signal with .float()"))
    target = spec.target_field if spec is not None else None
    if target in batch:
        labels = batch[target]
        if spec.task_type in CLASS_LABEL_TASKS + TOKEN_LABEL_TASKS and spec.loss_type == "cross_entropy" and (
                not _integer(labels)):
            problems.append((target, f"{target} has dtype {labels.dtype}, but task_type={spec.task_type!r} with "
                                     f"cross_entropy needs integer class ids: map labels to ints 0..num_classes-1"))
        elif spec.task_type == "regression" and not labels.is_floating_point():
            problems.append((target, f"{target} has dtype {labels.dtype}, but task_type='regression' needs float "
                                     f"targets: convert them with float(...)"))
    return problems


def _image_shape(size: Any) -> tuple[int, ...] | None:
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, (list, tuple)) and len(size) in (2, 3) and all(isinstance(s, int) for s in size):
        return tuple(size)
    return None


def check_shapes(batch: dict[str, torch.Tensor], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    rows = {key: tensor.shape[0] for key, tensor in batch.items() if tensor.dim() > 0 and key not in BOUNDARY_KEYS}
    if len(set(rows.values())) > 1:
        first = next(iter(rows))
        odd = next(key for key, size in rows.items() if size != rows[first])
        problems.append((odd, f"batch dims disagree: {first} has {rows[first]} rows but {odd} has {rows[odd]} "
                              f"(all sizes: {rows}); every key needs one entry per row: check the collator"))
    spec = ctx.spec
    if spec is None:
        return problems
    expected = _image_shape(spec.additional_config.get("image_size"))
    image_keys = [k for k in spec.input_fields if k in batch] if spec.modality == "vision" else []
    image_keys += [k for k in ("pixel_values",) if k in batch and k not in image_keys]
    for key in image_keys if expected else ():
        shape = tuple(batch[key].shape)
        if len(shape) != 4 or shape[-len(expected):] != expected:
            problems.append((key, f"{key} has shape {list(shape)}, but TaskSpec.additional_config['image_size'] is "
                                  f"{list(expected)} (expected [batch, channels, height, width] ending in it): resize "
                                  f"images in a dataset transform, or correct image_size"))
    limit = spec.max_seq_len
    ids, bounds = batch.get("input_ids"), batch.get("cu_seq_lens_q")
    if limit and bounds is not None and bounds.dim() == 1 and len(bounds) > 1:  # packed: the longest document counts
        longest = int(bounds.diff().max())
        if longest > limit:
            problems.append(("input_ids", f"a packed document has {longest} tokens > max_seq_len {limit}: truncate "
                                          f"to TaskSpec.additional_config['max_seq_len'] (collator max_length) or "
                                          f"raise it"))
    elif limit and ids is not None and ids.dim() == 2 and ids.shape[1] > limit:
        problems.append(("input_ids", f"input_ids length {ids.shape[1]} > max_seq_len {limit}: truncate to "
                                      f"TaskSpec.additional_config['max_seq_len'] (collator max_length) or raise it"))
    return problems


def check_finite(batch: dict[str, torch.Tensor], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    for key, tensor in batch.items():
        if not tensor.is_floating_point():
            continue
        for what, bad in (("NaN", torch.isnan(tensor)), ("Inf", torch.isinf(tensor))):
            count = int(bad.sum())
            if count:
                problems.append((key, f"{what} detected in {key} ({count} of {tensor.numel()} values): check the "
                                      f"preprocessing that made it (division by zero in a normalization, log of 0)"))
    return problems


def _range(key: str, values: torch.Tensor, bound: int, name: str, fix: str) -> list[Problem]:
    if values.numel() == 0:
        return []
    low, high = int(values.min()), int(values.max())
    if high >= bound:
        return [(key, f"{key} max {high} >= {name} {bound}: {fix}")]
    if low < 0:
        return [(key, f"{key} min {low} < 0, outside [0, {name} {bound}): {fix}")]
    return []


def check_label_range(batch: dict[str, torch.Tensor], ctx: Context) -> list[Problem]:
    spec = ctx.spec
    if spec is None:
        return []
    problems: list[Problem] = []
    vocab = spec.vocab_size
    vocab_fix = ("token ids must be below the vocabulary size; check that TaskSpec.additional_config['vocab_size'] "
                 "matches the tokenizer (len(tokenizer))")
    if vocab:  # token ids only: token_type_ids and position_ids have other bounds
        for key in ("input_ids", "decoder_input_ids"):
            if key in batch and _integer(batch[key]):
                problems += _range(key, batch[key], vocab, "vocab_size", vocab_fix)
    target = spec.target_field
    labels = batch.get(target) if target else None
    if labels is None or not _integer(labels):
        return problems
    kept = labels[~torch.isin(labels, torch.tensor(sorted(ctx.ignore_ids), dtype=labels.dtype))]
    if spec.task_type in CLASS_LABEL_TASKS and spec.num_classes:
        n = spec.num_classes
        problems += _range(target, kept, n, "num_classes",
                           f"the spec says {n} classes; check TaskSpec.additional_config[\"num_classes\"] or the "
                           f"label mapping")
    elif spec.task_type in TOKEN_LABEL_TASKS and vocab:
        problems += _range(target, kept, vocab, "vocab_size",
                           f"{vocab_fix} (positions labelled {sorted(ctx.ignore_ids)} are ignored)")
    return problems


def check_attention_mask(batch: dict[str, torch.Tensor], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    for mask_key, ids_key in MASK_PAIRS:
        mask, ids = batch.get(mask_key), batch.get(ids_key)
        if mask is None:
            continue
        if not torch.isin(mask, torch.tensor([0, 1], dtype=mask.dtype)).all():
            found = torch.unique(mask)[:6].tolist()
            problems.append((mask_key, f"{mask_key} holds values other than 0 and 1 (found {found}): a mask marks "
                                       f"real tokens with 1 and padding with 0"))
            continue
        if ids is None:
            continue
        if mask.shape != ids.shape:
            problems.append((mask_key, f"{mask_key} has shape {list(mask.shape)} but {ids_key} has shape "
                                       f"{list(ids.shape)}: they must match position for position"))
            continue
        if mask.dim() != 2:
            continue
        pad, padded = ctx.pad_token_id, mask == 0
        zero = padded.all(dim=1)
        if pad is not None:  # a row that holds only pad ids was empty: all zeros is right for it
            zero &= ~(ids == pad).all(dim=1)
        zero_rows = torch.nonzero(zero).flatten().tolist()
        if zero_rows:
            why = "" if pad is not None else " (no pad id is known, so they cannot be told apart from empty rows)"
            problems.append((mask_key, f"{mask_key} rows {zero_rows[:8]} are all zeros but the rows are not "
                                       f"empty{why}: an all-masked row makes attention NaN; drop empty rows or "
                                       f"check how the mask is built"))
        if pad is not None:
            wrong = int((ids[padded] != pad).sum())
            if wrong:
                problems.append((ids_key, f"{ids_key} holds {wrong} id(s) other than the pad id {pad} where "
                                          f"{mask_key} is 0: the mask and the padding disagree; check "
                                          f"padding_side and the pad id (tokenizer.pad_token_id / "
                                          f"TaskSpec.special_tokens['pad_token_id'])"))
    return problems


CHECKS = (
    ("keys", check_keys),
    ("dtypes", check_dtypes),
    ("shapes", check_shapes),
    ("finite", check_finite),
    ("label_range", check_label_range),
    ("attention_mask", check_attention_mask),
)
"""``(name, check)`` in the order they run; later checks see only the tensor entries of the batch."""
