"""Seeded, epoch-aware, rank-aware and stateful batch sampling.

The order of an epoch is a pure function of (seed, epoch): iterating again gives the next epoch's order,
``set_epoch`` pins one, and ``state_dict`` is three integers, so saving it every step costs nothing.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from engine.epochs import set_epoch as set_loader_epoch
from engine.rng import batch_seed, derive_seed, generator_from

UNEVEN_POLICIES = ("pad", "drop")


class BatchIndices(list):
    """A batch of sample indices that carries the seed of its randomness to wherever the batch is built."""

    rng_seed: int | None = None


class EpochHandle:
    """What Lightning reads as ``batch_sampler.sampler``: it calls ``set_epoch`` there at every epoch start.
    This forwards it to the batch sampler that owns the order and, once :meth:`attach` gave it the loader, to
    every dataset on the loader's path that defines ``set_epoch`` (curriculum datasets)."""

    def __init__(self, owner: EpochBatchSampler) -> None:
        self.owner = owner
        self._loader: weakref.ref[Any] | None = None

    def attach(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader() if self._loader is not None else None
        if loader is None:
            self.owner.set_epoch(epoch)
        else:
            set_loader_epoch(loader, epoch)  # reaches self.owner too, and restarts workers holding a stale dataset

    def __getstate__(self) -> dict[str, Any]:
        return {"owner": self.owner, "_loader": None}


class EpochBatchSampler(Sampler[list[int]]):
    """Base of the engine's batch samplers: epoch bookkeeping, resume state and per-batch seeds.

    Subclasses only say how an epoch is cut into batches, in :meth:`epoch_batches`, as a pure function of
    (seed, epoch, rank). Iterating again gives the next epoch; ``set_epoch`` pins one; ``state_dict`` is
    (seed, epoch, position), so saving it every step costs microseconds and resuming is exact.
    """

    reseed_each_epoch = True
    """Whether per-batch randomness changes with the epoch (training) or repeats every pass (evaluation)."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._epoch = 0
        self._fresh = True  # the next iteration uses self._epoch as is; otherwise it advances first
        self._pinned: int | None = None  # the epoch set_epoch() asked for, until an iteration starts
        self._position = 0
        self._resume_position = 0
        self._cache: tuple[int, list[list[int]]] | None = None
        self.sampler = EpochHandle(self)
        self._retired: str | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order. Must depend only on (seed, epoch) and the options."""
        raise NotImplementedError

    def _batches(self, epoch: int) -> list[list[int]]:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.epoch_batches(epoch))
        return self._cache[1]

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) iteration draws its order from."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next iteration (Lightning and distributed loops call this each epoch)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch should be an int >= 0, but got epoch={epoch!r}")
        if epoch != self._epoch:
            self._resume_position = 0
        self._epoch = self._pinned = epoch
        self._fresh = True

    def __len__(self) -> int:
        return len(self._batches(self._epoch))

    def __iter__(self) -> Iterator[BatchIndices]:
        # Bookkeeping runs lazily, on the first next(): torchdata creates iterators it never consumes.
        # An iteration abandoned part-way still counts as an epoch, so the next one gets a new order.
        if not self._fresh:
            self._epoch += 1
        self._fresh, self._pinned = False, None
        epoch, start = self._epoch, self._resume_position
        self._resume_position = 0
        batches = self._batches(epoch)
        for position in range(start, len(batches)):
            if self._retired is not None:
                raise RuntimeError(self._retired)
            batch = BatchIndices(batches[position])
            batch.rng_seed = batch_seed(self.seed, epoch if self.reseed_each_epoch else 0, batch)
            self._position = position + 1
            yield batch
        self._epoch, self._position, self._fresh = epoch + 1, 0, True

    def retire(self, reason: str) -> None:
        """Make iterators still running over this sampler raise ``reason`` instead of yielding stale batches."""
        self._retired = reason

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands: seed, the epoch of the next batch and batches already yielded in it."""
        return {"seed": self.seed, "epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes its epoch at the saved position."""
        missing = {"seed", "epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"sampler state is missing {sorted(missing)}; got keys {sorted(state)}")
        if state["seed"] != self.seed:
            raise ValueError(
                f"sampler state was saved with seed={state['seed']}, but this sampler has seed={self.seed}; "
                f"resuming would visit a different order. Build the loader with seed={state['seed']}"
            )
        self._epoch, self._resume_position = int(state["epoch"]), int(state["position"])
        if self._pinned is not None and self._pinned > self._epoch:
            # torchdata applies a loaded state lazily, at iter(): a later epoch pinned before that wins.
            self._epoch, self._resume_position = self._pinned, 0
        elif self._pinned is None and self._resume_position >= len(self._batches(self._epoch)):
            # Saved after the epoch's last batch was handed out (worker snapshots are taken then, before the
            # epoch completes) and no caller pinned an epoch: go on with the next epoch, not an empty pass.
            # A caller that pinned this very epoch (a multi-loader finishing a child's pass) gets the empty rest.
            self._epoch, self._resume_position = self._epoch + 1, 0
        self._position = self._resume_position
        self._fresh = True


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
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples should be an int >= 0, but got num_samples={num_samples!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size should be an int >= 1, but got batch_size={batch_size!r}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank should be in [0, num_replicas={num_replicas}), but got rank={rank}")
        if uneven not in UNEVEN_POLICIES:
            raise ValueError(f"uneven should be one of {UNEVEN_POLICIES}, but got uneven={uneven!r}")
        super().__init__(seed=seed)
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.uneven = uneven

    def rank_indices(self, epoch: int) -> list[int]:
        """The indices this rank visits in ``epoch``, in order."""
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=generator_from(derive_seed(self.seed, epoch)))
            order = order.tolist()
        else:
            order = list(range(self.num_samples))
        if self.num_replicas > 1:
            if self.uneven == "pad" and order:
                total = math.ceil(len(order) / self.num_replicas) * self.num_replicas
                order = (order * math.ceil(total / len(order)))[:total]
            else:
                order = order[: len(order) - len(order) % self.num_replicas]
            order = order[self.rank :: self.num_replicas]
        return order

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = self.rank_indices(epoch)
        batches = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __len__(self) -> int:  # without computing an epoch's order
        rows = self._num_rank_samples()
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    def _num_rank_samples(self) -> int:
        if self.num_replicas == 1:
            return self.num_samples
        if self.uneven == "pad":
            return math.ceil(self.num_samples / self.num_replicas) if self.num_samples else 0
        return self.num_samples // self.num_replicas


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
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank should be in [0, num_replicas={num_replicas}), but got rank={rank}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size should be an int >= 1, but got batch_size={batch_size!r}")
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
