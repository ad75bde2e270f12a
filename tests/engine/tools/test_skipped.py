"""SkippedRowsCallback: the rows a data module left out reach Lightning's log as a metric and a warning."""

import lightning
import pytest
import torch
from torch import nn

from engine import SkippedRowsCallback, UniversalDataModule
from tests.engine.sources.test_bad_rows import BAD, SPEC, Rows


class TinyLM(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(64, 8), nn.Linear(8, 64)

    def loss(self, batch):
        logits = self.head(self.embed(batch["input_ids"]))
        return nn.functional.cross_entropy(logits.reshape(-1, 64), batch["labels"].clamp(min=0).reshape(-1))

    def training_step(self, batch, batch_index):
        return self.loss(batch)

    def validation_step(self, batch, batch_index):
        self.log("val_loss", self.loss(batch), batch_size=len(batch["input_ids"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(callback, epochs=2):
    return lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, max_epochs=epochs,
                             callbacks=[callback], num_sanity_val_steps=0)


def test_the_count_is_logged_and_the_rows_are_warned_about_each_epoch():
    dm = UniversalDataModule(Rows(), task_spec=SPEC, batch_size=4, val_split=4, seed=3, on_error="skip")
    callback = SkippedRowsCallback()
    with pytest.warns(RuntimeWarning, match=r"rows were left out of their batches since the last report: "
                                            r"(train|val) row (3|13|17) \(OSError: truncated file") as caught:
        fitted = trainer(callback)
        fitted.fit(TinyLM(), datamodule=dm)
    assert dm.skipped.count > 0 and callback.last_logged == dm.skipped.count
    assert float(fitted.callback_metrics["data/skipped_rows"]) == dm.skipped.count
    logged = [row for w in caught for row in map(str, dm.skipped.records) if row in str(w.message)]
    assert set(logged) == {str(row) for row in dm.skipped.records}  # every record reached a warning
    assert {row.index for row in dm.skipped.records} == set(BAD)


def test_a_trainer_without_our_data_module_is_refused_at_setup():
    data = torch.utils.data.DataLoader([{"input_ids": torch.ones(3, dtype=torch.long)}] * 4, batch_size=2)
    with pytest.raises(TypeError, match=r"SkippedRowsCallback reads the rows left out from a UniversalDataModule's "
                                        r"dm.skipped, but the trainer's datamodule is NoneType"):
        trainer(SkippedRowsCallback(), epochs=1).fit(TinyLM(), train_dataloaders=data)
