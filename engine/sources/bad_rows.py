"""Rows that cannot be read: named in an error (``on_error='raise'``), or left out of their batch and recorded
(``'skip'``, ``'warn'``).

The path of a record: the source's ``__getitems__`` (in a worker) reads the batch's rows one by one only after
the batch failed, keeps those that read, and hangs the failures on the rows (``RowBatch.skipped``);
``SeededCollate`` wraps the collated batch with them in a :class:`WithSkippedRows`; the loader's iterator, in the
parent process, unwraps it and adds the records to the module's :class:`SkipReport`. A batch that reads
has no record, so nothing is added to the steps that work.
"""

from __future__ import annotations

from typing import Any

from engine.core.skipped_rows import SkippedRow
from engine.sources.transforms import TransformFailed


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
            kept_rows.extend(source.transform([row], [index], epoch,
                                              reread=lambda _, position=position: source._fetch([position])[0]))
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


