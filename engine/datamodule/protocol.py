"""DataModuleProtocol: the two methods a training loop needs from a data module."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DataModuleProtocol(Protocol):
    """Anything with ``train_dataloader()`` and ``val_dataloader()``: a :class:`~engine.datamodule.module.DataModule`
    (no Lightning), a ``UniversalDataModule`` (a ``LightningDataModule``, which a ``Trainer`` requires), a
    ``MultiDataModule``, another ``LightningDataModule``, or a plain class. Code that only needs the loaders types
    against this protocol and so never needs Lightning. ``isinstance`` checks work at run time.

    Example:
        >>> class Loaders:
        ...     def train_dataloader(self): return []
        ...     def val_dataloader(self): return []
        >>> isinstance(Loaders(), DataModuleProtocol)
        True
    """

    def train_dataloader(self) -> Any: ...

    def val_dataloader(self) -> Any: ...
