"""Step accounting: batches per epoch, global batch size and validation steps, for any loader the engine builds.

The three functions keep the semantics of dream-trainer's ``utils/dataloader.py`` (see each docstring for where
that code is inconsistent and what is kept). "Length" is always in loader batches, so ``drop_last`` counts.

Batch size, the one thing a loader may not know, is read in this order: ``loader.batch_size`` (torch's automatic
batching); ``loader.batch_sampler.batch_size`` (the engine's :class:`~engine.sampling.seeded.SeededBatchSampler`,
torch's ``BatchSampler``); ``loader.dataset.batch_size`` (an IterableDataset that yields whole batches); for a
:class:`~engine.multi.loader.MultiDataLoader`, its children's common batch size. A token-budget loader
(:class:`~engine.sampling.length.TokenBudgetBatchSampler`) has no fixed batch size: its batches hold as many rows
as fit in ``max_tokens``. Asking for its batch size raises an error that names ``max_tokens`` and the epoch's mean
rows per batch; pass ``batch_size=`` to :func:`get_train_dataloader_steps` to say which size the global batch size
uses.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from engine.core.checks import check_int

Batch = dict[str, Any]
"""A batch as the collators build it: field name -> tensor (or list, for fields that do not stack)."""




def loader_length(dataloader: Iterable[Any]) -> int | None:
    """Batches per epoch of ``dataloader``, or None when it cannot know (an IterableDataset without ``__len__``)."""
    try:
        return len(dataloader)  # type: ignore[arg-type]
    except TypeError:
        return None


def _unknown_length(dataloader: Any, argument: str) -> ValueError:
    dataset = getattr(dataloader, "dataset", None)
    what = f"its dataset ({type(dataset).__name__}) has no __len__" if dataset is not None else "it has no __len__"
    return ValueError(f"the number of batches of this {type(dataloader).__name__} is unknown: {what}. "
                      f"Pass {argument}=<batches per epoch> to say how long an epoch is")


def get_epoch_length(dataloader: Iterable[Any], length: int | None = None) -> int:
    """Batches in one epoch: ``length`` when given, else ``len(dataloader)``.

    Args:
        dataloader: Any loader; a loader over an IterableDataset without ``__len__`` needs ``length``.
        length: Batches per epoch, overriding the loader's own length.

    Raises:
        ValueError: ``length`` is not an int >= 0, or it is None and the loader has no length.

    Example:
        >>> get_epoch_length(range(5)), get_epoch_length(iter(range(5)), length=3)
        (5, 3)
    """
    if length is not None:
        check_int("length", length, minimum=0)
        return length
    known = loader_length(dataloader)
    if known is None:
        raise _unknown_length(dataloader, "length")
    return known


def loader_batch_size(dataloader: Any) -> int:
    """Rows per batch of ``dataloader`` (see the module docstring for the lookup order).

    Raises:
        ValueError: No fixed batch size: a token-budget sampler (the message names ``max_tokens`` and the
            mean rows per batch), children of a multi-loader with different sizes, or nothing to read it from.
    """
    children = getattr(dataloader, "loaders", None)
    if isinstance(children, Mapping):  # a MultiDataLoader: one size if all its children agree
        sizes = {name: loader_batch_size(child) for name, child in children.items()}
        if len(set(sizes.values())) == 1:
            return next(iter(sizes.values()))
        raise ValueError(f"the multi-loader's children have different batch sizes {sizes}, so there is no single "
                         f"batch size; pass batch_size=<the size to count> explicitly")
    size = getattr(dataloader, "batch_size", None)
    if isinstance(size, int):
        return size
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    size = getattr(batch_sampler, "batch_size", None)
    if isinstance(size, int):
        return size
    max_tokens = getattr(batch_sampler, "max_tokens", None)
    if max_tokens is not None:
        mean = _mean_batch_rows(batch_sampler)
        hint = f"; this epoch's batches hold {mean:.1f} rows on average" if mean is not None else ""
        raise ValueError(
            f"the loader's {type(batch_sampler).__name__} packs each batch up to max_tokens={max_tokens} tokens, "
            f"so batches have no fixed number of rows{hint}. Pass batch_size=<rows to count per batch> "
            f"(e.g. the mean) to say what the global batch size means for this loader"
        )
    size = getattr(getattr(dataloader, "dataset", None), "batch_size", None)
    if isinstance(size, int):
        return size
    raise ValueError(f"cannot tell the batch size of this {type(dataloader).__name__}: neither it, its batch_sampler "
                     f"nor its dataset has an int batch_size. Pass batch_size=<rows per batch>")


def _mean_batch_rows(batch_sampler: Any) -> float | None:
    epoch_batches = getattr(batch_sampler, "epoch_batches", None)
    if not callable(epoch_batches):
        return None
    batches = epoch_batches(getattr(batch_sampler, "epoch", 0))
    return sum(len(batch) for batch in batches) / len(batches) if batches else None


def get_train_dataloader_steps(
    dataloader: Iterable[Any],
    train_steps_per_epoch: int | None,
    gradient_accumulation_steps: int = 1,
    dp_size: int = 1,
    *,
    batch_size: int | None = None,
) -> tuple[int, int, int]:
    """Global batch size, loader batches per epoch and gradient accumulation steps of a training loader.

    Args:
        dataloader: This rank's training loader (already sharded: ``dp_size`` never divides its length).
        train_steps_per_epoch: Optimizer steps per epoch, or None to use ``len(dataloader)``.
        gradient_accumulation_steps: Loader batches per optimizer step.
        dp_size: Data-parallel ranks.
        batch_size: Rows per loader batch, overriding the lookup (needed for a token-budget loader).

    Returns:
        ``(global_batch_size, steps, gradient_accumulation_steps)``: ``global_batch_size = batch_size * dp_size *
        gradient_accumulation_steps``. ``steps`` counts loader batches: ``train_steps_per_epoch *
        gradient_accumulation_steps`` when given (the argument counts optimizer steps), else ``len(dataloader)``,
        not multiplied (the loader's length already counts batches). This asymmetry is the seed's.

    Raises:
        ValueError: A count is not a positive int; the length is needed but unknown (names
            ``train_steps_per_epoch``); the batch size is unknown (see :func:`loader_batch_size`).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(range(100), batch_size=8)  # 13 batches
        >>> get_train_dataloader_steps(loader, None, 2, dp_size=4), get_train_dataloader_steps(loader, 5, 2)
        ((64, 13, 2), (16, 10, 2))
    """
    check_int("gradient_accumulation_steps", gradient_accumulation_steps, minimum=1)
    check_int("dp_size", dp_size, minimum=1)
    known = loader_length(dataloader)
    if train_steps_per_epoch is None:
        if known is None:
            raise _unknown_length(dataloader, "train_steps_per_epoch")
        steps = known
    else:
        check_int("train_steps_per_epoch", train_steps_per_epoch, minimum=1)
        steps = train_steps_per_epoch * gradient_accumulation_steps
        if known is not None and steps > known:  # upstream compares before multiplying; batches are what run out
            warnings.warn(f"train_steps_per_epoch={train_steps_per_epoch} x gradient_accumulation_steps="
                          f"{gradient_accumulation_steps} = {steps} batches, but the loader has only {known} per "
                          f"epoch", UserWarning, stacklevel=2)
    if batch_size is None:
        batch_size = loader_batch_size(dataloader)
    check_int("batch_size", batch_size, minimum=1)
    return batch_size * dp_size * gradient_accumulation_steps, steps, gradient_accumulation_steps


def get_val_dataloader_steps(
    dataloader: Iterable[Any],
    val_steps_per_epoch: int | None,
    num_sanity_val_steps: int = 0,
    dp_size: int = 1,
) -> tuple[int, int]:
    """Validation batches per rank and sanity-check steps per rank.

    Unlike the training steps, both counts are divided by ``dp_size`` (the seed's semantics): they are read as
    totals over all ranks, e.g. an unsharded validation loader. The engine's evaluation loaders built with
    ``rank``/``num_replicas`` are already sharded, so their length is per rank: pass ``dp_size=1`` for them,
    or the count is divided twice.

    Args:
        dataloader: The validation loader.
        val_steps_per_epoch: Validation batches over all ranks; None uses ``len(dataloader)``. 0 means no
            validation (upstream treated 0 like None).
        num_sanity_val_steps: Sanity-check batches before training, over all ranks.
        dp_size: Data-parallel ranks.

    Returns:
        ``(n // dp_size, ceil(num_sanity_val_steps / dp_size))``: the floor drops up to ``dp_size - 1`` batches
        so every rank runs the same number; the sanity count rounds up so a requested check always runs.

    Raises:
        ValueError: A count is negative or not an int, or the length is needed but unknown (names
            ``val_steps_per_epoch``).

    Example:
        >>> get_val_dataloader_steps(range(10), None, num_sanity_val_steps=3, dp_size=4)
        (2, 1)
    """
    check_int("num_sanity_val_steps", num_sanity_val_steps, minimum=0)
    check_int("dp_size", dp_size, minimum=1)
    known = loader_length(dataloader)
    if val_steps_per_epoch is None:
        if known is None:
            raise _unknown_length(dataloader, "val_steps_per_epoch")
        batches = known
    else:
        check_int("val_steps_per_epoch", val_steps_per_epoch, minimum=0)
        batches = val_steps_per_epoch
        if known is not None and batches > known:
            warnings.warn(f"val_steps_per_epoch={batches}, but the loader has only {known} batches",
                          UserWarning, stacklevel=2)
    return batches // dp_size, math.ceil(num_sanity_val_steps / dp_size)
