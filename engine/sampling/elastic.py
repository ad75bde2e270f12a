"""Elastic resume: an epoch saved part-way on W ranks continues on W' ranks, every remaining row exactly once.

An epoch's row order is a function of (seed, epoch) alone, and each rank's batches are a function of that order,
the number of ranks, the rank and the per-rank batch (rows, or tokens for a token budget). So the rows served
before a save are a function of the saved state: (epoch, the number of ranks, the batches each rank had yielded).
Resuming on another number of ranks removes those rows from the epoch's order, keeps the rest in that order, and
cuts it as a fresh epoch on the new ranks would be cut, with the per-rank batch ``global_batch / W'``; each such
earlier part of the epoch is a *segment* ``(num_replicas, position)`` kept in the state, a few integers. The next
epochs are exactly what a fresh run on W' ranks serves.

The samplers say how, through :class:`ElasticSampler`: ``epoch_order``, ``batches_of`` and ``per_rank_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from engine.core.checks import check_saved_int

Segment = tuple[int, int]
"""A part of an epoch served on an earlier topology: (number of ranks, batches each rank had yielded)."""


class ElasticSampler(Protocol):
    """What a batch sampler provides to resume on another number of ranks."""

    num_replicas: int
    rank: int
    per_rank_option: str  # the constructor argument that holds the per-rank batch, e.g. "batch_size"

    @property
    def per_rank_size(self) -> int: ...

    def epoch_order(self, epoch: int) -> np.ndarray: ...

    def batches_of(self, order: np.ndarray, epoch: int, num_replicas: int, rank: int,
                   per_rank_size: int) -> list[list[int]]: ...


def global_batch(sampler: ElasticSampler) -> int:
    """The batch of one step across all ranks: ranks x per-rank batch (rows, or tokens for a token budget)."""
    return sampler.num_replicas * sampler.per_rank_size


def check_global_batch(sampler: ElasticSampler, saved_replicas: int, saved_global: Any) -> None:
    """Refuse a state whose global batch differs from this sampler's: the rest of its epoch would be cut into
    other steps. Names the per-rank value to pass, or says that the global batch does not divide."""
    saved_global = check_saved_int("sampler state", "global_batch", saved_global, low=1)
    mine, name = global_batch(sampler), sampler.per_rank_option
    if saved_global == mine:
        return
    if saved_global % sampler.num_replicas:
        fix = (f"{saved_global} does not divide among {sampler.num_replicas} ranks; resume on a number of ranks "
               f"that divides it")
    else:
        fix = f"build it with {name}={saved_global // sampler.num_replicas} (the global batch / {sampler.num_replicas})"
    raise ValueError(
        f"sampler state was saved with a global batch of {saved_global} ({saved_replicas} ranks x {name}="
        f"{saved_global // saved_replicas}), but this sampler's is {mine} ({sampler.num_replicas} ranks x {name}="
        f"{sampler.per_rank_size}); the rest of the epoch would be cut into other steps. To resume, {fix}"
    )


def check_ranks(saved_replicas: int, saved_global: int) -> None:
    """Refuse a number of ranks that does not divide the global batch: each rank's share of a step would be cut
    short (or be empty, with more ranks than the step has rows or tokens)."""
    if saved_global % saved_replicas:
        raise ValueError(f"sampler state's num_replicas should divide its global_batch={saved_global} (every rank "
                         f"serves a whole share of each step), but got num_replicas={saved_replicas}; the state was "
                         f"not saved by this engine, or was changed since")


def check_segments(value: Any, saved_global: int) -> tuple[Segment, ...]:
    """The ``served`` segments of a saved state, as a tuple of (num_replicas, position) pairs."""
    if not isinstance(value, Sequence) or not all(isinstance(s, Sequence) and len(s) == 2 for s in value):
        raise TypeError(f"sampler state's served should be a list of [num_replicas, position] pairs, but got "
                        f"served={value!r:.80}")
    segments = tuple((check_saved_int("sampler state", "served num_replicas", w, low=1),
                      check_saved_int("sampler state", "served position", p, low=1)) for w, p in value)
    for replicas, _ in segments:
        if saved_global % replicas:
            raise ValueError(f"sampler state's served segment on {replicas} ranks does not divide its global batch "
                             f"{saved_global}; the state was not written by this engine")
    return segments


def remaining_order(sampler: ElasticSampler, epoch: int, segments: tuple[Segment, ...]) -> np.ndarray:
    """The epoch's order without the rows the ``segments`` served, in the epoch's order."""
    order, total = sampler.epoch_order(epoch), global_batch(sampler)
    for replicas, position in segments:
        per_rank = [sampler.batches_of(order, epoch, replicas, rank, total // replicas) for rank in range(replicas)]
        had = max(len(batches) for batches in per_rank)
        if position > had:
            raise ValueError(f"sampler state's served position should be at most the {had} batches each of {replicas} "
                             f"ranks had in epoch {epoch}, but got served position={position}; the state was saved "
                             f"from other data or options, or was changed since")
        served = [batches[:position] for batches in per_rank]
        rows = np.fromiter((row for batches in served for batch in batches for row in batch), dtype=np.int64)
        order = without(order, rows)
    return order


def without(order: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``order`` less one occurrence of each of ``rows`` (the earliest), in order. An order holds a row more than
    once when a mixture cycles a source within an epoch; each served copy removes one."""
    return order[~taken_out(order, rows)] if len(rows) else order


def taken_out(order: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Which positions of ``order`` :func:`without` removes for ``rows``: the earliest occurrence of each served
    copy (a row served more often than the order holds it, a rank's padding, removes what there is)."""
    if not len(rows):
        return np.zeros(len(order), dtype=bool)
    if len(np.unique(order)) == len(order):
        return np.isin(order, rows)
    values, counts = np.unique(rows, return_counts=True)
    by_value = np.argsort(order, kind="stable")
    ordered = order[by_value]
    firsts = np.searchsorted(ordered, ordered, side="left")
    occurrence = np.arange(len(ordered)) - firsts  # 0 for a row's first copy in the order, 1 for its second...
    found = np.searchsorted(values, ordered)
    found[found == len(values)] = 0
    served = np.where(values[found] == ordered, counts[found], 0)
    taken = np.empty(len(order), dtype=bool)
    taken[by_value] = occurrence < served
    return taken


def pass_batches(sampler: ElasticSampler, epoch: int, segments: tuple[Segment, ...], *, num_replicas: int | None = None,
                 rank: int | None = None) -> list[list[int]]:
    """One rank's batches of the rest of ``epoch`` after ``segments`` (by default this sampler's topology)."""
    replicas = sampler.num_replicas if num_replicas is None else num_replicas
    rank = sampler.rank if rank is None else rank
    order = remaining_order(sampler, epoch, segments)
    return sampler.batches_of(order, epoch, replicas, rank, global_batch(sampler) // replicas)
