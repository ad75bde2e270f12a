"""The one home of resume state: its keys, its version, the data fingerprint, the compatibility check, and
:class:`TrainPosition`, which holds a module's train loader or the loaded state waiting for it.

A state is only loaded into a module whose data, seed and splits match; otherwise a resumed run would
silently train on other rows, so loading raises and names what differs. Map-style data resume elastically: on
another number of ranks or workers, with the same global batch (:mod:`engine.sampling.elastic`).

"Resume state" in ``docs/architecture.md`` describes a whole checkpoint: these keys, the loader's state and the
sampler's (:class:`engine.sampling.position.PassState`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset

from engine.core.checks import check_saved_int
from engine.core.compat import iterator_finished, sampler_state_of, single_process_state
from engine.loading.settings import RESUMED
from engine.sampling.modes import BUDGET_MODES
from engine.sources.protocol import Source

STATE_VERSION = 5
"""Version of every state the engine writes (module, multi-module, multi-loader). 3: the batching options and
the sampler's epoch offset are saved. 4: the sampler's ranks, global batch and the parts of its epoch served on
other ranks are saved (elastic resume). 5: the data fingerprint is the source's own (every row of a tensor list,
a torch dataset's rows or its ``fingerprint()``)."""

VERSION, SEED, EPOCH = "version", "seed", "epoch"
DATA_FINGERPRINT, SPLIT_FINGERPRINT = "data_fingerprint", "split_fingerprint"
WORLD_SIZE, NUM_WORKERS = "world_size", "num_workers"
BATCH_SIZE, BATCHING, MAX_TOKENS = "batch_size", "batching", "max_tokens"
SHUFFLE_WINDOW = "shuffle_window"
"""Sharded train data's ``Shards(shuffle_window=...)`` (a mixture's: by source name); absent from states saved
before it was recorded, which are not held to it."""
TRAIN_LOADER = "train_loader"
"""The train loader's own (torchdata) state: the sampler's epoch and position, and per-worker state."""
SKIPPED_ROWS = "skipped_rows"
"""With on_error='skip' or 'warn': how many training rows were left out so far (an integer; not the records)."""
CHILDREN, MULTI = "children", "multi"
"""A module over several named datasets: each child's identity, and the multi-loader's state."""

IDENTITY_CHECKS = {
    SEED: RESUMED[SEED],
    DATA_FINGERPRINT: "the training data differ (rows changed, reordered, added or removed)",
    SPLIT_FINGERPRINT: "the train/val/test split differs (val_split, test_split or the data changed)",
    WORLD_SIZE: "a stream, or a schedule over several datasets, resumes each rank's own share, which cannot be "
                "dealt to another number of ranks",
    NUM_WORKERS: RESUMED[NUM_WORKERS],
    **RESUMED,  # the settings a resume checks, declared with their reasons: batch_size, shuffle, drop_last, ...
    SHUFFLE_WINDOW: "sharded data's epoch order shuffles rows within windows of this many rows, so another window "
                    "orders the epoch otherwise and the rest of the saved epoch would lose or repeat rows",
}
"""What a saved state must match to be loaded, and why each matters."""
TOPOLOGY = (WORLD_SIZE, NUM_WORKERS)
"""Identity fields an elastic resume (map-style data) may change; the per-rank batch then follows the ranks."""
LOADER_OPTIONS = tuple(name for name in RESUMED if name not in (SEED, *TOPOLOGY))
"""Identity fields that are the module's own options: the fix is to resume with the saved value."""


