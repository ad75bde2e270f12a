"""TextCollator's labels for every task type, and the shared buffer of its per-token outputs.

The functions take the collator's resolved options as :class:`collators._text_options.TextOptions` rather than
importing the collator: the collator calls them, and no module imports its caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from collators._padding import PaddingLayout, padded_length
from collators._text_checks import CLASS_FIX, check_padded, check_range
from collators._text_inputs import check_same_lengths, flatten_ids, mixed_targets_error, tokenize_column
from collators._text_options import TextOptions
from collators._text_targets import collate_targets
from collators.masking import mask_tokens
from collators.targets import missing_target, needs_targets, row_name
from task_spec.choices import SUPERVISED_TASK_TYPES

if TYPE_CHECKING:
    from collators._text_batch import ColumnInputs, RowInputs, SpanColumn


def target_key(options: TextOptions, inputs: RowInputs | ColumnInputs) -> str | None:
    """The key the batch's targets come from, or None when no row has one (a batch for prediction).

    A key whose value is None in every row counts as absent; None in some rows only raises, naming the row. A batch
    of the train, val or test split of a supervised task (``inputs.origin.role``) must have its targets in every row.
    """
    required = needs_targets(inputs.origin, options.task_type in SUPERVISED_TASK_TYPES)
    keys = [options.target_field] + ([options.target_text_field] if options.task_type == "seq2seq" else [])
    null_key = None  # a target key that is None in every row
    for key in keys:
        if key not in inputs.keys:
            continue
        empty = inputs.none_rows(key)
        if not empty:
            return key
        if len(empty) < len(inputs):
            if required:
                raise missing_target(row_name(inputs.origin, empty[0]), key, f"{key}=None")
            having = next(index for index in range(len(inputs)) if index not in set(empty))
            raise mixed_targets_error(key, empty[0], having)
        null_key = null_key or key
    if required:
        key = null_key or options.target_field
        found = f"{key}=None" if null_key else f"no {key!r} (the row's keys: {sorted(inputs.keys)})"
        raise missing_target(row_name(inputs.origin, 0), key, found)
    return None


class Slots(dict):
    """``{key: [batch, length] int64 tensor}``, all views of one buffer, with :attr:`arrays`: the same views as
    numpy arrays (writing through them costs no tensor-to-numpy conversion per use), and :attr:`written`: the
    keys the input ids' compiled pass already wrote."""

    arrays: dict[str, np.ndarray]
    written: frozenset[str]


def output_slots(keys: list[str], layout: PaddingLayout) -> Slots:
    """One ``[batch, length]`` int64 view per key, all of one buffer.

    One allocation per batch, and a worker process hands the batch to the main process as one shared-memory
    segment instead of one per key (each costs a file-descriptor round trip between the processes, which waits
    for the worker to be scheduled). The views do not overlap: writing one never changes another.
    """
    keys = list(dict.fromkeys(keys))
    buffer = np.empty((len(keys), len(layout.lengths), layout.length), dtype=np.int64)
    slots = Slots(zip(keys, torch.from_numpy(buffer).unbind(0)))
    slots.arrays, slots.written = dict(zip(keys, buffer)), frozenset()
    return slots


def pad_input_ids(options: TextOptions, inputs: RowInputs | ColumnInputs, flat: Any, spans: SpanColumn | None,
                  lengths: torch.Tensor, layout: PaddingLayout, slots: Slots, has_target: bool) -> torch.Tensor:
    """``input_ids`` padded into their slot (from ``flat``, or from ``spans`` of a token buffer) and checked
    against the vocabulary.

    Spans take one compiled pass, which also writes the attention mask when the rows carry none (or carry ones,
    see :func:`_mask_of_ones`), and the causal-LM labels when they are derived from the ids;
    :attr:`Slots.written` names them.
    """
    arrays, value_range = slots.arrays, None
    if spans is None:
        layout.fill(flat, options.pad_token_id, out=slots["input_ids"])
    else:
        mask = arrays["attention_mask"] if "attention_mask" not in inputs.keys or _mask_of_ones(inputs, lengths) \
            else None
        labels = arrays[options.target_field] if options.task_type == "causal_lm" and not has_target else None
        value_range = layout.gather_tokens(spans.values, spans.starts, options.pad_token_id, arrays["input_ids"],
                                           mask=mask, labels=labels, label_pad=options.label_pad_token_id)
        slots.written = frozenset(key for key, array in (("attention_mask", mask), (options.target_field, labels))
                                  if array is not None)
    if options.check_values:
        check_padded(arrays["input_ids"], layout, "input_ids", high=options.vocab_size, limit=options.vocab_source,
                     value_range=value_range)
    return slots["input_ids"]


