"""Lightning strategy='ddp' on CPU with 2 processes (gloo), with a DataMonitorCallback: each rank writes the table
its callback gathered at the end of the epoch, and what it logged, to <out>/rank<r>.json. Lightning re-launches
this script for rank 1."""

import json
import sys
from pathlib import Path

import lightning

from engine import DataMonitorCallback, UniversalDataModule
from tests.distributed._data import SPEC, IdRows
from tests.distributed._lightning_ddp import Recorder

if __name__ == "__main__":
    out = Path(sys.argv[1])
    callback = DataMonitorCallback(log_every_n_steps=2)
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                callbacks=[callback], num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(Recorder(), datamodule=UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=4, seed=5))
    table = callback.rank_waits
    report = {"rank": trainer.global_rank, "batches": callback.monitor.batches, "wait_s": callback.monitor.wait_s,
              "table": [[rank.rank, rank.batches, rank.wait_s] for rank in table.ranks],
              "imbalance": table.imbalance, "logged": sorted(callback.last_logged),
              "transfer_ms": callback.monitor.stages_ms()["transfer"]}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