def data_fingerprint(source: Source) -> str:
    """A fingerprint of the data, different whenever the data are replaced, reordered, grown or shrunk: the row
    count and the source's own :meth:`~engine.sources.protocol.Source.fingerprint` (Hugging Face data: ``datasets``'
    fingerprint; shards: files, versions and row groups; tensor lists: every row; a dataset with a ``fingerprint()``:
    that; other datasets: a few evenly spaced rows, or their class alone when their rows are drawn at random)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(len(source).to_bytes(8, "little"))
    digest.update(source.fingerprint().encode())
    return digest.hexdigest()


def module_identity(*, seed: int, data_fingerprint: str | None, split_plan: Any, world_size: int, config: Any,
                    shuffle_window: int | dict[str, int] | None = None, **settings: Any) -> dict[str, Any]:
    """The identity part of a module's state: what a saved state must match to be loaded. Each setting a resume
    checks (:data:`~engine.loading.settings.RESUMED`) but the seed is read from ``settings`` (the module's own,
    resolved: ``uneven``, ``batching``, ``max_tokens``), else from ``config``, the train loader's
    :class:`~engine.loading.config.DataLoaderConfig`. ``shuffle_window``: sharded train data's (by source name for
    a mixture), None for other data."""
    checked = [name for name in RESUMED if name != SEED]
    unknown = sorted(set(settings) - set(checked))
    if unknown:
        raise TypeError(f"module_identity() got settings a resume does not check: {unknown}; those it checks are "
                        f"{sorted(checked)}")
    return {VERSION: STATE_VERSION, SEED: seed, DATA_FINGERPRINT: data_fingerprint,
            SPLIT_FINGERPRINT: split_plan.fingerprint if split_plan is not None else None, WORLD_SIZE: world_size,
            **{name: settings[name] if name in settings else getattr(config, name) for name in checked},
            SHUFFLE_WINDOW: shuffle_window}


def check_structure(state: Any, required: tuple[str, ...] = (VERSION, SEED, EPOCH, TRAIN_LOADER)) -> None:
    """Refuse what is not a saved state at all: not a mapping, keys missing, a loader part of the wrong type."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state_dict should be a dict from dm.state_dict() (or a checkpoint's data module "
                        f"entry), but got {type(state).__name__}: {state!r:.80}")
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"the checkpoint's data state is missing {missing} (it has {sorted(state)}); without them "
                         f"the run cannot resume where it stopped. Pass the whole dict from dm.state_dict()")
    loader_state = state.get(TRAIN_LOADER)
    if loader_state is not None and not isinstance(loader_state, Mapping):
        raise TypeError(f"the checkpoint's data state should hold the train loader's state dict (or None before "
                        f"any training) under {TRAIN_LOADER!r}, but got {type(loader_state).__name__}")
    epoch = state.get(EPOCH)
    if EPOCH in required and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise ValueError(f"the checkpoint's data state should have a non-negative integer epoch, but got "
                         f"epoch={epoch!r}")


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], *, elastic: bool = False) -> None:
    """Raise ValueError naming the first field of ``saved`` that differs from ``current``.

    ``elastic`` (map-style data): the number of ranks and workers may differ, and the per-rank batch (``batch_size``,
    or ``max_tokens`` for a token budget) is compared as the global batch, per-rank batch x ranks."""
    if saved.get(VERSION) != current[VERSION]:
        raise ValueError(
            f"the checkpoint's data state has version {saved.get(VERSION)!r}, but this engine writes version "
            f"{current[VERSION]}; it cannot be resumed exactly. Start a new run"
        )
    for key, why in IDENTITY_CHECKS.items():
        if elastic and key in TOPOLOGY:
            continue
        if key == BATCH_SIZE and current.get(BATCHING) in BUDGET_MODES and saved.get(BATCHING) == current.get(
                BATCHING):  # batches cut by tokens: batch_size cuts none of them
            continue
        if elastic and key in (BATCH_SIZE, MAX_TOKENS) and saved.get(WORLD_SIZE) != current.get(WORLD_SIZE):
            check_global_batch(saved, current, key)
            continue
        if key == DATA_FINGERPRINT and isinstance(saved.get(key), Mapping) and isinstance(current.get(key), Mapping):
            check_mixed_sources(saved[key], current[key])
            continue
        if key == SPLIT_FINGERPRINT and isinstance(saved.get(key), Mapping) and isinstance(current.get(key), Mapping):
            check_mixed_splits(saved[key], current[key])
            continue
        if key == SHUFFLE_WINDOW and key not in saved:  # saved before the window was recorded
            continue
        if saved.get(key) != current.get(key):
            fix = (f"Resume with {key}={saved.get(key)!r}" if key in LOADER_OPTIONS
                   else f"Resume with Shards(shuffle_window=...) as saved ({saved.get(key)!r})" if key == SHUFFLE_WINDOW
                   else "Resume with the same data, seed, splits and number of ranks")
            raise ValueError(
                f"the checkpoint's data state does not match this data module: {key} was {saved.get(key)!r} when "
                f"saved and is {current.get(key)!r} now ({why}). {fix}, or start a new run"
            )


