"""A stream of 41 rows (one shard, so datasets splits it row by row: 21 and 20 rows) on the ranks of a torchrun
launch: ``_torchrun_loop.py`` runs ``seen_stream`` for its case ``stream:<workers>``."""

from typing import Any

import datasets
import torch.distributed as dist

from engine import UniversalDataModule
from tests.distributed._data import SPEC


def seen_stream(workers: int) -> dict[str, Any]:
    """The row ids and batch counts this rank saw in each of two epochs."""
    rows = {"input_ids": [[1 + i % 60] * (1 + i % 5) for i in range(41)], "row_id": list(range(41))}
    stream = datasets.Dataset.from_dict(rows).to_iterable_dataset(num_shards=1)
    dm = UniversalDataModule(stream, task_spec=SPEC, batch_size=4, seed=5, num_workers=workers)
    loader = dm.train_dataloader()
    epochs, counts = [], []
    for _ in range(2):
        batches = list(loader)
        epochs.append([int(i) for batch in batches for i in batch["row_id"]])
        counts.append(len(batches))
        dist.barrier()  # would hang if the ranks had different numbers of batches and then synchronized
    return {"train": epochs, "batches": counts}
