"""Packed vision-language batches: whole rows, image tokens counted, one ``[1, T]`` sequence with the boundaries of
text packing (:class:`collators.packed.PackedCollator`): ``position_ids`` restarting at each row, ``cu_seq_lens_q``
and ``cu_seq_lens_k``, ``max_length_q`` and ``max_length_k``; the pack's images in row order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from collators._extra import add_extra_keys
from collators.multimodal import CONSUMED, VisionLanguageCollator, create_multimodal_collator
from task_spec import TaskSpec

__all__ = ["PackedVisionLanguageCollator", "create_packed_vision_language_collator"]


class PackedVisionLanguageCollator:
    """Concatenate rows of text with images into one sequence, each row expanded and labelled as
    :class:`collators.multimodal.VisionLanguageCollator` does alone, and its first position labelled -100 (as text
    packing does: no row learns its first token from the previous row's last).

    The batch: ``input_ids``, ``labels``, ``position_ids`` ``[1, T]``; ``cu_seq_lens_q``, ``cu_seq_lens_k`` int32
    ``[n + 1]``; ``max_length_q``, ``max_length_k`` ints; ``pixel_values`` ``[N, 3, H, W]`` (or the encoded images
    with ``decode_device``), ``images_per_row`` ``[n]`` and, when sizes vary, ``image_sizes`` ``[N, 2]``.

    Args:
        rows: The collator that expands and labels each row and makes the images.

    Example:
        >>> from collators._vlm_images import ImagePipeline
        >>> rows = VisionLanguageCollator(images=ImagePipeline(image_size=4, image_tokens=2), image_token_id=9,
        ...                               pad_token_id=0)
        >>> image = torch.zeros(3, 4, 4, dtype=torch.uint8)
        >>> batch = PackedVisionLanguageCollator(rows)([{"input_ids": [9, 5], "image": image},
        ...                                              {"input_ids": [6, 7]}])
        >>> batch["input_ids"].tolist(), batch["labels"].tolist(), batch["position_ids"].tolist()
        ([[9, 9, 5, 6, 7]], [[-100, -100, 5, -100, 7]], [[0, 1, 2, 0, 1]])
    """

    def __init__(self, rows: VisionLanguageCollator) -> None:
        if not isinstance(rows, VisionLanguageCollator):
            raise TypeError(f"rows should be a VisionLanguageCollator, but got {type(rows).__name__}")
        self.rows = rows

    @property
    def max_length(self) -> int | None:
        """The longest row (the packer plans with it)."""
        return self.rows.max_length

    @property
    def decode_device(self) -> str | None:
        """Where the images are decoded after collation (None: in the workers)."""
        return self.rows.decode_device

    @property
    def images(self) -> Any:
        """The image step (for :class:`engine.tools.device.DeviceDecode`)."""
        return self.rows.images

    @property
    def image_field(self) -> str:
        """Key of the pixels in the batch."""
        return self.rows.image_field

    def row_length(self, row: Any) -> int:
        """A row's token count with its image tokens (what the packer plans by)."""
        return self.rows.row_length(row)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Pack ``rows``; ``generator`` draws the random flips (when ``flip_probability`` > 0)."""
        if len(rows) == 0:
            raise ValueError("PackedVisionLanguageCollator got an empty list of rows; a pack needs at least one row")
        ids, labels, images, where, sizes, counts = self.rows.expand_rows(rows)
        lengths = [len(row) for row in ids]
        for row_labels in labels:
            if row_labels:
                row_labels[0] = self.rows.label_pad_token_id
        bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        batch = {
            self.rows.input_field: torch.tensor([token for row in ids for token in row], dtype=torch.int64)[None],
            "labels": torch.tensor([label for row in labels for label in row], dtype=torch.int64)[None],
            "position_ids": torch.cat([torch.arange(length, dtype=torch.int64) for length in lengths])[None],
            "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds.clone(),
            "max_length_q": max(lengths), "max_length_k": max(lengths),
            **self.rows.image_batch(images, where, sizes, generator),
            "images_per_row": torch.tensor(counts, dtype=torch.int64),
        }
        return add_extra_keys(batch, rows, CONSUMED | {self.rows.input_field, self.rows.text_field})

    def __repr__(self) -> str:
        return f"PackedVisionLanguageCollator({self.rows!r})"


def create_packed_vision_language_collator(task_spec: TaskSpec | None = None,
                                           **kwargs: Any) -> PackedVisionLanguageCollator:
    """Factory for the registry: the rows' collator of :func:`collators.multimodal.create_multimodal_collator`
    (causal LM), packed."""
    if task_spec is not None and task_spec.task_type != "causal_lm":
        raise ValueError(f"packing vision-language rows needs task_type='causal_lm', but got task_type="
                         f"{task_spec.task_type!r}; use batching='plain' for image-text pairs")
    return PackedVisionLanguageCollator(create_multimodal_collator(task_spec, task_type="causal_lm", **kwargs))
