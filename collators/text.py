"""TextCollator: dynamic padding and labels for every text task type, vectorized over the whole batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from collators import _text_options as opts
from collators._extra import collate_extra
from collators._generator import OwnGenerator
from collators._kernels import load
from collators._padding import PaddingLayout, check_padding_side, padded_length
from collators._text_batch import ColumnInputs, RaggedColumn, RowInputs, SpanColumn, batch_inputs
from collators._text_inputs import flatten_ids, tokenize_column
from collators._text_labels import add_labels, output_slots, pad_input_ids, pad_per_token, slot_keys, target_key
from task_spec import TaskSpec

__all__ = ["RaggedColumn", "SpanColumn", "TextCollator", "create_text_collator"]


class TextCollator(OwnGenerator):
    """Pad token rows into a batch and build the labels of the task (causal/masked LM, classification, seq2seq...).

    Rows are dicts with ``input_ids`` (list, 1-D tensor or 1-D numpy array of ints), or raw text under
    ``text_field`` (tokenized in one batched call), or bare id sequences. Padding is to the longest row, rows
    longer than ``max_length`` keep their start (right truncation). Labels by task:

    - ``causal_lm``: a copy of ``input_ids`` with the padded positions (by position, not by id, so a real eos
      equal to the pad id keeps its label) set to ``label_pad_token_id``; labels the rows carry are kept, padded.
    - ``masked_lm``: :func:`collators.masking.mask_tokens` on the padded ids; ``special_tokens_mask`` is used,
      then dropped.
    - ``classification`` / ``regression``: ``target_field`` stacked as int64 / float32.
    - ``token_classification``: per-token ``target_field`` padded with ``label_pad_token_id``.
    - ``seq2seq``: ``target_field`` (or text under ``target_text_field``) padded separately to its own longest row,
      truncated to ``max_target_length``; ``decoder_input_ids`` are padded with ``pad_token_id``. With
      ``padding='max_length'`` both are ``max_target_length`` wide, else ``max_length`` wide (a longer target
      is then refused), as transformers' ``DataCollatorForSeq2Seq``.

    Rows without targets (none of them has ``target_field``, or it is None in all) are a batch for prediction:
    inputs are padded and, except for causal/masked LM, no labels are returned. Targets in some rows only raise.

    Every batch is checked on the host (one min/max per key): ids in ``[0, vocab_size)``, and with
    ``num_classes`` known, class labels in ``[0, num_classes)`` or ``label_pad_token_id``. A bad value raises a
    ValueError naming the key, the value, its row and the limit, instead of a CUDA device-side assert later.

    Other keys are collated with ``default_collate`` when they stack, else returned as lists; text that was
    tokenized is not returned. Rows are never modified and no output shares memory with them.

    Args:
        tokenizer: a transformers tokenizer; needed for raw text, and a source of default ids.
        task_spec: defaults for every option below that is not given.
        task_type: one of ``TASK_TYPES``; default the spec's, else 'causal_lm'.
        pad_token_id: explicit > ``tokenizer.pad_token_id`` > for causal_lm, ``tokenizer.eos_token_id`` (logged
            once; padded labels are set by position, so a real eos keeps its label) >
            ``spec.special_tokens['pad_token_id']``. ``pad_source`` says which: 'given', 'tokenizer', 'eos', 'spec'.
        label_pad_token_id: label of padded (and unselected masked-LM) positions.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        padding: 'longest' (pad to the batch's longest row) or 'max_length' (every batch ``max_length`` wide, as
            transformers' ``padding="max_length"``); default the spec's ``padding``, else 'longest'.
        pad_to_buckets: widths such as (128, 256, 512): each batch is padded to the smallest that holds it, so
            torch.compile, CUDA graphs and XLA see a handful of shapes; default the spec's ``pad_to_buckets``.
        padding_side: 'right' or 'left'; default ``tokenizer.padding_side``, else the spec's, else 'right'.
        max_length: truncate inputs to this many tokens; default ``spec.max_seq_len``; None disables.
        max_target_length: seq2seq label truncation; default ``spec.additional_config['max_target_len']``.
        target_field: key of the target in rows and batch; default ``spec.target_field``, else 'labels'.
        text_field: key of raw input text; default the spec's ``text_field``, else 'source' for seq2seq or 'text'.
        target_text_field: key of raw seq2seq target text; default the spec's, else 'target'.
        mlm_probability: masked-LM selection probability; default the spec's, else 0.15.
        mask_token_id: explicit > ``tokenizer.mask_token_id`` > ``spec.special_tokens['mask_token_id']``.
        vocab_size: ids must be below it (and masked-LM random replacements are drawn below it); explicit >
            ``len(tokenizer)`` > ``spec.vocab_size``; unknown: only negative ids are refused.
        num_classes: classification and token-classification labels must be below it; explicit > the spec's
            ``num_classes`` (when its loss is cross_entropy); None: not checked.
        check_values: run the per-batch value checks above (False skips them).
        special_token_ids: ids never masked; default ``tokenizer.all_special_ids`` or the spec's ids (+ pad).
        seed: seeds the collator's own generator, used when ``__call__`` gets none.

    Example:
        >>> collate = TextCollator(pad_token_id=0)
        >>> batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
        >>> batch["labels"]
        tensor([[   5,    6,    7],
                [   8, -100, -100]])
    """

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        task_spec: TaskSpec | None = None,
        task_type: str | None = None,
        pad_token_id: int | None = None,
        label_pad_token_id: int = -100,
        pad_to_multiple_of: int | None = None,
        padding: str | None = None,
        pad_to_buckets: Sequence[int] | None = None,
        padding_side: str | None = None,
        max_length: int | None = opts.UNSET,
        max_target_length: int | None = opts.UNSET,
        target_field: str | None = None,
        text_field: str | None = None,
        target_text_field: str | None = None,
        mlm_probability: float | None = None,
        mask_token_id: int | None = None,
        vocab_size: int | None = None,
        special_token_ids: Sequence[int] | None = None,
        num_classes: int | None = None,
        check_values: bool = True,
        seed: int = 0,
    ) -> None:
        spec = task_spec
        if spec is not None and not isinstance(spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec or None, but got {type(spec).__name__}: {spec!r}")
        self.tokenizer = tokenizer
        self.task_type = opts.resolve_task_type(task_type, spec)
        self.pad_token_id, self.pad_source = opts.resolve_pad_token_id(pad_token_id, tokenizer, spec, self.task_type)
        self.label_pad_token_id = opts.check_int("label_pad_token_id", label_pad_token_id)
        self.pad_to_multiple_of = opts.check_int("pad_to_multiple_of", pad_to_multiple_of, minimum=1, optional=True)
        if padding_side is None:
            padding_side = tokenizer.padding_side if tokenizer is not None else opts.preprocessing(
                spec, "padding_side", "right")
        self.padding_side = check_padding_side(padding_side)
        if max_length is opts.UNSET:
            max_length = spec.max_seq_len if spec is not None else None
        self.max_length = opts.check_int("max_length", max_length, minimum=1, optional=True)
        if max_target_length is opts.UNSET:
            max_target_length = spec.additional_config.get("max_target_len") if spec is not None else None
        self.max_target_length = opts.check_int("max_target_length", max_target_length, minimum=1, optional=True)
        self.padding, self.pad_to_buckets = opts.resolve_static_shapes(padding, pad_to_buckets, self.max_length, spec)
        spec_target = spec.target_field if spec is not None else None
        self.target_field = target_field or spec_target or "labels"
        self.text_field = text_field or opts.preprocessing(spec, "text_field", "source" if self.task_type ==
                                                           "seq2seq" else "text")
        self.target_text_field = target_text_field or opts.preprocessing(spec, "target_text_field", "target")
        self.seed = opts.check_int("seed", seed)
        self._generator = torch.Generator().manual_seed(self.seed)
        self.draws_random = self.task_type == "masked_lm"  # the engine seeds a generator per batch only if True
        self.check_values = bool(check_values)
        self.num_classes = opts.resolve_num_classes(num_classes, spec)
        self.vocab_size, self.vocab_source = opts.resolve_vocab_size(
            vocab_size, tokenizer, spec, required=self.task_type == "masked_lm")
        opts.check_id_in_vocab("pad_token_id", self.pad_token_id, pad_token_id, tokenizer, self.vocab_size,
                               self.vocab_source)
        if self.task_type == "masked_lm":
            self.mlm_probability, self.mask_token_id, self.special_token_ids = opts.resolve_masked_lm(
                mlm_probability, mask_token_id, special_token_ids, tokenizer, spec, self.pad_token_id)
            opts.check_id_in_vocab("mask_token_id", self.mask_token_id, mask_token_id, tokenizer, self.vocab_size,
                                   self.vocab_source)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Collate ``rows`` into a dict of tensors; ``generator`` drives masked-LM randomness (else the own one).

        A batch that can hand over its columns (``rows.to_columns()``, as the engine's Arrow-backed batches do)
        is collated from them by :meth:`collate_columns`, with the same result.
        """
        keys = (self.target_field, self.target_text_field) if self.task_type == "seq2seq" else (self.target_field,)
        return self._collate(batch_inputs(rows, keys), generator)

    def collate_columns(self, columns: Mapping[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Collate a batch given as columns instead of row dicts; the result equals ``__call__`` on the rows.

        Token columns are padded straight from flat values + offsets, without one Python object per token.

        Args:
            columns: ``{key: column}`` in the key order rows would have. A column is a
                :class:`RaggedColumn` (flat ``values`` + ``offsets``, as numpy arrays or tensors), a pyarrow
                ``Array``/``ChunkedArray`` (list arrays are read through their offsets), a numpy array or tensor
                whose first dimension is the batch (row ``i`` is ``column[i].tolist()``), or a list of per-row
                values.
            generator: as for ``__call__``.

        Example:
            >>> import numpy as np
            >>> collate = TextCollator(pad_token_id=0)
            >>> flat = RaggedColumn(values=np.array([5, 6, 7, 8]), offsets=np.array([0, 3, 4]))
            >>> collate.collate_columns({"input_ids": flat})["input_ids"]
            tensor([[5, 6, 7],
                    [8, 0, 0]])
        """
        return self._collate(ColumnInputs(columns), generator)

    def _collate(self, inputs: RowInputs | ColumnInputs, generator: torch.Generator | None) -> dict[str, Any]:
        spans = inputs.spans("input_ids")
        if spans is None:
            flat, lengths, consumed = self._input_ids(inputs)
        else:  # spans of a token buffer: padded straight from it, reading only the kept tokens
            flat, lengths, consumed = None, torch.from_numpy(spans.lengths), set()
        longest = int(lengths.max()) if spans is None else int(np.maximum.reduce(spans.lengths))
        width = padded_length(longest, max_length=self.max_length, padding=self.padding,
                              buckets=self.pad_to_buckets, pad_to_multiple_of=self.pad_to_multiple_of)
        layout = PaddingLayout(lengths if spans is None else spans.lengths, length=width,
                               padding_side=self.padding_side)
        target = target_key(self, inputs)
        slots = output_slots(slot_keys(self.task_type, self.target_field, inputs.keys, target is not None), layout)
        batch: dict[str, Any] = {"input_ids": pad_input_ids(self, inputs, flat, spans, lengths, layout, slots,
                                                             target is not None)}
        for key, pad_value in opts.TOKEN_KEYS.items():
            if key in inputs.keys:
                batch[key] = slots[key] if key in slots.written else pad_per_token(inputs, key, lengths, layout,
                                                                                   pad_value, slots.get(key))
        if "attention_mask" not in batch:
            batch["attention_mask"] = slots["attention_mask"] if "attention_mask" in slots.written else \
                layout.write_mask(slots["attention_mask"], slots.arrays["attention_mask"])
        consumed.update(("input_ids", *opts.TOKEN_KEYS, self.target_field))
        if self.task_type == "seq2seq" and self.target_text_field in inputs.keys and target is None:
            consumed.add(self.target_text_field)  # None in every row: nothing to pass through
        add_labels(self, batch, inputs, target, lengths, layout, consumed, generator, slots)
        for key in inputs.keys:
            if key not in consumed:
                batch[key] = collate_extra(inputs.values(key))
        return batch

    def _input_ids(self, inputs: RowInputs | ColumnInputs) -> tuple[Any, torch.Tensor, set[str]]:
        """Flat input ids and row lengths, tokenizing raw text if the rows hold no ids; and the keys consumed."""
        if "input_ids" in inputs.keys:
            return (*inputs.ids("input_ids"), set())
        if self.text_field in inputs.keys:
            ids = tokenize_column(self.tokenizer, inputs.values(self.text_field), self.text_field,
                                  max_length=self.max_length, target=False, ids_key="input_ids",
                                  rows=inputs.origin)
            return (*flatten_ids(ids, "input_ids"), {self.text_field})
        raise ValueError(
            f"row 0 has neither 'input_ids' nor raw text under {self.text_field!r} (keys: {sorted(inputs.keys)}); "
            f"give token ids under 'input_ids', or text under {self.text_field!r} (name its key with text_field=...)"
        )

    def __repr__(self) -> str:
        shown = {
            "task_type": self.task_type, "pad_token_id": self.pad_token_id,
            "label_pad_token_id": self.label_pad_token_id, "padding_side": self.padding_side,
            "max_length": self.max_length, "pad_to_multiple_of": self.pad_to_multiple_of, "padding": self.padding,
            "pad_to_buckets": self.pad_to_buckets,
            "target_field": self.target_field, "text_field": self.text_field,
        }
        if self.task_type == "seq2seq":
            shown.update(max_target_length=self.max_target_length, target_text_field=self.target_text_field)
        if self.task_type == "masked_lm":
            shown.update(mlm_probability=self.mlm_probability, mask_token_id=self.mask_token_id)
        shown.update(vocab_size=self.vocab_size, num_classes=self.num_classes, check_values=self.check_values)
        options = ", ".join(f"{name}={value!r}" for name, value in shown.items())
        return f"TextCollator({options}, tokenizer={opts.describe_tokenizer(self.tokenizer)}, seed={self.seed})"


def create_text_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> TextCollator:
    """Build a :class:`TextCollator` whose defaults come from ``task_spec``; explicit ``kwargs`` override them.

    Example:
        >>> collate = create_text_collator(TaskSpec.mlm_tiny(), mlm_probability=0.3)
        >>> collate.task_type, collate.mask_token_id, collate.mlm_probability
        ('masked_lm', 103, 0.3)
    """
    return TextCollator(task_spec=task_spec, **kwargs)


def warm_token_loops() -> None:
    """Load the compiled padding loops in this process (:func:`collators._kernels.load`: from numba's disk cache
    when it holds them, else compiled) for the usual argument types, rather than at the first batch that runs them
    here. Loader workers forked afterwards inherit them (shared) instead of running their numpy twins, a few tens of
    microseconds more per batch; the loader does not do this itself, since loading takes about a second on the way to
    the first batch."""
    load()
