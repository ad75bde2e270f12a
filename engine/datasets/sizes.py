"""sizeof: the payload bytes of a value, as a byte-budgeted cache counts them."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["sizeof"]

_NUMBER_BYTES = 8
"""Bytes counted for a Python int, float or bool: its value, not the object around it."""


def sizeof(value: Any) -> int:
    """The payload bytes of ``value``: what a cache holding it should count against its budget.

    Tensors and numpy arrays count ``nbytes`` (their own elements: a view that keeps a larger storage alive is
    counted by its elements only, so cache compact copies); strings count ``len(value.encode())``; bytes their
    length; numbers 8; dicts, lists and tuples the sum of their values (keys and object overhead are not
    counted). Anything else counts ``sys.getsizeof``.

    Example:
        >>> sizeof({"x": torch.zeros(4, dtype=torch.float32), "text": "héllo"})
        22
    """
    kind = type(value)
    if kind is str:  # the common types first, by exact type: this runs once per cached row
        return len(value) if value.isascii() else len(value.encode())  # isascii() is O(1) in CPython
    if kind is dict:
        total = 0
        for item in value.values():  # a string value (a text row) without a call of its own
            total += len(item) if type(item) is str and item.isascii() else sizeof(item)
        return total
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if value is None:
        return 0
    if isinstance(value, (bool, int, float, np.generic)):
        return _NUMBER_BYTES
    if isinstance(value, (Mapping, list, tuple)):
        return sum([sizeof(item) for item in (value.values() if isinstance(value, Mapping) else value)])
    return sys.getsizeof(value)
