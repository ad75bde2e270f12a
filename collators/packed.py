"""PackedCollator: whole documents concatenated into one ``[1, T]`` sequence, with FlashAttention varlen fields.

The output equals transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True,
return_position_ids=True)`` field for field on the same documents, built with vectorized operations over the
batch's flat ids (read straight from Arrow offsets when the engine hands over columns) instead of per-token lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from collators import _text_options as opts
from collators._extra import collate_extra
from collators._generator import OwnGenerator
from collators._text_batch import ColumnInputs, RowInputs, batch_inputs
from collators._text_checks import check_range
from collators._text_inputs import check_same_lengths, flatten_ids, mixed_targets_error, tokenize_column
from collators.masking import mask_tokens
from task_spec import TaskSpec

__all__ = ["PACKED_FIELDS", "PackedCollator", "create_packed_collator"]

PACKED_TASK_TYPES = ("causal_lm", "masked_lm")
PACKED_FIELDS = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                 "max_length_k")
"""The keys of every packed batch, as ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` names them."""


class PackedCollator(OwnGenerator):
    """Concatenate a batch of documents into one sequence with no cross-document attention fields.

    Output (``n`` documents, ``T`` tokens in all, no padding):

    - ``input_ids``: int64 ``[1, T]``, the documents one after another.
    - ``labels``: int64 ``[1, T]``. ``causal_lm``: the ids (or the rows' own ``target_field``) with
      ``label_pad_token_id`` at each document's first position, so no document is trained to predict its first token
      from the previous document's last. ``masked_lm``: :func:`collators.masking.mask_tokens` labels (original id
      where a token was selected, ``label_pad_token_id`` elsewhere), and ``input_ids`` are the masked ids.
    - ``position_ids``: int64 ``[1, T]``, restarting at 0 at each document.
    - ``cu_seq_lens_q``, ``cu_seq_lens_k``: int32 ``[n + 1]``, the cumulative document lengths from 0.
    - ``max_length_q``, ``max_length_k``: Python ints, the longest document.

    Rows may carry ``attention_mask`` (all ones: a zero means padding inside a document, which is refused),
    ``special_tokens_mask`` (masked LM: never selected; then dropped) and ``token_type_ids`` (concatenated as
    ``[1, T]``). Any other key is passed through as one entry per document (a tensor if they stack, else a list).
    Ids are checked on the host: a negative id or one at or past ``vocab_size`` raises a ValueError naming the
    row and position. Rows are never modified and no output shares memory with them.

    Args:
        tokenizer: a transformers tokenizer; needed for raw text (tokenized untruncated, then cut to ``max_length``),
            and a source of vocab and special ids.
        task_spec: defaults for every option below that is not given.
        task_type: 'causal_lm' or 'masked_lm'; default the spec's, else 'causal_lm'.
        label_pad_token_id: the label of each document's first position (causal LM) and of unselected tokens.
        target_field: key of labels the rows may carry (causal LM); default the spec's, else 'labels'.
        text_field: key of raw text, tokenized in one batched call when rows hold no ``input_ids``.
        mlm_probability, mask_token_id, special_token_ids: masked LM, as for :class:`collators.text.TextCollator`.
        vocab_size: ids must be below it: explicit > ``len(tokenizer)`` > ``spec.vocab_size``.
        max_length: the longest document the model takes (its positions); a longer one keeps its first
            ``max_length`` tokens, as the text collator truncates rows. Default ``spec.max_seq_len``; None disables.
        check_values: run the per-batch value checks (False skips them).
        seed: seeds the collator's own generator, used when ``__call__`` gets none.

    Example:
        >>> collate = PackedCollator()
        >>> batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
        >>> batch["input_ids"], batch["labels"], batch["position_ids"]
        (tensor([[5, 6, 7, 8, 9]]), tensor([[-100,    6,    7, -100,    9]]), tensor([[0, 1, 2, 0, 1]]))
        >>> batch["cu_seq_lens_q"], batch["max_length_q"]
        (tensor([0, 3, 5], dtype=torch.int32), 3)
    """

    def __init__(self, *, tokenizer: Any = None, task_spec: TaskSpec | None = None, task_type: str | None = None,
                 label_pad_token_id: int = -100, target_field: str | None = None, text_field: str | None = None,
                 mlm_probability: float | None = None, mask_token_id: int | None = None,
                 special_token_ids: Sequence[int] | None = None, vocab_size: int | None = None,
                 max_length: int | None = opts.UNSET, check_values: bool = True, seed: int = 0) -> None:
        spec = task_spec
        if spec is not None and not isinstance(spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec or None, but got {type(spec).__name__}: {spec!r}")
        self.tokenizer = tokenizer
        self.task_type = opts.resolve_task_type(task_type, spec)
        if self.task_type not in PACKED_TASK_TYPES:
            raise ValueError(f"PackedCollator packs documents for {' and '.join(PACKED_TASK_TYPES)}, but got "
                             f"task_type={self.task_type!r}; use batching='plain', 'grouped' or 'token_budget' (the "
                             f"text collator) for {self.task_type}")
        self.label_pad_token_id = opts.check_int("label_pad_token_id", label_pad_token_id)
        self.target_field = target_field or (spec.target_field if spec is not None else None) or "labels"
        self.text_field = text_field or opts.preprocessing(spec, "text_field", "text")
        if max_length is opts.UNSET:
            max_length = spec.max_seq_len if spec is not None else None
        self.max_length = opts.check_int("max_length", max_length, minimum=1, optional=True)
        self.check_values = bool(check_values)
        self.seed = opts.check_int("seed", seed)
        self._generator = torch.Generator().manual_seed(self.seed)
        self.vocab_size, self.vocab_source = opts.resolve_vocab_size(
            vocab_size, tokenizer, spec, required=self.task_type == "masked_lm")
        if self.task_type == "masked_lm":
            self.mlm_probability, self.mask_token_id, self.special_token_ids = opts.resolve_masked_lm(
                mlm_probability, mask_token_id, special_token_ids, tokenizer, spec)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Pack ``rows`` (dicts with ``input_ids``, or bare id sequences) into one sequence; ``generator`` drives
        masked-LM randomness (else the collator's own). Arrow-backed engine batches are read as columns."""
        return self._collate(batch_inputs(rows, (self.target_field,)), generator)

    def collate_columns(self, columns: Mapping[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Pack a batch given as ``{key: column}`` (see ``TextCollator.collate_columns``); equals ``__call__``."""
        return self._collate(ColumnInputs(columns), generator)

    def _collate(self, inputs: RowInputs | ColumnInputs, generator: torch.Generator | None) -> dict[str, Any]:
        flat, full_lengths, consumed = self._input_ids(inputs)
        if int(full_lengths.min()) == 0:
            row = int((full_lengths == 0).nonzero()[0])
            raise ValueError(f"row {row} has no tokens; packing needs at least one token per document, so filter "
                             f"empty rows out of the data")
        keep = self._kept_positions(full_lengths)
        lengths = full_lengths if keep is None else full_lengths.clamp(max=self.max_length)
        ids = _cut(_owned_long(flat), keep).unsqueeze(0)
        if self.check_values:
            check_range(ids[0], "input_ids", high=self.vocab_size, limit=self.vocab_source, lengths=lengths)
        # Index arithmetic in numpy: a few microseconds per call where each torch op costs several.
        cu_seq_lens = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths.numpy(), out=cu_seq_lens[1:])
        starts, position_ids = _document_positions(lengths.numpy())
        batch: dict[str, Any] = {"input_ids": ids, "labels": None,
                                 "position_ids": torch.from_numpy(position_ids).unsqueeze(0)}
        self._per_token_keys(inputs, full_lengths, keep, batch, consumed)
        batch["labels"] = self._labels(inputs, batch, full_lengths, keep, starts, generator)
        consumed.update(("input_ids", self.target_field))
        batch["cu_seq_lens_q"] = torch.from_numpy(cu_seq_lens)
        batch["cu_seq_lens_k"] = torch.from_numpy(cu_seq_lens.copy())
        batch["max_length_q"] = batch["max_length_k"] = int(lengths.max())
        for key in inputs.keys:
            if key not in consumed:
                batch[key] = collate_extra(inputs.values(key))
        return batch

    def _kept_positions(self, lengths: torch.Tensor) -> torch.Tensor | None:
        """Which of the concatenated tokens survive truncation to ``max_length`` (None: all of them)."""
        if self.max_length is None or int(lengths.max()) <= self.max_length:
            return None
        return torch.from_numpy(_document_positions(lengths.numpy())[1] < self.max_length)

    def _input_ids(self, inputs: RowInputs | ColumnInputs) -> tuple[Any, torch.Tensor, set[str]]:
        if "input_ids" in inputs.keys:
            return (*inputs.ids("input_ids"), set())
        if self.text_field in inputs.keys:
            ids = tokenize_column(self.tokenizer, inputs.values(self.text_field), self.text_field,
                                  max_length=None, target=False, ids_key="input_ids", rows=inputs.origin)
            return (*flatten_ids(ids, "input_ids"), {self.text_field})
        raise ValueError(f"row 0 has neither 'input_ids' nor raw text under {self.text_field!r} (keys: "
                         f"{sorted(inputs.keys)}); give token ids under 'input_ids', or text under "
                         f"{self.text_field!r} (name its key with text_field=...)")

    def _per_token_keys(self, inputs: RowInputs | ColumnInputs, lengths: torch.Tensor, keep: torch.Tensor | None,
                        batch: dict[str, Any], consumed: set[str]) -> None:
        """Check ``attention_mask``, keep ``special_tokens_mask`` aside, concatenate ``token_type_ids``."""
        for key in ("attention_mask", "special_tokens_mask", "token_type_ids"):
            if key not in inputs.keys:
                continue
            values, counts = inputs.ids(key, allow_bool=key != "token_type_ids")
            check_same_lengths(counts, lengths, key, "input_ids")
            values = _cut(_owned_long(values), keep)
            consumed.add(key)
            if key == "attention_mask" and len(values) and int(values.min()) == 0:
                position = int((values == 0).nonzero()[0])
                kept = lengths if keep is None else lengths.clamp(max=self.max_length)
                row = int(torch.searchsorted(torch.cumsum(kept, 0), torch.tensor(position), right=True))
                raise ValueError(f"row {row}: attention_mask has a 0, so the row holds padding; packing "
                                 f"concatenates unpadded documents, so give rows without padding")
            if key != "attention_mask":
                batch[key] = values.unsqueeze(0)

    def _labels(self, inputs: RowInputs | ColumnInputs, batch: dict[str, Any], lengths: torch.Tensor,
                keep: torch.Tensor | None, starts: np.ndarray, generator: torch.Generator | None) -> torch.Tensor:
        if self.task_type == "masked_lm":
            special = batch.pop("special_tokens_mask", None)
            masked, labels = mask_tokens(
                batch["input_ids"], mask_token_id=self.mask_token_id, vocab_size=int(self.vocab_size),
                generator=generator if generator is not None else self._generator,
                special_ids=self.special_token_ids, special_tokens_mask=special,
                mlm_probability=self.mlm_probability, label_pad_token_id=self.label_pad_token_id)
            batch["input_ids"] = masked
            return labels
        batch.pop("special_tokens_mask", None)
        missing = inputs.none_rows(self.target_field) if self.target_field in inputs.keys else []
        if missing and len(missing) < len(inputs):
            raise mixed_targets_error(self.target_field, missing[0], next(
                row for row in range(len(inputs)) if row not in missing))
        if self.target_field in inputs.keys and not missing:
            values, counts = inputs.ids(self.target_field)
            check_same_lengths(counts, lengths, self.target_field, "input_ids")
            if self.check_values:
                check_range(values, self.target_field, high=self.vocab_size, limit=self.vocab_source,
                            ignore=self.label_pad_token_id, lengths=lengths)
            labels = _cut(_owned_long(values), keep).unsqueeze(0)
        else:
            labels = batch["input_ids"].clone()
        labels.numpy()[0, starts] = self.label_pad_token_id  # labels own their memory: never a row's
        return labels

    def __repr__(self) -> str:
        shown = {"task_type": self.task_type, "label_pad_token_id": self.label_pad_token_id,
                 "max_length": self.max_length, "target_field": self.target_field, "text_field": self.text_field}
        if self.task_type == "masked_lm":
            shown.update(mlm_probability=self.mlm_probability, mask_token_id=self.mask_token_id)
        shown.update(vocab_size=self.vocab_size, check_values=self.check_values)
        options = ", ".join(f"{name}={value!r}" for name, value in shown.items())
        return f"PackedCollator({options}, tokenizer={opts.describe_tokenizer(self.tokenizer)}, seed={self.seed})"


def _owned_long(values: Any) -> torch.Tensor:
    """``values`` as an int64 tensor that owns its memory (numpy views of Arrow buffers are copied)."""
    if isinstance(values, np.ndarray):
        return torch.from_numpy(np.array(values, dtype=np.int64))
    return values.to(torch.long)


def _document_positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each document's start in the concatenation, and each token's position within its document."""
    starts = np.cumsum(lengths) - lengths
    return starts, np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


def _cut(values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return values if keep is None else values[keep]


def create_packed_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> PackedCollator:
    """Build a :class:`PackedCollator` whose defaults come from ``task_spec``; explicit ``kwargs`` override them.

    The module picks it for ``batching='packed'``; it takes the text collator's padding options only to refuse
    them, since a packed batch has no padding.

    Example:
        >>> create_packed_collator(TaskSpec.lm_tiny()).task_type
        'causal_lm'
    """
    padding = sorted(set(kwargs) & {"pad_token_id", "pad_to_multiple_of", "padding", "pad_to_buckets", "padding_side"})
    if padding:
        raise ValueError(f"the packed collator adds no padding, but got {padding}; drop them (the sampler's "
                         f"max_tokens bounds each packed sequence)")
    return PackedCollator(task_spec=task_spec, **kwargs)
