"""How a :class:`~engine.multi.MultiDataLoader` interleaves its loaders: the config, the per-epoch schedule
and the epoch each pass of a child loader runs on.

The schedule of an epoch is a pure function of (config, loader lengths, epoch): which loader serves each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from engine.rng import derive_seed, generator_from

_RESTART_BASE = 1 << 30


def restart_epoch(seed: int, epoch: int, restart: int) -> int:
    """The child epoch of a loader's ``restart``-th restart within ``epoch`` (0: the epoch itself)."""
    return epoch if restart == 0 else _RESTART_BASE + derive_seed(seed, "restart", epoch, restart) % _RESTART_BASE


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's sampler, batch sampler (and its sampler) and dataset, once each."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    targets = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None),
               getattr(loader, "dataset", None))
    for target in {id(t): t for t in targets if t is not None}.values():
        if callable(getattr(target, "set_epoch", None)):
            target.set_epoch(epoch)


class SamplingStrategy(str, Enum):
    """Which loader serves each step."""

    ROUND_ROBIN = "round_robin"
    """0, 1, ..., n-1, repeated (``burst_size`` batches per turn)."""
    WEIGHTED = "weighted"
    """Each loader gets its largest-remainder share of the epoch, in an order shuffled per (seed, epoch)."""
    SEQUENTIAL = "sequential"
    """Each loader's share in one run, in order: its full length under SUM_OF_LENGTHS, else an equal split."""
    ALTERNATING = "alternating"
    """``alternating_pattern`` (loader indices), repeated."""


class EpochLengthPolicy(str, Enum):
    """How many batches an epoch of the multi-loader yields."""

    SUM_OF_LENGTHS = "sum_of_lengths"
    MAX_OF_LENGTHS = "max_of_lengths"
    MIN_OF_LENGTHS = "min_of_lengths"
    FIXED_NUM_STEPS = "fixed_num_steps"
    """``steps_per_epoch`` batches; the only policy that works with loaders of unknown length."""


