"""Streaming inputs (``datasets.IterableDataset``): sharded by rank with ``split_dataset_by_node`` and by
worker inside ``datasets``, a new epoch each pass, and resumable through torchdata's per-worker state."""

from __future__ import annotations

import copy
import hashlib
import itertools
import sys
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from engine.core.rng import hash_into


def is_hf_stream(data: Any) -> bool:
    hf_datasets = sys.modules.get("datasets")  # a datasets stream exists only once datasets is imported
    return hf_datasets is not None and isinstance(data, hf_datasets.IterableDataset)


class EpochStream(IterableDataset):
    """One pass of a ``datasets.IterableDataset`` per epoch, resumable mid-pass.

    The epoch is ``datasets``' own, which it shares with persistent workers through shared memory, so it is only
    ever set in the parent process: by :meth:`begin_pass` (the loader calls it at every ``iter()``: each pass after
    the first is a new epoch, and the shard order and any shuffle buffer reseed with it) or by :meth:`set_epoch`.
    A loaded state resumes on a copy of the stream, so the saved position applies to one pass only.

    Example:
        >>> import datasets
        >>> rows = datasets.Dataset.from_dict({"x": list(range(6))}).to_iterable_dataset(num_shards=2)
        >>> epochs = EpochStream(rows.shuffle(seed=0, buffer_size=6))
        >>> epochs.begin_pass(); first = [r["x"] for r in epochs]
        >>> epochs.begin_pass(); second = [r["x"] for r in epochs]
        >>> sorted(first) == sorted(second) == list(range(6)), first != second, epochs.epoch
        (True, True, 1)
    """

    def __init__(self, stream: Any, *, rank: int = 0, world_size: int = 1) -> None:
        if world_size > 1:
            from datasets.distributed import split_dataset_by_node

            stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        self.stream, self.rank, self.world_size = stream, rank, world_size
        self._advance = False  # whether the next pass starts a new epoch
        self._resume: Any = None  # a copy of the stream that continues a saved pass
        self._current: Any = None  # the stream being iterated, whose position state_dict() reports

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def set_epoch(self, epoch: int) -> None:
        """Pin the epoch of the next pass (parent process, before the pass starts)."""
        self.stream.set_epoch(epoch)
        self._advance = False

    def begin_pass(self) -> None:
        """Called in the parent process when a pass starts; every pass after the first is a new epoch."""
        if self._advance:
            self.stream.set_epoch(self.stream.epoch + 1)
        self._advance = True

    def __iter__(self) -> Iterator[Any]:
        stream, self._resume = (self._resume if self._resume is not None else self.stream), None
        self._current = stream
        yield from stream
        self._current = None  # the pass is complete: no position left to save

    def state_dict(self) -> dict[str, Any]:
        # Outside a pass there is no position to save; datasets' own state then still describes an earlier pass
        # or a peek made in the parent process.
        return {"epoch": self.epoch, "stream": self._current.state_dict() if self._current is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved pass (in each worker, or in the process that iterates). The epoch itself is set by
        the parent from the data module's state, never here: workers share it."""
        if state["stream"] is not None:
            check_resumable(self.stream)
            self._resume = copy.copy(self.stream)
            self._resume.load_state_dict(state["stream"])

    @property
    def column_names(self) -> list[str] | None:
        return self.stream.column_names

    @property
    def n_shards(self) -> int:
        return self.stream.n_shards


def check_stream_options(*, val_split: Any, test_split: Any, shuffle: bool | None) -> None:
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


def peek_rows(stream: Any, count: int) -> list[Any]:
    """The first ``count`` rows of ``stream`` (for input checks and the fingerprint)."""
    return list(itertools.islice(iter(stream), count))


def stream_fingerprint(stream: Any, rows: int = 16) -> str:
    """A hash of the stream's shard count and first rows: resuming on another stream is refused."""
    digest = hashlib.blake2b(str(stream.n_shards).encode(), digest_size=12)
    hash_into(digest, peek_rows(stream, rows))
    return digest.hexdigest()


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
