"""Run under `torchrun --nproc_per_node=2`: a stream of 41 rows (one shard, so datasets splits it row by row:
21 and 20 rows); each rank writes the row ids and batch counts it saw per epoch to <out>/rank<r>.json."""

import json
import sys
from pathlib import Path

import datasets
import torch.distributed as dist

from engine import UniversalDataModule
from tests.distributed._data import SPEC

if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rows = {"input_ids": [[1 + i % 60] * (1 + i % 5) for i in range(41)], "row_id": list(range(41))}
    stream = datasets.Dataset.from_dict(rows).to_iterable_dataset(num_shards=1)
    dm = UniversalDataModule(stream, task_spec=SPEC, batch_size=4, seed=5, num_workers=int(sys.argv[2]))
    loader = dm.train_dataloader()
    epochs, counts = [], []
    for _ in range(2):
        batches = list(loader)
        epochs.append([int(i) for batch in batches for i in batch["row_id"]])
        counts.append(len(batches))
        dist.barrier()  # would hang if the ranks had different numbers of batches and then synchronized
    report = {"rank": dist.get_rank(), "train": epochs, "batches": counts}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
