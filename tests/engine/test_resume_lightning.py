"""Exact resume through Lightning: ModelCheckpoint every few steps, then Trainer.fit(..., ckpt_path=...)."""

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.engine.test_resume import SPEC, fingerprint, module


class Recorder(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(600, 8), torch.nn.Linear(8, 600)
        self.seen: list[str] = []

    def training_step(self, batch, batch_index):
        self.seen.append(fingerprint(batch))
        logits = self.head(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(**kwargs):
    return lightning.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


@pytest.mark.parametrize("batching", ["plain", "grouped"])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_mid_epoch_and_epoch_end_checkpoints_sees_the_remaining_batches(tmp_path, workers, batching):
    assert SPEC.task_type == "masked_lm"  # masks are random: they must match after resume too
    full = Recorder()
    mid_epoch = ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=7, save_top_k=-1)
    epoch_end = ModelCheckpoint(dirpath=tmp_path / "epochs", every_n_epochs=1, save_top_k=-1)
    trainer(callbacks=[mid_epoch, epoch_end]).fit(full, datamodule=module(workers, batching=batching))
    assert len(full.seen) == 15  # 40 training rows, batch 8: 5 steps per epoch, 3 epochs
    for checkpoint, done in ((tmp_path / "steps" / "epoch=1-step=7.ckpt", 7),
                             (tmp_path / "epochs" / "epoch=0-step=5.ckpt", 5)):
        resumed = Recorder()
        trainer(enable_checkpointing=False).fit(resumed, datamodule=module(workers, batching=batching),
                                                ckpt_path=checkpoint)
        assert resumed.seen == full.seen[done:], checkpoint.name


def test_checkpoint_of_other_data_is_refused(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer(callbacks=[checkpoints], max_steps=3).fit(Recorder(), datamodule=module(seed=11))
    with pytest.raises(ValueError, match="does not match this data module: seed was 11"):
        trainer(enable_checkpointing=False).fit(Recorder(), datamodule=module(seed=12),
                                                ckpt_path=tmp_path / "epoch=0-step=3.ckpt")


@pytest.mark.parametrize("limit", [3, 0.6], ids=["int", "float"])
@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_cut_by_limit_train_batches_is_finished_for_resume(tmp_path, workers, limit):
    # 5 batches per epoch, 3 of them served (0.6 of 5): the checkpoint at an epoch's end resumes at the next epoch,
    # as the uninterrupted run goes on, never at the batches the limit left out
    full = Recorder()
    epoch_end = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1)
    trainer(callbacks=[epoch_end], limit_train_batches=limit).fit(full, datamodule=module(workers))
    assert len(full.seen) == 9 and len(set(full.seen)) == 9
    resumed = Recorder()
    trainer(enable_checkpointing=False, limit_train_batches=limit).fit(
        resumed, datamodule=module(workers), ckpt_path=tmp_path / "epoch=0-step=3.ckpt")
    assert resumed.seen == full.seen[3:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_max_steps_stop_inside_a_limited_epoch_resumes_mid_epoch(tmp_path, workers):
    full = Recorder()
    trainer(limit_train_batches=4, enable_checkpointing=False).fit(full, datamodule=module(workers))
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    first = Recorder()
    trainer(callbacks=[checkpoints], limit_train_batches=4, max_steps=2).fit(first, datamodule=module(workers))
    resumed = Recorder()
    trainer(enable_checkpointing=False, limit_train_batches=4).fit(resumed, datamodule=module(workers),
                                                                    ckpt_path=tmp_path / "epoch=0-step=2.ckpt")
    assert first.seen + resumed.seen == full.seen
