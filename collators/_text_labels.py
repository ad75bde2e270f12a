"""Pieces of TextCollator's output: the shared buffer of the per-token tensors, and seq2seq targets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from collators._padding import PaddingLayout, padded_length
from collators._text_inputs import check_same_lengths, flatten_ids, tokenize_column

if TYPE_CHECKING:
    from collators._text_batch import ColumnInputs, RowInputs
    from collators.text import TextCollator


def output_slots(keys: list[str], layout: PaddingLayout) -> dict[str, torch.Tensor]:
    """One ``[batch, length]`` int64 view per key, all of one buffer.

    One allocation per batch, and a worker process hands the batch to the main process as one shared-memory
    segment instead of one per key (each costs a file-descriptor round trip between the processes, about 1 ms
    on a busy 2-core machine). The views do not overlap: writing one never changes another.
    """
    keys = list(dict.fromkeys(keys))
    buffer = torch.empty((len(keys), len(layout.lengths), layout.length), dtype=torch.long)
    return dict(zip(keys, buffer.unbind(0)))


def slot_keys(task_type: str, target_field: str, keys: list[str]) -> list[str]:
    """The ``[batch, length]`` int64 outputs of a batch with ``keys``, in the order they are written."""
    out = ["input_ids", "attention_mask", *(key for key in ("token_type_ids", "special_tokens_mask") if key in keys)]
    if task_type == "masked_lm":
        out = [key for key in out if key != "special_tokens_mask"] + [target_field]  # that mask is dropped
    elif task_type in ("causal_lm", "token_classification"):
        out.append(target_field)
    return out


def pad_per_token(inputs: RowInputs | ColumnInputs, key: str, lengths: torch.Tensor, layout: PaddingLayout,
                  pad_value: int, out: torch.Tensor | None) -> torch.Tensor:
    """Pad ``key``, one entry per token of ``input_ids`` (masks, token types, token labels), into ``out``."""
    flat, key_lengths = inputs.ids(key, allow_bool=True)
    check_same_lengths(key_lengths, lengths, key, "input_ids")
    if out is not None and key == "attention_mask" and isinstance(flat, np.ndarray) and all_ones(flat):
        return out.copy_(layout.mask)  # what the fill gives; the common case for Arrow columns, without the scatter
    return layout.fill(flat, pad_value, torch.long, out=out)


def all_ones(flat: np.ndarray) -> bool:
    """Whether every element is 1 (True for bools): two vectorized reductions, no per-element Python."""
    return len(flat) == 0 or (int(flat.min()) == 1 and int(flat.max()) == 1)


def pad_target(collator: TextCollator, flat: Any, lengths: torch.Tensor,
               pad_value: int) -> tuple[torch.Tensor, PaddingLayout]:
    """Pad a seq2seq target sequence to its own longest row, truncated to ``max_target_length``."""
    width = padded_length(int(lengths.max()), max_length=collator.max_target_length,
                          pad_to_multiple_of=collator.pad_to_multiple_of)
    layout = PaddingLayout(lengths, length=width, padding_side=collator.padding_side)
    return layout.fill(flat, pad_value, torch.long), layout


def add_seq2seq_labels(collator: TextCollator, batch: dict[str, Any], inputs: RowInputs | ColumnInputs,
                       consumed: set[str]) -> None:
    """Labels (ids, or tokenized target text) and optional decoder inputs/mask, each padded to its own length."""
    key, text_key = collator.target_field, collator.target_text_field
    if key in inputs.keys:
        flat, lengths = inputs.ids(key)
    elif text_key in inputs.keys:
        ids = tokenize_column(collator.tokenizer, inputs.values(text_key), text_key,
                              max_length=collator.max_target_length, target=True, ids_key=key)
        flat, lengths = flatten_ids(ids, key)
        consumed.add(text_key)
    else:
        raise collator._missing_target(inputs, f" and no target text under {text_key!r} "
                                               f"(set target_text_field=... for raw text)")
    batch[key] = pad_target(collator, flat, lengths, collator.label_pad_token_id)[0]
    if "decoder_input_ids" in inputs.keys:
        flat, lengths = inputs.ids("decoder_input_ids")
        batch["decoder_input_ids"], layout = pad_target(collator, flat, lengths, collator.pad_token_id)
        consumed.add("decoder_input_ids")
        if "decoder_attention_mask" in inputs.keys:
            flat, mask_lengths = inputs.ids("decoder_attention_mask", allow_bool=True)
            check_same_lengths(mask_lengths, lengths, "decoder_attention_mask", "decoder_input_ids")
            batch["decoder_attention_mask"] = layout.fill(flat, 0, torch.long)
            consumed.add("decoder_attention_mask")
