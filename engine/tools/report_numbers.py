"""The numbers behind ``dm.report()``, read from the columns: row lengths, padding shares, truncation, labels;
and, from the first batch, a vision-language task's image sizes and image tokens.

Everything is computed with numpy over Arrow offsets, flat-buffer shapes or an Arrow label column, so a million
rows take well under a second. A source without columns (a map-style torch ``Dataset``) is read row by row only
up to :data:`ROW_PASS_LIMIT` rows, and the report says that it did; beyond that the number is left out and the
report says why, rather than stalling a notebook.
"""

from __future__ import annotations

import collections
import itertools
import sys
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from engine.sources.lengths import lengths_of

ROW_PASS_LIMIT = 10_000
"""Rows a source without columns is read one by one for the report (each row fetched, images and audio decoded);
larger ones are not measured."""


def measured_lengths(source: Any, key: str | None) -> tuple[np.ndarray | None, str]:
    """``(lengths, how they were read)``; ``(None, why not)`` where the rows have no length to read cheaply."""
    if isinstance(source, IterableDataset):
        return None, "a stream: its length is unknown until it is read"
    try:
        lengths = source.lengths(key)
        if lengths is not None:
            return lengths, source.lengths_from
        if len(source) > ROW_PASS_LIMIT:
            return None, (f"not measured: {len(source)} rows without a length column (a row pass is over "
                          f"{ROW_PASS_LIMIT})")
        return lengths_of(source, key), f"a pass over its {len(source)} rows (no length column)"
    except (KeyError, TypeError) as error:
        return None, f"not measured: {error}"


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Rows, total length (tokens or samples), min, mean, median, 95th percentile and max of ``lengths``."""
    if not len(lengths):
        return {"rows": 0, "total": 0}
    low, median, p95, high = np.percentile(lengths, [0, 50, 95, 100])
    return {"rows": int(len(lengths)), "total": int(lengths.sum()), "min": int(low), "mean": float(lengths.mean()),
            "median": float(median), "p95": float(p95), "max": int(high)}


def padded_widths(longest: np.ndarray, collator: Any) -> np.ndarray:
    """Vectorized :func:`collators._padding.padded_length` of each batch's longest row under ``collator``'s options."""
    max_length = getattr(collator, "max_length", None)
    widths = np.minimum(longest, max_length) if max_length is not None else longest.copy()
    if getattr(collator, "padding", "longest") == "max_length" and max_length is not None:
        widths[:] = max_length
    else:
        buckets = np.asarray(getattr(collator, "pad_to_buckets", None) or (), dtype=np.int64)
        if len(buckets):
            fitting = np.searchsorted(buckets, widths)  # the smallest bucket >= width; the collator refuses others
            widths = np.where(fitting < len(buckets), buckets[np.minimum(fitting, len(buckets) - 1)], widths)
    multiple = getattr(collator, "pad_to_multiple_of", None)
    if multiple:
        widths = -(-widths // multiple) * multiple
    return widths


def padding_share(batches: list[list[int]], lengths: np.ndarray, collator: Any = None) -> float | None:
    """Share of padded positions holding no data over ``batches`` (a sampler's epoch), the collator's truncation
    and rounding applied; None for no batches. One ``reduceat`` over the flattened batches, no loop over rows."""
    if _is_packed(collator) and batches:  # documents concatenated, no padding: every position real
        return 0.0
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    flat = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.int64, count=int(sizes.sum()))
    return padding_share_of_order(flat, sizes, lengths, collator)


def padding_share_of_order(order: np.ndarray, sizes: np.ndarray, lengths: np.ndarray,
                           collator: Any = None) -> float | None:
    """:func:`padding_share` of the batches that cut ``order`` (row indices) into consecutive ``sizes``."""
    if not len(sizes):
        return None
    rows = lengths[order[: int(sizes.sum())]]
    max_length = getattr(collator, "max_length", None)
    if max_length is not None:
        rows = np.minimum(rows, max_length)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    padded = int((padded_widths(np.maximum.reduceat(rows, starts), collator) * sizes).sum())
    return 1.0 - int(rows.sum()) / padded if padded else 0.0


def plain_padding_share(sampler: Any, lengths: np.ndarray, collator: Any = None) -> float | None:
    """:func:`padding_share` of epoch 0 of a :class:`SeededBatchSampler`, from its order without building lists
    of batches: the order cut into ``batch_size`` rows, the last batch short (or dropped with ``drop_last``)."""
    order = np.fromiter(sampler.rank_indices(0), dtype=np.int64)
    full, rest = divmod(len(order), sampler.batch_size)
    sizes = np.full(full + (rest > 0 and not sampler.drop_last), sampler.batch_size, dtype=np.int64)
    if rest and not sampler.drop_last:
        sizes[-1] = rest
    return padding_share_of_order(order, sizes, lengths, collator)


def truncation(lengths: np.ndarray, max_length: int | None) -> dict[str, int] | None:
    """``{rows, long_rows, tokens, lost_tokens}`` of cutting ``lengths`` to ``max_length`` (as ``dm.truncation``)."""
    if max_length is None:
        return None
    over = np.maximum(lengths - max_length, 0)
    return {"rows": int(len(lengths)), "long_rows": int((over > 0).sum()), "tokens": int(lengths.sum()),
            "lost_tokens": int(over.sum())}


def label_counts(source: Any, field: str | None, num_classes: int | None) -> tuple[dict[int, int] | None, str]:
    """``({class: rows}, how)`` of an integer class label per row; ``(None, why not)`` where there is none."""
    if field is None:
        return None, "the task has no target field"
    if isinstance(source, IterableDataset):
        return None, "a stream: its labels are unknown until it is read"
    if (values := source.labels(field)) is not None:
        how = "the Arrow label column"
    elif len(source) <= ROW_PASS_LIMIT:
        values, how = _row_labels(source, field), f"a pass over its {len(source)} rows (no label column)"
    else:
        return None, f"not counted: {len(source)} rows without a label column (a row pass is over {ROW_PASS_LIMIT})"
    if values is None:
        return None, f"no integer class label under {field!r}"
    values = values[values >= 0]  # -100 and other negative labels are ignored by the loss
    counts = np.bincount(values, minlength=num_classes or 0) if len(values) else np.zeros(num_classes or 0, np.int64)
    return {index: int(count) for index, count in enumerate(counts)}, how


def class_names(source: Any, field: str | None) -> list[str] | None:
    """The class names of a ``datasets.ClassLabel`` column ``field`` (as ``load_dataset('imagefolder')`` and
    ``class_encode_column`` make them), else None."""
    if field is None or isinstance(source, IterableDataset):
        return None
    return source.class_names(field)


def _row_labels(source: Any, field: str, chunk: int = 1024) -> np.ndarray | None:
    values = np.empty(len(source), dtype=np.int64)
    for start in range(0, len(source), chunk):
        rows = source.__getitems__(list(range(start, min(start + chunk, len(source)))))
        for offset, row in enumerate(rows):
            label = row.get(field) if hasattr(row, "get") else None
            if label is None or getattr(label, "ndim", 0) != 0 or isinstance(label, (float, np.floating)) or (
                    hasattr(label, "is_floating_point") and label.is_floating_point()):
                return None  # no scalar integer label: a sequence target, a regression value or none at all
            values[start + offset] = int(label)
    return values


def shard_reads(sources: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per reader among ``sources`` (by split; a mixture's by split and name), keyed by the splits that read it
    (``"train, val"`` for a cut ``val_split``): its :meth:`~engine.sources.protocol.Source.counters`, for sharded
    data the listing (``shards``, ``row_groups``, ``rows``) and what its reader did (``process``: this process's
    reader, setup's reads included; ``workers``: the loader worker processes', as of each worker's last batch)."""
    readers: dict[Any, tuple[list[str], dict[str, Any]]] = {}
    for role, source in sources.items():
        if isinstance(source, IterableDataset):
            continue
        for name, part in source.parts():
            counted = part.counters()
            if counted is not None:  # splits of one corpus share its reader and counts
                readers.setdefault(counted[0], ([], counted[1]))[0].append(role if name is None else f"{role} {name!r}")
    return {", ".join(roles): counts for roles, counts in readers.values()}


def describe_reads(reads: dict[str, Any]) -> str:
    """One line of :func:`shard_reads`: the listing, then the reader's counts, this process's and the workers'."""
    def counts(values: dict[str, int]) -> str:
        return ", ".join(f"{key}={value}" for key, value in values.items())

    return (f"{reads['shards']} shards, {reads['row_groups']} row groups, {reads['rows']} rows; reads of this "
            f"process: {counts(reads['process'])}; of its loader workers (as of their last batch): "
            f"{counts(reads['workers'])}")


def _is_packed(collator: Any) -> bool:
    """Whether ``collator`` is a ``PackedCollator``; its module (numba) is loaded wherever one exists."""
    packed = sys.modules.get("collators.packed")
    return packed is not None and isinstance(collator, packed.PackedCollator)


def image_numbers(batch: Any, collator: Any) -> dict[str, Any] | None:
    """What a vision-language batch holds: the sizes its images were resized to (``{'HxW': count}``), the image
    tokens of each row (min, mean, max) and the shares of text and image tokens among its real positions; None for
    a batch without images per row (any other task)."""
    rows = getattr(collator, "rows", collator)  # a packed collator holds its rows' collator
    token_id = getattr(rows, "image_token_id", None)
    if token_id is None or not isinstance(batch, dict) or "images_per_row" not in batch:
        return None
    ids = batch[rows.input_field]
    image = ids == token_id
    if "cu_seq_lens_q" in batch:  # a pack: its rows lie between the boundaries
        bounds = batch["cu_seq_lens_q"].tolist()
        per_row = [int(image[0, start:end].sum()) for start, end in zip(bounds[:-1], bounds[1:])]
        real = ids.numel()
    else:
        per_row = image.sum(1).tolist()
        real = int(batch["attention_mask"].sum())
    if "image_sizes" in batch:
        sizes = [tuple(size) for size in batch["image_sizes"].tolist()]
    elif rows.image_field in batch:
        sizes = [tuple(batch[rows.image_field].shape[-2:])] * len(batch[rows.image_field])
    else:
        sizes = []
    counted = dict(sorted(collections.Counter(f"{height}x{width}" for height, width in sizes).items()))
    image_tokens = sum(per_row)
    return {"sizes": counted, "images": int(batch["images_per_row"].sum()),
            "tokens_per_row": {"min": min(per_row), "mean": image_tokens / len(per_row), "max": max(per_row)},
            "image_share": image_tokens / max(real, 1), "text_share": 1 - image_tokens / max(real, 1)}


def describe_images(numbers: dict[str, Any]) -> str:
    """One line of :func:`image_numbers`."""
    sizes = ", ".join(f"{count} at {size}" for size, count in numbers["sizes"].items()) or (
        "decoded on the device" if numbers["images"] else "none in this batch")
    tokens = numbers["tokens_per_row"]
    return (f"{numbers['images']} images ({sizes}); image tokens per row min {tokens['min']}, mean "
            f"{tokens['mean']:.1f}, max {tokens['max']}; tokens: text {numbers['text_share']:.1%}, image "
            f"{numbers['image_share']:.1%}")
