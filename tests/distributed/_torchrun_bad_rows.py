"""Run under `torchrun --nproc_per_node=2`: rows that fail to read on rank 0 only (on_error='skip', 2 workers).
Each step all-reduces, as DDP's gradient sync does, so unequal batch counts would hang or time out; each rank
writes its batch counts, rows seen and rows left out to <out>/rank<r>.json."""

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine import UniversalDataModule
from tests.distributed._data import SPEC, IdRows


class BadOnRankZero(IdRows):
    def __getitem__(self, index):
        if os.environ["RANK"] == "0" and index % 5 == 1:  # workers inherit the environment
            raise OSError(f"truncated file {index}")
        return super().__getitem__(index)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    dm = UniversalDataModule(BadOnRankZero(), task_spec=SPEC, batch_size=4, val_split=8, seed=5, uneven="drop",
                             num_workers=2, on_error="skip")
    loader, report = dm.train_dataloader(), {"rank": dist.get_rank(), "batches": [], "train": [], "skipped": []}
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        before, rows, batches = len(dm.skipped.records), [], 0
        for batch in loader:
            dist.all_reduce(torch.ones(1))  # a rank with fewer batches would leave the other waiting here
            rows += [int(i) for i in batch["row_id"]]
            batches += 1
        report["batches"].append(batches)
        report["train"].append(rows)
        report["skipped"].append([row.index for row in dm.skipped.records[before:]])
    val_batches = 0
    for _ in dm.val_dataloader():
        dist.all_reduce(torch.ones(1))
        val_batches += 1
    report["val_batches"] = val_batches
    dist.barrier()
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
