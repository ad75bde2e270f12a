"""Loops compiled with numba as the engine compiles them: on first call, cached on disk, releasing the GIL.

The collators' padding loops (``collators._kernels``) and the engine's own (a mixture's block walks, a mixed
batch's span copy) are compiled this way. A loop that runs in loader workers has a numpy twin (:class:`Loop`):
a worker runs the twin unless it inherited the compiled loop from the process that forked it, so that no worker
imports numba (about 100 MiB of private memory each, and a second before its loops run).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch.utils.data import get_worker_info


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


class Loop:
    """A loop compiled at its first call outside loader workers (:func:`compiled`), and its numpy ``twin`` (the same
    values) that a loader worker runs unless the process that forked it had compiled the loop."""

    def __init__(self, function: Callable[..., Any], twin: Callable[..., Any]) -> None:
        self.function, self.twin = function, twin
        self.dispatcher: Any = None
        self.__doc__, self.__name__ = function.__doc__, function.__name__

    def __call__(self, *args: Any) -> Any:
        dispatcher = self.dispatcher
        if dispatcher is None:
            if get_worker_info() is not None:
                return self.twin(*args)
            dispatcher = self.load()
        return dispatcher(*args)

    def load(self) -> Any:
        """The compiled loop, compiled (or loaded from numba's disk cache) now unless it was."""
        if self.dispatcher is None:
            self.dispatcher = compiled(self.function)
        return self.dispatcher
