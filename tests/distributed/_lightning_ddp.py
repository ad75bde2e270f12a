"""Lightning strategy='ddp' on CPU with 2 processes (gloo); each rank writes the row ids it trained and validated
on to <out>/rank<r>.json. Lightning re-launches this script for rank 1."""

import json
import sys
from pathlib import Path

import lightning
import torch

from engine import UniversalDataModule
from tests.distributed._data import SPEC, IdRows


class Recorder(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)
        self.train_ids: list[list[int]] = [[], []]
        self.val_ids: list[int] = []

    def loss(self, batch):
        logits = self.head(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def training_step(self, batch, batch_index):
        self.train_ids[self.current_epoch].extend(int(i) for i in batch["row_id"])
        return self.loss(batch)

    def validation_step(self, batch, batch_index):
        if not self.trainer.sanity_checking and self.current_epoch == 1:
            self.val_ids.extend(int(i) for i in batch["row_id"])
        self.log("val_loss", self.loss(batch), sync_dist=True, batch_size=len(batch["row_id"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dm = UniversalDataModule(IdRows(), task_spec=SPEC, batch_size=4, val_split=8, seed=5)
    model = Recorder()
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    # use_distributed_sampler left at Lightning's default: the module turns it off for its own loaders at setup
    trainer.fit(model, datamodule=dm)
    report = {"rank": trainer.global_rank, "train": model.train_ids, "val": model.val_ids}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
