"""The records of rows left out of their batches (``on_error='skip'`` or ``'warn'``): each row's record
(:class:`SkippedRow`), a collated batch carrying them from a worker to the parent (:class:`WithSkippedRows`), and the
module's report of them (:class:`SkipReport`, ``dm.skipped``). Sources make the records
(:mod:`engine.sources.bad_rows`); collation, the loader and the tools carry and read them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.checks import check_choice, check_int
from engine.core.compat import pin_memory

ON_ERROR = ("raise", "skip", "warn")
"""What a module does with a row whose read, decode or transform raises."""


@dataclass(frozen=True)
class SkippedRow:
    """One row left out of its batch: where it is and why."""

    index: int
    """The row's index in the data the user gave (not its position in the split)."""
    split: str
    """The split it belongs to: train, val, test or predict."""
    error_type: str
    """The exception's class name, e.g. ``OSError``."""
    message: str
    """The exception's message."""
    mixed_row: int | None = field(default=None, compare=False)
    """In a mixture: the row's position in the mixed source, so the served counts leave it out; None elsewhere."""

    def __str__(self) -> str:
        return f"{self.split} row {self.index} ({self.error_type}: {self.message})"


def check_on_error(on_error: Any, max_skipped: Any, *, is_stream: bool) -> None:
    """Refuse an unknown ``on_error``, a cap without skipping, a cap that is not a count or a fraction, and
    skipping on a stream (whose rows have no index to record or to skip again on resume)."""
    check_choice("on_error", on_error, ON_ERROR)
    if is_stream and on_error != "raise":
        raise ValueError(f"on_error={on_error!r} leaves out rows by their index, which a stream "
                         f"(datasets.IterableDataset) does not have; use on_error='raise' or a map-style Dataset")
    if max_skipped is None:
        return
    if on_error == "raise":
        raise ValueError(f"max_skipped caps the rows that on_error='skip' or 'warn' leaves out, but got "
                         f"max_skipped={max_skipped!r} with on_error='raise'; pass on_error='skip' or drop max_skipped")
    if isinstance(max_skipped, float):
        if not 0.0 < max_skipped < 1.0:
            raise ValueError(f"max_skipped should be a row count (an integer >= 0) or a fraction of the split in "
                             f"(0, 1), but got max_skipped={max_skipped!r}")
        return
    check_int("max_skipped", max_skipped, minimum=0, hint="; a float in (0, 1) is a fraction of the split")


class WithSkippedRows:
    """A collated batch together with the rows left out of it, on its way from a worker to the parent process;
    also the worker's shard-reader counts since its previous batch (``reader_counts``, see
    :meth:`engine.sources.shards.source.ShardedSource.reader_counts`) and the seconds each stage of the batch took
    in the worker (``stage_s``, see :mod:`engine.core.stage_times`). ``pin_memory()`` pins the batch, so a
    pinning loader keeps the records."""

    __slots__ = ("batch", "skipped", "reader_counts", "stage_s")

    def __init__(self, batch: Any, skipped: list[SkippedRow] | None,
                 reader_counts: dict[str, Any] | None = None, stage_s: dict[str, float] | None = None) -> None:
        self.batch, self.skipped, self.reader_counts, self.stage_s = batch, skipped, reader_counts, stage_s

    def with_batch(self, batch: Any) -> WithSkippedRows:
        """The same records around another form of the batch (pinned, handed off)."""
        return WithSkippedRows(batch, self.skipped, self.reader_counts, self.stage_s)

    def pin_memory(self) -> WithSkippedRows:
        return self.with_batch(pin_memory(self.batch))

    def __reduce__(self) -> tuple[Any, ...]:
        # every worker batch crosses in one (its stage times): by its arguments, half the cost of pickling slots
        return WithSkippedRows, (self.batch, self.skipped, self.reader_counts, self.stage_s)


