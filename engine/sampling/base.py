"""The base of every batch sampler: epoch bookkeeping, resume position and per-batch seeds.

The order of an epoch is a pure function of (seed, epoch): iterating again gives the next epoch's order,
``set_epoch`` pins one, and ``state_dict`` is three integers, so saving it every step costs nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from engine._checks import check_int
from engine.epochs import set_epoch as set_loader_epoch
from engine.rng import batch_seed


class BatchIndices(list):
    """A batch of sample indices that carries the seed of its randomness, and the epoch it belongs to (which
    seeds per-row transforms, :mod:`engine.sources.transforms`), to wherever the batch is built."""

    rng_seed: int | None = None
    epoch: int | None = None


class EpochHandle:
    """What Lightning reads as ``batch_sampler.sampler``: it calls ``set_epoch`` there at every epoch start.
    This forwards it to the batch sampler that owns the order and, once :meth:`attach` gave it the loader, to
    every dataset on the loader's path that defines ``set_epoch`` (curriculum datasets)."""

    def __init__(self, owner: EpochBatchSampler) -> None:
        self.owner = owner
        self._loader: weakref.ref[Any] | None = None

    def attach(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader() if self._loader is not None else None
        if loader is None:
            self.owner.set_epoch(epoch)
        else:
            set_loader_epoch(loader, epoch)  # reaches self.owner too, and restarts workers holding a stale dataset

    def __getstate__(self) -> dict[str, Any]:
        return {"owner": self.owner, "_loader": None}


class EpochBatchSampler(Sampler[list[int]]):
    """Base of the engine's batch samplers: epoch bookkeeping, resume state and per-batch seeds.

    Subclasses only say how an epoch is cut into batches, in :meth:`epoch_batches`, as a pure function of
    (seed, epoch, rank). Iterating again gives the next epoch; ``set_epoch`` pins one; ``state_dict`` is
    (seed, epoch, position), so saving it every step costs microseconds and resuming is exact.
    """

    reseed_each_epoch = True
    """Whether per-batch randomness changes with the epoch (training) or repeats every pass (evaluation)."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._epoch = 0
        self._fresh = True  # the next iteration uses self._epoch as is; otherwise it advances first
        self._pinned: int | None = None  # the epoch set_epoch() asked for (callers' numbering), until iter()
        self._offset = 0  # callers' epoch minus the data epoch: nonzero after resuming a pass they counted as done
        self._loaded_pass: int | None = None  # the epoch of a loaded mid-epoch pass, until a caller pins an epoch
        self._position = 0
        self._resume_position = 0
        self._cache: tuple[int, list[list[int]]] | None = None
        self.sampler = EpochHandle(self)
        self._retired: str | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order. Must depend only on (seed, epoch) and the options."""
        raise NotImplementedError

    def _batches(self, epoch: int) -> list[list[int]]:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.epoch_batches(epoch))
        return self._cache[1]

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration draws its order from."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next iteration (Lightning and distributed loops call this each epoch).

        After a resume whose saved pass the caller had already counted as finished (Lightning stopping at
        ``max_steps`` mid-epoch), the caller's epochs run one ahead of the data's; the offset is kept in the
        state, so ``set_epoch(e)`` then means data epoch ``e - offset`` and the run continues as if uninterrupted.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        self._pinned = epoch
        loaded, self._loaded_pass = self._loaded_pass, None
        if loaded is not None and epoch - self._offset > loaded:  # as in load_state_dict, when set after the load
            self._offset = epoch - loaded  # the loaded pass goes on (it may already be running, to fill a prefetch)
            return
        if epoch < self._offset:  # the caller restarted its count: follow it
            self._offset = 0
        if epoch - self._offset != self._epoch:
            self._resume_position = 0
        self._epoch = epoch - self._offset
        self._fresh = True

    def __len__(self) -> int:
        return len(self._batches(self._epoch))

    def __iter__(self) -> Iterator[BatchIndices]:
        # Bookkeeping runs lazily, on the first next(): torchdata creates iterators it never consumes.
        # An iteration abandoned part-way still counts as an epoch, so the next one gets a new order.
        if not self._fresh:
            self._epoch += 1
        self._fresh, self._pinned = False, None
        epoch, start = self._epoch, self._resume_position
        if epoch != self._loaded_pass or not start:
            self._loaded_pass = None
        self._resume_position = 0
        batches = self._batches(epoch)
        for position in range(start, len(batches)):
            if self._retired is not None:
                raise RuntimeError(self._retired)
            batch = BatchIndices(batches[position])
            batch.epoch = epoch if self.reseed_each_epoch else 0
            batch.rng_seed = batch_seed(self.seed, batch.epoch, batch)
            self._position = position + 1
            yield batch
        self._epoch, self._position, self._fresh = epoch + 1, 0, True

    def retire(self, reason: str) -> None:
        """Make iterators still running over this sampler raise ``reason`` instead of yielding stale batches."""
        self._retired = reason

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: seed, the epoch of the next batch, batches already yielded in it, and the
        offset of the callers' epoch numbering (see :meth:`set_epoch`)."""
        return {"seed": self.seed, "epoch": self._epoch, "position": self._position, "epoch_offset": self._offset}

    def check_state(self, state: Any) -> tuple[int, int, int]:
        """``(epoch, position, epoch_offset)`` of a saved state, after checking its keys, types and ranges."""
        if not isinstance(state, dict):
            raise TypeError(f"sampler state should be a dict from state_dict(), but got {type(state).__name__}")
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"sampler state is missing {sorted(missing)}; got keys {sorted(state)}")
        if state["seed"] != self.seed:
            raise ValueError(
                f"sampler state was saved with seed={state['seed']}, but this sampler has seed={self.seed}; "
                f"resuming would visit a different order. Build the loader with seed={state['seed']}"
            )
        epoch = check_int("sampler state's epoch", state["epoch"], minimum=0)
        position = check_int("sampler state's position", state["position"], minimum=0)
        offset = check_int("sampler state's epoch_offset", state.get("epoch_offset", 0), minimum=0)
        count = len(self._batches(epoch))
        if position > count:
            raise ValueError(f"sampler state's position should be at most the {count} batches of epoch {epoch}, "
                             f"but got position={position}; the state was saved from other data or options")
        return epoch, position, offset

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes its epoch at the saved position."""
        self._epoch, self._resume_position, self._offset = self.check_state(state)
        count = len(self._batches(self._epoch))
        if self._pinned is not None and self._pinned - self._offset != self._epoch:
            # torchdata applies a loaded state lazily, at iter(), after the caller's set_epoch for this run.
            if 0 < self._resume_position < count and self._pinned > self._epoch:
                # A pass saved part-way that the caller counts as done (Lightning advances its epoch when it stops
                # at max_steps): finish the pass, and shift the caller's later epochs onto the data's.
                self._offset = self._pinned - self._epoch
            elif self._pinned - self._offset > self._epoch:  # a later epoch pinned at a boundary wins
                self._epoch, self._resume_position = self._pinned - self._offset, 0
        elif self._pinned is None and self._resume_position >= count:
            # Saved after the epoch's last batch was handed out (worker snapshots are taken then, before the
            # epoch completes) and no caller pinned an epoch: go on with the next epoch, not an empty pass.
            # A caller that pinned this very epoch (a multi-loader finishing a child's pass) gets the empty rest.
            self._epoch, self._resume_position = self._epoch + 1, 0
        self._position = self._resume_position
        self._fresh = True
        part_way = 0 < self._resume_position < count
        self._loaded_pass = self._epoch if part_way and self._pinned is None else None
