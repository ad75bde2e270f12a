"""What numpy views of a pyarrow list column's buffers can cover: which columns qualify, one view over chunks
that share a memory mapping, and a column that holds a single value.

Helpers of :mod:`engine.sources._arrow_fetch`; nothing here copies a column's values.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def list_of_ints(column: Any) -> bool:
    """Whether a pyarrow column holds lists of plain integers/bools with no nulls at either level."""
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return False
    if not (pa.types.is_integer(kind.value_type) or pa.types.is_boolean(kind.value_type)):
        return False
    return all(chunk.null_count == 0 and chunk.values.null_count == 0 for chunk in column.chunks)


COMBINE_LIMIT = 512 * 2**20
"""Bytes of token values a process copies into one buffer when a column's chunks do not share one (in memory)."""


UNIFORM_SCAN_LIMIT = 64 * 2**20
"""Bytes of one-byte values (masks, token types) a process scans once to find a column that holds one value."""


def uniform_value(values: list[np.ndarray]) -> Any:
    """The one value every element of ``values`` holds, or None. Only one-byte columns (attention masks and
    token types, which ``datasets`` stores as int8) up to :data:`UNIFORM_SCAN_LIMIT` are scanned, once."""
    if not values or values[0].dtype.itemsize != 1 or sum(array.nbytes for array in values) > UNIFORM_SCAN_LIMIT:
        return None
    ends = {end for array in values if len(array) for end in (np.minimum.reduce(array), np.maximum.reduce(array))}
    return ends.pop() if len(ends) == 1 else None


def _data_address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _root(buffer: Any) -> Any:
    while buffer.parent is not None:
        buffer = buffer.parent
    return buffer


def shared_view(arrays: list[np.ndarray], buffers: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """One numpy view over the buffer that holds all ``arrays`` (chunks of a memory-mapped Arrow file share its
    mapping) and each array's first element in it; None when they do not share one, are misaligned in it, or an
    array is a copy (bit-packed bools)."""
    roots = {(_root(buffer).address, _root(buffer).size) for buffer in buffers}
    if len(roots) != 1 or len({array.dtype for array in arrays}) != 1:
        return None
    root = _root(buffers[0])
    itemsize = arrays[0].dtype.itemsize
    gaps = [_data_address(array) - root.address for array in arrays]
    if any(gap < 0 or gap % itemsize or gap + array.nbytes > root.size for gap, array in zip(gaps, arrays)):
        return None
    whole = np.frombuffer(root, dtype=arrays[0].dtype, count=root.size // itemsize)
    return whole, np.asarray(gaps, dtype=np.int64) // itemsize
