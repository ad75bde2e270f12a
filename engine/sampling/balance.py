"""Compute-balanced steps of packed batching: each step's documents dealt to ranks so that every rank's estimated
compute is about the same, not only its tokens.

Packing gives every rank the same number of tokens, but attention costs grow with the square of each document's
length, so a rank whose sequence holds one long document works longer than a rank whose sequence holds many short
ones, and the other ranks wait at the step's collective. The cost of a rank's sequence is modelled as
``tokens + attention_weight * sum(len ** 2)`` (per layer, the linear layers cost about ``24 * d**2`` per token and
causal attention about ``2 * d * len**2`` per document, so ``attention_weight`` is about ``1 / (12 * d)`` for a
model of width ``d``; or measure it). Two moves balance it, both pure functions of the epoch's bins, so every
rank computes every step alike without communicating, and resume and elastic resume stay exact:

1. *grouping*: within windows of ``window`` steps' worth of bins (in the epoch's shuffled order), bins are sorted
   by cost and cut into steps of ``num_replicas`` bins, so the bins of one step cost about the same (a bin holding
   one very long document meets others like it); the steps of a window are then shuffled;
2. *refining*: within a step, documents move or swap between the costliest rank and the cheapest ones, never over
   a rank's token budget, while that lowers the costliest rank's cost (:func:`refine`).

Every document stays in its step, so every document is served exactly once per epoch, as without balancing.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

BALANCE_MODES = ("tokens", "compute")
"""``tokens``: every rank's sequence has the same token budget (plain packing); ``compute``: the steps are also
balanced by the cost model."""

TOLERANCE = 0.005
"""Refining a step stops once its costliest rank is within this share of the mean rank: closer is not worth the
loader's time."""

MAX_MOVES = 64
"""Most moves or swaps refining one step: each lowers the sum of squared rank costs, so it ends anyway; this bounds
the loader's time per step."""


def check_balance(balance: str, attention_weight: Any, order: Any = None) -> float | None:
    """``attention_weight`` as a float for ``balance='compute'`` (None for ``'tokens'``), after refusing what cannot
    hold: another mode, a weight that is not a finite number >= 0, a weight without balancing, and a mixture's
    order (its windows hold each source at its share; grouping bins by cost across them would not)."""
    if balance not in BALANCE_MODES:
        raise ValueError(f"balance should be one of {BALANCE_MODES}, but got balance={balance!r}")
    if balance == "tokens":
        if attention_weight is not None:
            raise ValueError(f"attention_weight={attention_weight!r} weighs the cost model of balance='compute', but "
                             f"balance='tokens'; pass balance='compute', or drop attention_weight")
        return None
    if attention_weight is None:
        raise ValueError("balance='compute' needs attention_weight=... : the cost of one len**2 term of a document in "
                         "tokens' worth, about 1 / (12 * d) for a transformer of width d, or measured")
    if isinstance(attention_weight, bool) or not isinstance(attention_weight, numbers.Real) or not (
            math.isfinite(attention_weight) and attention_weight >= 0):
        raise ValueError(f"attention_weight should be a finite number >= 0, but got "
                         f"attention_weight={attention_weight!r}")
    if getattr(order, "block", None) is not None:
        raise ValueError("balance='compute' groups bins of like cost into steps, but a mixture's steps hold each "
                         "source at its share (mix=); drop balance='compute' with mix=, or train on one dataset")
    return float(attention_weight)


def document_costs(lengths: np.ndarray, attention_weight: float) -> np.ndarray:
    """The estimated compute of each document: ``len + attention_weight * len**2`` (in tokens' worth).

    Example:
        >>> document_costs(np.array([10, 100]), 0.01).tolist()
        [11.0, 200.0]
    """
    lengths = lengths.astype(np.float64)
    return lengths + attention_weight * lengths * lengths


