"""Run as one process or under torchrun, one or more jobs one after another.

``save <folder> <steps> <workers>``: a plain loop over a DataModule with <workers> loader workers serves <steps>
steps, saves the data state with DCP into <folder>/dcp on every rank, then serves the rest of the epoch (the
uninterrupted run). ``resume <folder> <out>``: a fresh module on this run's ranks loads <folder>/dcp with DCP and
serves the rest of the epoch. Each writes its rank's rows to a json file in its folder (<folder> or <out>). The
global batch is 8 rows: batch_size is 8 // world size."""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from engine import DataModule
from tests.distributed._data import SPEC, IdRows

GLOBAL_BATCH = 8


def module(world_size, workers=0):
    return DataModule(IdRows(), task_spec=SPEC, batch_size=GLOBAL_BATCH // world_size, val_split=8, seed=5,
                      num_workers=workers)


def row_ids(batches):
    return [int(i) for batch in batches for i in batch["row_id"]]


def save(world, folder, steps, workers):
    dm = module(world, workers)
    iterator = iter(dm.train_dataloader())
    served = row_ids(next(iterator) for _ in range(steps))
    leaf = dm.state_dict()
    dcp.save({"data": dm}, checkpoint_id=folder / "dcp")
    digest = {key: hashlib.sha256(value).hexdigest() for key, value in leaf.items()}
    return {"served": served, "rest": row_ids(iterator), "leaf": digest}


def resume(world, folder):
    dm = module(world)
    dcp.load({"data": dm}, checkpoint_id=folder / "dcp")
    rest = row_ids(dm.train_dataloader())
    if dist.is_initialized():
        dist.barrier()  # would hang here if one rank had more batches than another
    return {"rest": rest}


if __name__ == "__main__":
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    jobs = sys.argv[1:]
    while jobs:
        mode, folder = jobs[0], Path(jobs[1])
        if mode == "save":
            out, report, jobs = folder, save(world, folder, int(jobs[2]), int(jobs[3])), jobs[4:]
        else:
            out, report, jobs = Path(jobs[2]), resume(world, folder), jobs[3:]
        (out / f"{mode}{rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()
