"""Which rank this process is, and the checks that keep a multi-process run from hanging or double-counting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from engine.core.compat import replaces_samplers, set_replaces_samplers


def rank_and_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the default process group, or None when ``torch.distributed`` is not initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def resolve_world(trainer: Any = None) -> tuple[int, int]:
    """(rank, world size): from a Lightning trainer when attached, else from ``torch.distributed``, else (0, 1)."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    return rank_and_world() or (0, 1)


def keep_our_samplers(trainer: Any) -> bool:
    """Lightning replaces a loader's sampler under DDP unless told not to (Lightning #21131, #21447); ours is
    already rank-aware, and a replaced one would reshuffle, duplicate or hang. Turn the trainer's replacement off
    (``use_distributed_sampler=False``, what its user would otherwise have to pass) and return whether it was on,
    so :func:`restore_samplers` can turn it on again for loaders that are not ours."""
    if trainer is None or int(trainer.world_size) <= 1 or not replaces_samplers(trainer):
        return False
    set_replaces_samplers(trainer, False)
    return True


def restore_samplers(trainer: Any) -> None:
    """Turn the trainer's replacement of samplers back on, after :func:`keep_our_samplers` turned it off."""
    if trainer is not None:
        set_replaces_samplers(trainer, True)


def stop_together(batches: Iterator[Any]) -> Iterator[Any]:
    """Yield ``batches`` while every rank still has one: a pass ends on all ranks when the first runs out.

    For streams, whose ranks can hold a few more or fewer rows than each other: a rank that went on alone would
    wait forever in the next collective (datasets #6437, Lightning #20404). One small all-reduce per batch; the
    longer ranks' last batches of the pass are dropped.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    while True:
        try:
            batch, has_batch = next(batches), 1
        except StopIteration:
            batch, has_batch = None, 0
        everyone = torch.tensor([has_batch], device=device)
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        if not int(everyone.item()):
            return
        yield batch
