"""A lock that a module holds across threads and that pickles as a new lock (a copy or a worker gets its own)."""

from __future__ import annotations

import threading
from typing import Any


class ModuleLock:
    """A re-entrant lock that pickles as a fresh, unlocked one: modules and loaders that hold it stay picklable
    (checkpoints, spawned workers) without a ``__getstate__`` of their own."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *error: Any) -> None:
        self._lock.__exit__(*error)

    def __reduce__(self) -> tuple[type[ModuleLock], tuple[()]]:
        return ModuleLock, ()
