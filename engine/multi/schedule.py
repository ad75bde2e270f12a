"""The schedule of a multi-loader epoch, a pure function of (config, loader lengths, epoch): which loader serves
each step, how long the epoch is, and the epoch each restarted pass of a child loader runs on."""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.core.rng import derive_seed, generator_from
from engine.multi.config import EpochLengthPolicy, MultiDataLoaderConfig, SamplingStrategy

_RESTART_BASE = 1 << 30


def restart_epoch(seed: int, epoch: int, restart: int) -> int:
    """The child epoch of a loader's ``restart``-th restart within ``epoch`` (0: the epoch itself)."""
    return epoch if restart == 0 else _RESTART_BASE + derive_seed(seed, "restart", epoch, restart) % _RESTART_BASE


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
