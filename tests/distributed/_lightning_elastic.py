"""Lightning DDP on CPU with 2 processes (gloo) stops at max_steps=2 mid-epoch and writes <out>/ddp.ckpt; each
rank writes the row ids it trained on to <out>/rank<r>.json. tests/distributed/test_elastic.py resumes the
checkpoint on 1 device. The global batch is 8 rows: batch_size is 8 // devices."""

import json
import sys
from pathlib import Path

import lightning
import torch

from engine import UniversalDataModule
from tests.distributed._data import SPEC, IdRows

GLOBAL_BATCH = 8


class Recorder(lightning.LightningModule):
    """Trains a tiny model and records the ids (under ``key``) of the rows it trained on."""

    def __init__(self, key="row_id", vocab=64):
        super().__init__()
        self.key, self.embed, self.head = key, torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)
        self.rows: list[int] = []

    def training_step(self, batch, batch_index):
        self.rows.extend(int(i) for i in batch[self.key])
        logits = self.head(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def module(devices):
    return UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=GLOBAL_BATCH // devices, val_split=8, seed=5)


def trainer(devices, max_steps):
    return lightning.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                             max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                             limit_val_batches=0)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    model, run = Recorder(), trainer(2, 2)
    run.fit(model, datamodule=module(2))
    run.save_checkpoint(out / "ddp.ckpt")
    (out / f"rank{run.global_rank}.json").write_text(json.dumps(model.rows))
