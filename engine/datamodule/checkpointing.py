"""What a data module puts into a checkpoint and takes back: its identity, its training position and its
configuration. The state's schema, its version and its checks live in :mod:`engine.loading.state`; this is the
module's side of the ``state_dict`` / ``load_state_dict`` protocol (torch's, Lightning's and DCP's names) and of
``load_from_checkpoint``. Nothing here imports Lightning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset

from engine.core.stateful import SavedAsOneLeaf
from engine.datamodule import options
from engine.loading.settings import RESUMED
from engine.loading.state import SKIPPED_ROWS, check_compatible, check_structure, module_identity
from engine.sources.streams import check_resumable


def read_configuration(checkpoint_path: Any, map_location: Any = None) -> dict[str, Any]:
    """The data module's configuration stored in a Lightning checkpoint (``datamodule_hyper_parameters``)."""
    checkpoint = torch.load(checkpoint_path, map_location=map_location or "cpu", weights_only=True)
    return checkpoint["datamodule_hyper_parameters"]


def shuffle_windows(source: Any) -> int | dict[str, int] | None:
    """The ``shuffle_window`` of sharded train data (its epoch order's), by name for a mixture's sharded sources;
    None for other data, whose order has no window."""
    if source is None or isinstance(source, IterableDataset):  # a stream: no parts, and no window
        return None
    windows = {name: part.shuffle_window for name, part in source.parts() if part.shuffle_window is not None}
    return windows[None] if list(windows) == [None] else windows or None


class CheckpointedModule(SavedAsOneLeaf):
    """Mixin of :class:`engine.datamodule.module.DataModule`: saving and resuming its training position, and
    rebuilding it from its configuration."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, **data: Any) -> Any:
        """A module configured as the one in a Lightning checkpoint; pass the data (and tokenizer) again, e.g.
        ``UniversalDataModule.load_from_checkpoint(path, train_data=rows, tokenizer=tok)``."""
        return cls.from_configuration(read_configuration(checkpoint_path, map_location), where=checkpoint_path, **data)

    @classmethod
    def from_configuration(cls, configuration: dict[str, Any], *, where: Any = None, **data: Any) -> Any:
        """A module built with the arguments recorded in ``configuration`` (a module's ``dm.configuration``, or a
        checkpoint's ``datamodule_hyper_parameters``); pass the data (and tokenizer) again, e.g.
        ``DataModule.from_configuration(saved, train_data=rows)``. ``where``: the checkpoint read, if any."""
        arguments = options.restore_configuration(configuration, data)
        if arguments.pop("multi_config", None) is not None:  # a module over several named datasets
            held = "configuration" if where is None else f"checkpoint at {where}"
            raise ValueError(f"the {held} holds a module over several named datasets; load it with "
                             f"MultiDataModule.load_from_checkpoint(...)")
        return cls(**arguments)

    def identity(self) -> dict[str, Any]:
        """What a saved state must match to be loaded here: version, seed, fingerprints, ranks and workers."""
        self.setup()
        config = self.train_config  # the resumed settings it lacks are the module's attributes, resolved
        own = {name: getattr(self, name) for name in RESUMED if not hasattr(config, name)}
        return module_identity(seed=self.seed, data_fingerprint=self._fingerprint, split_plan=self.split_plan,
                               world_size=self.world_size, config=config,
                               shuffle_window=shuffle_windows(self.datasets.get("train")), **own)

    def data_state(self) -> dict[str, Any]:
        """The identity (seed, fingerprints, options) and the train loader's position; microseconds to save."""
        skipped = {} if self.skipped.on_error == "raise" else {SKIPPED_ROWS: self.skipped.state_dict()["train"]}
        return {**self.identity(), **self._position.save(epoch_batches=self._epoch_batches()), **skipped}

    def _epoch_batches(self) -> int | None:
        """The batches per epoch where the training loop ends its epochs before the train loader's pass ends (a
        Lightning trainer's ``limit_train_batches``); None for a loop that runs each pass to its end."""
        return None

    def load_data_state(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``: the next training batch is the one after the last saved one.

        Refuses a malformed state, or one from other data, seed, splits or batching options; map-style data may
        resume on another number of ranks or workers (elastic, with the same global batch). A train loader already
        handed out is replaced; iterators still running over it raise rather than yield stale rows."""
        check_structure(state_dict)
        with self._lock:  # not between another thread's setup and its first train loader
            # not state_dict(): that would query the loader too. Map-style data resume on other ranks and workers.
            check_compatible(state_dict, self.identity(), elastic=self._stream is None)
            if self._stream is not None and state_dict.get("train_loader"):
                check_resumable(self._stream)
            if SKIPPED_ROWS in state_dict:
                self.skipped.load_state_dict({"train": state_dict[SKIPPED_ROWS]})
            self._position.load(state_dict, retired_because=(
                f"{type(self).__name__}.load_state_dict() replaced this train loader; call dm.train_dataloader() "
                f"again and iterate the new loader to continue from the loaded state"))
            if "train" in self.datasets:
                self.train_dataloader()  # hands the loader its state now, so a bad position is refused here
