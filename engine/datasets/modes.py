"""How a file-backed dataset reads its rows: from the file on each access, all at once, cached, or as a stream."""

from __future__ import annotations

from enum import Enum

__all__ = ["LoadingMode", "resolve_mode"]


class LoadingMode(Enum):
    """The loading modes of :mod:`engine.datasets`; every map-style mode gives the same rows.

    - ``LAZY``: read each row from the file when it is asked for. Least memory, nothing done up front.
    - ``EAGER``: read every row into memory (one flat buffer per field) at construction.
    - ``CACHED``: as ``LAZY``, plus a :class:`~engine.datasets.cache.ByteBudgetLRU` of recently read rows
      under a byte budget (one cache per process: each worker holds its own).
    - ``STREAMING``: an ``IterableDataset`` that reads the file sequentially, in file order, in blocks of rows
      shared out among workers (and ranks) so that every row is read exactly once; no random access order.
    """

    LAZY = "lazy"
    EAGER = "eager"
    CACHED = "cached"
    STREAMING = "streaming"


def resolve_mode(mode: LoadingMode | str) -> LoadingMode:
    """``mode`` as a :class:`LoadingMode`; strings such as ``'lazy'`` or ``'EAGER'`` are accepted.

    Raises:
        ValueError: If ``mode`` names no loading mode.
    """
    if isinstance(mode, LoadingMode):
        return mode
    if isinstance(mode, str):
        for member in LoadingMode:
            if mode.lower() in (member.value, member.name.lower()):
                return member
    names = ", ".join(f"LoadingMode.{member.name}" for member in LoadingMode)
    raise ValueError(f"mode should be one of {names} (or its name as a string), but got mode={mode!r}")
