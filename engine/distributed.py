"""Which rank this process is, and the checks that keep a multi-process run from hanging or double-counting."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def resolve_world(trainer: Any = None) -> tuple[int, int]:
    """(rank, world size): from a Lightning trainer when attached, else from ``torch.distributed``, else (0, 1)."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_trainer_keeps_our_samplers(trainer: Any) -> None:
    """Lightning replaces a loader's sampler under DDP unless told not to (Lightning #21131, #21447); ours is
    already rank-aware, and a replaced one would reshuffle, duplicate or hang. Refuse with the fix."""
    if trainer is None or int(trainer.world_size) <= 1:
        return
    connector = getattr(trainer, "_accelerator_connector", None)
    if getattr(connector, "use_distributed_sampler", False):
        raise ValueError(
            "UniversalDataModule shards its data by rank itself, but this Trainer would replace its samplers "
            "with DistributedSampler (use_distributed_sampler=True is Lightning's default). Create the Trainer with "
            "lightning.Trainer(..., use_distributed_sampler=False)"
        )
