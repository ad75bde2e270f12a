"""Loops compiled with numba as the engine compiles them: on first call, cached on disk, releasing the GIL.

The collators' padding loops (``collators._kernels``) and the engine's own (a mixture's block walks, a mixed
batch's span copy) are compiled this way.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def compiled(function: Callable[..., Any]) -> Any:
    """``numba.njit(nogil=True, cache=True)(function)``. Where numba finds no writable place for its disk cache
    (neither beside this module nor in the user's cache folder, as in a read-only container) it says so, and the
    loops are compiled in every process instead (about 1 s at the first batch). numba is imported here, at the
    first loop compiled, so that importing a module of loops costs nothing until they run."""
    import numba

    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError as error:
        if "no locator available" not in str(error):
            raise
        warnings.warn(f"{error}: these loops will be compiled in every process (about 1 s at its first batch); "
                      f"set NUMBA_CACHE_DIR to a writable folder to compile them once", stacklevel=2)
        return numba.njit(nogil=True)(function)