@dataclass
class MultiDataLoaderConfig:
    """Options of :class:`~engine.multi.MultiDataLoader`; enums may also be given by value (``"weighted"``).

    Example:
        >>> MultiDataLoaderConfig("weighted", dataloader_weights=[3, 1]).sampling_strategy.name
        'WEIGHTED'
    """

    sampling_strategy: SamplingStrategy = SamplingStrategy.ROUND_ROBIN
    """Which loader serves each step."""
    dataloader_names: list[str] | None = None
    """One unique name per loader; None uses the dict's keys, or ``dl0, dl1, ...`` for a list of loaders."""
    dataloader_weights: list[float] | None = None
    """WEIGHTED only: one positive weight per loader (normalized, need not sum to 1)."""
    alternating_pattern: list[int] | None = None
    """ALTERNATING only: loader indices, e.g. ``[0, 0, 1]``; every loader must appear."""
    epoch_length_policy: EpochLengthPolicy = EpochLengthPolicy.SUM_OF_LENGTHS
    """How long an epoch is."""
    steps_per_epoch: int | None = None
    """FIXED_NUM_STEPS only: batches per epoch."""
    cycle_short_loaders: bool = True
    """An exhausted loader restarts on its next epoch; False drops it for the rest of the epoch."""
    burst_size: int = 1
    """Consecutive batches per turn (ROUND_ROBIN, ALTERNATING, WEIGHTED)."""
    choice_rng_seed: int = 0
    """Seed of the WEIGHTED order (with the epoch) and of each loader's restart epochs."""

    def __post_init__(self) -> None:
        self.sampling_strategy = _member(SamplingStrategy, self.sampling_strategy, "sampling_strategy")
        self.epoch_length_policy = _member(EpochLengthPolicy, self.epoch_length_policy, "epoch_length_policy")
        for name in ("burst_size", "choice_rng_seed"):
            _check_int(name, getattr(self, name), 1 if name == "burst_size" else 0)
        if not isinstance(self.cycle_short_loaders, bool):
            raise TypeError(f"cycle_short_loaders should be a bool, but got {self.cycle_short_loaders!r}")
        if self.dataloader_names is not None:
            self.dataloader_names = list(self.dataloader_names)
            bad = [n for n in self.dataloader_names if not isinstance(n, str) or not n]
            if bad:
                raise ValueError(f"dataloader_names should be non-empty strings, but got {bad}")
            repeated = sorted({n for n in self.dataloader_names if self.dataloader_names.count(n) > 1})
            if repeated:
                raise ValueError(f"dataloader_names should be unique, but {repeated} appear more than once "
                                 f"in {self.dataloader_names}")
        fixed = self.epoch_length_policy is EpochLengthPolicy.FIXED_NUM_STEPS
        if fixed and (not isinstance(self.steps_per_epoch, int) or self.steps_per_epoch < 1):
            raise ValueError(f"epoch_length_policy=FIXED_NUM_STEPS needs steps_per_epoch, an int >= 1, but got "
                             f"steps_per_epoch={self.steps_per_epoch!r}")
        if not fixed and self.steps_per_epoch is not None:
            raise ValueError(f"steps_per_epoch={self.steps_per_epoch} applies only to epoch_length_policy="
                             f"FIXED_NUM_STEPS, but the policy is {self.epoch_length_policy.name}; drop one")
        self._check_option("dataloader_weights", SamplingStrategy.WEIGHTED)
        self._check_option("alternating_pattern", SamplingStrategy.ALTERNATING)
        if self.dataloader_weights is not None:
            self.dataloader_weights = [float(w) for w in self.dataloader_weights]
            if not self.dataloader_weights or not all(math.isfinite(w) and w > 0 for w in self.dataloader_weights):
                raise ValueError(f"dataloader_weights should be finite numbers > 0, one per loader, but got "
                                 f"{self.dataloader_weights}")
        if self.alternating_pattern is not None:
            self.alternating_pattern = list(self.alternating_pattern)
            if not self.alternating_pattern or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.alternating_pattern
            ):
                raise ValueError(f"alternating_pattern should be a non-empty list of loader indices (ints >= 0), "
                                 f"but got {self.alternating_pattern}")

    def _check_option(self, name: str, strategy: SamplingStrategy) -> None:
        given = getattr(self, name) is not None
        if self.sampling_strategy is strategy and not given:
            raise ValueError(f"sampling_strategy={strategy.name} needs {name}")
        if self.sampling_strategy is not strategy and given:
            raise ValueError(f"{name} applies only to sampling_strategy={strategy.name}, but the strategy is "
                             f"{self.sampling_strategy.name}; drop {name} or change the strategy")

    def check_loaders(self, names: list[str]) -> None:
        """Check the per-loader options against the loaders' ``names`` (in order)."""
        count = len(names)
        if count == 0:
            raise ValueError("a MultiDataLoader needs at least one loader, but got none")
        if self.dataloader_weights is not None and len(self.dataloader_weights) != count:
            raise ValueError(f"dataloader_weights should have one weight per loader ({count}: {names}), but got "
                             f"{len(self.dataloader_weights)}: {self.dataloader_weights}")
        if self.alternating_pattern is not None:
            outside = sorted({i for i in self.alternating_pattern if i >= count})
            if outside:
                raise ValueError(f"alternating_pattern indices should be in [0, {count}) for loaders {names}, but "
                                 f"got {outside} in {self.alternating_pattern}")
            unused = [names[i] for i in range(count) if i not in self.alternating_pattern]
            if unused:
                raise ValueError(f"loaders {unused} never appear in alternating_pattern={self.alternating_pattern}; "
                                 f"add their indices or leave them out of the MultiDataLoader")

    def needs_lengths(self) -> bool:
        """Whether the schedule needs every loader's length (all but FIXED_NUM_STEPS)."""
        return self.epoch_length_policy is not EpochLengthPolicy.FIXED_NUM_STEPS


def _member(enum: type[Enum], value: Any, name: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        options = [member.name for member in enum]
        raise ValueError(f"{name} should be one of {options} (a {enum.__name__} or its value), but got "
                         f"{name}={value!r}") from None


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} should be an int >= {minimum}, but got {name}={value!r}")


