"""Batch to device, asynchronously where that is safe.

``non_blocking=True`` only overlaps the copy with compute when the source is in page-locked (pinned) host memory
and the target is a CUDA device; from pageable memory the copy is synchronous anyway, and a non-blocking copy
*to* the host can be read before it has landed. So the choice is made per tensor. Pinning is the loader's job
(``DataLoaderConfig.pin_memory``), never done here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def use_non_blocking(pinned: bool, device: torch.device, non_blocking: bool | None = None) -> bool:
    """Whether to copy with ``non_blocking=True``: only from pinned memory to CUDA, and never when asked not to.

    ``non_blocking=None`` (auto) and ``True`` both mean "when safe"; ``False`` always copies synchronously.
    """
    return non_blocking is not False and pinned and device.type == "cuda"


def move_to_device(batch: Any, device: torch.device | str, non_blocking: bool | None = None) -> Any:
    """Move every tensor in ``batch`` (nested dicts, lists, tuples, named tuples) to ``device``.

    Args:
        batch: A tensor or a nested structure of them; other leaves (strings, ints, None) are returned as is.
        device: Target device.
        non_blocking: None or True copy asynchronously where it is safe (pinned source, CUDA target); False never.

    Returns:
        The same structure (same container types) with tensors on ``device``. A tensor already there is
        returned as the same object; nothing is copied or pinned on the host.

    Example:
        >>> batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "ids": [torch.zeros(2)], "name": "x"}
        >>> moved = move_to_device(batch, "cpu")
        >>> moved["input_ids"] is batch["input_ids"], moved["name"]
        (True, 'x')
    """
    device = torch.device(device)
    return _move(batch, device, non_blocking)


def _move(value: Any, device: torch.device, non_blocking: bool | None) -> Any:
    if isinstance(value, torch.Tensor):
        pinned = value.device.type == "cpu" and device.type == "cuda" and value.is_pinned()
        return value.to(device, non_blocking=use_non_blocking(pinned, device, non_blocking))
    if isinstance(value, Mapping):
        moved = {key: _move(item, device, non_blocking) for key, item in value.items()}
        try:
            return type(value)(moved)
        except TypeError:  # a mapping type that cannot be built from a dict (e.g. frozen views)
            return moved
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple
        return type(value)(*(_move(item, device, non_blocking) for item in value))
    if isinstance(value, (list, tuple)):
        moved_items = [_move(item, device, non_blocking) for item in value]
        return moved_items if type(value) is list else type(value)(moved_items)
    return value