def check_mixed_sources(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A mixture's sources, by name: one whose data changed since the state was saved is refused, naming it. Sources
    added or left out are a change of the mixture, which its sampler accepts or refuses (``Mixture.on_change``)."""
    changed = sorted(name for name in set(saved) & set(current) if saved[name] != current[name])
    if changed:
        raise ValueError(f"the checkpoint's data state does not match this data module: the data of the mixture's "
                         f"source{'s' if len(changed) > 1 else ''} {changed} changed since it was saved (rows "
                         f"changed, reordered, added or removed). Resume with the same data, or start a new run")


def check_mixed_splits(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A mixture's train/val/test splits, by source name: one cut otherwise since the state was saved is refused."""
    changed = sorted(name for name in set(saved) & set(current) if saved[name] != current[name])
    if changed:
        raise ValueError(f"the checkpoint's data state does not match this data module: the train/val/test split of "
                         f"the mixture's source{'s' if len(changed) > 1 else ''} {changed} differs from the one saved "
                         f"(val_split or test_split changed: each cuts every source on its own), so the train rows "
                         f"differ. Resume with the val_split and test_split of the saved run, or start a new run")


def check_global_batch(saved: Mapping[str, Any], current: Mapping[str, Any], key: str) -> None:
    """Elastic resume keeps the global batch: ``key`` (the per-rank batch) x ranks must be what it was when saved.
    ``batch_size`` is no batch of a token budget or of packing (their batches are cut by tokens), so with
    ``batching='token_budget'`` or ``'packed'`` only ``max_tokens`` counts, the global budget being
    ``max_tokens x world_size``; in the other modes only ``batch_size`` counts."""
    if (key == BATCH_SIZE) == (current.get(BATCHING) in BUDGET_MODES):
        return
    ranks, per_rank = current.get(WORLD_SIZE), current.get(key)
    saved_ranks = check_saved_int("the checkpoint's data state", WORLD_SIZE, saved.get(WORLD_SIZE), low=1)
    saved_per_rank = check_saved_int("the checkpoint's data state", key, saved.get(key), low=1)
    total = saved_per_rank * saved_ranks
    if per_rank * ranks == total:
        return
    fix = (f"Resume with {key}={total // ranks} ({total} / {ranks} ranks)" if total % ranks == 0 else
           f"{total} does not divide among {ranks} ranks: resume on a number of ranks that divides it")
    raise ValueError(
        f"the checkpoint's data state does not match this data module: the global batch ({key} x world_size) was "
        f"{total} ({saved_per_rank} x {saved_ranks}) when saved and is {per_rank * ranks} ({per_rank} x {ranks}) "
        f"now; an elastic resume keeps the global batch, so the rest of the epoch is cut into the same steps. "
        f"{fix}, or start a new run"
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
        if isinstance(self.loader.dataset, IterableDataset):  # a stream keeps its own epoch
            return self.loader.dataset.epoch
        delivered = getattr(self.loader, "delivered_epoch", None)  # a loader whose sampler runs ahead (threads)
        return delivered if delivered is not None else self.loader.batch_sampler.epoch

    def save(self, epoch_batches: int | None = None) -> dict[str, Any]:
        """``{epoch, train_loader}``: the loader's state, or the loaded one not yet applied.

        ``epoch_batches`` is the caller's count of batches per epoch where it stops its epochs before the loader's
        pass ends (Lightning's ``limit_train_batches``): a pass that served that many is a finished epoch, saved as
        the start of the next one, so a resumed run never serves the batches the limit left out."""
        loader_state = self.loader.data_state() if self.loader is not None else self._pending
        sampler_state = sampler_state_of(loader_state) if isinstance(loader_state, dict) else None
        if epoch_batches is not None and isinstance(sampler_state, dict) and not iterator_finished(loader_state) \
                and sampler_state.get("position", 0) >= epoch_batches:
            following = {**sampler_state, "epoch": sampler_state["epoch"] + 1, "position": 0}
            if "served" in following:
                following["served"] = []
            return {EPOCH: following["epoch"], TRAIN_LOADER: single_process_state(following, 0, True)}
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
        if isinstance(loader.dataset, IterableDataset):  # a stream's epoch is set here, in the parent
            loader.dataset.set_epoch(self._pending_epoch)
        loader.load_state_dict(pending)
        return loader
