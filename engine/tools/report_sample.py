"""The sample batch of ``dm.report()``: token ids decoded back to text, images as a grid, other keys as shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.tools.summary import describe_value

LINE_CHARS = 160
"""A decoded row longer than this is cut, with '...' at the end."""


def sample_lines(batch: Any, tokenizer: Any, rows: int, *, seq2seq: bool = False, image_key: str = "pixel_values",
                 label_key: str = "labels", class_names: Sequence[str] | None = None
                 ) -> tuple[list[str], str | None]:
    """``(lines, image grid HTML or None)`` showing the first ``rows`` rows of ``batch``; with ``seq2seq``, each
    source row is followed by its target (the labels, without the ignored -100 positions). Images are read under
    ``image_key`` and class labels under ``label_key`` (the spec's fields), shown by ``class_names`` where given."""
    if not isinstance(batch, dict):
        items = batch if isinstance(batch, (list, tuple)) else [] if batch is None else [batch]
        return ([f"{type(batch).__name__} of " + ", ".join(describe_value(item) for item in items)] if items
                else []), None
    lines = [", ".join(f"{key} {describe_value(value)}" for key, value in batch.items())]
    labels = batch.get(label_key)
    class_labels = labels.tolist() if isinstance(labels, torch.Tensor) and labels.dim() == 1 else None
    targets = labels if seq2seq and isinstance(labels, torch.Tensor) and labels.dim() == 2 else None
    if class_labels is not None and class_names is not None:
        from engine.tools.figures import class_name

        class_labels = [class_name(label, class_names) if isinstance(label, int) else label
                        for label in class_labels]
    pixels = batch.get(image_key)
    if isinstance(pixels, torch.Tensor) and pixels.dim() == 4:
        from engine.tools.figures import image_grid

        count = min(len(pixels), 2 * rows)
        return lines, image_grid(pixels[:count], class_labels[:count] if class_labels else None)
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        mask = batch.get("attention_mask")
        for index in range(min(rows, len(ids))):
            row = ids[index][mask[index].bool()] if isinstance(mask, torch.Tensor) else ids[index]
            label = f"label={class_labels[index]}: " if class_labels else ""
            line = f"{label}{_decode(tokenizer, row)}"
            if targets is not None:
                line += f" => {_decode(tokenizer, targets[index][targets[index] >= 0])}"
            lines.append(line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "...")
    elif class_labels is not None:
        lines.append(f"labels {class_labels}")
    return lines, None


def _decode(tokenizer: Any, ids: torch.Tensor) -> str:
    return tokenizer.decode(ids.tolist()) if tokenizer is not None else str(ids.tolist())
