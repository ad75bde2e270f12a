"""Packed batching: whole documents concatenated into sequences of at most ``max_tokens`` tokens, no padding.

Each batch is one *bin*: a list of row indices whose lengths sum to at most ``max_tokens``; the packed collator
(:mod:`collators.packed`) lays it out as ``input_ids`` of shape ``[1, T]`` with ``T`` the sum of the lengths,
so every position is a real token. Per epoch the rows are shuffled (seeded by (seed, epoch)), cut into windows of
``mega_batch_factor`` bins' worth of rows, and each window is packed best-fit decreasing; the rows of a window's
emptiest bin join the next window, so only the epoch's last window leaves a short bin and the bins use over 99%
of ``max_tokens`` (measured in tests/engine/sampling/test_packed.py and benchmarks/bench_packing.py). The bins are
then shuffled and dealt to ranks, so every rank gets the same number of bins and, on one rank, every row appears
exactly once per epoch.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from engine.core.checks import check_int
from engine.sampling.balance import BalancedSteps, SummedCost, check_balance, document_costs
from engine.sampling.blocks import EpochOrder
from engine.sampling.length import _LengthAware
from engine.sampling.ranks import deal_to_ranks


def best_fit_decreasing(rows: np.ndarray, lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Pack ``rows`` (already sorted longest first) into bins of at most ``capacity`` tokens, each row into the
    fullest bin that still holds it (a new bin when none does). Bins keep their rows longest first.

    Example:
        >>> best_fit_decreasing(np.array([0, 1, 2, 3]), np.array([6, 5, 4, 1]), 10)
        [[0, 2], [1, 3]]
    """
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (tokens still free, bin number), sorted: the first that fits is the fullest
    for row, length in zip(rows.tolist(), lengths[rows].tolist()):
        slot = bisect.bisect_left(free, (length, -1))
        if slot == len(free):
            bins.append([row])
            remaining, number = capacity - length, len(bins) - 1
        else:
            remaining, number = free.pop(slot)
            bins[number].append(row)
            remaining -= length
        if remaining:
            bisect.insort(free, (remaining, number))
    return bins


