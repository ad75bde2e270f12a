"""The base of every batch sampler: epoch bookkeeping, resume position and per-batch seeds.

The order of an epoch is a pure function of (seed, epoch): iterating again gives the next epoch's order,
``set_epoch`` pins one, and ``state_dict`` is a few integers, so saving it every step costs nothing. A state saved
on another number of ranks continues the rest of its epoch on this one (:mod:`engine.sampling.elastic`). The
position is one :class:`~engine.sampling.position.PassState`; "Resume state" in ``docs/architecture.md`` describes
it and the rest of a checkpoint.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from engine.core.checks import check_int, check_saved_int
from engine.core.rng import batch_seed
from engine.sampling import elastic
from engine.sampling.epochs import set_epoch as set_loader_epoch
from engine.sampling.position import PassState


class BatchIndices(list):
    """A batch of sample indices that carries the seed of its randomness, and the epoch it belongs to (which
    seeds per-row transforms, :mod:`engine.sources.transforms`), to wherever the batch is built."""

    rng_seed: int | None = None
    epoch: int | None = None
    ahead: list[int] | None = None
    """The rows of the batch :attr:`EpochBatchSampler.look_ahead` batches later, so a source that fetches from
    object storage can start reading them now (:mod:`engine.sources.shards.source`); None when not asked for."""


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
    (seed, epoch, position), so saving it every step costs microseconds and resuming is exact. The position is a
    :class:`~engine.sampling.position.PassState`, changed only by its transitions ("Resume state" in
    ``docs/architecture.md``).
    """

    reseed_each_epoch = True
    """Whether per-batch randomness changes with the epoch (training) or repeats every pass (evaluation)."""

    look_ahead = 0
    """How many batches ahead each batch names the rows of (:attr:`BatchIndices.ahead`); 0: none. Set by the
    factory for sources that read ahead (sharded data)."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._pass = PassState()  # every change of position is one of its transitions
        self._cache: tuple[Any, list[list[int]]] | None = None
        self.sampler = EpochHandle(self)
        self._retired: str | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order. Must depend only on (seed, epoch) and the options."""
        raise NotImplementedError

    def _batches(self, epoch: int, served: tuple[elastic.Segment, ...]) -> list[list[int]]:
        """This rank's batches of ``epoch`` after the parts ``served`` on other numbers of ranks (cached)."""
        key = (epoch, served)
        if self._cache is None or self._cache[0] != key:
            batches = elastic.pass_batches(self, epoch, served) if served else self.epoch_batches(epoch)
            self._cache = (key, batches)
        return self._cache[1]

    @property
    def is_elastic(self) -> bool:
        """Whether a state saved on another number of ranks can continue here (see :mod:`engine.sampling.elastic`)."""
        return callable(getattr(self, "batches_of", None))

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration draws its order from."""
        return self._pass.epoch

    @property
    def retired(self) -> str | None:
        """Why iterators over this sampler raise (see :meth:`retire`), or None while it serves."""
        return self._retired

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next iteration (Lightning and distributed loops call this each epoch).

        After a resume whose saved pass the caller had already counted as finished (Lightning stopping at
        ``max_steps`` mid-epoch), the caller's epochs run one ahead of the data's; the offset is kept in the
        state, so ``set_epoch(e)`` then means data epoch ``e - offset`` and the run continues as if uninterrupted
        (:meth:`PassState.pinned <engine.sampling.position.PassState.pinned>`).
        """
        self._pass = self._pass.pinned(check_int("epoch", epoch, minimum=0))

    def __len__(self) -> int:
        """This rank's batches of the current epoch. After an elastic resume, the steps served on other ranks count
        too, as the caller's (Lightning's) restored step count within the epoch does."""
        elsewhere = sum(position for _, position in self._pass.served)
        if self.mixture is not None:  # the steps of the epoch served under a mixture this one went on from
            elsewhere += self.mixture.steps_before(self._pass.epoch)
        return elsewhere + len(self._batches(self._pass.epoch, self._pass.served))

    def __iter__(self) -> Iterator[BatchIndices]:
        # Bookkeeping runs lazily, on the first next(): torchdata creates iterators it never consumes.
        # An iteration abandoned part-way still counts as an epoch, so the next one gets a new order.
        self._pass = self._pass.started()
        epoch, start = self._pass.epoch, self._pass.position
        batches = self._batches(epoch, self._pass.served)
        for position in range(start, len(batches)):
            if self._retired is not None:
                raise RuntimeError(self._retired)
            batch = BatchIndices(batches[position])
            batch.epoch = epoch if self.reseed_each_epoch else 0
            batch.rng_seed = batch_seed(self.seed, batch.epoch, batch)
            if self.look_ahead and position + self.look_ahead < len(batches):
                batch.ahead = list(batches[position + self.look_ahead])
            self._pass = self._pass.advanced(position + 1)
            yield batch
        self._pass = self._pass.finished(epoch)

    @property
    def mixture(self) -> Any:
        """The order of a mixture of sources this sampler draws from (see :mod:`~engine.sampling.mixtures`), or None."""
        order = getattr(self, "order", None)
        return order if callable(getattr(order, "saved", None)) else None

    def retire(self, reason: str) -> None:
        """Make iterators still running over this sampler raise ``reason`` instead of yielding stale batches."""
        self._retired = reason

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: seed, the epoch of the next batch, batches already yielded in it, and the
        offset of the callers' epoch numbering (see :meth:`set_epoch`); for samplers that can resume on another
        number of ranks, also that number, the global batch and the parts of the epoch served on other ranks.
        "Resume state" in ``docs/architecture.md`` describes it."""
        state = {"seed": self.seed, **self._pass.as_state()}
        if self.mixture is not None:
            state["mixture"] = self.mixture.saved(self)
        if self.is_elastic:
            state.update(num_replicas=self.num_replicas, global_batch=elastic.global_batch(self),
                         served=[list(segment) for segment in self._pass.served])
        return state

    def check_state(self, state: Any) -> PassState:
        """The saved position of ``state`` on this sampler's ranks, after checking its keys, types and ranges. A
        state from another number of ranks becomes the rest of its epoch. Every number is checked before it is
        used (:func:`~engine.core.checks.check_saved_int`), so a crafted state is refused, never sizes memory."""
        if not isinstance(state, dict):
            raise TypeError(f"sampler state should be a dict from state_dict(), but got {type(state).__name__}")
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"sampler state is missing {sorted(missing)}; got keys {sorted(state)}")
        if isinstance(state["seed"], bool) or not isinstance(state["seed"], numbers.Integral):
            raise TypeError(f"sampler state's seed should be an integer, but got seed={state['seed']!r} "
                            f"({type(state['seed']).__name__}); the state was not saved by this engine")
        if state["seed"] != self.seed:
            raise ValueError(
                f"sampler state was saved with seed={state['seed']}, but this sampler has seed={self.seed}; "
                f"resuming would visit a different order. Build the loader with seed={state['seed']}"
            )
        saved = PassState.from_state(state)
        if self.mixture is not None and not self.mixture.check_saved(state.get("mixture")):
            if self.mixture.continues(state["mixture"]):  # the rest of the epoch, in an order of its own
                saved_global = check_saved_int("sampler state", "global_batch", state.get("global_batch", 1), low=1)
                segments = elastic.check_segments(state.get("served", ()), saved_global)
                self.mixture.check_taken(state["mixture"], saved.position + sum(steps for _, steps in segments))
                return PassState.at(saved.epoch, 0, saved.offset)
            return PassState.at(saved.epoch + 1, 0, saved.offset)  # another mixture goes on from the next epoch
        anchored = self.mixture.anchor(state.get("mixture")) if self.mixture is not None else None
        try:  # the mixture plans the saved epoch from where it starts, not every epoch before it
            return self._checked_position(state, saved)
        except BaseException:
            if anchored is not None:
                self.mixture.unanchor(anchored)
            raise

    def _checked_position(self, state: dict[str, Any], saved: PassState) -> PassState:
        """:meth:`check_state` past the seed and the mixture: the ranks, the global batch and the position."""
        replicas = getattr(self, "num_replicas", 1)
        saved_replicas = check_saved_int("sampler state", "num_replicas", state.get("num_replicas", replicas), low=1)
        segments: tuple[elastic.Segment, ...] = ()
        if self.is_elastic and "global_batch" in state:
            saved_global = check_saved_int("sampler state", "global_batch", state["global_batch"], low=1)
            elastic.check_ranks(saved_replicas, saved_global)
            elastic.check_global_batch(self, saved_replicas, saved_global)
            segments = elastic.check_segments(state.get("served", ()), saved_global)
        elif saved_replicas != replicas:
            raise ValueError(f"sampler state was saved on {saved_replicas} ranks, but this {type(self).__name__} has "
                             f"num_replicas={replicas} and cannot resume on another number of ranks; resume with "
                             f"num_replicas={saved_replicas}")
        epoch, position, offset = saved.epoch, saved.position, saved.offset
        count = len(self._batches(epoch, segments) if saved_replicas == replicas else
                    elastic.pass_batches(self, epoch, segments, num_replicas=saved_replicas, rank=0))
        if position > count:
            raise ValueError(f"sampler state's position should be at most the {count} batches of epoch {epoch}, "
                             f"but got position={position}; the state was saved from other data or options")
        if saved_replicas == replicas:
            return PassState.at(epoch, position, offset, segments)
        if position == count:  # the saved pass had ended: the epoch is over on any number of ranks
            return PassState.at(epoch, len(self._batches(epoch, ())), offset)
        return PassState.at(epoch, 0, offset, segments + ((saved_replicas, position),) if position else segments)

    def check_options(self, state: dict[str, Any]) -> None:
        """Refuse a state saved with other options than this sampler's (subclasses that fingerprint theirs)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes its epoch at the saved position (saved on another
        number of ranks: with the rows of the epoch not served yet, dealt to this sampler's ranks), read against
        the epoch a caller pinned (:meth:`PassState.loaded <engine.sampling.position.PassState.loaded>`)."""
        changed = self.mixture is not None and not self.mixture.check_saved(state.get("mixture"))
        if not changed:  # a checkpoint of another mixture, accepted, starts the next epoch whatever its options
            self.check_options(state)
        saved = self.check_state(state)
        if changed:  # another mixture's checkpoint: this one's epochs start at the loaded epoch, at the saved step
            # (the rest of the saved epoch, on_change='continue')
            self.mixture.start_at(saved.epoch, state.get("mixture"))
            self._cache = None
        self._pass = self._pass.loaded(saved, len(self._batches(saved.epoch, saved.served)))
        if self.mixture is not None:
            self.mixture.restore(self, state.get("mixture"))
