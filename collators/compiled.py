"""Loops compiled with numba as the engine compiles them: on first call, cached on disk, releasing the GIL.

The collators' padding loops (``collators._kernels``) and the engine's own (a mixture's block walks, a mixed
batch's span copy) are compiled this way. A loader worker that has to load the collators' loops itself (a spawned
one) does so after its first batch (:func:`hold_loading`), running them as Python until then.
"""

from __future__ import annotations

import os
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


_HELD: dict[int, Callable[[], None] | None] = {}
"""``{pid: start}``: a loader worker whose first batch is in progress (:func:`hold_loading`), and the loading to
start when it is done (given by :func:`after_first_batch`; None while the batch has asked for none)."""
_RELEASED: set[int] = set()
"""The loader workers whose first batch is done (:func:`release_loading`)."""


def hold_loading() -> None:
    """Called by a loader worker before each batch: until its first batch is done (:func:`release_loading`), the
    collators' loops are not loaded in it (:func:`collators._kernels.loaded`). Importing numba in a thread beside
    the first batch competes with it for the GIL and the import lock (a first batch of text took up to 0.6 s
    instead of 30 ms), and the first batch is what a training run waits for."""
    if os.getpid() not in _RELEASED:
        _HELD.setdefault(os.getpid(), None)


def release_loading() -> None:
    """Called by a loader worker after each batch: after its first, start the loading that batch asked for."""
    if os.getpid() in _HELD:
        start = _HELD.pop(os.getpid())
        _RELEASED.add(os.getpid())
        if start is not None:
            start()


def after_first_batch(start: Callable[[], None]) -> bool:
    """Whether this process is a loader worker whose first batch is in progress: ``start`` (a loading) is then
    called when the batch is done, instead of now."""
    if os.getpid() not in _HELD:
        return False
    _HELD[os.getpid()] = start
    return True
