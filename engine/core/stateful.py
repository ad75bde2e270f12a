"""The :class:`Stateful` protocol: what every part whose position a checkpoint holds offers, under torch's names."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["SHARED_LEAF", "SavedAsOneLeaf", "Stateful", "rank_leaf", "readable_state"]


@runtime_checkable
class Stateful(Protocol):
    """A part whose position a checkpoint holds: the loader, the batch samplers, the mixture's order, the skip
    report and the shard reader. The names are torch's (``torch.distributed.checkpoint.stateful.Stateful``,
    torchdata's ``Stateful``), so Lightning and DCP take each part as it is."""

    def state_dict(self) -> dict[str, Any]:
        """A picklable value from which :meth:`load_state_dict` restores this part's position exactly."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the position saved by :meth:`state_dict`, refusing a state that does not fit this part."""
        ...


SHARED_LEAF = "state"
"""The leaf of a state every rank shares (map-style data: the position is the global step's), which DCP writes
once for all ranks."""


def rank_leaf(rank: int) -> str:
    """The leaf of rank ``rank``'s own state (a stream: each rank reads its own share)."""
    return f"rank{rank}"


def is_leaf_key(key: Any) -> bool:
    """Whether ``key`` names a one-leaf state's leaf (:data:`SHARED_LEAF` or ``rank<r>``)."""
    return key == SHARED_LEAF or (isinstance(key, str) and key.startswith("rank") and key[4:].isdigit())


def encode_state(state: Mapping[str, Any]) -> bytes:
    """``state`` as ``torch.save`` writes it: one value DCP saves whole, whatever keys the state has."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def readable_state(state_dict: Any, leaf: str) -> Any:
    """The readable state in ``state_dict``: decoded from its leaf ``leaf`` (plain values only,
    ``torch.load(weights_only=True)``) when it is a one-leaf state, else ``state_dict`` itself (a ``data_state()``,
    checked by whoever loads it)."""
    if not isinstance(state_dict, Mapping) or not state_dict or not all(map(is_leaf_key, state_dict)):
        return state_dict
    if leaf not in state_dict:
        found = sorted(state_dict)
        if leaf == SHARED_LEAF:
            raise ValueError(f"the saved state holds each rank's own state ({found}), but this one is the same on "
                             f"every rank (map-style data) and is saved under {SHARED_LEAF!r}; load a state saved "
                             f"by this kind of module or loader")
        raise ValueError(f"the saved state holds {found}, but this rank reads {leaf!r}: each rank of a stream resumes "
                         f"its own share, which another rank's state cannot give. Save every rank's state (dcp.save "
                         f"writes each rank's leaf) and resume on the same number of ranks")
    blob = state_dict[leaf]
    if not isinstance(blob, (bytes, bytearray)):
        raise TypeError(f"the saved state's {leaf!r} should be the bytes state_dict() wrote, but got "
                        f"{type(blob).__name__}")
    return torch.load(io.BytesIO(blob), weights_only=True)


class SavedAsOneLeaf:
    """Mixin of the data modules and loaders: their state as one leaf.

    :meth:`data_state` is the readable nested state. ``state_dict()`` (what Lightning, ``torch.save`` and
    ``torch.distributed.checkpoint`` call) is ``{leaf: bytes}``, that state as ``torch.save`` writes it: DCP plans a
    load from the keys of the fresh object's ``state_dict()``, and a data state's keys depend on how far it ran, so
    only a leaf that exists before the first batch loads into a fresh module. ``load_state_dict()`` takes that form
    or a :meth:`data_state`. A subclass defines :meth:`data_state` and :meth:`load_data_state`, and
    :meth:`state_leaf` where its state is its rank's own.
    """

    def data_state(self) -> dict[str, Any]:
        """The readable state: plain values in nested dicts, what :meth:`load_data_state` restores exactly."""
        raise NotImplementedError

    def load_data_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`data_state`, refusing one that does not fit."""
        raise NotImplementedError

    def state_leaf(self) -> str:
        """The key of this object's leaf: :data:`SHARED_LEAF`, the same on every rank, unless overridden."""
        return SHARED_LEAF

    def state_dict(self) -> dict[str, bytes]:
        """``{leaf: bytes}``: :meth:`data_state` as one value (about 2 KB; read it with
        :meth:`data_state`)."""
        state = self.data_state()
        return {self.state_leaf(): encode_state(state)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``: a :meth:`state_dict` (of any rank that shares this leaf) or a
        :meth:`data_state`."""
        self.load_data_state(readable_state(state_dict, self.state_leaf()))
