"""Lightning's per-epoch set_epoch reaches a curriculum dataset through the module, also in worker processes."""

import lightning
import pytest
import torch
from torch.utils.data import Dataset

from engine import UniversalDataModule
from task_spec import TaskSpec

SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 16})


class Curriculum(Dataset):
    """Rows whose token is the epoch + 1: the data changes with the epoch, as a curriculum's would."""

    def __init__(self):
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return 16

    def __getitem__(self, index):
        return {"input_ids": torch.full((3,), self.epoch + 1)}


class Recorder(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        self.tokens: list[list[int]] = []

    def training_step(self, batch, batch_index):
        self.tokens.append(sorted(set(batch["input_ids"].flatten().tolist())))
        return self.embed(batch["input_ids"]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_sees_the_dataset_at_that_epoch(workers):
    model = Recorder()
    dm = UniversalDataModule(Curriculum(), task_spec=SPEC, batch_size=8, num_workers=workers)
    lightning.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False).fit(model, datamodule=dm)
    assert model.tokens == [[1], [1], [2], [2], [3], [3]]
