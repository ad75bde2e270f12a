"""Run as one process or under torchrun, one or more jobs one after another: ``save <out> <workers> <steps>``
trains <steps> steps of a plain loop and writes the module state to <out> (rank 0, as a checkpoint is written) and
each rank's rows; ``resume <state> <out> <workers>`` loads the state in the folder <state> on this run's number of
ranks, finishes the epoch and runs the next, and writes to <out> each rank's rows and those of a fresh run's second
epoch. Each job builds a module of its own. The global batch is 8 rows: batch_size is 8 // world size."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine import UniversalDataModule
from engine.core.compat import sampler_state_of
from tests.distributed._data import SPEC, IdRows

GLOBAL_BATCH = 8


def module(world_size, workers):
    return UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=GLOBAL_BATCH // world_size, val_split=8, seed=5,
                               num_workers=workers)


def row_ids(batches):
    return [int(i) for batch in batches for i in batch["row_id"]]


def save(rank, world, out, workers, steps):
    dm = module(world, workers)
    iterator = iter(dm.train_dataloader())
    served = row_ids(next(iterator) for _ in range(steps))
    state = dm.state_dict()
    if rank == 0:
        torch.save(state, out / "state.pt")
    return {"served": served, "sampler": sampler_state_of(dm.data_state()["train_loader"])}


def resume(rank, world, state, workers):
    dm = module(world, workers)
    dm.load_state_dict(torch.load(state / "state.pt", weights_only=True))
    loader = dm.train_dataloader()
    rest = row_ids(loader)
    if dist.is_initialized():
        dist.barrier()  # would hang here if one rank had more batches than another
    following = row_ids(loader)
    fresh = module(world, workers)
    fresh.train_dataloader().batch_sampler.set_epoch(1)
    return {"rest": rest, "next": following, "fresh_next": row_ids(fresh.train_dataloader())}


if __name__ == "__main__":
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    jobs = sys.argv[1:]
    while jobs:
        (mode, first, second, third), jobs = jobs[:4], jobs[4:]
        if mode == "save":
            out, report = Path(first), save(rank, world, Path(first), int(second), int(third))
        else:
            out, report = Path(second), resume(rank, world, Path(first), int(third))
        (out / f"{mode}{rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()