def refine(step: list[list[int]], costs: np.ndarray, lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """The documents of ``step`` (one bin per rank) redealt to lower the costliest rank's cost: repeatedly, the
    move of one document, or the swap of two, between the costliest rank and the cheapest rank that has one,
    bringing the pair's costs closest to their mean, with no rank over ``capacity`` tokens; until the costliest rank
    is within :data:`TOLERANCE` of the mean, or no such move is left.

    Example (the 8-token document, cost 40, ends alone; the rest, cost 30, fill the other rank's 12 tokens):
        >>> lengths = np.array([8, 1, 1, 1, 1, 4, 4])
        >>> refine([[0, 1, 2], [3, 4, 5, 6]], document_costs(lengths, 0.5), lengths, 12)
        [[0], [5, 6, 3, 4, 1, 2]]
    """
    ranks = [np.asarray(rows, dtype=np.int64) for rows in step]
    tokens = np.array([int(lengths[rows].sum()) for rows in ranks], dtype=np.int64)
    load = np.array([float(costs[rows].sum()) for rows in ranks])
    for _ in range(MAX_MOVES):
        if load.max() <= load.mean() * (1 + TOLERANCE):
            break
        heavy, exchange = int(load.argmax()), None
        for light in np.argsort(load, kind="stable").tolist():
            if light == heavy:
                break
            exchange = _best_exchange(ranks[heavy], ranks[light], load[heavy] - load[light], tokens[heavy],
                                      tokens[light], costs, lengths, capacity)
            if exchange is not None:
                break
        if exchange is None:
            break
        i, j, change, shift = exchange
        mine, theirs = ranks[heavy], ranks[light]
        ranks[heavy] = np.delete(mine, i) if j == len(theirs) else np.append(np.delete(mine, i), theirs[j])
        ranks[light] = np.append(np.delete(theirs, j) if j < len(theirs) else theirs, mine[i])
        tokens[heavy], tokens[light] = tokens[heavy] - shift, tokens[light] + shift
        load[heavy], load[light] = load[heavy] - change, load[light] + change
    return [rows[np.argsort(-lengths[rows], kind="stable")].tolist() for rows in ranks]


def _best_exchange(mine: np.ndarray, theirs: np.ndarray, gap: float, my_tokens: int, their_tokens: int,
                   costs: np.ndarray, lengths: np.ndarray, capacity: int) -> tuple[int, int, float, int] | None:
    """The move of one of ``mine`` to the other rank (``j == len(theirs)``), or its swap with ``theirs[j]``, that
    brings the two ranks' costs (``gap`` apart) closest to their mean within ``capacity`` tokens each:
    ``(i, j, cost moved, tokens moved)``, or None when none lowers the costlier rank's cost."""
    their_cost, their_length = np.append(costs[theirs], 0.0), np.append(lengths[theirs], 0)  # the last: a move
    change = costs[mine][:, None] - their_cost[None, :]
    shift = lengths[mine][:, None] - their_length[None, :]
    fits = (change > 0) & (change < gap) & (their_tokens + shift <= capacity) & (my_tokens - shift <= capacity)
    if not fits.any():
        return None
    i, j = np.unravel_index(int(np.where(fits, np.abs(change - gap / 2), np.inf).argmin()), fits.shape)
    return int(i), int(j), float(change[i, j]), int(shift[i, j])


def balanced_steps(bins: list[list[int]], costs: np.ndarray, lengths: np.ndarray, num_replicas: int, capacity: int,
                   window: int, rng: np.random.Generator) -> list[list[list[int]]]:
    """``bins`` (in the epoch's order, a multiple of ``num_replicas`` of them) as steps of one bin per rank: sorted
    by cost within windows of ``window`` steps, cut into steps, each step refined (:func:`refine`), and the steps of
    each window in ``rng``'s order. The bins keep their rows longest first, as :func:`refine` leaves them."""
    bin_costs = np.array([float(costs[rows].sum()) for rows in bins])
    steps: list[list[list[int]]] = []
    span = window * num_replicas
    for start in range(0, len(bins), span):
        numbers = np.arange(start, min(start + span, len(bins)))
        ranked = numbers[np.argsort(-bin_costs[numbers], kind="stable")].tolist()
        groups = [ranked[i : i + num_replicas] for i in range(0, len(ranked), num_replicas)]
        for i in rng.permutation(len(groups)).tolist():
            step, loads = [bins[n] for n in groups[i]], bin_costs[groups[i]]
            balanced = loads.max() <= loads.mean() * (1 + TOLERANCE)  # refine would leave it as it is
            steps.append(step if balanced else refine(step, costs, lengths, capacity))
    return steps


def step_balance(steps: list[list[list[int]]], costs: np.ndarray) -> tuple[float, float]:
    """``(epoch, worst)``: the summed costliest rank over the summed mean rank of every step (the time all ranks
    spend over the time they work, when a step lasts as long as its costliest rank), and the worst single step's
    max / mean."""
    loads = np.array([[float(costs[rows].sum()) for rows in step] for step in steps])
    if not len(loads):
        return 1.0, 1.0
    means = loads.mean(axis=1)
    return float(loads.max(axis=1).sum() / means.sum()), float((loads.max(axis=1) / means).max())
