"""How rows are shared among ranks: the one rule every training sampler uses, so every rank gets the same
number of rows (and so of batches) and no rank waits forever in a collective call."""

from __future__ import annotations

import math

import numpy as np

UNEVEN_POLICIES = ("pad", "drop")
"""When rows don't divide evenly among ranks: ``pad`` repeats rows from the start of the epoch's order,
``drop`` leaves the tail out."""


def deal_to_ranks(order: np.ndarray, num_replicas: int, rank: int, uneven: str) -> np.ndarray:
    """This rank's rows of the epoch's ``order``: equalized by ``uneven``, then dealt round robin.

    Example:
        >>> deal_to_ranks(np.arange(5), 2, 1, "pad").tolist(), deal_to_ranks(np.arange(5), 2, 1, "drop").tolist()
        ([1, 3, 0], [1, 3])
    """
    if num_replicas == 1:
        return order
    if uneven == "pad" and len(order):
        order = np.resize(order, math.ceil(len(order) / num_replicas) * num_replicas)
    else:
        order = order[: len(order) - len(order) % num_replicas]
    return order[rank::num_replicas]


def rows_per_rank(num_samples: int, num_replicas: int, uneven: str) -> int:
    """How many rows :func:`deal_to_ranks` gives each rank, without building an order."""
    if num_replicas == 1:
        return num_samples
    if uneven == "pad":
        return math.ceil(num_samples / num_replicas) if num_samples else 0
    return num_samples // num_replicas


def equalize_batch_counts(mine: list[list[int]], per_rank: list[list[list[int]]], uneven: str) -> list[list[int]]:
    """For samplers whose ranks pack different numbers of batches (token budgets): ``pad`` repeats whole batches
    from the start of this rank's order up to the largest count, ``drop`` cuts to the smallest. Every rank computes
    every rank's batches from the same (seed, epoch), so no communication is needed."""
    counts = [len(batches) for batches in per_rank]
    if uneven == "drop":
        return mine[: min(counts)]
    if not max(counts):
        return []
    pool = mine or next(b for b in per_rank if b)  # a rank with no rows (fewer rows than ranks) borrows
    return mine + [pool[i % len(pool)] for i in range(max(counts) - len(mine))]
