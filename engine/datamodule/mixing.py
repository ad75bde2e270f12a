"""A module's mixture: the batching modes it works with, and the order its training sampler draws from."""

from __future__ import annotations

import numpy as np

from engine.loading.factory import block_order
from engine.sampling.length import MEGA_BATCH_FACTOR
from engine.sampling.mixtures.mixture import Mixture
from engine.sampling.mixtures.order import MixtureOrder
from engine.sources.lengths import lengths_of
from engine.sources.mixed import MixedSource

DOCUMENT_BLOCK = 64
"""Documents per block of the mixture under token budgets and packing, whose steps hold varying row counts."""


def check_mixture_batching(mixture: Mixture, batching: str, mega_batch_factor: int = MEGA_BATCH_FACTOR) -> None:
    """Refuse, at construction, a schedule that a batching mode cannot follow step by step: under token budgets and
    packing a step holds a varying number of documents, so no document position is the start of a given step;
    grouped batching sorts rows by length within runs of ``mega_batch_factor`` steps, so a change must start one.
    ``on_change='continue'`` works under every mode: a state names the rows its epoch served."""
    if mixture.points and batching in ("token_budget", "packed"):
        raise ValueError(f"a Mixture schedule changes weights at training steps, but batching={batching!r} puts a "
                         f"varying number of documents in each step, so the switch could not fall on its step; use "
                         f"batching='plain' or 'grouped' with a schedule, or constant weights with {batching!r}")
    if batching == "grouped":
        for step in mixture.change_steps():
            if step % mega_batch_factor:
                low = step - step % mega_batch_factor
                where = f"{low} or {low + mega_batch_factor}" if low else f"{mega_batch_factor}"
                raise ValueError(f"batching='grouped' sorts rows by length within runs of {mega_batch_factor} steps, "
                                 f"so a Mixture schedule's change at step {step} would reach steps before it; put "
                                 f"it at step {where}")


def mixture_order(mixture: Mixture, source: MixedSource, *, batching: str, key: str | None, global_batch: int,
                  seed: int) -> MixtureOrder:
    """The order of ``mixture`` over the train split's sources: blocks of one global batch (one step) under plain
    and grouped batching, of :data:`DOCUMENT_BLOCK` documents otherwise."""
    lengths = None
    if key is not None and (mixture.by == "tokens" or batching != "plain"):
        lengths = [lengths_of(part, key) for part in source.sources]
    elif key is not None:  # plain batching by rows: the served tokens too, where no row must be read for them
        lengths = _cheap_lengths(source, key)
    block = global_batch if batching in ("plain", "grouped") else DOCUMENT_BLOCK
    return MixtureOrder(mixture, source.sizes, block=block, seed=seed, lengths=lengths,
                        within=[block_order(part) for part in source.sources])


def _cheap_lengths(source: MixedSource, key: str) -> list[np.ndarray] | None:
    """Each source's lengths where every source knows them without reading its rows one by one, else None."""
    try:
        parts = [part.lengths(key) for part in source.sources]
    except (KeyError, TypeError):  # a field without lengths (an image, raw text): no served tokens to count
        return None
    return None if any(part is None for part in parts) else parts
