"""Compute-balanced steps of packed and token-budget batching: each step's documents dealt to ranks so that every
rank's estimated compute is about the same, not only its tokens.

Packing gives every rank the same number of tokens, but attention costs grow with the square of each document's
length, so a rank whose sequence holds one long document works longer than a rank whose sequence holds many short
ones, and the other ranks wait at the step's collective. The cost of a rank's packed sequence is modelled as
``tokens + attention_weight * sum(len ** 2)`` (per layer, the linear layers cost about ``24 * d**2`` per token and
causal attention about ``2 * d * len**2`` per document, so ``attention_weight`` is about ``1 / (12 * d)`` for a
model of width ``d``; or measure it). A token-budget batch is padded to its longest row, so its cost is
``rows * (L + attention_weight * L**2)`` with ``L`` that padded length (:class:`PaddedCost`). Two moves balance
the steps, both pure functions of the epoch's plain steps, so every rank computes every step alike without
communicating, and resume and elastic resume stay exact:

1. *grouping*: within windows of ``window`` steps' worth of batches (in the epoch's shuffled order), batches are
   sorted by cost and cut into steps of ``num_replicas`` batches, so the batches of one step cost about the same (a
   batch holding one very long document meets others like it); the steps of a window are then shuffled. A
   mixture's steps are not grouped: each keeps the rows it serves without balancing, so each source's share of it
   stays what the mixture made it;
2. *refining*: within a step, documents move or swap between the costliest rank and the cheapest ones, never over
   a rank's token budget, while that lowers the costliest rank's cost (:func:`refine`).

Refining alone moves little when the batches are full: a rank that holds a long document needs fewer tokens to cost
the mean, and a step whose batches are all near the budget has no room for the tokens it gives up. So a mixture's
steps, which are only refined, come out about as balanced as without balancing; grouping does the work.

Every document stays in its step, so every document is served exactly once per epoch, as without balancing.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import Any, Protocol

import numpy as np

from engine.core.rng import derive_seed

BALANCE_MODES = ("tokens", "compute")
"""``tokens``: every rank's batch has the same token budget (plain packing or token budgets); ``compute``: the steps
are also balanced by the cost model."""

TOLERANCE = 0.005
"""Refining a step stops once its costliest rank is within this share of the mean rank: closer is not worth the
loader's time."""

MAX_MOVES = 64
"""Most moves or swaps refining one step: each lowers the costlier rank of a pair, so it ends anyway; this bounds
the loader's time per step."""


def check_balance(balance: str, attention_weight: Any) -> float | None:
    """``attention_weight`` as a float for ``balance='compute'`` (None for ``'tokens'``), after refusing what cannot
    hold: another mode, a weight that is not a finite number >= 0, and a weight without balancing."""
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
    return float(attention_weight)


def document_costs(lengths: np.ndarray, attention_weight: float) -> np.ndarray:
    """The estimated compute of each document: ``len + attention_weight * len**2`` (in tokens' worth).

    Example:
        >>> document_costs(np.array([10, 100]), 0.01).tolist()
        [11.0, 200.0]
    """
    lengths = lengths.astype(np.float64)
    return lengths + attention_weight * lengths * lengths


