"""The one home of resume state: its keys, its version, the data fingerprint, the compatibility check, and
:class:`TrainPosition`, which holds a module's train loader or the loaded state waiting for it.

A state is only loaded into a module whose data, seed and splits match; otherwise a resumed run would
silently train on other rows, so loading raises and names what differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.rng import hash_into
from engine.sources.adapt import HFSource, MapSource, TorchSource
from engine.sources.streams import EpochStream

STATE_VERSION = 2
"""Version of every state the engine writes (module, multi-module, multi-loader)."""
SAMPLED_ROWS = 16

VERSION, SEED, EPOCH = "version", "seed", "epoch"
DATA_FINGERPRINT, SPLIT_FINGERPRINT = "data_fingerprint", "split_fingerprint"
WORLD_SIZE, NUM_WORKERS = "world_size", "num_workers"
TRAIN_LOADER = "train_loader"
"""The train loader's own (torchdata) state: the sampler's epoch and position, and per-worker state."""
CHILDREN, MULTI = "children", "multi"
"""A module over several named datasets: each child's identity, and the multi-loader's state."""

IDENTITY_CHECKS = {
    SEED: "the seed decides the split, the order and every random choice",
    DATA_FINGERPRINT: "the training data differ (rows changed, reordered, added or removed)",
    SPLIT_FINGERPRINT: "the train/val/test split differs (val_split, test_split or the data changed)",
    WORLD_SIZE: "the number of ranks differs, so each rank would read other rows",
    NUM_WORKERS: "torchdata resumes a loader's position only with the same number of worker processes",
}
"""What a saved state must match to be loaded, and why each matters."""


def data_fingerprint(source: MapSource) -> str:
    """A fingerprint of the data, different whenever the data are replaced, reordered, grown or shrunk.

    Hugging Face data: ``datasets``' own fingerprint. Lists of tensors: a hash of evenly spaced rows. Other
    datasets: class, length and their ``fingerprint`` attribute if they define one. Their rows are not read,
    because ``__getitem__`` often augments at random and the same data must still resume.
    """
    digest = hashlib.blake2b(digest_size=12)
    count = len(source)
    digest.update(count.to_bytes(8, "little"))
    if isinstance(source, HFSource):
        digest.update(str(getattr(source.dataset, "_fingerprint", "")).encode())
    elif isinstance(source, TorchSource):
        dataset = source.dataset
        digest.update(f"{type(dataset).__module__}.{type(dataset).__qualname__}".encode())
        digest.update(repr(getattr(dataset, "fingerprint", "")).encode())
    else:
        positions = sorted({int(p) for p in np.linspace(0, count - 1, num=min(count, SAMPLED_ROWS))}) if count else []
        for position in positions:
            hash_into(digest, source[position])
    return digest.hexdigest()


def module_identity(*, seed: int, data_fingerprint: str | None, split_plan: Any, world_size: int,
                    num_workers: int) -> dict[str, Any]:
    """The identity part of a module's state: what a saved state must match to be loaded."""
    return {VERSION: STATE_VERSION, SEED: seed, DATA_FINGERPRINT: data_fingerprint,
            SPLIT_FINGERPRINT: split_plan.fingerprint if split_plan is not None else None,
            WORLD_SIZE: world_size, NUM_WORKERS: num_workers}


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first field of ``saved`` that differs from ``current``."""
    if saved.get(VERSION) != current[VERSION]:
        raise ValueError(
            f"the checkpoint's data state has version {saved.get(VERSION)!r}, but this engine writes version "
            f"{current[VERSION]}; it cannot be resumed exactly. Start a new run"
        )
    for key, why in IDENTITY_CHECKS.items():
        if saved.get(key) != current.get(key):
            raise ValueError(
                f"the checkpoint's data state does not match this data module: {key} was {saved.get(key)!r} when "
                f"saved and is {current.get(key)!r} now ({why}). Resume with the same data, seed, splits and "
                f"number of ranks, or start a new run"
            )


class TrainPosition:
    """Where a module's training stands: its train loader once built, or a loaded state waiting for it.

    torchdata applies a loaded state at the next ``iter()``, so the state is kept until the loader exists and
    is handed over in :meth:`attach`; a loader already handed out is retired on :meth:`load`, so iterators
    still running over it raise instead of yielding stale rows.
    """

    def __init__(self) -> None:
        self.loader: Any = None
        self._pending: dict[str, Any] | None = None
        self._pending_epoch = 0

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        if self.loader is None:
            return self._pending_epoch
        if isinstance(self.loader.dataset, EpochStream):
            return self.loader.dataset.epoch
        return self.loader.batch_sampler.epoch

    def save(self) -> dict[str, Any]:
        """``{epoch, train_loader}``: the loader's state, or the loaded one not yet applied."""
        loader_state = self.loader.state_dict() if self.loader is not None else self._pending
        return {EPOCH: self.epoch, TRAIN_LOADER: loader_state}

    def load(self, state: Mapping[str, Any], *, retired_because: str) -> None:
        """Keep ``state``'s position for the next loader; make iterators over the current one raise."""
        if self.loader is not None and hasattr(self.loader.batch_sampler, "retire"):
            self.loader.batch_sampler.retire(retired_because)
        self.loader = None
        self._pending = state.get(TRAIN_LOADER)
        self._pending_epoch = state.get(EPOCH, 0)

    def attach(self, loader: Any) -> Any:
        """Adopt a newly built train loader and hand it the loaded state, if any; returns the loader."""
        self.loader = loader
        pending, self._pending = self._pending, None
        if pending is None:
            return loader
        if isinstance(loader.dataset, EpochStream):  # a stream's epoch is set here, in the parent
            loader.dataset.set_epoch(self._pending_epoch)
        sampler_state = sampler_state_of(pending)
        if hasattr(loader.batch_sampler, "check_state") and sampler_state is not None:
            loader.batch_sampler.check_state(sampler_state)  # now, not at the first batch
        if pending.get(ITERATOR_FINISHED) and sampler_state is not None:
            # Saved after the pass ended: torchdata would build an iterator for the state, see it finished and
            # build another. With workers the first one has already drawn from the sampler, so the next epoch
            # would be skipped. The sampler's own state says all there is: the next epoch, from its start.
            loader.batch_sampler.load_state_dict(sampler_state)
        else:
            loader.load_state_dict(pending)
        return loader


ITERATOR_FINISHED = "_iterator_finished"
"""torchdata's flag: the state was saved after the loader's pass ended."""


def sampler_state_of(loader_state: Mapping[str, Any]) -> Any:
    """The batch sampler's state inside a torchdata loader state (single- or multi-process layout), if any."""
    snapshot = loader_state.get("_snapshot")
    if isinstance(snapshot, Mapping):
        loader_state = snapshot.get("_main_snapshot") or {}
    return loader_state.get("_index_sampler_state")
