"""Run under `torchrun --nproc_per_node=2`: a hand-written loop over UniversalDataModule; each rank writes the
row ids it saw per train epoch and in validation to <out>/rank<r>.json."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from engine import UniversalDataModule
from tests.distributed._data import SPEC, IdRows

if __name__ == "__main__":
    out, uneven = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    dm = UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=4, val_split=8, seed=5, uneven=uneven,
                             num_workers=int(sys.argv[3]))
    loader = dm.train_dataloader()
    epochs = []
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        epochs.append([int(i) for batch in loader for i in batch["row_id"]])
        dist.barrier()  # would hang here if one rank had more batches than the other
    val = [int(i) for batch in dm.val_dataloader() for i in batch["row_id"]]
    batches = len(dm.val_dataloader())
    report = {"rank": dist.get_rank(), "train": epochs, "val": val, "val_batches": batches,
              "world_size": dm.world_size}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
