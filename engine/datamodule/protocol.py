"""DataModuleProtocol: the two methods a training loop needs from a data module."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DataModuleProtocol(Protocol):
    """Anything with ``train_dataloader()`` and ``val_dataloader()``: a UniversalDataModule, a Lightning
    ``LightningDataModule``, or a plain class. ``isinstance`` checks work at run time.

    Example:
        >>> class Loaders:
        ...     def train_dataloader(self): return []
        ...     def val_dataloader(self): return []
        >>> isinstance(Loaders(), DataModuleProtocol)
        True
    """

    def train_dataloader(self) -> Any: ...

    def val_dataloader(self) -> Any: ...
