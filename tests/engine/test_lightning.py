"""The data module inside real Lightning Trainers: through ``datamodule=`` and through the protocol pattern."""

import lightning
import torch
from torch import nn

from engine import DataModuleProtocol, UniversalDataModule
from task_spec import TaskSpec


def trainer(**kwargs):
    options = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
    return lightning.Trainer(**options, **kwargs)


class TinyLM(lightning.LightningModule):
    """Embedding + linear next-token model that records the first token of every training row it sees."""

    def __init__(self, vocab=512):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 16), nn.Linear(16, vocab)
        self.seen: list[list[int]] = []
        self.val_rows = 0

    def loss(self, batch):
        logits = self.head(self.embed(batch["input_ids"]))[:, :-1]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1))

    def training_step(self, batch, batch_index):
        self.seen.append(batch["input_ids"][:, 0].tolist())
        return self.loss(batch)

    def validation_step(self, batch, batch_index):
        self.val_rows += len(batch["input_ids"])
        self.log("val_loss", self.loss(batch), batch_size=len(batch["input_ids"]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class ProtocolModule(TinyLM):
    """The seed's pattern: a LightningModule that takes any DataModuleProtocol and serves its loaders."""

    def __init__(self, data_module: DataModuleProtocol):
        super().__init__()
        self.data_module = data_module

    def train_dataloader(self):
        return self.data_module.train_dataloader()

    def val_dataloader(self):
        return self.data_module.val_dataloader()


SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"max_seq_len": 128,
                                                                                       "vocab_size": 512})


def distinct_first_tokens(count):
    return [torch.cat([torch.tensor([i]), torch.randint(20, 500, (3 + i % 9,))]) for i in range(count)]


class TestFitThroughDatamodule:
    def test_every_epoch_sees_every_training_row_once_in_a_new_order(self):
        rows = distinct_first_tokens(40)
        dm = UniversalDataModule(rows, task_spec=SPEC, batch_size=8, val_split=8, seed=3)
        model = TinyLM()
        trainer(max_epochs=2).fit(model, datamodule=dm)
        epochs = [sum(model.seen[:4], []), sum(model.seen[4:], [])]
        train_ids = sorted(int(dm.datasets["train"][i]["input_ids"][0]) for i in range(32))
        assert sorted(epochs[0]) == sorted(epochs[1]) == train_ids
        assert epochs[0] != epochs[1]
        assert model.val_rows >= 8

    def test_loss_falls_on_a_learnable_sequence(self):
        rows = [torch.arange(i % 5, i % 5 + 12) for i in range(64)]
        dm = UniversalDataModule(rows, task_spec=SPEC, batch_size=16, seed=0)
        model = TinyLM()
        first = model.loss(next(iter(dm.train_dataloader()))).item()
        trainer(max_steps=40).fit(model, datamodule=dm)
        assert model.loss(next(iter(dm.train_dataloader()))).item() < first / 2


class TestProtocolPattern:
    def test_module_wrapping_a_protocol_object_fits(self):
        dm = UniversalDataModule(distinct_first_tokens(24), task_spec=SPEC, batch_size=8, val_split=8)
        assert isinstance(dm, DataModuleProtocol)
        model = ProtocolModule(dm)
        trainer(max_epochs=1, num_sanity_val_steps=0).fit(model)
        assert len(model.seen) == 2 and model.val_rows == 8
