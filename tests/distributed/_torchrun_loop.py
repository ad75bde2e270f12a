"""Run under `torchrun --nproc_per_node=2`: a hand-written loop over UniversalDataModule; each rank writes the
row ids it saw per train epoch and in validation to <out>/rank<r>.json. Arguments: out, then one or more cases
``<uneven>:<mode>``, run one after another in this launch, each with a module of its own; the loader mode is a
number of worker processes ("0", "2") or of threads ("threads=1"; then the same loop with ``num_workers=0`` is
written too, under "workers_0", to compare with). A case ``stream:<workers>`` is the stream of
``_torchrun_stream.py`` instead. The report holds each case's rows under "cases"."""

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from engine import UniversalDataModule
from tests.distributed._data import SPEC, IdRows
from tests.distributed._torchrun_stream import seen_stream


def seen(uneven: str, **parallel: int) -> dict[str, Any]:
    """The row ids of two train epochs and of validation, with the data module's loaders in ``parallel`` mode."""
    dm = UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=4, val_split=8, seed=5, uneven=uneven,
                             **parallel)
    loader = dm.train_dataloader()
    epochs = []
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        epochs.append([int(i) for batch in loader for i in batch["row_id"]])
        dist.barrier()  # would hang here if one rank had more batches than the other
    val = [int(i) for batch in dm.val_dataloader() for i in batch["row_id"]]
    return {"train": epochs, "val": val, "val_batches": len(dm.val_dataloader()), "world_size": dm.world_size}


def case(uneven: str, mode: str) -> dict[str, Any]:
    if uneven == "stream":
        return seen_stream(int(mode))
    threads = mode.startswith("threads=")
    report = seen(uneven, **({"num_threads": int(mode.removeprefix("threads="))} if threads
                             else {"num_workers": int(mode)}))
    if threads:
        report["workers_0"] = seen(uneven, num_workers=0)
    return report


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    report = {"rank": dist.get_rank(), "cases": {name: case(*name.split(":", 1)) for name in sys.argv[2:]}}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