class PackedBatchSampler(BalancedSteps, _LengthAware):
    """Bins of whole rows with at most ``max_tokens`` tokens in all, a new seeded packing and order every epoch.

    Args:
        lengths: Tokens of every row (1-D ints), e.g. from :func:`engine.sources.lengths.lengths_of`.
        max_tokens: The token budget of one packed sequence: a bin's lengths sum to at most this.
        seed: Seed of the shuffles; an epoch's bins are a function of (seed, epoch, rank).
        mega_batch_factor: Rows are packed within windows of about this many bins' worth of shuffled rows; larger
            fills bins more evenly, smaller mixes lengths more randomly.
        max_length: Count each row as at most this many tokens, as the packed collator will cut it (its
            ``max_length``, default ``spec.max_seq_len``); None counts rows whole.
        num_replicas, rank: Ranks sharing the data; the epoch's bins are dealt to them round robin.
        uneven: When the bins don't divide evenly among ranks, ``pad`` repeats bins from the start of the epoch's
            order, ``drop`` leaves the last few out; either way every rank gets the same number of batches.
        balance: ``tokens``: every rank's bin holds at most ``max_tokens`` tokens; ``compute``: also, each step's
            documents are dealt to its ranks so their estimated compute, ``tokens + attention_weight *
            sum(len**2)``, is about the same (:mod:`engine.sampling.balance`).
        attention_weight: The cost of one ``len**2`` term in tokens' worth, for ``balance='compute'`` (about
            ``1 / (12 * d)`` for a transformer of width ``d``).

    Raises:
        ValueError: A row is empty, or longer than ``max_tokens`` (the message names the row and its length).

    Example:
        >>> sampler = PackedBatchSampler([3, 5, 2, 4, 6], max_tokens=10, seed=0)
        >>> bins = list(sampler)
        >>> sorted(row for b in bins for row in b), [sum([3, 5, 2, 4, 6][row] for row in b) <= 10 for b in bins]
        ([0, 1, 2, 3, 4], [True, True])
    """

    def __init__(self, lengths: Any, max_tokens: int, *, seed: int = 0, mega_batch_factor: int = 64,
                 max_length: int | None = None, num_replicas: int = 1, rank: int = 0, uneven: str = "pad",
                 order: EpochOrder | None = None, balance: str = "tokens",
                 attention_weight: float | None = None) -> None:
        max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        self.attention_weight = check_balance(balance, attention_weight)
        self.balance = balance
        if max_length is not None:
            max_length = check_int("max_length", max_length, minimum=1)
        super().__init__(lengths, seed=seed, mega_batch_factor=mega_batch_factor, num_replicas=num_replicas,
                         rank=rank, uneven=uneven, order=order)
        self.max_tokens, self.max_length = max_tokens, max_length
        if max_length is not None:  # counted as the collator will cut them
            self.lengths = np.minimum(self.lengths, max_length)
        if len(self.lengths) and self.lengths.min() == 0:
            row = int(np.flatnonzero(self.lengths == 0)[0])
            raise ValueError(f"row {row} has 0 tokens, but packing needs every document to hold at least one "
                             f"token; filter empty rows out of the data (e.g. dataset.filter(len))")
        over = np.flatnonzero(self.lengths > max_tokens)
        if len(over):
            raise ValueError(
                f"{len(over)} row(s) are longer than max_tokens={max_tokens}: row {int(over[0])} has "
                f"{int(self.lengths[over[0]])} tokens (longest: {int(self.lengths.max())}); packing keeps documents "
                f"whole, so raise max_tokens to at least {int(self.lengths.max())}, or truncate long rows (the "
                f"spec's max_seq_len, the collator's max_length) or split them before packing"
            )
        self.costs = document_costs(self.lengths, self.attention_weight or 0.0)
    per_rank_option = "max_tokens"

    @property
    def per_rank_size(self) -> int:
        """The token budget of each rank's packed sequence; a step of all ranks packs ``num_replicas`` of them."""
        return self.max_tokens

    def _options(self) -> tuple[Any, ...]:  # not max_tokens: the base class checks the global budget on resume
        return (*super()._options(), self.max_length, *self._windows(), *self._balance_options())

    def pack(self, order: np.ndarray, max_tokens: int, runs: list[int] | None = None) -> list[list[int]]:
        """``order``'s rows in bins of at most ``max_tokens`` tokens: best-fit decreasing within windows of about
        ``mega_batch_factor`` bins' worth of rows, the emptiest bin of each window joining the next one. Under a
        mixture, windows are whole blocks of its documents and keep their bins (no rows join the next window), so
        every window holds each source at its share. ``runs``, when given, gets the number of bins of each window."""
        over = np.flatnonzero(self.lengths[order] > max_tokens)
        if len(over):  # only after an elastic resume onto more ranks, whose per-rank budget is smaller
            row = int(order[over[0]])
            raise ValueError(f"row {row} has {int(self.lengths[row])} tokens, more than the per-rank budget "
                             f"max_tokens={max_tokens} of this resume; resume on fewer ranks (a larger per-rank "
                             f"budget) or split long rows")
        mean = float(self.lengths.mean()) if len(self.lengths) else 1.0
        window_rows = self._window_rows(self.mega_batch_factor * max(1, int(max_tokens // mean)))
        mixed = getattr(self.order, "block", None) is not None
        bins, carried = [], np.empty(0, dtype=np.int64)
        for start in range(0, len(order), window_rows):
            window = np.concatenate([carried, order[start : start + window_rows]])
            packed = best_fit_decreasing(window[np.argsort(-self.lengths[window], kind="stable")], self.lengths,
                                         max_tokens)
            if start + window_rows < len(order) and not mixed:  # the emptiest bin's rows join the next window
                emptiest = min(range(len(packed)), key=lambda number: int(self.lengths[packed[number]].sum()))
                carried = np.asarray(packed.pop(emptiest), dtype=np.int64)
            bins.extend(packed)
            if runs is not None:
                runs.append(len(packed))
        return bins

    def _bins(self, order: np.ndarray, max_tokens: int, epoch: int) -> list[list[int]]:
        """Every rank's bins of ``order``, shuffled alike on every rank (a mixture's: within each window)."""
        runs: list[int] = []
        return self._shuffled(self.pack(order, max_tokens, runs), epoch, 0, runs)

    def all_bins(self, epoch: int) -> list[list[int]]:
        """Every rank's bins of ``epoch`` together, in their shuffled order (before they are dealt to ranks)."""
        return self._bins(self.epoch_order(epoch), self.max_tokens, epoch)

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> list[list[int]]:
        """``rank``'s bins of ``order`` on ``num_replicas`` ranks: all bins packed and shuffled alike on every rank
        (rank 0's stream), then dealt round robin (under ``balance='compute'``: its bin of every balanced step), so
        every rank gets the same number."""
        if self.balance == "compute" and num_replicas > 1:
            return [step[rank] for step in self.steps_of(order, epoch, num_replicas, per_rank_size)]
        bins = self._bins(order, per_rank_size, epoch)
        if num_replicas == 1:
            return bins
        mine = deal_to_ranks(np.arange(len(bins)), num_replicas, rank, self.uneven)
        return [bins[number] for number in mine.tolist()]

    def plain_steps(self, order: np.ndarray, epoch: int, num_replicas: int,
                    per_rank_size: int) -> tuple[list[list[list[int]]], int]:
        """The bins of ``order`` dealt round robin as steps; the bins left over make the last step, with
        ``uneven='pad'``'s repeats of the first bins, or are left out with ``'drop'``."""
        bins = self._bins(order, per_rank_size, epoch)
        whole = len(bins) - len(bins) % num_replicas
        steps = [bins[start : start + num_replicas] for start in range(0, whole, num_replicas)]
        if whole < len(bins) and self.uneven == "pad":
            steps.append([bins[n % len(bins)] for n in range(whole, whole + num_replicas)])
        return steps, whole // num_replicas

    def cost_model(self, per_rank_size: int) -> SummedCost:
        """A rank's packed sequence costs the sum of its documents' costs, within ``per_rank_size`` tokens."""
        return SummedCost(self.lengths, self.costs, per_rank_size)

    def fill(self, epoch: int = 0) -> float:
        """Share of the token budget the bins of ``epoch`` use: tokens / (bins x ``max_tokens``), on all ranks."""
        bins = self.all_bins(epoch)
        return float(self.lengths.sum()) / (len(bins) * self.max_tokens) if bins else 1.0
