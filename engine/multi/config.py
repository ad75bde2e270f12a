"""How a :class:`~engine.multi.loader.MultiDataLoader` interleaves its loaders: strategies, epoch lengths and
the validated config. The schedule itself is in :mod:`engine.multi.schedule`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from engine.core.checks import check_int


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
    """Options of :class:`~engine.multi.loader.MultiDataLoader`; enums may also be given by value (``"weighted"``).

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
    choice_rng_seed: int | None = None
    """Seed of the WEIGHTED order (with the epoch) and of each loader's restart epochs; None: 0 for a bare
    MultiDataLoader, the module's seed in a MultiDataModule."""

    def __post_init__(self) -> None:
        self.sampling_strategy = _member(SamplingStrategy, self.sampling_strategy, "sampling_strategy")
        self.epoch_length_policy = _member(EpochLengthPolicy, self.epoch_length_policy, "epoch_length_policy")
        check_int("burst_size", self.burst_size, minimum=1)
        if self.choice_rng_seed is not None:
            check_int("choice_rng_seed", self.choice_rng_seed, minimum=0)
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

    def name_loaders(self, loaders: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
        """``{name: loader}`` from a dict (names checked against ``dataloader_names``) or a list (named by them)."""
        if isinstance(loaders, Mapping):
            names = list(loaders)
            if not all(isinstance(name, str) and name for name in names):
                raise ValueError(f"loader names (the dict's keys) should be non-empty strings, but got {names}")
            if self.dataloader_names is not None and self.dataloader_names != names:
                raise ValueError(f"config.dataloader_names={self.dataloader_names} differs from the loaders' "
                                 f"keys {names}; drop dataloader_names or make them equal")
        elif isinstance(loaders, Sequence) and not isinstance(loaders, str):
            names = self.dataloader_names or [f"dl{i}" for i in range(len(loaders))]
            if len(names) != len(loaders):
                raise ValueError(f"dataloader_names should have one name per loader ({len(loaders)}), but got "
                                 f"{len(names)}: {names}")
            loaders = dict(zip(names, loaders))
        else:
            raise TypeError(f"loaders should be a dict of name -> loader or a list of loaders, "
                            f"but got {type(loaders).__name__}")
        return dict(loaders)

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

    def check_lengths(self, names: list[str], lengths: list[int | None]) -> None:
        """Refuse loaders without batches, and unknown lengths where the policy needs them."""
        empty = [name for name, n in zip(names, lengths) if n == 0]
        if empty:
            raise ValueError(f"loaders {empty} have no batches; remove them from the MultiDataLoader")
        if self.needs_lengths() and None in lengths:
            unknown = [name for name, n in zip(names, lengths) if n is None]
            raise ValueError(f"epoch_length_policy={self.epoch_length_policy.name} needs every loader's length, "
                             f"but {unknown} have none (IterableDataset without __len__); use epoch_length_policy="
                             f"FIXED_NUM_STEPS with steps_per_epoch=<batches per epoch>")

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



