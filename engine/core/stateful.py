"""The :class:`Stateful` protocol: what every part whose position a checkpoint holds offers, under torch's names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful"]


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


class SavedAsOneLeaf:
    """Mixin of the data modules and loaders: :meth:`data_state` is the readable nested state, and ``state_dict()``
    / ``load_state_dict()`` (the names Lightning, ``torch.save`` and DCP call) carry it. A subclass defines
    :meth:`data_state` and :meth:`load_data_state`."""

    def data_state(self) -> dict[str, Any]:
        """The readable state: plain values in nested dicts, what :meth:`load_data_state` restores exactly."""
        raise NotImplementedError

    def load_data_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`data_state`, refusing one that does not fit."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return self.data_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.load_data_state(state_dict)
