"""Evaluation batches: every row exactly once across ranks, in storage order, equal batch counts per rank."""

from __future__ import annotations

import math

from engine.core.checks import check_int, check_rank
from engine.sampling.base import EpochBatchSampler


class ShardedEvalBatchSampler(EpochBatchSampler):
    """Evaluation batches: every row exactly once across ranks, in storage order, and the same number of
    batches on every rank, so collective calls in evaluation cannot hang (``DistributedSampler`` pads with
    duplicates instead, pytorch #25162). Ranks with fewer rows get slightly smaller last batches.

    Example:
        >>> [list(map(len, ShardedEvalBatchSampler(17, 4, num_replicas=2, rank=r))) for r in range(2)]
        [[4, 4, 1], [4, 3, 1]]
    """

    reseed_each_epoch = False  # the same masks every validation pass, so losses compare across epochs

    def __init__(
        self, num_samples: int, batch_size: int, *, seed: int = 0, num_replicas: int = 1, rank: int = 0
    ) -> None:
        rank, num_replicas = check_rank(rank, num_replicas)
        batch_size = check_int("batch_size", batch_size, minimum=1)
        num_samples = check_int("num_samples", num_samples, minimum=0)
        if 0 < num_samples < num_replicas:
            raise ValueError(
                f"{num_samples} evaluation rows cannot be shared by {num_replicas} ranks without duplicating rows; "
                f"give at least {num_replicas} rows or evaluate on fewer ranks"
            )
        super().__init__(seed=seed)
        self.num_samples, self.batch_size = num_samples, batch_size
        self.num_replicas, self.rank = num_replicas, rank

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        shard = list(range(self.rank, self.num_samples, self.num_replicas))
        longest = math.ceil(self.num_samples / self.num_replicas) if self.num_samples else 0
        count = math.ceil(longest / self.batch_size)
        sizes = [self.batch_size] * count
        excess = self.batch_size * count - len(shard)
        for index in reversed(range(count)):  # shrink the last batches, keeping every batch non-empty
            cut = min(excess, sizes[index] - 1)
            sizes[index] -= cut
            excess -= cut
        starts = [sum(sizes[:i]) for i in range(count)]
        return [shard[start : start + size] for start, size in zip(starts, sizes)]