class SkipReport:
    """The rows a module's loaders left out, readable during or after training as ``dm.skipped``.

    A record is added each time a row is left out of a batch, so a bad training row appears once per epoch.
    ``count`` is the number of rows left out; after resuming from a state it includes the training rows left out
    before the state was saved, whose records are not carried (see :meth:`state`).
    """

    def __init__(self, on_error: str = "raise", max_skipped: int | float | None = None) -> None:
        self.on_error, self.max_skipped = on_error, max_skipped
        self.records: list[SkippedRow] = []
        self.counts: dict[str, int] = {}
        self._warned: set[tuple[str, int]] = set()

    @classmethod
    def checked(cls, on_error: Any, max_skipped: Any, *, is_stream: bool) -> SkipReport:
        """A module's report, after :func:`check_on_error` refused arguments that cannot work."""
        check_on_error(on_error, max_skipped, is_stream=is_stream)
        return cls(on_error, max_skipped)

    @property
    def count(self) -> int:
        """Rows left out of batches so far, in every split (including those before a resume)."""
        return sum(self.counts.values())

    def limit(self, rows_in_pass: int) -> int | None:
        """The most rows one pass over ``rows_in_pass`` rows may leave out: ``max_skipped`` as a count, or its
        fraction of the rows (rounded down); None without a cap."""
        if isinstance(self.max_skipped, float):
            return math.floor(self.max_skipped * rows_in_pass)
        return None if self.max_skipped is None else int(self.max_skipped)  # a count (numpy integers too)

    def add(self, skipped: list[SkippedRow]) -> None:
        """Record ``skipped``; with ``on_error='warn'``, warn once for each row not warned about before."""
        self.records.extend(skipped)
        for row in skipped:
            split = row.split.split(" ")[0]  # a mixture's source ("train 'code'") counts in its split
            self.counts[split] = self.counts.get(split, 0) + 1
            if self.on_error == "warn" and (row.split, row.index) not in self._warned:
                self._warned.add((row.split, row.index))
                warnings.warn(f"on_error='warn' left out {row} from its batch; it is recorded in dm.skipped",
                              RuntimeWarning, stacklevel=3)

    def check_cap(self, split: str, in_pass: int, rows_in_pass: int, first: list[SkippedRow]) -> None:
        """Raise when one pass over a split left out more rows than ``max_skipped`` allows."""
        limit = self.limit(rows_in_pass)
        if limit is not None and in_pass > limit:
            shown = "; ".join(map(str, first[:3]))
            raise RuntimeError(
                f"on_error={self.on_error!r} left out {in_pass} rows of the {split} data in this pass, more than "
                f"max_skipped={self.max_skipped!r} allows ({limit} of {rows_in_pass} rows): the failures look "
                f"systematic rather than a few bad files. First: {shown}. Fix the data, or raise max_skipped")

    def apply_to(self, sources: Iterable[Any]) -> None:
        """Give each source this report's ``on_error``; it travels with the source to the workers."""
        for source in sources:
            source.on_error = self.on_error

    def attach(self, loader: Any) -> Any:
        """Make ``loader`` record the rows it leaves out here; returns the loader."""
        loader.skipped = self
        return loader

    def state_dict(self) -> dict[str, int]:
        """What a saved state carries: ``{"train": rows}``, the number of training rows left out (not the records)."""
        return {"train": self.counts.get("train", 0)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue counting from a saved state's number of training rows left out."""
        if not isinstance(state_dict, Mapping) or "train" not in state_dict:
            raise TypeError(f"a skip report's state should be {{'train': rows}} from state_dict(), but got "
                            f"{state_dict!r:.80}")
        self.counts["train"] = check_int("skipped_rows", state_dict["train"], minimum=0)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[SkippedRow]:
        return iter(self.records)

    def __getitem__(self, item: int) -> SkippedRow:
        return self.records[item]

    def __repr__(self) -> str:
        shown = ", ".join(map(str, self.records[:3])) + (", ..." if len(self.records) > 3 else "")
        return f"SkipReport(count={self.count}, on_error={self.on_error!r}, records=[{shown}])"