def epoch_length(config: MultiDataLoaderConfig, lengths: list[int | None]) -> int:
    """Batches in one epoch under ``config.epoch_length_policy``, given each loader's length."""
    policy = config.epoch_length_policy
    if policy is EpochLengthPolicy.FIXED_NUM_STEPS:
        return config.steps_per_epoch  # type: ignore[return-value]
    known = [n for n in lengths if n is not None]
    if len(known) != len(lengths):
        raise ValueError(f"epoch_length_policy={policy.name} needs every loader's length, but some are unknown; "
                         f"use FIXED_NUM_STEPS with steps_per_epoch")
    return {EpochLengthPolicy.SUM_OF_LENGTHS: sum, EpochLengthPolicy.MAX_OF_LENGTHS: max,
            EpochLengthPolicy.MIN_OF_LENGTHS: min}[policy](known)


class Schedule:
    """The loader index of every slot of one epoch: ``entry(cursor)``, a pure function of (config, lengths, epoch).

    The first ``length`` slots are the epoch when no loader is dropped. Past them, the schedule goes on (the
    pattern repeats; WEIGHTED draws further blocks), so the slots of a dropped loader can go to the others;
    SEQUENTIAL ends after its shares and returns None.
    """

    def __init__(self, config: MultiDataLoaderConfig, lengths: list[int | None], epoch: int) -> None:
        self.config, self.lengths, self.epoch = config, list(lengths), epoch
        self.length = epoch_length(config, lengths)
        self.count = len(lengths)
        strategy, burst = config.sampling_strategy, config.burst_size
        self._blocks: dict[int, np.ndarray] = {}
        if strategy is SamplingStrategy.SEQUENTIAL:
            if config.epoch_length_policy is EpochLengthPolicy.SUM_OF_LENGTHS:
                shares = list(lengths)
            else:  # upstream: the epoch's length split equally, the first loaders taking the remainder
                shares = [self.length // self.count + (i < self.length % self.count) for i in range(self.count)]
            self._sequence = np.repeat(np.arange(self.count), shares)
        elif strategy is SamplingStrategy.WEIGHTED:
            self._units = math.ceil(self.length / burst)
            shares = largest_remainder(config.dataloader_weights, self._units)  # type: ignore[arg-type]
            self._pool = np.repeat(np.arange(self.count), shares)
        elif strategy is SamplingStrategy.ALTERNATING:
            shares = [int(i in config.alternating_pattern) for i in range(self.count)]  # type: ignore[operator]
        else:
            shares = [1] * self.count
        self.support = frozenset(i for i, share in enumerate(shares) if share)
        """Loaders that appear in the schedule at all."""

    def entry(self, cursor: int) -> int | None:
        """The loader of slot ``cursor`` (0-based), or None past the end of a finite (SEQUENTIAL) schedule."""
        config, unit = self.config, cursor // self.config.burst_size
        strategy = config.sampling_strategy
        if strategy is SamplingStrategy.ROUND_ROBIN:
            return unit % self.count
        if strategy is SamplingStrategy.ALTERNATING:
            return config.alternating_pattern[unit % len(config.alternating_pattern)]  # type: ignore[index]
        if strategy is SamplingStrategy.SEQUENTIAL:
            return int(self._sequence[cursor]) if cursor < len(self._sequence) else None
        block, within = divmod(unit, self._units)
        if block not in self._blocks:
            seed = derive_seed(config.choice_rng_seed, "weighted", self.epoch, block)
            order = torch.randperm(self._units, generator=generator_from(seed)).numpy()
            self._blocks[block] = self._pool[order]
        return int(self._blocks[block][within])

    def head(self) -> list[int]:
        """The epoch's ``length`` slots when no loader is dropped."""
        return [self.entry(cursor) for cursor in range(self.length)]  # type: ignore[misc]


def largest_remainder(weights: list[float], total: int) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (Hamilton's method; ties go to the lower index)."""
    exact = [total * w / sum(weights) for w in weights]
    shares = [math.floor(q) for q in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (shares[i] - exact[i], i))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares
