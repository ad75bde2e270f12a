"""Rows that cannot be read: named in an error (``on_error='raise'``), or left out of their batch and recorded
(``'skip'``, ``'warn'``).

The path of a record: the source's ``__getitems__`` (in a worker) reads the batch's rows one by one only after
the batch failed, keeps those that read, and hangs the failures on the rows (``RowBatch.skipped``);
``SeededCollate`` wraps the collated batch with them in a :class:`WithSkippedRows`; the loader's iterator, in the
parent process, unwraps it and adds the records to the module's :class:`SkipReport`. A batch that reads
has no record, so nothing is added to the steps that work.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.core.checks import check_choice, check_int
from engine.core.compat import pin_memory
from engine.sources.transforms import TransformFailed

ON_ERROR = ("raise", "skip", "warn")
"""What a module does with a row whose read, decode or transform raises."""


class DataRowError(RuntimeError):
    """Reading or collating a row failed with an exception that cannot be rebuilt from a message alone."""


def named_error(error: Exception, message: str) -> Exception:
    """An exception of ``error``'s own type (so ``except ValueError`` still works, also from a worker, where torch
    re-raises by type and message) whose message names the rows; ``DataRowError`` when the type needs more."""
    try:
        named = type(error)(f"{message} ({type(error).__name__}: {error})")
    except Exception:  # the type takes other arguments (UnicodeDecodeError, ...)
        named = DataRowError(f"{message} ({type(error).__name__}: {error})")
    return named


READ_FIX = "fix or remove that row (or its file), or pass on_error='skip' to leave out rows that fail to read"

PEEK_ROWS = 64
"""How many rows construction tries, with ``on_error`` 'skip' or 'warn', to find one that reads."""


def first_readable(read: Any, count: int, what: str, on_error: str) -> int:
    """The index of the first row that ``read(index)`` reads, for construction's checks of the rows' fields.

    With ``on_error='raise'`` that is row 0, and a row 0 that fails is named with the fix; 'skip' and 'warn' try up
    to :data:`PEEK_ROWS` rows (the rows that fail are left out later, when a batch reads them)."""
    first_error = None
    for index in range(min(count, 1 if on_error == "raise" else PEEK_ROWS)):
        try:
            read(index)
        except Exception as error:  # the user's data: any exception of its reader
            first_error = first_error or error
            continue
        first_error = None  # its traceback holds this frame and the callers': a cycle that only a collection frees
        return index
    if first_error is None:
        return 0
    tried = "row 0" if on_error == "raise" else f"rows 0 to {min(count, PEEK_ROWS) - 1}"
    raise named_error(first_error, f"reading {tried} of {what} failed at construction, which reads a row to check "
                                   f"its fields; {READ_FIX}") from first_error


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


def read_skipping(source: Any, positions: list[int], error: Exception) -> tuple[list[Any], list[int], list[SkippedRow]]:
    """``(rows, kept positions, records)`` of a batch whose read raised ``error``: each row read alone, the
    failing ones left out. Raises if no single row fails (the batch, not a row, is at fault) or if every row
    fails (an empty batch would break the model's step and the ranks' equal batch counts)."""
    rows, kept, skipped, first = [], [], [], None
    for position in positions:
        try:
            row = source._fetch([position])[0]
        except Exception as single:  # the failing row, recorded with its own exception
            first = first or single
            skipped.append(SkippedRow(source.user_index(position), source.role, type(single).__name__,
                                      str(single)))
            continue
        rows.append(row)
        kept.append(position)
    if not skipped:
        raise source.row_error(positions, error) from error
    if not rows:
        indices = [row.index for row in skipped]
        raise named_error(first, f"every row of the batch {indices[:8]} of the {source.role} data failed to read, "
                                 f"and on_error={source.on_error!r} leaves out rows, not whole batches (an empty "
                                 f"batch would break the step and the ranks' equal batch counts); fix the data")
    return rows, kept, skipped


def transform_skipping(source: Any, rows: list[Any], positions: list[int],
                       epoch: int) -> tuple[list[Any], list[int], list[SkippedRow]]:
    """``(rows, kept positions, records)`` of a batch whose transform raised: each row through the transform alone
    (seeded by its own index, so a kept row is what it would have been in the batch), the failing ones left out."""
    kept_rows, kept, skipped, first = [], [], [], None
    for row, position in zip(rows, positions):
        index = source.dataset_index(position)
        try:
            kept_rows.extend(source.transform([row], [index], epoch))
        except TransformFailed as failed:
            first = first or failed.error
            skipped.append(SkippedRow(source.user_index(position), source.role, type(failed.error).__name__,
                                      str(failed.error)))
            continue
        kept.append(position)
    if not kept_rows:
        raise named_error(first, f"the {source.transform.argument} failed on every row of the batch "
                                        f"{[row.index for row in skipped][:8]} of the {source.role} data, and "
                                        f"on_error={source.on_error!r} leaves out rows, not whole batches; fix the "
                                        f"transform")
    return kept_rows, kept, skipped


class WithSkippedRows:
    """A collated batch together with the rows left out of it, on its way from a worker to the parent process;
    also the worker's shard-reader counts since its previous batch (``reader_counts``, see
    :meth:`engine.sources.shards.source.ShardedSource.reader_counts`). ``pin_memory()`` pins the batch, so a
    pinning loader keeps the records."""

    __slots__ = ("batch", "skipped", "reader_counts")

    def __init__(self, batch: Any, skipped: list[SkippedRow] | None,
                 reader_counts: dict[str, Any] | None = None) -> None:
        self.batch, self.skipped, self.reader_counts = batch, skipped, reader_counts

    def with_batch(self, batch: Any) -> WithSkippedRows:
        """The same records around another form of the batch (pinned, handed off)."""
        return WithSkippedRows(batch, self.skipped, self.reader_counts)

    def pin_memory(self) -> WithSkippedRows:
        return self.with_batch(pin_memory(self.batch))


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

    def state(self) -> int:
        """What a saved state carries: the number of training rows left out (one integer, not the records)."""
        return self.counts.get("train", 0)

    def load_state(self, train_count: int) -> None:
        """Continue counting from a saved state's number of training rows left out."""
        self.counts["train"] = check_int("skipped_rows", train_count, minimum=0)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[SkippedRow]:
        return iter(self.records)

    def __getitem__(self, item: int) -> SkippedRow:
        return self.records[item]

    def __repr__(self) -> str:
        shown = ", ".join(map(str, self.records[:3])) + (", ..." if len(self.records) > 3 else "")
        return f"SkipReport(count={self.count}, on_error={self.on_error!r}, records=[{shown}])"
