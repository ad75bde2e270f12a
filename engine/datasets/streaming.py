"""STREAMING: read a file-backed dataset sequentially, sharing blocks of rows among workers and ranks.

Rows are cut into blocks of ``block_rows`` consecutive rows; block ``b`` goes to shard ``b % num_shards``, where
the shard of worker ``w`` on rank ``r`` is ``w * world_size + r``. So every row is read exactly once; each rank
reads the blocks ``b % world_size == rank``; and since a DataLoader takes batches from its workers in turn, a
loader whose ``batch_size`` equals ``block_rows`` returns the rows of its rank in file order whatever the number
of workers (with other batch sizes, each worker's rows are in file order, interleaved by batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from engine.core import distributed

__all__ = ["ShardIterator", "StreamingMixin", "shard_blocks"]


def shard_blocks(num_rows: int, block_rows: int, shard: int, num_shards: int) -> Iterator[tuple[int, int]]:
    """The ``(start, stop)`` row ranges of the blocks that ``shard`` of ``num_shards`` reads, in file order.

    Example:
        >>> list(shard_blocks(10, 3, 1, 2))
        [(3, 6), (9, 10)]
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard should be in [0, {num_shards}), but got shard={shard}")
    for start in range(shard * block_rows, num_rows, num_shards * block_rows):
        yield start, min(start + block_rows, num_rows)


class StreamingMixin(IterableDataset):
    """Makes a :class:`~engine.datasets.base.FileDataset` subclass iterable: rows in file order, sharded.

    The rank is read from ``torch.distributed`` when it is initialized in the process that iterates; otherwise
    the rank seen at construction or when the dataset was pickled for a spawned worker is used.
    ``len()`` is the number of rows this rank yields (all its workers together).
    """

    block_rows: int
    _saved_rank: tuple[int, int] | None

    def _rank_world(self) -> tuple[int, int]:
        return distributed.rank_and_world() or self._saved_rank or (0, 1)

    def __iter__(self) -> ShardIterator:
        rank, world = self._rank_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return ShardIterator(self, worker * world + rank, workers * world)

    def __len__(self) -> int:
        rank, world = self._rank_world()
        return sum(stop - start for start, stop in shard_blocks(self.num_rows, self.block_rows, rank, world))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_saved_rank"] = distributed.rank_and_world() or self._saved_rank
        return state


class ShardIterator:
    """The rows of one shard in file order, read a block at a time when first asked for.

    Stateful (``state_dict`` is the number of rows yielded), so a ``StatefulDataLoader`` resumed mid-epoch
    continues where it stopped, skipping the blocks already read instead of reading them again.
    """

    def __init__(self, dataset: StreamingMixin, shard: int, num_shards: int) -> None:
        self.dataset, self.shard, self.num_shards = dataset, shard, num_shards
        self.position = 0
        self._rows: Iterator[Any] | None = None

    def __iter__(self) -> ShardIterator:
        return self

    def __next__(self) -> Any:
        if self._rows is None:
            self._rows = self._read_from(self.position)
        row = next(self._rows)
        self.position += 1
        return row

    def _read_from(self, skip: int) -> Iterator[Any]:
        dataset = self.dataset
        for start, stop in shard_blocks(dataset.num_rows, dataset.block_rows, self.shard, self.num_shards):
            if skip >= stop - start:
                skip -= stop - start
                continue
            yield from dataset._read_range(start + skip, stop)
            skip = 0

    def state_dict(self) -> dict[str, int]:
        return {"rows_yielded": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position, self._rows = int(state["rows_yielded"]), None
