"""UniversalDataModule options that switch on the fast paths and checks: batching, device_normalize, validate."""

import lightning
import pytest
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from engine import DataModule, UniversalDataModule
from task_spec import TaskSpec


class Images(Dataset):
    def __init__(self, count=16, label_offset=0):
        self.count, self.label_offset = count, label_offset

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=generator)
        return {"pixel_values": image, "labels": index % 4 + self.label_offset}


def padding_share(loader):
    masks = [batch["attention_mask"] for batch in loader]
    return 1 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


class TestBatching:
    def lengths_rows(self):
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(2, 90, (int(n),), generator=generator)
                for n in torch.randint(32, 513, (2000,), generator=generator)]

    @pytest.mark.parametrize(("options", "ceiling"), [
        ({"batching": "grouped"}, 0.05),
        ({"batching": "token_budget", "max_tokens": 8192}, 0.05),
    ])
    def test_length_aware_batching_cuts_padding_and_keeps_every_row(self, options, ceiling):
        rows = self.lengths_rows()
        spec = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"max_seq_len": 512})
        plain = UniversalDataModule(rows, task_spec=spec, batch_size=32, seed=0)
        grouped = UniversalDataModule(rows, task_spec=spec, batch_size=32, seed=0, **options)
        assert padding_share(plain.train_dataloader()) > 0.3
        loader = grouped.train_dataloader()
        assert padding_share(loader) < ceiling
        first = [b["input_ids"].shape for b in loader]
        second = [b["input_ids"].shape for b in loader]
        assert first != second  # batch order is still shuffled each epoch
        assert sum(s[0] for s in first) == len(rows)

    def test_batching_from_the_spec(self):
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"batching": "grouped"})
        dm = UniversalDataModule(self.lengths_rows()[:200], task_spec=spec, batch_size=16)
        assert dm.batching == "grouped" and "grouped" in type(dm.train_dataloader().batch_sampler).__name__.lower()


class TestDeviceNormalize:
    def test_uint8_batches_normalized_after_transfer_equal_torchvision(self):
        dm = UniversalDataModule(Images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, shuffle=False,
                                 device_normalize=True)
        batch = next(iter(dm.train_dataloader()))
        assert batch["pixel_values"].dtype == torch.uint8
        finished = dm.on_after_batch_transfer(batch, 0)["pixel_values"]
        mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
        reference = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
        expected = torch.stack([reference(Images()[i]["pixel_values"]) for i in range(8)])
        assert torch.allclose(finished, expected, atol=1e-6)

    def test_a_plain_loop_transfers_through_the_same_hooks(self):
        dm = DataModule(Images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, shuffle=False,
                        device_normalize=True)
        batch = next(iter(dm.train_dataloader()))
        moved = dm.transfer(batch, "cpu")
        assert batch["pixel_values"].dtype == torch.uint8  # the caller's batch is not changed
        assert moved["pixel_values"].dtype == torch.float32 and moved["labels"] is batch["labels"]
        assert torch.equal(moved["pixel_values"], dm.device_normalize(batch)["pixel_values"])
        plain = DataModule([torch.arange(5)] * 8, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        tokens = next(iter(plain.train_dataloader()))
        assert all(plain.transfer(tokens, "cpu")[key] is tokens[key] for key in tokens)  # no hook: only the move

    def test_through_lightning(self):
        seen = []

        class Probe(lightning.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3 * 8 * 8, 4)

            def training_step(self, batch, batch_index):
                seen.append(batch["pixel_values"].dtype)
                return torch.nn.functional.cross_entropy(self.layer(batch["pixel_values"].flatten(1)),
                                                         batch["labels"])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        dm = UniversalDataModule(Images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, device_normalize=True)
        lightning.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False).fit(Probe(), datamodule=dm)
        assert seen == [torch.float32, torch.float32]

    def test_needs_a_vision_spec(self):
        with pytest.raises(ValueError, match="device_normalize=True keeps images uint8"):
            UniversalDataModule([torch.arange(4)], task_spec=TaskSpec.lm_tiny(), device_normalize=True)


SMALL_IMAGES = TaskSpec.vision_tiny().replace(additional_config={"image_size": [3, 8, 8], "num_classes": 4})


class TestValidate:
    def test_labels_out_of_the_spec_range_fail_at_setup(self):
        dm = UniversalDataModule(Images(label_offset=4), task_spec=SMALL_IMAGES, batch_size=8, validate=True)
        with pytest.raises(ValueError, match=r"'labels' should be a class index in \[0, 4\)"):  # the collator's check
            dm.setup("fit")

    def test_a_valid_module_gets_a_report_and_an_untouched_loader(self):
        dm = UniversalDataModule(Images(), task_spec=SMALL_IMAGES, batch_size=8, validate=True, seed=1)
        dm.setup("fit")
        assert dm.validation_report is not None
        reference = UniversalDataModule(Images(), task_spec=SMALL_IMAGES, batch_size=8, seed=1)
        assert all(torch.equal(a["labels"], b["labels"])
                   for a, b in zip(dm.train_dataloader(), reference.train_dataloader()))
