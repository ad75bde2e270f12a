"""The order of an epoch over sharded data: row groups in a seeded order, then rows shuffled within a window.

A full permutation of a corpus in object storage would read a different row group for nearly every row. This
order visits the row groups in a seeded permutation, lays their rows end to end, and shuffles the rows within
consecutive windows of ``window`` rows: a batch reads from the few row groups its window spans, and a loader
worker keeps only those open. It is a pure function of (seed, epoch), like every order of the engine, so resume,
elastic resume and the batching modes work on it unchanged. ``docs/sharded_data.md`` measures how close it is to a
full shuffle.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.core.checks import check_int
from engine.core.rng import derive_seed


class EpochOrder(Protocol):
    """An epoch order a sampler draws from instead of its own shuffle: :class:`BlockOrder` (sharded data) or
    :class:`engine.sampling.mixtures.order.MixtureOrder` (a mixture of sources)."""

    size: int
    varies: bool
    always: bool

    @property
    def key(self) -> object: ...

    def epoch_rows(self, seed: int, epoch: int) -> np.ndarray: ...


class BlockOrder:
    """Seeded epoch orders of rows that lie in row groups (``groups[i]`` is row ``i``'s row group).

    Example:
        >>> order = BlockOrder(np.array([0, 0, 0, 1, 1, 1, 2, 2, 2]), window=3).permutation(seed=0)
        >>> sorted(order.tolist()) == list(range(9)), [sorted(order[i:i + 3] // 3) for i in (0, 3, 6)]
        (True, [[2, 2, 2], [1, 1, 1], [0, 0, 0]])
    """

    def __init__(self, groups: np.ndarray, window: int) -> None:
        self.window = check_int("shuffle_window", window, minimum=1)
        groups = np.asarray(groups)
        self.size = len(groups)
        if self.size and np.all(groups[1:] >= groups[:-1]):  # rows in storage order: runs of one row group
            self.run_starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]).astype(np.int64)
            self.groups = None
        else:  # a split's rows in another order: sorted by row group when an epoch is drawn
            self.run_starts, self.groups = None, groups

    always = False
    """Used only when the sampler shuffles (a mixture's order is its order either way)."""
    varies = False
    """Every epoch has the same rows (:class:`engine.sampling.mixtures.order.MixtureOrder`'s epochs can differ)."""

    @property
    def key(self) -> int:
        """What a sampler's fingerprint adds for this order."""
        return self.window

    def epoch_rows(self, seed: int, epoch: int) -> np.ndarray:
        """The order of ``epoch`` for a sampler of ``seed``."""
        return self.permutation(derive_seed(seed, "blocks", epoch))

    def permutation(self, seed: int) -> np.ndarray:
        """Every row once: row groups in a permutation drawn from ``seed``, rows shuffled within windows."""
        rng = np.random.default_rng(seed)
        if self.run_starts is not None:
            ends = np.r_[self.run_starts[1:], self.size]
            lengths = ends - self.run_starts
            chosen = rng.permutation(len(self.run_starts))
            firsts = np.repeat(self.run_starts[chosen] - (np.cumsum(lengths[chosen]) - lengths[chosen]),
                               lengths[chosen])
            order = firsts + np.arange(self.size, dtype=np.int64)
        else:
            rank = np.empty(int(self.groups.max()) + 1, dtype=np.int64)
            rank[rng.permutation(len(rank))] = np.arange(len(rank))
            order = np.argsort(rank[self.groups], kind="stable")
        full = self.size // self.window * self.window
        if full:
            order[:full] = rng.permuted(order[:full].reshape(-1, self.window), axis=1).reshape(-1)
        order[full:] = rng.permutation(order[full:])
        return order
