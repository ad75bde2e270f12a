"""MultiDataLoader: several named loaders interleaved by a seeded per-epoch schedule, resumable mid-epoch.

Each step yields ``(name, batch)``, the batch as that loader built it; a Lightning ``training_step`` unpacks
``name, batch = batch``. An epoch's schedule is a function of (config, loader lengths, epoch); iterating again
gives the next epoch, ``set_epoch`` pins one (Lightning's per-epoch call reaches it through ``multi.sampler``).
At epoch ``e`` each child's first pass runs on its own epoch ``e``; a child that runs out restarts
(``cycle_short_loaders``) on a new epoch derived from (seed, e, restart), >= 2**30 so no regular epoch repeats,
or else is dropped and its later slots go to the next scheduled loaders still running. ``state_dict`` holds the
epoch, the position and each child's pass with its own ``state_dict``: a resumed run yields the same batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from engine.core.checks import check_int
from engine.core.stateful import SavedAsOneLeaf, Stateful
from engine.loading.state import EPOCH, SEED, STATE_VERSION, VERSION
from engine.multi.config import MultiDataLoaderConfig
from engine.multi.schedule import Schedule, epoch_length, restart_epoch
from engine.sampling.epochs import reach_epoch
from engine.tools.steps import loader_length


class MultiDataLoader(SavedAsOneLeaf):
    """Interleaves named loaders by a seeded schedule; yields ``(name, batch)``.

    Args:
        loaders: ``{name: loader}``, or a list of loaders named by ``config.dataloader_names`` (default ``dl0``...).
            Any iterables work; stateful ones (torchdata ``StatefulDataLoader``) resume exactly from their own
            state, others by replaying their pass up to the saved position.
        config: How to interleave; default round robin over the sum of the lengths.

    Raises:
        ValueError: Names or per-loader options do not match the loaders, a loader has no batches, or the
            policy needs a length a loader does not have.

    Example:
        >>> multi = MultiDataLoader({"a": [1, 2], "b": [10]})
        >>> list(multi), len(multi)
        ([('a', 1), ('b', 10), ('a', 2)], 3)
    """

    def __init__(self, loaders: Mapping[str, Any] | Sequence[Any], config: MultiDataLoaderConfig | None = None):
        config = config if config is not None else MultiDataLoaderConfig()
        if not isinstance(config, MultiDataLoaderConfig):
            raise TypeError(f"config should be a MultiDataLoaderConfig, but got {type(config).__name__}")
        if config.choice_rng_seed is None:  # a bare loader's schedule: seed 0
            config = dataclasses.replace(config, choice_rng_seed=0)
        loaders = config.name_loaders(loaders)
        names = list(loaders)
        config.check_loaders(names)
        self.config, self.names, self.loaders = config, names, dict(loaders)
        self._children = list(self.loaders.values())
        config.check_lengths(names, self._current_lengths())
        self._epoch, self._fresh = 0, True
        self._offset, self._loaded_pass = 0, None  # as in EpochBatchSampler: callers' epochs after a resume
        self._start_epoch(0)
        self.sampler = _EpochHook(self)

    # -- the schedule ---------------------------------------------------------------------------------

    def _current_lengths(self) -> list[int | None]:
        return [loader_length(child) for child in self._children]
    def __len__(self) -> int:
        """Batches per epoch by the policy (fewer when loaders are dropped without cycling)."""
        return epoch_length(self.config, self._lengths or self._current_lengths())

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration follows."""
        return self._epoch

    def schedule(self, epoch: int | None = None) -> list[str]:
        """The names of the loaders serving each step of ``epoch`` (default: the current), when none is dropped."""
        epoch = self._epoch if epoch is None else epoch
        lengths = self._lengths if epoch == self._epoch and self._lengths else self._current_lengths()
        return [self.names[i] for i in Schedule(self.config, lengths, epoch).head()]

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next iteration and forward it to every child loader.

        After resuming a pass that the caller counted as done (Lightning stopping at ``max_steps`` mid-epoch),
        the pass goes on and the caller's later epochs map onto the data's, as in ``EpochBatchSampler.set_epoch``.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        loaded, self._loaded_pass = self._loaded_pass, None
        if loaded is not None and epoch - self._offset > loaded:
            self._offset = epoch - loaded
            return
        self._offset = self._offset if epoch >= self._offset else 0
        epoch -= self._offset
        if epoch != self._epoch or not self._fresh:
            self._start_epoch(epoch)
        self._fresh = True
        for child in self._children:
            reach_epoch(child, epoch)

    def _start_epoch(self, epoch: int) -> None:
        count = len(self._children)
        self._epoch, self._position, self._cursor = epoch, 0, 0
        self._lengths: list[int | None] | None = None  # read when the epoch's first batch is asked for
        self._schedule: Schedule | None = None
        self._pass_epoch: list[int | None] = [None] * count  # None: no pass of this child running
        self._taken, self._restarts, self._dropped = [0] * count, [0] * count, [False] * count
        self._pending: list[dict[str, Any] | None] = [None] * count  # child states loaded, applied on next use
        self._iterators: list[Iterator[Any] | None] = [None] * count

    # -- iteration ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._run()

    def _run(self) -> Iterator[tuple[str, Any]]:
        # Bookkeeping runs on the first next(), as in EpochBatchSampler: an iterator made but never used (or
        # replaced by load_state_dict) changes nothing. State lives on self, so a load mid-iteration takes effect.
        if not self._fresh:
            self._start_epoch(self._epoch + 1)
        self._fresh = False
        if self._loaded_pass != self._epoch or not self._position:
            self._loaded_pass = None
        while True:
            slot = self._next_slot()
            if slot is None:
                break
            batch = self._next_batch(slot)
            if batch is _END:  # the loader was dropped; its slot goes to the next one
                continue
            self._position += 1
            self._cursor += 1
            yield self.names[slot], batch
        self._start_epoch(self._epoch + 1)
        self._fresh = True

    def _epoch_schedule(self) -> Schedule:
        if self._lengths is None:  # the children's lengths on this epoch (a token-budget loader's vary)
            for child in self._children:
                reach_epoch(child, self._epoch)
            self._lengths = self._current_lengths()
        if self._schedule is None or self._schedule.epoch != self._epoch:
            self._schedule = Schedule(self.config, self._lengths, self._epoch)
        return self._schedule

    def _next_slot(self) -> int | None:
        schedule = self._epoch_schedule()
        while self._position < schedule.length and not all(self._dropped[i] for i in schedule.support):
            slot = schedule.entry(self._cursor)
            if slot is None or not self._dropped[slot]:
                return slot
            self._cursor += 1  # a dropped loader's slot goes to the next loader scheduled
        return None

    def _next_batch(self, i: int) -> Any:
        for attempt in range(2):
            if self._iterators[i] is None:
                self._iterators[i] = self._open(i)
            batch = next(self._iterators[i], _END)  # type: ignore[call-overload]
            if batch is not _END:
                self._taken[i] += 1
                return batch
            self._iterators[i], self._pass_epoch[i] = None, None  # this pass is over
            if not self.config.cycle_short_loaders:
                self._dropped[i] = True
                return _END
            if attempt or not self._taken[i]:
                raise RuntimeError(f"loader {self.names[i]!r} yielded no batch on a new pass, so it cannot be "
                                   f"cycled; remove it or set cycle_short_loaders=False")
            self._restarts[i] += 1
        return _END

    def _open(self, i: int) -> Iterator[Any]:
        child, pending = self._children[i], self._pending[i]
        self._pending[i] = None
        if pending is None:  # a new pass
            self._pass_epoch[i] = restart_epoch(self.config.choice_rng_seed, self._epoch, self._restarts[i])
            self._taken[i] = 0
        reach_epoch(child, self._pass_epoch[i])
        if pending and isinstance(child, Stateful):
            child.load_state_dict(pending)  # the child continues its pass from its own state
            return iter(child)
        iterator = iter(child)
        for _ in range(self._taken[i] if pending is not None else 0):  # not stateful: replay up to the position
            next(iterator)
        return iterator

    # -- state ----------------------------------------------------------------------------------------

    def data_state(self) -> dict[str, Any]:
        """Epoch, schedule position and each loader's pass, so a resumed run yields the same batches."""
        children = {}
        for i, name in enumerate(self.names):
            running = self._pass_epoch[i] is not None
            state = self._pending[i]
            if state is None and running and self._iterators[i] is not None and isinstance(self._children[i], Stateful):
                child = self._children[i]
                state = child.data_state() if isinstance(child, SavedAsOneLeaf) else child.state_dict()
            children[name] = {"pass_epoch": self._pass_epoch[i], "taken": self._taken[i],
                              "restarts": self._restarts[i], "dropped": self._dropped[i], "loader": state}
        return {VERSION: STATE_VERSION, SEED: self.config.choice_rng_seed, EPOCH: self._epoch,
                "position": self._position, "cursor": self._cursor, "epoch_offset": self._offset,
                "lengths": self._lengths, "children": children}

    def load_data_state(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next (or the current) iteration resumes at the saved step.

        Raises:
            KeyError: ``state`` lacks a key or names other loaders.
            ValueError: It was saved with another ``choice_rng_seed``.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state should be a dict from MultiDataLoader.state_dict(), but got {type(state).__name__}")
        missing = {"version", "seed", "epoch", "position", "cursor", "lengths", "children"} - set(state)
        if missing:
            raise KeyError(f"MultiDataLoader state is missing {sorted(missing)}; got keys {sorted(state)}")
        if sorted(state["children"]) != sorted(self.names):
            raise KeyError(f"the state was saved for loaders {sorted(state['children'])}, but this MultiDataLoader "
                           f"has {sorted(self.names)}; resume with the same named loaders")
        if state["seed"] != self.config.choice_rng_seed:
            raise ValueError(f"the state was saved with choice_rng_seed={state['seed']}, but this MultiDataLoader has "
                             f"choice_rng_seed={self.config.choice_rng_seed}; resuming would follow another schedule")
        self._start_epoch(int(state["epoch"]))
        self._position, self._cursor, self._lengths = int(state["position"]), int(state["cursor"]), state["lengths"]
        for i, name in enumerate(self.names):
            child = state["children"][name]
            self._pass_epoch[i], self._taken[i] = child["pass_epoch"], int(child["taken"])
            self._restarts[i], self._dropped[i] = int(child["restarts"]), bool(child["dropped"])
            if child["pass_epoch"] is not None:
                self._pending[i] = child["loader"] if child["loader"] is not None else {}
        self._fresh = True  # the next iteration continues the saved epoch, or starts the next one if it was done
        self._offset = check_int("epoch_offset", state.get("epoch_offset", 0), minimum=0)
        if self._lengths is not None and self._next_slot() is None:
            self._start_epoch(self._epoch + 1)
        self._loaded_pass = self._epoch if self._position else None

    def __repr__(self) -> str:
        return (f"MultiDataLoader({self.names}, strategy={self.config.sampling_strategy.name}, "
                f"policy={self.config.epoch_length_policy.name}, epoch={self._epoch})")


_END = object()


class _EpochHook:
    """Found at ``multi.sampler``, where Lightning calls ``set_epoch`` each epoch: the epoch reaches the multi-loader
    even when a run resumes at an epoch boundary, where Lightning saves no loader state."""

    def __init__(self, multi: MultiDataLoader) -> None:
        self.multi = multi

    def set_epoch(self, epoch: int) -> None:
        self.multi.set_epoch(epoch)


def build_multi_loader(
    named_loaders: Mapping[str, Any], config: MultiDataLoaderConfig | None = None
) -> MultiDataLoader:
    """A :class:`MultiDataLoader` over ``{name: loader}`` (e.g. one StatefulDataLoader per dataset and task spec).

    Example:
        >>> multi = build_multi_loader({"a": [1, 2, 3], "b": [10]}, MultiDataLoaderConfig(cycle_short_loaders=False))
        >>> list(multi)
        [('a', 1), ('b', 10), ('a', 2), ('a', 3)]
    """
    if not isinstance(named_loaders, Mapping) or not named_loaders:
        raise ValueError(f"named_loaders should be a non-empty dict of name -> loader, but got {named_loaders!r}")
    return MultiDataLoader(named_loaders, config)
