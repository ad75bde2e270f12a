"""The plain training sampler: a seeded shuffle per epoch (or storage order), dealt to ranks, cut into batches."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import torch

from engine.core.checks import check_choice, check_int, check_rank
from engine.core.rng import derive_seed, generator_from
from engine.sampling.base import EpochBatchSampler
from engine.sampling.blocks import EpochOrder
from engine.sampling.ranks import UNEVEN_POLICIES, deal_to_ranks, rows_per_rank


class RowBatches(Sequence[list[int]]):
    """One rank's batches of an epoch: its rows in one numpy array, cut every ``size`` rows when a batch is read.

    A list of lists would hold a Python int per row (tens of bytes each, written by every process that forks from
    this one and touches them); this holds 4 bytes a row (8 past 2**31 rows) and no Python object per row.
    """

    def __init__(self, rows: np.ndarray, size: int, drop_last: bool) -> None:
        self.rows = rows.astype(np.int32) if len(rows) and int(rows.max()) < 2**31 else rows
        self.size = size
        full, rest = divmod(len(rows), size)
        self._count = full + (rest > 0 and not drop_last)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> list[int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[list[int]]: ...

    def __getitem__(self, index: int | slice) -> list[int] | list[list[int]]:
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(self._count))]
        position = operator.index(index)
        if position < 0:
            position += self._count
        if not 0 <= position < self._count:
            raise IndexError(f"batch {index} of {self._count}")
        return self.rows[position * self.size:(position + 1) * self.size].tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RowBatches, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


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
        order: Sharded data: shuffle in the block order that keeps reads local (:mod:`engine.sampling.blocks`)
            rather than with a full permutation.

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
        order: EpochOrder | None = None,
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
        if order is not None and order.size != num_samples:
            raise ValueError(f"order should cover the {num_samples} rows sampled, but it orders {order.size}")
        self.order = order

    per_rank_option = "batch_size"

    @property
    def per_rank_size(self) -> int:
        """Rows per batch on each rank; the global batch is ``num_replicas * batch_size``."""
        return self.batch_size

    def state_dict(self) -> dict[str, Any]:
        """The base state, and when it shuffles in an order of its source's (sharded data's blocks; a mixture's
        order saves its own) that order's key (the ``shuffle_window``). A full permutation saves none, as before."""
        state = super().state_dict()
        key = self._order_key()
        if key is not None:
            state["order"] = key
        return state

    def _order_key(self) -> Any:
        shuffles_in_order = self.shuffle and self.order is not None and self.mixture is None
        return self.order.key if shuffles_in_order else None

    def check_options(self, state: dict[str, Any]) -> None:
        """Refuse a state saved shuffling in another order (another window, or blocks against a full permutation):
        the rest of its epoch would serve other rows. A state without ``order`` was saved by a full permutation
        (or before orders were recorded) and is not checked here."""
        if "order" not in state or not self.shuffle or self.mixture is not None:
            return
        ours = self._order_key()
        if state["order"] != ours:
            raise ValueError(f"sampler state was saved shuffling by {_shuffle_name(state['order'])}, but this "
                             f"sampler shuffles by {_shuffle_name(ours)}; resuming would serve other rows for the "
                             f"rest of the epoch. Resume over the same data with the same shuffle (for sharded "
                             f"data, the same Shards(shuffle_window=...))")

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every row of ``epoch`` in the order the ranks share them: a seeded permutation, or storage order."""
        if self.order is not None and (self.shuffle or self.order.always):
            return self.order.epoch_rows(self.seed, epoch)
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=generator_from(derive_seed(self.seed, epoch))).numpy()
        return np.arange(self.num_samples)

    def rank_indices(self, epoch: int) -> list[int]:
        """The indices this rank visits in ``epoch``, in order."""
        return deal_to_ranks(self.epoch_order(epoch), self.num_replicas, self.rank, self.uneven).tolist()

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> RowBatches:
        """``rank``'s batches of ``order`` on ``num_replicas`` ranks of ``per_rank_size`` rows: rows dealt round
        robin, so step ``p`` of all ranks together serves rows ``[p * global_batch, (p + 1) * global_batch)`` of
        ``order``."""
        return RowBatches(deal_to_ranks(order, num_replicas, rank, self.uneven), per_rank_size, self.drop_last)

    def epoch_batches(self, epoch: int) -> RowBatches:
        return self.batches_of(self.epoch_order(epoch), epoch, self.num_replicas, self.rank, self.batch_size)

    def __len__(self) -> int:  # without computing an epoch's order, unless the epoch is the rest of a resumed one
        if self._pass.served or (self.order is not None and self.order.varies):
            return super().__len__()
        rows = rows_per_rank(self.num_samples, self.num_replicas, self.uneven)
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)


def _shuffle_name(key: Any) -> str:
    """How a saved ``order`` key reads in a refusal."""
    return "a full permutation of the rows" if key is None else f"blocks with shuffle_window={key!r}"
