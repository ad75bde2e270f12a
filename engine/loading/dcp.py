"""The data state in ``torch.distributed.checkpoint`` (DCP): :class:`DCPState`, one bytes leaf per state.

DCP flattens a state into leaves and plans a load from the keys of the fresh object's ``state_dict()``. A data
state's keys depend on how far it has run (a loader that has not run has no position yet, its workers and
sampler add keys once it has), so a fresh module would ask for keys the checkpoint lacks, or leave saved ones
unread. :class:`DCPState` hands DCP the whole state as one leaf, the state's ``torch.save`` bytes, under a key
that exists before the first batch; on load it reads them back with ``torch.load(weights_only=True)`` (plain values
only) and gives them to the module's own ``load_state_dict``, which validates them as for any checkpoint.
The module's ``state_dict()`` itself stays the readable nested dict that Lightning and ``torch.save`` hold.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from engine.core.stateful import Stateful

SHARED_KEY = "state"
"""The leaf of a state that every rank shares (map-style data: the position is the global step's), written once."""


def rank_key(rank: int) -> str:
    """The leaf of rank ``rank``'s own state (a stream: each rank reads its own share)."""
    return f"rank{rank}"


def is_per_rank(stateful: Any) -> bool:
    """Whether ``stateful``'s state is its rank's own: what it declares (``per_rank_state``: a data module over a
    stream), else a loader over an ``IterableDataset``, and anything that is not a loader. A loader over map-style
    data has the same state on every rank: its position is the global step's."""
    declared = getattr(stateful, "per_rank_state", None)
    if declared is not None:
        return bool(declared)
    dataset = getattr(stateful, "dataset", None)
    return dataset is None or isinstance(dataset, IterableDataset)


class DCPState:
    """A data module's (or a loader's) state as ``torch.distributed.checkpoint`` saves and loads it.

    Map-style data: one leaf, ``"state"``, the same on every rank, which DCP writes once for all of them; it loads
    on any number of ranks that keeps the global batch (an elastic resume, as the module's own state). A stream:
    one leaf per rank, ``"rank<r>"``, each rank's own share, loaded on the same number of ranks.

    Args:
        stateful: A :class:`~engine.datamodule.module.DataModule`, ``UniversalDataModule``, ``MultiDataModule``,
            or a loader from :class:`~engine.loading.factory.DataLoaderFactory`: anything with ``state_dict()`` and
            ``load_state_dict()``.

    Example:
        >>> import torch
        >>> import torch.distributed.checkpoint as dcp
        >>> from engine import DataModule
        >>> rows = [torch.arange(n) for n in range(1, 41)]
        >>> dm = DataModule(rows, batch_size=4)
        >>> batches = iter(dm.train_dataloader()); _ = next(batches)
        >>> sorted(DCPState(dm).state_dict())
        ['state']
    """

    def __init__(self, stateful: Any) -> None:
        if not isinstance(stateful, Stateful):
            raise TypeError(f"stateful should have state_dict() and load_state_dict() (a data module or a loader), "
                            f"but got {type(stateful).__name__}")
        self.stateful = stateful

    def _key(self) -> str:
        if not is_per_rank(self.stateful):
            return SHARED_KEY
        return rank_key(dist.get_rank() if dist.is_available() and dist.is_initialized() else 0)

    def state_dict(self) -> dict[str, bytes]:
        """``{key: bytes}``: the wrapped object's ``state_dict()`` as ``torch.save`` writes it."""
        buffer = io.BytesIO()
        torch.save(self.stateful.state_dict(), buffer)
        return {self._key(): buffer.getvalue()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Read the leaf back (plain values only) and load it into the wrapped object, which validates it."""
        key = self._key()
        if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get(key), bytes):
            found = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
            raise ValueError(f"state_dict should hold the saved data state as bytes under {key!r} (from "
                             f"DCPState(...).state_dict()), but got {found}; save with dcp.save({{..: DCPState(dm)}})")
        self.stateful.load_state_dict(torch.load(io.BytesIO(state_dict[key]), weights_only=True))
