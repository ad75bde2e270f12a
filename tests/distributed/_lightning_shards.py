"""Lightning DDP on CPU with 2 processes (gloo) over a sharded corpus in S3: ``<out> <url> <storage options as
JSON>`` trains 3 steps (mid-epoch), writes <out>/ddp.ckpt, and each rank writes the corpus rows it trained on to
<out>/rank<r>.json. tests/distributed/test_sharded_elastic.py resumes the checkpoint on 1 device. The global batch
is 16 rows: batch_size is 16 // devices."""

import json
import sys
from pathlib import Path

import lightning
import torch

from engine import Shards, UniversalDataModule
from tests.engine.sources.shard_corpus import SPEC

GLOBAL_BATCH = 16


class Recorder(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(50257, 4), torch.nn.Linear(4, 8)
        self.rows: list[int] = []

    def training_step(self, batch, batch_index):
        self.rows.extend(int(i) for i in batch["doc"])
        logits = self.head(self.embed(batch["input_ids"]))
        return logits.square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def module(devices, url, options, cache_dir, workers=0):
    return UniversalDataModule(Shards(url, storage_options=options, cache_dir=cache_dir, shuffle_window=64),
                               task_spec=SPEC, batch_size=GLOBAL_BATCH // devices, val_split=0, seed=5,
                               num_workers=workers)


def trainer(devices, max_steps):
    return lightning.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                             max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                             limit_val_batches=0)


if __name__ == "__main__":
    out, url, options = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    model, run = Recorder(), trainer(2, 3)
    run.fit(model, datamodule=module(2, url, options, str(out / "cache")))
    run.save_checkpoint(out / "ddp.ckpt")
    (out / f"rank{run.global_rank}.json").write_text(json.dumps(model.rows))
