"""Run under `torchrun --nproc_per_node=2` (gloo): each rank iterates its share of a module's train loader inside a
DataMonitor, gathers every rank's wait with ``monitor.rank_waits()`` and writes to <out>/rank<r>.json its own
numbers (``rank_wait()``) and the gathered table. Rank 1 reads through a transform that sleeps, so its loader's
decode stage is timed and its wait is the larger (the test asserts the table, not the times)."""

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from engine import UniversalDataModule
from engine.tools.monitor import DataMonitor
from tests.distributed._data import SPEC, IdRows


def slow(row):
    time.sleep(0.002)
    return row


if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), Path(sys.argv[1])
    dm = UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=4, seed=5, num_workers=1,
                             train_transform=slow if rank == 1 else None)
    with DataMonitor() as monitor:
        for _ in monitor.wrap(dm.train_dataloader()):
            pass
    own, table = monitor.rank_wait(), monitor.rank_waits()
    report = {"own": own.as_vector().tolist(), "table": [row.as_vector().tolist() for row in table.ranks],
              "imbalance": table.imbalance, "text": str(table), "html": table.to_html(),
              "summary": str(monitor.stats(gather=True))}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