def _mask_of_ones(inputs: RowInputs | ColumnInputs, lengths: torch.Tensor) -> bool:
    """Whether the rows' attention mask is all ones, handed over as spans of one repeated 1 (as the engine hands
    over a uniform Arrow column), one per token of ``input_ids`` (else the row's error is raised)."""
    spans = inputs.spans("attention_mask", allow_bool=True)
    if spans is None or spans.values.strides != (0,) or not len(spans.values) or spans.values[0] != 1:
        return False
    check_same_lengths(torch.from_numpy(spans.lengths), lengths, "attention_mask", "input_ids")
    return True


def slot_keys(task_type: str, target_field: str, keys: list[str], has_target: bool) -> list[str]:
    """The ``[batch, length]`` int64 outputs of a batch with ``keys``, in the order they are written."""
    out = ["input_ids", "attention_mask", *(key for key in ("token_type_ids", "special_tokens_mask") if key in keys)]
    if task_type == "masked_lm":
        out = [key for key in out if key != "special_tokens_mask"] + [target_field]  # that mask is dropped
    elif task_type == "causal_lm" or (task_type == "token_classification" and has_target):
        out.append(target_field)
    return out


def pad_per_token(inputs: RowInputs | ColumnInputs, key: str, lengths: torch.Tensor, layout: PaddingLayout,
                  pad_value: int, out: torch.Tensor | None, *, check: dict[str, Any] | None = None) -> torch.Tensor:
    """Pad ``key``, one entry per token of ``input_ids`` (masks, token types, token labels), into ``out``.

    ``check``, the arguments of :func:`check_range` (labels), checks the values' range.
    """
    spans = inputs.spans(key, allow_bool=True)
    if spans is not None:
        check_same_lengths(torch.from_numpy(spans.lengths), lengths, key, "input_ids")
        padded = layout.gather(spans.values, spans.starts, pad_value, torch.long, out=out)
    else:
        flat, key_lengths = inputs.ids(key, allow_bool=True)
        check_same_lengths(key_lengths, lengths, key, "input_ids")
        if out is not None and key == "attention_mask" and isinstance(flat, np.ndarray) and all_ones(flat):
            return layout.write_mask(out)  # what the fill gives, without the scatter
        padded = layout.fill(flat, pad_value, torch.long, out=out)
    if check is not None:
        check_padded(padded, layout, key, **check)
    return padded


def all_ones(flat: np.ndarray) -> bool:
    """Whether every element is 1 (True for bools): two vectorized reductions, no per-element Python."""
    return len(flat) == 0 or (int(flat.min()) == 1 and int(flat.max()) == 1)


def pad_target(options: TextOptions, flat: Any, lengths: torch.Tensor, pad_value: int,
               key: str) -> tuple[torch.Tensor, PaddingLayout]:
    """Pad a seq2seq target sequence ``key`` to its own longest row, truncated to ``max_target_length``.

    With ``padding='max_length'`` every batch has one width, as transformers' ``DataCollatorForSeq2Seq``:
    ``max_target_length``, else ``max_length``. Without ``max_target_length`` a longer target is refused, not cut.
    """
    static = options.padding == "max_length"
    cap = options.max_target_length
    if static and cap is None:
        cap = options.max_length
        longer = torch.nonzero(lengths > cap)
        if len(longer):
            row = int(longer[0, 0])
            raise ValueError(
                f"{key!r} should have at most max_length={cap} tokens with padding='max_length' and no "
                f"max_target_length, but got {int(lengths[row])} tokens in row {row}; set max_target_length=... to "
                f"truncate the targets, or raise max_length"
            )
    width = padded_length(int(lengths.max()), max_length=cap, pad_to_multiple_of=options.pad_to_multiple_of,
                          padding="max_length" if static else "longest")
    layout = PaddingLayout(lengths, length=width, padding_side=options.padding_side)
    return layout.fill(flat, pad_value, torch.long), layout


def _vocab_check(options: TextOptions, ignore: int | None = None) -> dict[str, Any] | None:
    """Arguments of :func:`check_range` for token ids (labels: ``ignore`` the label padding), or None: no check."""
    if not options.check_values:
        return None
    return {"high": options.vocab_size, "limit": options.vocab_source, "ignore": ignore}


