"""Length-aware batch samplers: rows of similar length share a batch, so little of each batch is padding.

Both samplers are :class:`engine.sampling.base.EpochBatchSampler` subclasses, so an epoch is a pure function of
(seed, epoch, rank), resume is exact and each batch carries its ``rng_seed``. Every epoch shuffles the rows,
cuts them into mega-batches, sorts each mega-batch by length, packs it into batches and shuffles the batches:
batch contents are near-uniform in length, the order of batches is still random epoch to epoch.
Lengths are read once from the source with :func:`engine.sources.lengths.lengths_of` (Arrow list offsets for HF
data).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from engine.core.checks import check_choice, check_int, check_rank
from engine.core.rng import derive_seed
from engine.sampling.balance import BalancedSteps, PaddedCost, check_balance
from engine.sampling.base import EpochBatchSampler
from engine.sampling.blocks import EpochOrder
from engine.sampling.ranks import UNEVEN_POLICIES, deal_to_ranks, equalize_batch_counts

OVERSIZED_POLICIES = ("error", "alone")
MEGA_BATCH_FACTOR = 50
"""Batches per run that the length-aware samplers sort by length, by default."""


def _as_lengths(lengths: Any) -> np.ndarray:
    array = np.asarray(lengths.numpy() if isinstance(lengths, torch.Tensor) else lengths)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"lengths should be a 1-D array of ints, but got shape {array.shape} of {array.dtype}")
    if array.size and array.min() < 0:
        raise ValueError(f"lengths should be >= 0, but row {int(array.argmin())} has length {int(array.min())}")
    return array.astype(np.int64)


class _LengthAware(EpochBatchSampler):
    """Shared parts: the epoch's permutation, mega-batch sorting, batch shuffling and a data fingerprint."""

    def __init__(self, lengths: Any, *, seed: int, mega_batch_factor: int, num_replicas: int, rank: int,
                 uneven: str, order: EpochOrder | None = None) -> None:
        mega_batch_factor = check_int("mega_batch_factor", mega_batch_factor, minimum=1)
        rank, num_replicas = check_rank(rank, num_replicas)
        check_choice("uneven", uneven, UNEVEN_POLICIES)
        super().__init__(seed=seed)
        self.lengths, self.mega_batch_factor = _as_lengths(lengths), mega_batch_factor
        self.num_replicas, self.rank, self.uneven = num_replicas, rank, uneven
        self.order = order
        """Sharded data: the block order that keeps reads local (:mod:`engine.sampling.blocks`); None: a full
        permutation."""

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every row of ``epoch`` in the seeded order the ranks share them (before grouping by length)."""
        if self.order is not None:
            return self.order.epoch_rows(self.seed, epoch)
        return np.random.default_rng(derive_seed(self.seed, "length-aware", epoch)).permutation(len(self.lengths))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return self.batches_of(self.epoch_order(epoch), epoch, self.num_replicas, self.rank, self.per_rank_size)

    def _sorted_chunks(self, order: np.ndarray, rows: int) -> list[np.ndarray]:
        """``order`` cut into mega-batches of ``rows``, each sorted by length, longest first (stable)."""
        chunks = []
        for start in range(0, len(order), rows):
            chunk = order[start : start + rows]
            chunks.append(chunk[np.argsort(-self.lengths[chunk], kind="stable")])
        return chunks

    def _window_rows(self, rows: int) -> int:
        """A window of about ``rows`` rows; under a mixture (an order with blocks of documents), a whole number of
        its blocks, so each window's rows hold every source at its share (:meth:`_shuffled` keeps windows apart)."""
        block = getattr(self.order, "block", None)
        return -(-rows // block) * block if block else rows

    def _windows(self) -> tuple[str, ...]:
        """A mixture's windows of whole blocks, in the fingerprint: a state saved before them resumed other batches."""
        return ("windows of whole blocks",) if getattr(self.order, "block", None) else ()

    def _shuffled(self, batches: list[list[int]], epoch: int, rank: int,
                  runs: list[int] | None = None) -> list[list[int]]:
        """``batches`` in a seeded order: over the whole epoch, or for sharded data (:attr:`order`) within runs of
        ``mega_batch_factor`` batches, which lie in one stretch of the block order (reads stay local). ``runs``:
        the batches of each window, shuffled within it (a mixture's windows are served one after the other)."""
        rng = np.random.default_rng(derive_seed(self.seed, "batch-order", epoch, rank))
        if self.order is None:
            return [batches[i] for i in rng.permutation(len(batches))]
        if runs is None or getattr(self.order, "block", None) is None:
            runs = [min(self.mega_batch_factor, len(batches) - start)
                    for start in range(0, len(batches), self.mega_batch_factor)]
        starts = np.r_[0, np.cumsum(runs)].astype(int).tolist()
        return [batches[start + i] for start, run in zip(starts, runs) for i in rng.permutation(run)]

    def _fingerprint(self) -> str:
        """Hash of the lengths and options, computed once, so ``state_dict`` stays microseconds per step. The
        ranks and the per-rank batch are not in it: the state is the same on every rank, and the base class checks
        the global batch when the number of ranks changes."""
        if getattr(self, "_digest", None) is None:
            digest = hashlib.blake2b(self.lengths.tobytes(), digest_size=8)
            digest.update(repr(self._options()).encode())
            self._digest = digest.hexdigest()
        return self._digest

    def _options(self) -> tuple[Any, ...]:
        order = (self.order.key,) if self.order is not None else ()  # states saved without one hash as before
        return (type(self).__name__, self.mega_batch_factor, self.uneven, *order)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fingerprint": self._fingerprint()}

    def check_options(self, state: dict[str, Any]) -> None:
        if "fingerprint" in state and state["fingerprint"] != self._fingerprint():
            raise ValueError(
                f"sampler state was saved from other lengths or options ({state['fingerprint']} != "
                f"{self._fingerprint()}); resuming would visit other batches. Resume with the same data, "
                f"{type(self).__name__} options, num_replicas and rank"
            )


class LengthGroupedBatchSampler(_LengthAware):
    """Batches of ``batch_size`` rows of similar length, in a shuffled order that changes every epoch.

    Args:
        lengths: Length of every row (1-D ints), e.g. from :func:`lengths_of`.
        batch_size: Rows per batch.
        seed: Seed of the shuffles; the epoch's batches are a function of (seed, epoch, rank).
        mega_batch_factor: Rows are sorted within windows of ``mega_batch_factor * batch_size`` shuffled rows;
            larger means less padding and less randomness of batch contents.
        drop_last: Drop this rank's one incomplete batch.
        num_replicas, rank: Ranks sharing the data; the rows are dealt out before grouping.
        uneven: When rows don't divide evenly among ranks, ``pad`` repeats rows from the start of the epoch's
            order, ``drop`` leaves the tail out; either way every rank gets the same number of batches.

    Example:
        >>> sampler = LengthGroupedBatchSampler([5, 50, 6, 49, 7, 48], batch_size=2, seed=0)
        >>> sorted(sorted([5, 50, 6, 49, 7, 48][i] for i in batch) for batch in sampler)
        [[5, 6], [7, 48], [49, 50]]
    """

    def __init__(self, lengths: Any, batch_size: int, *, seed: int = 0, mega_batch_factor: int = MEGA_BATCH_FACTOR,
                 drop_last: bool = False, num_replicas: int = 1, rank: int = 0, uneven: str = "pad",
                 order: EpochOrder | None = None) -> None:
        batch_size = check_int("batch_size", batch_size, minimum=1)
        super().__init__(lengths, seed=seed, mega_batch_factor=mega_batch_factor, num_replicas=num_replicas,
                         rank=rank, uneven=uneven, order=order)
        self.batch_size, self.drop_last = batch_size, drop_last

    per_rank_option = "batch_size"

    @property
    def per_rank_size(self) -> int:
        """Rows per batch on each rank; the global batch is ``num_replicas * batch_size``."""
        return self.batch_size

    def _options(self) -> tuple[Any, ...]:
        return (*super()._options(), self.drop_last)

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> list[list[int]]:
        """``rank``'s batches of ``order`` on ``num_replicas`` ranks: its rows, grouped by length, shuffled."""
        order, size = deal_to_ranks(order, num_replicas, rank, self.uneven), per_rank_size
        batches = [chunk[start : start + size].tolist()
                   for chunk in self._sorted_chunks(order, size * self.mega_batch_factor)
                   for start in range(0, len(chunk), size)]
        if self.drop_last and batches and len(batches[-1]) < size:
            batches.pop()  # only the last mega-batch can end short, since mega-batches hold whole batches
        return self._shuffled(batches, epoch, rank)


class TokenBudgetBatchSampler(BalancedSteps, _LengthAware):
    """Batches whose padded size (rows x longest row) stays within ``max_tokens``, shuffled every epoch.

    Rows are dealt out to ranks, then each rank packs its rows; since batch counts then differ, every rank
    computes all ranks' counts from the same (seed, epoch) (no communication) and ``uneven='pad'`` repeats
    whole batches from the start of its own order up to the largest count, ``'drop'`` drops its last
    batches down to the smallest.

    Args:
        lengths: Length of every row (1-D ints), e.g. from :func:`lengths_of`.
        max_tokens: Most padded tokens per batch, ``len(batch) * max(lengths in batch)``.
        seed: Seed of the shuffles.
        mega_batch_factor: Rows are sorted within windows of ``mega_batch_factor`` typical batches
            (``max_tokens // mean length`` rows each).
        max_batch_size: Most rows per batch (None: no limit beyond the budget).
        pad_to_multiple_of: Count lengths rounded up to this multiple, as the collator will pad them.
        oversized: A row longer than ``max_tokens``: ``'error'`` raises at construction naming it, ``'alone'``
            gives it a batch of its own (the only batches allowed over budget).
        num_replicas, rank, uneven: As above.
        balance: ``tokens``: every rank's batch keeps the budget; ``compute``: also, each step's rows are dealt
            to its ranks so their estimated compute, ``rows * (L + attention_weight * L**2)`` for a batch padded
            to ``L``, is about the same (:mod:`engine.sampling.balance`).
        attention_weight: The cost of one ``L**2`` term in tokens' worth, for ``balance='compute'``.
    """

    def __init__(self, lengths: Any, max_tokens: int, *, seed: int = 0, mega_batch_factor: int = MEGA_BATCH_FACTOR,
                 max_batch_size: int | None = None, pad_to_multiple_of: int = 1, oversized: str = "error",
                 num_replicas: int = 1, rank: int = 0, uneven: str = "pad", order: EpochOrder | None = None,
                 balance: str = "tokens", attention_weight: float | None = None) -> None:
        max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        self.attention_weight = check_balance(balance, attention_weight)
        self.balance = balance
        pad_to_multiple_of = check_int("pad_to_multiple_of", pad_to_multiple_of, minimum=1)
        if max_batch_size is not None:
            max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        check_choice("oversized", oversized, OVERSIZED_POLICIES)
        super().__init__(lengths, seed=seed, mega_batch_factor=mega_batch_factor, num_replicas=num_replicas,
                         rank=rank, uneven=uneven, order=order)
        self.max_tokens, self.max_batch_size, self.oversized = max_tokens, max_batch_size, oversized
        self.pad_to_multiple_of = multiple = pad_to_multiple_of
        self.costs = np.maximum(-(-self.lengths // multiple) * multiple, 1)  # an empty row still takes a slot
        over = np.flatnonzero(self.costs > max_tokens)
        if len(over) and oversized == "error":
            raise ValueError(
                f"{len(over)} row(s) are longer than max_tokens={max_tokens}: row {int(over[0])} has "
                f"{int(self.lengths[over[0]])} tokens (longest: {int(self.lengths.max())}); raise max_tokens, "
                f"truncate (spec.max_seq_len), or pass oversized='alone' to give each such row a batch of its own"
            )
        self.mega_batch_rows = self._mega_batch_rows(max_tokens)

    per_rank_option = "max_tokens"

    @property
    def per_rank_size(self) -> int:
        """The token budget of each rank's batch; the global budget is ``num_replicas * max_tokens``."""
        return self.max_tokens

    def _mega_batch_rows(self, max_tokens: int) -> int:
        typical = max(1, max_tokens // max(1, int(self.costs.mean()))) if len(self.costs) else 1
        return self.mega_batch_factor * min(typical, self.max_batch_size or typical)

    def _options(self) -> tuple[Any, ...]:
        return (*super()._options(), self.max_batch_size, self.pad_to_multiple_of, self.oversized, *self._windows(),
                *self._balance_options())

    def _pack(self, rows: np.ndarray, max_tokens: int, runs: list[int] | None = None) -> list[list[int]]:
        """Greedy packing of each sorted mega-batch: longest first, so a batch's first row sets its width.
        ``runs``, when given, gets the number of batches of each mega-batch."""
        batches, cap = [], self.max_batch_size or len(self.lengths) or 1
        for chunk in self._sorted_chunks(rows, self._window_rows(self._mega_batch_rows(max_tokens))):
            costs, start, before = self.costs[chunk], 0, len(batches)
            while start < len(chunk):
                count = min(max(1, max_tokens // int(costs[start])), cap)
                batches.append(chunk[start : start + count].tolist())
                start += count
            if runs is not None:
                runs.append(len(batches) - before)
        return batches

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> list[list[int]]:
        """``rank``'s batches of ``order`` on ``num_replicas`` ranks with a budget of ``per_rank_size`` tokens
        (under ``balance='compute'``: its batch of every balanced step)."""
        if self.balance == "compute" and num_replicas > 1:
            return [step[rank] for step in self.steps_of(order, epoch, num_replicas, per_rank_size)]
        return self._rank_batches(order, epoch, num_replicas, per_rank_size, [rank])[0][0]

    def _rank_batches(self, order: np.ndarray, epoch: int, num_replicas: int, per_rank_size: int,
                      ranks: list[int]) -> tuple[list[list[list[int]]], int]:
        """The batches of each of ``ranks`` (each rank packs the rows dealt to it and shuffles its batches, and
        every rank gets as many, by ``uneven``), and the fewest batches a rank packed."""
        runs: list[list[int]] = [[] for _ in range(num_replicas)]
        per_rank = [self._pack(order[r::num_replicas], per_rank_size, runs[r]) for r in range(num_replicas)]
        mine = [self._shuffled(per_rank[r], epoch, r, runs[r]) for r in ranks]
        if num_replicas > 1:
            mine = [equalize_batch_counts(one, per_rank, self.uneven) for one in mine]
        return mine, min(len(batches) for batches in per_rank)

    def plain_steps(self, order: np.ndarray, epoch: int, num_replicas: int,
                    per_rank_size: int) -> tuple[list[list[list[int]]], int]:
        """Every rank's batches, the ``k``-th of each making step ``k``; the steps before the first that repeats
        (or drops) a batch are whole."""
        per_rank, whole = self._rank_batches(order, epoch, num_replicas, per_rank_size, list(range(num_replicas)))
        return [list(step) for step in zip(*per_rank)], whole

    def cost_model(self, per_rank_size: int) -> PaddedCost:
        """A rank's batch costs its padded rows, within ``per_rank_size`` padded tokens and ``max_batch_size``."""
        return PaddedCost(self.costs, self.attention_weight or 0.0, per_rank_size, self.max_batch_size)
