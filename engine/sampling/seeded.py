"""The plain training sampler: a seeded shuffle per epoch (or storage order), dealt to ranks, cut into batches."""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.core.checks import check_choice, check_int, check_rank
from engine.core.rng import derive_seed, generator_from
from engine.sampling.base import EpochBatchSampler
from engine.sampling.ranks import UNEVEN_POLICIES, deal_to_ranks, rows_per_rank


class SeededBatchSampler(EpochBatchSampler):
    """Yields batches of indices into a dataset of ``num_samples`` rows, in a seeded order per epoch.

    Args:
        num_samples: Rows in the dataset (or split view) being sampled.
        batch_size: Rows per batch.
        shuffle: Shuffle with a permutation derived from (seed, epoch); otherwise sequential.
        seed: Seed of the shuffle and of each batch's ``rng_seed``.
        drop_last: Drop this rank's last incomplete batch.
        num_replicas: Number of ranks sharing the data; each gets an equal share.
        rank: This process's rank.
        uneven: When rows don't divide evenly among ranks: ``pad`` repeats rows from the start of the
            epoch's order, ``drop`` leaves the tail out, so every rank sees the same number of batches.

    Example:
        >>> sampler = SeededBatchSampler(10, batch_size=4, shuffle=True, seed=0)
        >>> [len(b) for b in sampler], list(sampler) != list(sampler)  # a new order each epoch
        ([4, 4, 2], True)
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        uneven: str = "pad",
    ) -> None:
        num_samples = check_int("num_samples", num_samples, minimum=0)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        rank, num_replicas = check_rank(rank, num_replicas)
        check_choice("uneven", uneven, UNEVEN_POLICIES)
        super().__init__(seed=seed)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.uneven = uneven

    per_rank_option = "batch_size"

    @property
    def per_rank_size(self) -> int:
        """Rows per batch on each rank; the global batch is ``num_replicas * batch_size``."""
        return self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every row of ``epoch`` in the order the ranks share them: a seeded permutation, or storage order."""
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=generator_from(derive_seed(self.seed, epoch))).numpy()
        return np.arange(self.num_samples)

    def rank_indices(self, epoch: int) -> list[int]:
        """The indices this rank visits in ``epoch``, in order."""
        return deal_to_ranks(self.epoch_order(epoch), self.num_replicas, self.rank, self.uneven).tolist()

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> list[list[int]]:
        """``rank``'s batches of ``order`` on ``num_replicas`` ranks of ``per_rank_size`` rows: rows dealt round
        robin, so step ``p`` of all ranks together serves rows ``[p * global_batch, (p + 1) * global_batch)`` of
        ``order``."""
        rows = deal_to_ranks(order, num_replicas, rank, self.uneven).tolist()
        batches = [rows[start : start + per_rank_size] for start in range(0, len(rows), per_rank_size)]
        if self.drop_last and batches and len(batches[-1]) < per_rank_size:
            batches.pop()
        return batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return self.batches_of(self.epoch_order(epoch), epoch, self.num_replicas, self.rank, self.batch_size)

    def __len__(self) -> int:  # without computing an epoch's order, unless the epoch is the rest of a resumed one
        if self._pass.served:
            return super().__len__()
        rows = rows_per_rank(self.num_samples, self.num_replicas, self.uneven)
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)
