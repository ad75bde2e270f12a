"""Streaming inputs (``datasets.IterableDataset``): sharded by rank with ``split_dataset_by_node`` and by
worker inside ``datasets``, reshuffled each epoch, and resumable through torchdata's per-worker state."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from engine.rng import hash_into

try:
    import datasets as hf_datasets
    from datasets.distributed import split_dataset_by_node
except ImportError:  # pragma: no cover
    hf_datasets = None


def is_hf_stream(data: Any) -> bool:
    return hf_datasets is not None and isinstance(data, hf_datasets.IterableDataset)


class EpochStream(IterableDataset):
    """Iterates a ``datasets.IterableDataset`` once per epoch, telling it the epoch first (its shuffle
    buffer reseeds with seed + epoch). The epoch lives in this object's state, which torchdata snapshots in
    every worker, so persistent workers and resumed runs see the right epoch without the parent's help.

    Example:
        >>> import datasets
        >>> stream = datasets.Dataset.from_dict({"x": list(range(6))}).to_iterable_dataset(num_shards=2)
        >>> epochs = EpochStream(stream.shuffle(seed=0, buffer_size=6))
        >>> first, second = [r["x"] for r in epochs], [r["x"] for r in epochs]
        >>> sorted(first) == sorted(second) == list(range(6)), first != second
        (True, True)
    """

    def __init__(self, stream: Any, *, rank: int = 0, world_size: int = 1) -> None:
        if world_size > 1:
            stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        self.stream = stream
        self.epoch = 0
        self._fresh = True

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next pass (in the process that iterates: workers=0 or before workers start)."""
        self.epoch, self._fresh = epoch, True

    def __iter__(self) -> Iterator[Any]:
        if not self._fresh:
            self.epoch += 1
        self._fresh = False
        self.stream.set_epoch(self.epoch)
        yield from self.stream
        self.epoch, self._fresh = self.epoch + 1, True

    def state_dict(self) -> dict[str, Any]:
        # Between epochs (or before the first row) there is no position in the stream to save; datasets'
        # own state then still describes an earlier pass, or a peek made in the parent process.
        return {"epoch": self.epoch, "stream": None if self._fresh else self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self._fresh = state["epoch"], True
        if state["stream"] is not None:
            check_resumable(self.stream)
            self.stream.load_state_dict(state["stream"])

    @property
    def column_names(self) -> list[str] | None:
        return self.stream.column_names

    @property
    def n_shards(self) -> int:
        return self.stream.n_shards


def is_buffer_shuffled(stream: Any) -> bool:
    """Whether ``IterableDataset.shuffle()`` was applied anywhere in the stream's chain of iterables."""
    node = getattr(stream, "_ex_iterable", None)
    while node is not None:
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        node = getattr(node, "ex_iterable", None)
    return False


def check_resumable(stream: Any) -> None:
    """``datasets`` does not save a shuffle buffer's rows in its state, so a shuffled stream would lose them
    on resume; refuse rather than train on different data."""
    if is_buffer_shuffled(stream):
        raise ValueError(
            "this stream was shuffled with IterableDataset.shuffle(), whose buffer datasets does not save in its "
            "state: resuming would silently skip the buffered rows. Shuffle at the source instead "
            "(Dataset.shuffle(seed=...).to_iterable_dataset(num_shards=...)) for exact resume"
        )


def check_stream_options(*, val_split: Any, test_split: Any, shuffle: bool | None, num_workers: int,
                         persistent_workers: bool | None) -> None:
    """What a stream cannot do, refused at construction with the fix."""
    if val_split or test_split:
        raise ValueError(
            "val_split/test_split cannot cut rows out of a stream (it has no length or random access); "
            "pass val_data=... / test_data=... instead"
        )
    if shuffle:
        raise ValueError(
            "shuffle=True cannot reorder a stream here; shuffle at the source (Dataset.shuffle(seed=...)"
            ".to_iterable_dataset(...), exactly resumable) or with IterableDataset.shuffle(...), which is "
            "reseeded every epoch but not resumable exactly"
        )
    if num_workers > 0 and persistent_workers is False:
        raise ValueError(
            "a stream with num_workers > 0 needs persistent workers: the epoch advances in each worker's copy "
            "of the stream, and fresh workers would repeat the first epoch's order. Leave persistent_workers=None"
        )


def peek_rows(stream: Any, count: int) -> list[Any]:
    """The first ``count`` rows of ``stream`` (for input checks and the fingerprint)."""
    return list(itertools.islice(iter(stream), count))


def stream_fingerprint(stream: Any, rows: int = 16) -> str:
    """A hash of the stream's shard count and first rows: resuming on another stream is refused."""
    digest = hashlib.blake2b(str(stream.n_shards).encode(), digest_size=12)
    hash_into(digest, peek_rows(stream, rows))
    return digest.hexdigest()
