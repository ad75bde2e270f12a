"""The data module's checkpoint methods, kept apart from the wiring: what is saved, checked and restored."""

from __future__ import annotations

from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from engine.state import STATE_VERSION, check_compatible
from engine.streams import EpochStream, check_resumable


class ResumableState:
    """``state_dict``/``load_state_dict`` for UniversalDataModule (Lightning calls them with checkpoints)."""

    def state_dict(self) -> dict[str, Any]:
        """Seed, fingerprints of the data and split, and the train loader's position (torchdata state).

        Saving costs microseconds at ``num_workers=0``: the fingerprints are computed once at setup.
        """
        identity = self.identity()
        loader = self._train_loader
        return {
            **identity,
            "epoch": self._epoch_of(loader),
            "train_loader": loader.state_dict() if loader is not None else self._pending_loader_state,
        }

    def identity(self) -> dict[str, Any]:
        """What a saved state must match to be loaded here: version, seed, fingerprints, ranks and workers."""
        self.setup()
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "data_fingerprint": self._fingerprint,
            "split_fingerprint": self.split_plan.fingerprint if self.split_plan else None,
            "world_size": self.world_size,
            "num_workers": self.train_config.num_workers,
        }

    @staticmethod
    def _epoch_of(loader: StatefulDataLoader | None) -> int:
        if loader is None:
            return 0
        return loader.dataset.epoch if isinstance(loader.dataset, EpochStream) else loader.batch_sampler.epoch

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict``: the next training batch is the one after the last saved one.

        Raises if the state was saved from other data, seed, splits or number of ranks. A train loader
        already handed out is replaced; iterators still running over it raise rather than yield stale rows.
        """
        check_compatible(state_dict, self.identity())  # not state_dict(): that would query the loader too
        if self._stream is not None and state_dict.get("train_loader"):
            check_resumable(self._stream)
        if self._train_loader is not None and hasattr(self._train_loader.batch_sampler, "retire"):
            self._train_loader.batch_sampler.retire(
                "UniversalDataModule.load_state_dict() replaced this train loader; call dm.train_dataloader() "
                "again and iterate the new loader to continue from the loaded state"
            )
        self._train_loader = None
        self._pending_loader_state = state_dict.get("train_loader")
        self._pending_epoch = state_dict.get("epoch", 0)
