"""The collate step of a loader: hands each batch's seeded generator to collators that take one."""

from __future__ import annotations

import inspect
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import get_worker_info

from collators import CollatorRegistry, Resolution
from collators.columns import RowBatch
from engine.core.rng import content_seed, generator_from
from engine.core.skipped_rows import SkippedRow, WithSkippedRows
from engine.core.stage_times import StageTimes
from engine.sources.bad_rows import named_error
from task_spec import TaskSpec


def accepts_generator(collate_fn: Callable[..., Any]) -> bool:
    """Whether ``collate_fn`` can be called with a ``generator=`` keyword."""
    try:
        parameters = inspect.signature(collate_fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "generator" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class SeededCollate:
    """Wraps a collate function; passes ``generator=`` seeded from the batch's (seed, epoch, indices).

    Rows from a stream have no indices: with ``content_seed_from=seed`` their generator derives from the
    seed and the rows themselves, so masks still do not depend on the worker that built the batch.
    Collators that take no generator (plain functions such as ``default_collate``), or that say they draw no
    random numbers (``draws_random = False``, as a causal-LM ``TextCollator``), are called without one.
    A batch some of whose rows were left out (``on_error='skip'``), or that carries a worker's shard-reader counts,
    comes back as a ``WithSkippedRows``, which the loader unwraps in the parent process.
    Each batch's stage times (the source's fetch and decode, stamped on its rows, and the collate timed here) are
    added to :attr:`stage_times` in this process; a worker process sends them back with the batch, in its
    ``WithSkippedRows``, and the loader adds them in the parent.
    Picklable whenever the wrapped function is, so it works in spawned workers.
    """

    def __init__(self, collate_fn: Callable[..., Any], *, content_seed_from: int | None = None) -> None:
        self.collate_fn = collate_fn
        self.takes_generator = accepts_generator(collate_fn)
        self.reads_columns = callable(getattr(collate_fn, "collate_columns", None))
        self.content_seed_from = content_seed_from
        self.pads_text = _is_text_collator(collate_fn)
        self.stage_times = StageTimes()
        """Seconds per stage of the batches made in this process, and of those workers sent back."""

    def __call__(self, rows: list[Any]) -> Any:
        start = time.perf_counter()
        try:
            batch = self._collate(rows)
        except Exception as error:
            if not skips_rows(rows):
                raise
            batch, rows = self._collate_skipping(rows, error)
        times = {**(getattr(rows, "stage_s", None) or {}), "collate": time.perf_counter() - start}
        if self.pads_text and isinstance(rows, RowBatch):  # Arrow columns and tensor lists were checked at setup
            refuse_empty_rows(batch, rows)
        skipped = getattr(rows, "skipped", None)  # rows left out by on_error='skip' or 'warn'
        counts = getattr(rows, "reader_counts", None)  # a worker's shard reads since its previous batch
        if get_worker_info() is not None:  # the times go back with the batch, to the parent's stage_times
            return WithSkippedRows(batch, skipped, counts, times)
        self.stage_times.add(times)
        return WithSkippedRows(batch, skipped, counts) if skipped or counts else batch

    def _collate(self, rows: list[Any]) -> Any:
        try:
            return self._call(rows)
        except Exception as error:
            indices = getattr(rows, "indices", None)  # the user's rows (a window of long_rows='split': its row)
            if indices is None or skips_rows(rows):
                raise
            raise named_error(error, collate_failure(error, indices, rows.role, getattr(rows, "sources", None))
                              ) from error

    def _call(self, rows: list[Any]) -> Any:
        if not self.takes_generator or not getattr(self.collate_fn, "draws_random", True):
            return self.collate_fn(rows)
        seed = getattr(rows, "rng_seed", None)
        if seed is None and self.content_seed_from is not None:  # stream rows carry no indices
            seed = content_seed(self.content_seed_from, rows)
        return self.collate_fn(rows, generator=generator_from(seed) if seed is not None else None)

    def _collate_skipping(self, rows: RowBatch, error: Exception) -> tuple[Any, RowBatch]:
        """``(batch, rows kept)`` of a batch whose collation raised ``error`` under ``on_error`` 'skip' or 'warn':
        each row collated alone (where a corrupt image is decoded), the failing ones left out and recorded with
        where they are (a shard and a sample's key, where the source names them), the rest collated together."""
        places = getattr(rows, "places", None) or [None] * len(rows)
        kept, records, first = [], [], None
        for place in range(len(rows)):
            try:
                self._call(_part(rows, [place]))
            except Exception as single:  # the row's own failure (a corrupt image, a bad value), recorded
                first = first or single
                where = f"{places[place]}: " if places[place] else ""
                mixed = rows.sources is not None  # a mixture's row: named by its source, left out of the counts
                records.append(SkippedRow(rows.indices[place], f"{rows.role} {rows.sources[place]!r}" if mixed
                                          else rows.role, type(single).__name__, f"{where}{single}",
                                          mixed_row=rows.positions[place] if mixed else None))
                continue
            kept.append(place)
        if not records:  # no row fails alone: the batch, not a row, is at fault
            raise named_error(error, collate_failure(error, rows.indices, rows.role, rows.sources)) from error
        if not kept:
            raise named_error(first, f"every row of the batch {rows.indices[:8]} of the {rows.role} data failed to "
                                     f"collate, and on_error={rows.on_error!r} leaves out rows, not whole batches "
                                     f"(an empty batch would break the step and the ranks' equal batch counts); "
                                     f"fix the data") from first
        part = _part(rows, kept)
        part.skipped = [*(rows.skipped or []), *records]
        return self._collate(part), part

    def __repr__(self) -> str:
        return f"SeededCollate({self.collate_fn!r})"


def skips_rows(rows: Any) -> bool:
    """Whether ``rows`` come from a source that leaves out rows that fail (``on_error`` 'skip' or 'warn'), one by
    one; a mixture's rows too, each recorded with its position so the served counts leave it out."""
    return (isinstance(rows, RowBatch) and getattr(rows, "on_error", "raise") != "raise"
            and rows.indices is not None and (rows.sources is None or rows.positions is not None))


def _part(rows: RowBatch, places: list[int]) -> RowBatch:
    """The rows at ``places`` of ``rows``, with their seed, split, indices, positions and places."""
    part = RowBatch([rows[place] for place in places])
    part.rng_seed, part.role, part.on_error = rows.rng_seed, rows.role, rows.on_error
    part.indices = [rows.indices[place] for place in places]
    if rows.sources is not None:
        part.sources = [rows.sources[place] for place in places]
    if rows.positions is not None:
        part.positions = [rows.positions[place] for place in places]
    places_of = getattr(rows, "places", None)
    part.places = [places_of[place] for place in places] if places_of else None
    return part


def refuse_empty_rows(batch: Any, rows: RowBatch) -> None:
    """Refuse a padded text batch with a row of 0 tokens, naming the user's row: padded, it is all padding, and
    attention over a fully masked row gives NaN. For rows whose lengths setup could not read (torch datasets)."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or rows.indices is None:
        return
    present = mask.any(dim=1)
    if bool(present.all()):
        return
    place = int((~present).nonzero()[0])
    raise ValueError(f"'input_ids' should hold at least one token in every row, but row {rows.indices[place]} of "
                     f"the {rows.role} data holds 0 tokens; padded, an empty row is all padding and gives NaN in "
                     f"attention: filter empty rows out of the data")


_BATCH_ROW = re.compile(r"\brow (\d+)\b")


def collate_failure(error: Exception, indices: list[int], role: str, sources: list[str] | None = None) -> str:
    """What failed, in the user's rows: the batch's rows by their index in the data given (not positions in a
    split or a window), and the row a collator named by its place in the batch ("row 1: ...") by its own index. A
    row the collator already named as the user's ("train row 13: ...", :func:`collators.targets.row_name`) is left
    as it is. A mixture's rows (``sources``) are named as (source, row)."""
    rows = list(dict.fromkeys(indices if sources is None else zip(sources, indices)))  # windows of one row: once
    what = f"{role} data" if sources is None else f"{role} data (source, row)"
    message = f"collating the batch of rows {rows[:16]}{' ...' if len(rows) > 16 else ''} of the {what} failed"
    named = re.compile(rf"(?<!\b{re.escape(role)} )" + _BATCH_ROW.pattern).search(str(error))
    if named is not None and int(named.group(1)) < len(indices):
        place = int(named.group(1))
        where = f"{role} data" if sources is None else f"{role} data's source {sources[place]!r}"
        message += f" at row {indices[place]} of the {where} (the batch's row {place})"
    return message


def build_collator(
    spec: TaskSpec | None, tokenizer: Any, collate_fn: Any, name: str | None, kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], Resolution | None]:
    """The collator for a data module: ``collate_fn`` as given, or the registry's choice for ``spec``.

    The tokenizer goes to factories that name a ``tokenizer`` parameter, or take ``**kwargs`` for a text
    or multimodal spec; giving one to any other collator is an error rather than silently unused.
    """
    if collate_fn is not None:
        if name is not None or kwargs:
            raise ValueError("collate_fn replaces the registry's collator; do not pass collator_name or "
                             "collator_kwargs with it")
        if not callable(collate_fn):
            raise TypeError(f"collate_fn should be callable, but got {collate_fn!r}")
        return collate_fn, None
    registry = CollatorRegistry.get_instance()
    resolution = registry.resolve(spec, name)
    if tokenizer is not None:
        parameters = inspect.signature(resolution.chosen.factory).parameters.values()
        named = any(p.name == "tokenizer" for p in parameters)
        open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
        if named or (open_kwargs and spec is not None and spec.modality == "text"):
            kwargs.setdefault("tokenizer", tokenizer)
        elif spec is None or spec.modality != "multimodal":  # multimodal: the engine tokenizes its text at setup
            raise ValueError(
                f"tokenizer= was given, but the collator {resolution.chosen.name!r} chosen for this task "
                f"({resolution.reason}) takes no tokenizer; drop tokenizer= or choose a text collator"
            )
    return resolution.chosen.create(task_spec=spec, **kwargs), resolution


def _is_text_collator(collate_fn: Any) -> bool:
    """Whether ``collate_fn`` is a ``TextCollator``, without importing its module (and numba) for another collator:
    a TextCollator exists only once its module is imported."""
    text = sys.modules.get("collators.text")
    return text is not None and isinstance(collate_fn, text.TextCollator)
