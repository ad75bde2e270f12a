"""The base of every batch sampler: epoch bookkeeping, resume position and per-batch seeds.

The order of an epoch is a pure function of (seed, epoch): iterating again gives the next epoch's order,
``set_epoch`` pins one, and ``state_dict`` is a few integers, so saving it every step costs nothing. A state saved
on another number of ranks continues the rest of its epoch on this one (:mod:`engine.sampling.elastic`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from engine.core.checks import check_int
from engine.core.rng import batch_seed
from engine.sampling import elastic
from engine.sampling.epochs import set_epoch as set_loader_epoch


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
        self._cache: tuple[Any, list[list[int]]] | None = None
        self._served: tuple[int, tuple[elastic.Segment, ...]] = (0, ())  # (epoch, its parts served on other ranks)
        self.sampler = EpochHandle(self)
        self._retired: str | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order. Must depend only on (seed, epoch) and the options."""
        raise NotImplementedError

    def _segments(self, epoch: int) -> tuple[elastic.Segment, ...]:
        """The parts of ``epoch`` served on another number of ranks before this pass (empty: a whole epoch)."""
        return self._served[1] if self._served[0] == epoch else ()

    def _batches(self, epoch: int, segments: tuple[elastic.Segment, ...] | None = None) -> list[list[int]]:
        key = (epoch, self._segments(epoch) if segments is None else segments)
        if self._cache is None or self._cache[0] != key:
            batches = elastic.pass_batches(self, epoch, key[1]) if key[1] else self.epoch_batches(epoch)
            self._cache = (key, batches)
        return self._cache[1]

    @property
    def is_elastic(self) -> bool:
        """Whether a state saved on another number of ranks can continue here (see :mod:`engine.sampling.elastic`)."""
        return callable(getattr(self, "batches_of", None))

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
            self._resume_position, self._served = 0, (0, ())
        self._epoch = epoch - self._offset
        self._fresh = True

    def __len__(self) -> int:
        """This rank's batches of the current epoch. After an elastic resume, the steps served on other ranks count
        too, as the caller's (Lightning's) restored step count within the epoch does."""
        return sum(position for _, position in self._segments(self._epoch)) + len(self._batches(self._epoch))

    def __iter__(self) -> Iterator[BatchIndices]:
        # Bookkeeping runs lazily, on the first next(): torchdata creates iterators it never consumes.
        # An iteration abandoned part-way still counts as an epoch, so the next one gets a new order.
        if not self._fresh:
            self._epoch += 1
        self._fresh, self._pinned = False, None
        epoch, start = self._epoch, self._resume_position
        if epoch != self._loaded_pass or not (start or self._segments(epoch)):
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
        self._epoch, self._position, self._fresh, self._served = epoch + 1, 0, True, (0, ())

    def retire(self, reason: str) -> None:
        """Make iterators still running over this sampler raise ``reason`` instead of yielding stale batches."""
        self._retired = reason

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: seed, the epoch of the next batch, batches already yielded in it, and the
        offset of the callers' epoch numbering (see :meth:`set_epoch`); for samplers that can resume on another
        number of ranks, also that number, the global batch and the parts of the epoch served on other ranks."""
        state = {"seed": self.seed, "epoch": self._epoch, "position": self._position, "epoch_offset": self._offset}
        if self.is_elastic:
            state.update(num_replicas=self.num_replicas, global_batch=elastic.global_batch(self),
                         served=[list(segment) for segment in self._segments(self._epoch)])
        return state

    def check_state(self, state: Any) -> tuple[int, int, int, tuple[elastic.Segment, ...]]:
        """``(epoch, position, epoch_offset, served segments)`` of a saved state on this sampler's ranks, after
        checking its keys, types and ranges. A state from another number of ranks becomes the rest of its epoch."""
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
        replicas = getattr(self, "num_replicas", 1)
        saved_replicas = check_int("sampler state's num_replicas", state.get("num_replicas", replicas), minimum=1)
        segments: tuple[elastic.Segment, ...] = ()
        if self.is_elastic and "global_batch" in state:
            elastic.check_global_batch(self, saved_replicas, state["global_batch"])
            segments = elastic.check_segments(state.get("served", ()), state["global_batch"])
        elif saved_replicas != replicas:
            raise ValueError(f"sampler state was saved on {saved_replicas} ranks, but this {type(self).__name__} has "
                             f"num_replicas={replicas} and cannot resume on another number of ranks; resume with "
                             f"num_replicas={saved_replicas}")
        count = len(self._batches(epoch, segments) if saved_replicas == replicas else
                    elastic.pass_batches(self, epoch, segments, num_replicas=saved_replicas, rank=0))
        if position > count:
            raise ValueError(f"sampler state's position should be at most the {count} batches of epoch {epoch}, "
                             f"but got position={position}; the state was saved from other data or options")
        if saved_replicas == replicas:
            return epoch, position, offset, segments
        if position == count:  # the saved pass had ended: the epoch is over on any number of ranks
            return epoch, len(self._batches(epoch, ())), offset, ()
        return epoch, 0, offset, segments + ((saved_replicas, position),) if position else segments

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes its epoch at the saved position (saved on another
        number of ranks: with the rows of the epoch not served yet, dealt to this sampler's ranks)."""
        self._epoch, self._resume_position, self._offset, segments = self.check_state(state)
        self._served = (self._epoch, segments)
        count = len(self._batches(self._epoch))
        part_way = (self._resume_position > 0 or bool(segments)) and self._resume_position < count
        if self._pinned is not None and self._pinned - self._offset != self._epoch:
            # torchdata applies a loaded state lazily, at iter(), after the caller's set_epoch for this run.
            if part_way and self._pinned > self._epoch:
                # A pass saved part-way that the caller counts as done (Lightning advances its epoch when it stops
                # at max_steps): finish the pass, and shift the caller's later epochs onto the data's.
                self._offset = self._pinned - self._epoch
            elif self._pinned - self._offset > self._epoch:  # a later epoch pinned at a boundary wins
                self._epoch, self._resume_position, part_way = self._pinned - self._offset, 0, False
        elif self._pinned is None and self._resume_position >= count:
            # Saved after the epoch's last batch was handed out (worker snapshots are taken then, before the
            # epoch completes) and no caller pinned an epoch: go on with the next epoch, not an empty pass.
            # A caller that pinned this very epoch (a multi-loader finishing a child's pass) gets the empty rest.
            self._epoch, self._resume_position = self._epoch + 1, 0
        self._position = self._resume_position
        self._fresh = True
        self._loaded_pass = self._epoch if part_way and self._pinned is None else None