def _class_check(options: TextOptions) -> dict[str, Any] | None:
    if not options.check_values or options.num_classes is None:
        return None
    return {"high": options.num_classes, "limit": "num_classes", "ignore": options.label_pad_token_id,
            "fix": CLASS_FIX}


def add_labels(options: TextOptions, batch: dict[str, Any], inputs: RowInputs | ColumnInputs, key: str | None,
               lengths: torch.Tensor, layout: PaddingLayout, consumed: set[str], generator: torch.Generator | None,
               slots: Slots) -> None:
    """Add the labels of ``options.task_type`` to ``batch``, read from ``key`` (None: the rows have no targets).

    Without targets, causal and masked LM derive labels from the inputs; the other tasks add none (prediction).
    """
    field, task = options.target_field, options.task_type
    if task == "masked_lm":
        if key is not None:
            raise ValueError(
                f"task_type='masked_lm' builds the labels under {field!r} itself, but the rows already carry "
                f"{field!r}; drop that column, or use task_type='causal_lm' to keep given labels"
            )
        special = batch.pop("special_tokens_mask", None)
        masked, labels = mask_tokens(
            batch["input_ids"], mask_token_id=options.mask_token_id, vocab_size=options.vocab_size,
            generator=generator if generator is not None else options._generator,
            special_ids=options.special_token_ids, special_tokens_mask=special, padding_mask=~layout.mask,
            mlm_probability=options.mlm_probability, label_pad_token_id=options.label_pad_token_id)
        batch["input_ids"] = slots["input_ids"].copy_(masked)
        batch[field] = slots[field].copy_(labels)
    elif task == "causal_lm" and key is None:
        batch[field] = slots[field]
        if field not in slots.written:
            layout.repad(slots.arrays["input_ids"], options.label_pad_token_id, out=slots.arrays[field])
    elif key is None:
        if task == "seq2seq" and "decoder_input_ids" in inputs.keys:
            _add_decoder_inputs(options, batch, inputs, consumed)
    elif task in ("causal_lm", "token_classification"):
        check = _vocab_check(options, options.label_pad_token_id) if task == "causal_lm" else _class_check(options)
        batch[field] = pad_per_token(inputs, field, lengths, layout, options.label_pad_token_id, slots[field],
                                     check=check)
    elif task in ("classification", "regression"):
        labels = collate_targets(inputs.values(field), field, dtype=torch.long if task == "classification"
                                 else torch.float32, rows=inputs.origin)
        check = _class_check(options) if task == "classification" and labels.dim() == 1 else None
        if check is not None:
            check_range(labels, field, **check)
        batch[field] = labels
    else:
        _add_seq2seq_labels(options, batch, inputs, key, consumed)


def _add_seq2seq_labels(options: TextOptions, batch: dict[str, Any], inputs: RowInputs | ColumnInputs, key: str,
                        consumed: set[str]) -> None:
    """Labels (ids, or tokenized target text) and optional decoder inputs/mask, each padded to its own length."""
    field = options.target_field
    if key == field:
        flat, lengths = inputs.ids(key)
    else:
        ids = tokenize_column(options.tokenizer, inputs.values(key), key,
                              max_length=options.max_target_length, target=True, ids_key=field,
                              rows=inputs.origin)
        flat, lengths = flatten_ids(ids, field)
        consumed.add(key)
    check = _vocab_check(options, options.label_pad_token_id)
    if check is not None:
        check_range(flat, field, lengths=lengths, **check)
    batch[field] = pad_target(options, flat, lengths, options.label_pad_token_id, field)[0]
    if "decoder_input_ids" in inputs.keys:
        _add_decoder_inputs(options, batch, inputs, consumed)


def _add_decoder_inputs(options: TextOptions, batch: dict[str, Any], inputs: RowInputs | ColumnInputs,
                        consumed: set[str]) -> None:
    flat, lengths = inputs.ids("decoder_input_ids")
    check = _vocab_check(options)
    if check is not None:
        check_range(flat, "decoder_input_ids", lengths=lengths, **check)
    batch["decoder_input_ids"], layout = pad_target(options, flat, lengths, options.pad_token_id,
                                                     "decoder_input_ids")
    consumed.add("decoder_input_ids")
    if "decoder_attention_mask" in inputs.keys:
        flat, mask_lengths = inputs.ids("decoder_attention_mask", allow_bool=True)
        check_same_lengths(mask_lengths, lengths, "decoder_attention_mask", "decoder_input_ids")
        batch["decoder_attention_mask"] = layout.fill(flat, 0, torch.long)
        consumed.add("decoder_attention_mask")
