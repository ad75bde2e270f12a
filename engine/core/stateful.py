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
