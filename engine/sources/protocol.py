"""What a source offers the layers above it, written down: the :class:`Source` protocol (the state of every part
whose position a checkpoint holds meets :class:`engine.core.stateful.Stateful`).

The layers above ``sources/`` (sampling, loading, collation, the tools, the module) ask a source only for what
:class:`Source` names, never for its class: a source of any kind, built in or the user's own, is then wired the
same way and gets every guarantee (the same batches at any worker count and start method, exact and elastic resume,
every batching mode its fields allow, ``on_error``, transforms, the report). :class:`engine.sources.rows.MapSource`
gives every member a default; the built-in sources override what they know better. A user's class needs much less
(see :class:`UserSource` and ``docs/sources.md``): the engine wraps it in the base class, which calls its optional
``fingerprint()`` and ``lengths(key)``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

__all__ = ["EpochBlocks", "Source", "UserSource", "epoch_blocks_of"]


class EpochBlocks(NamedTuple):
    """A source's own epoch order hook: rows that should be read together (a shard's row group), and the window
    within which the sampler shuffles rows. The sampler orders the blocks by the seed and the epoch, so a batch's
    reads stay within a few blocks."""

    block_of_row: np.ndarray
    """The block of each of the source's rows (int32)."""
    shuffle_window: int
    """How many rows, in consecutive blocks, are shuffled together."""


@runtime_checkable
class UserSource(Protocol):
    """The least a user's own source needs to be valid data: a length and a batched read of rows by position.

    The engine wraps such an object in :class:`~engine.sources.rows.MapSource`'s subclass for map-style data, which
    gives it splits, ``on_error``, transforms and every other member of :class:`Source`. Two optional methods raise
    what the engine can promise:

    - ``fingerprint() -> str``: a digest of the content. A resume refuses a state saved on other content; without
      it, the engine hashes a few evenly spaced rows.
    - ``lengths(key) -> numpy int64 array | None``: each row's length of field ``key``, so grouped, token-budget and
      packed batching plan without reading rows (None: read the rows to measure them).
    """

    def __len__(self) -> int: ...

    def __getitems__(self, positions: Sequence[int]) -> Sequence[Any]: ...


@runtime_checkable
class Source(Protocol):
    """What the layers above ``sources/`` ask of a source. Every built-in source meets it through
    :class:`~engine.sources.rows.MapSource`, whose defaults are noted below."""

    role: str
    """The split this source serves (train, val, test, predict), named in errors."""
    on_error: str
    """What a failing row does: 'raise' names it; 'skip' and 'warn' leave it out of its batch and record it."""

    def __len__(self) -> int:
        """The number of rows."""
        ...

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        """The rows at ``indices`` as a ``RowBatch`` (or, once handing columns, a ``ColumnBatch``), after the
        split's transform, with the records of rows left out by ``on_error``."""
        ...

    def view(self, positions: np.ndarray) -> Source:
        """A source over ``positions`` of this one (a split), sharing the data."""
        ...

    def for_role(self, role: str, transform: Any) -> Source:
        """A copy serving split ``role`` with its own per-row ``transform``, sharing the data."""
        ...

    def fingerprint(self) -> str:
        """A digest of the content, different whenever rows change, move, appear or go: what resume checks.
        Default: a hash of evenly spaced rows."""
        ...

    def lengths(self, key: str | None) -> np.ndarray | None:
        """Each row's length of field ``key`` (int64), or None when knowing them means reading every row.
        Default: None."""
        ...

    def epoch_blocks(self) -> EpochBlocks | None:
        """The source's epoch order hook (shards: row groups and the shuffle window), or None for a full
        permutation. Default: None."""
        ...

    @property
    def reads_ahead(self) -> bool:
        """Whether batches should name the rows of coming batches (``indices.ahead``) so the source fetches them
        in the background. Default: False."""
        ...

    @property
    def fork_safe(self) -> bool:
        """Whether loader workers forked from a process that has read this source read it correctly. False where a
        client shares state across ``fork`` that a child cannot use (pyarrow's Azure client keeps its connections in
        one pool per process, which forked workers would share): its loaders start their workers with
        ``forkserver``. Default: True."""
        ...

    @property
    def shuffle_window(self) -> int | None:
        """The window :meth:`epoch_blocks` shuffles rows within, which a saved state records (another window is
        another order); None without an order of its own. Default: None."""
        ...

    def handing_columns(self) -> Source:
        """This source answering column batches where it can (asked when the collator reads columns).
        Default: itself (rows)."""
        ...

    def parts(self) -> Sequence[tuple[str | None, Source]]:
        """The named sources this one is made of (a mixture's), else ``[(None, self)]``."""
        ...

    def counters(self) -> tuple[Hashable, dict[str, Any]] | None:
        """What this source's reader did, for the report: ``(key, counts)``, where sources sharing one reader
        share the key; None for sources without a reader of their own. Default: None."""
        ...

    def labels(self, field: str) -> np.ndarray | None:
        """Integer class labels of ``field`` read without reading rows (an Arrow column), else None."""
        ...

    def class_names(self, field: str) -> list[str] | None:
        """The names of the classes of ``field`` (a ``datasets.ClassLabel``), else None."""
        ...

    @property
    def lengths_from(self) -> str:
        """How :meth:`lengths` reads them, as the report says it (e.g. "Arrow list offsets")."""
        ...


def epoch_blocks_of(data: Any) -> EpochBlocks | None:
    """:meth:`Source.epoch_blocks` of ``data`` when it is a source; None for data not yet adapted to one (a list of
    indices, a torch dataset), which has no order of its own."""
    return data.epoch_blocks() if isinstance(data, Source) else None