class CostModel(Protocol):
    """How a batching mode costs a rank's batch and which batches it allows: :class:`SummedCost` (packed) or
    :class:`PaddedCost` (token budgets)."""

    lengths: np.ndarray

    def load(self, rows: np.ndarray) -> float: ...

    def exchanges(self, mine: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class SummedCost:
    """Packed sequences: a rank's cost is the sum of its documents' :func:`document_costs`; it holds at most
    ``capacity`` tokens."""

    def __init__(self, lengths: np.ndarray, costs: np.ndarray, capacity: int) -> None:
        self.lengths, self.costs, self.capacity = lengths, costs, capacity

    def load(self, rows: np.ndarray) -> float:
        return float(self.costs[rows].sum())

    def exchanges(self, mine: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Both ranks' costs after moving ``mine[i]`` to the other rank (``j == len(theirs)``) or swapping it with
        ``theirs[j]``, and whether both then keep the budget: three ``[len(mine), len(theirs) + 1]`` arrays."""
        their_cost, their_length = np.append(self.costs[theirs], 0.0), np.append(self.lengths[theirs], 0)
        change = self.costs[mine][:, None] - their_cost[None, :]
        shift = self.lengths[mine][:, None] - their_length[None, :]
        my_tokens, their_tokens = int(self.lengths[mine].sum()), int(self.lengths[theirs].sum())
        fits = (their_tokens + shift <= self.capacity) & (my_tokens - shift <= self.capacity)
        return self.load(mine) - change, self.load(theirs) + change, fits

class PaddedCost:
    """Token-budget batches: a batch is padded to its longest row (``widths``: each row's padded length), so its
    cost is ``rows * (L + attention_weight * L**2)`` with ``L`` its widest row; it keeps ``rows * L <= capacity``
    (a row alone may be wider) and at most ``max_rows`` rows."""

    def __init__(self, widths: np.ndarray, attention_weight: float, capacity: int, max_rows: int | None) -> None:
        self.lengths, self.weight, self.capacity = widths, attention_weight, capacity
        self.max_rows = max_rows or len(widths) or 1

    def _cost(self, rows: np.ndarray, width: np.ndarray) -> np.ndarray:
        return rows * (width + self.weight * width.astype(np.float64) ** 2)

    def load(self, rows: np.ndarray) -> float:
        return float(self._cost(np.array(len(rows)), self.lengths[rows].max(initial=0)))

    def _fits(self, rows: np.ndarray, width: np.ndarray) -> np.ndarray:
        return (rows > 0) & (rows <= self.max_rows) & ((rows * width <= self.capacity) | (rows == 1))

    def exchanges(self, mine: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`SummedCost.exchanges`, with each batch's width its widest row after the exchange."""
        my_widths, their_widths = self.lengths[mine], self.lengths[theirs]
        moved = np.append(their_widths, 0)
        kept = np.append(_widest_without(their_widths), their_widths.max(initial=0))
        my_width = np.maximum(_widest_without(my_widths)[:, None], moved[None, :])
        their_width = np.maximum(kept[None, :], my_widths[:, None])
        swap = np.arange(len(theirs) + 1) < len(theirs)
        my_rows = np.broadcast_to(len(mine) - 1 + swap, my_width.shape)
        their_rows = np.broadcast_to(len(theirs) + 1 - swap, my_width.shape)
        fits = self._fits(my_rows, my_width) & self._fits(their_rows, their_width)
        return self._cost(my_rows, my_width), self._cost(their_rows, their_width), fits

def _widest_without(widths: np.ndarray) -> np.ndarray:
    """For each ``i``, the widest of ``widths`` other than ``widths[i]`` (0 when none is left)."""
    if len(widths) < 2:
        return np.zeros(len(widths), dtype=widths.dtype)
    first = int(widths.argmax())
    rest = np.delete(widths, first).max()
    out = np.full(len(widths), widths[first])
    out[first] = rest
    return out


def refine(step: list[list[int]], model: CostModel) -> list[list[int]]:
    """The documents of ``step`` (one batch per rank) redealt to lower the costliest rank's cost: repeatedly, the
    move of one document, or the swap of two, between the costliest rank and the cheapest rank that has one,
    bringing the pair's costlier rank lowest, with every batch allowed by ``model``; until the costliest rank is
    within :data:`TOLERANCE` of the mean, or no such move is left. Batches keep their rows longest first.

    Example (the 8-token document, cost 40, ends alone; the rest, cost 30, fill the other rank's 12 tokens):
        >>> lengths = np.array([8, 1, 1, 1, 1, 4, 4])
        >>> refine([[0, 1, 2], [3, 4, 5, 6]], SummedCost(lengths, document_costs(lengths, 0.5), 12))
        [[0], [5, 6, 3, 4, 1, 2]]
    """
    ranks = [np.asarray(rows, dtype=np.int64) for rows in step]
    load = np.array([model.load(rows) for rows in ranks])
    for _ in range(MAX_MOVES):
        if load.max() <= load.mean() * (1 + TOLERANCE):
            break
        heavy, exchange = int(load.argmax()), None
        for light in np.argsort(load, kind="stable").tolist():
            if light == heavy:
                break
            exchange = _best_exchange(ranks[heavy], ranks[light], float(load[heavy]), model)
            if exchange is not None:
                break
        if exchange is None:
            break
        i, j = exchange
        mine, theirs = ranks[heavy], ranks[light]
        ranks[heavy] = np.delete(mine, i) if j == len(theirs) else np.append(np.delete(mine, i), theirs[j])
        ranks[light] = np.append(np.delete(theirs, j) if j < len(theirs) else theirs, mine[i])
        load[heavy], load[light] = model.load(ranks[heavy]), model.load(ranks[light])
    return [rows[np.argsort(-model.lengths[rows], kind="stable")].tolist() for rows in ranks]


def _best_exchange(mine: np.ndarray, theirs: np.ndarray, heaviest: float,
                   model: CostModel) -> tuple[int, int] | None:
    """The move of one of ``mine`` to the other rank (``j == len(theirs)``), or its swap with ``theirs[j]``, that
    leaves the costlier of the two ranks cheapest, below ``heaviest`` (the cost of ``mine``): ``(i, j)``, or None
    when no allowed exchange lowers it."""
    my_cost, their_cost, fits = model.exchanges(mine, theirs)
    worse = np.maximum(my_cost, their_cost)
    fits = fits & (worse < heaviest)
    if not fits.any():
        return None
    i, j = np.unravel_index(int(np.where(fits, worse, np.inf).argmin()), fits.shape)
    return int(i), int(j)


def balanced_steps(steps: list[list[list[int]]], whole: int, model: CostModel, window: int | None,
                   rng: np.random.Generator) -> list[list[list[int]]]:
    """The epoch's plain ``steps`` (a batch per rank, in the epoch's order) balanced: the first ``whole`` (those
    without a repeated batch) grouped by cost within windows of ``window`` steps, their windows' steps in ``rng``'s
    order, and refined; the rest (``uneven='pad'``'s repeats) refined in place, so repeats stay at the epoch's end.
    ``window=None`` (a mixture) keeps every step's rows and order, each step refined."""
    if window is None:
        return [refine(step, model) for step in steps]
    bins = [batch for step in steps[:whole] for batch in step]
    num_replicas = len(steps[0]) if steps else 1
    bin_costs = np.array([model.load(np.asarray(rows, dtype=np.int64)) for rows in bins])
    balanced: list[list[list[int]]] = []
    span = window * num_replicas
    for start in range(0, len(bins), span):
        numbers = np.arange(start, min(start + span, len(bins)))
        ranked = numbers[np.argsort(-bin_costs[numbers], kind="stable")].tolist()
        groups = [ranked[i : i + num_replicas] for i in range(0, len(ranked), num_replicas)]
        for i in rng.permutation(len(groups)).tolist():
            step, loads = [bins[n] for n in groups[i]], bin_costs[groups[i]]
            even = loads.max() <= loads.mean() * (1 + TOLERANCE)  # refine would leave it as it is
            balanced.append(step if even else refine(step, model))
    return balanced + [refine(step, model) for step in steps[whole:]]


def step_balance(steps: list[list[list[int]]], model: CostModel | np.ndarray) -> tuple[float, float]:
    """``(epoch, worst)``: the summed costliest rank over the summed mean rank of every step (the time all ranks
    spend over the time they work, when a step lasts as long as its costliest rank), and the worst single step's
    max / mean. ``model``: a :class:`CostModel`, or each document's cost (packed sequences)."""
    if isinstance(model, np.ndarray):
        costs = model
        loads = np.array([[float(costs[rows].sum()) for rows in step] for step in steps])
    else:
        loads = np.array([[model.load(np.asarray(rows, dtype=np.int64)) for rows in step] for step in steps])
    if not len(loads):
        return 1.0, 1.0
    means = loads.mean(axis=1)
    return float(loads.max(axis=1).sum() / means.sum()), float((loads.max(axis=1) / means).max())


class BalancedSteps:
    """The part of :class:`~engine.sampling.packed.PackedBatchSampler` and
    :class:`~engine.sampling.length.TokenBudgetBatchSampler` that balances their steps: a sampler gives its plain
    steps (:meth:`plain_steps`) and its :class:`CostModel` (:meth:`cost_model`), and under ``balance='compute'``
    every rank's batches are its batch of every balanced step."""

    balance: str
    attention_weight: float | None
    seed: int
    mega_batch_factor: int
    order: Any
    _steps: tuple[Any, list[list[list[int]]]] | None = None
    """The last balanced epoch, for every rank."""

    def plain_steps(self, order: np.ndarray, epoch: int, num_replicas: int,
                    per_rank_size: int) -> tuple[list[list[list[int]]], int]:
        """The steps of ``order`` without balancing (a batch per rank), and how many of the first hold no repeat."""
        raise NotImplementedError

    def cost_model(self, per_rank_size: int) -> CostModel:
        """The cost of a rank's batch, and the batches allowed, under a per-rank budget of ``per_rank_size``."""
        raise NotImplementedError

    def _balance_options(self) -> tuple[Any, ...]:
        """What balancing adds to the sampler's fingerprint: a state saved without it resumed other batches."""
        return ("balance compute", self.attention_weight) if self.balance == "compute" else ()

    def steps_of(self, order: np.ndarray, epoch: int, num_replicas: int, per_rank_size: int) -> list[list[list[int]]]:
        """Every step of ``order`` on ``num_replicas`` ranks under ``balance='compute'``, a batch per rank: the
        plain steps balanced (:func:`balanced_steps`), seeded by (seed, epoch); a mixture's steps each keep their
        rows. The last order's steps are kept, since every rank's call (and an elastic resume's replay of each rank)
        asks for them."""
        key = (epoch, num_replicas, per_rank_size, hashlib.blake2b(order.tobytes(), digest_size=16).digest())
        if self._steps is None or self._steps[0] != key:
            steps, whole = self.plain_steps(order, epoch, num_replicas, per_rank_size)
            mixed = getattr(self.order, "block", None) is not None
            rng = np.random.default_rng(derive_seed(self.seed, "balance", epoch))
            self._steps = (key, balanced_steps(steps, whole, self.cost_model(per_rank_size),
                                               None if mixed else self.mega_batch_factor, rng))
        return self._steps[1]
