"""Compiled copy (numba) of token spans into a batch's buffer: what a mixed batch's columns are gathered with.

A mixed batch's token rows come from several sources' buffers; the collator pads from one. Copying each row's
span with numpy takes a flat index as long as the batch's tokens (an ``arange``, a ``repeat``, a gather), whose
temporaries cost more than the copy itself; this loop copies each span straight to its place.
"""

from __future__ import annotations

import numpy as np

from collators.compiled import compiled


@compiled
def copy_spans(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray,
               at: np.ndarray) -> None:
    """``out[at[r]:at[r] + lengths[r]] = values[starts[r]:starts[r] + lengths[r]]`` for every row ``r``."""
    for r in range(len(starts)):
        out[at[r]:at[r] + lengths[r]] = values[starts[r]:starts[r] + lengths[r]]
