"""Packed vision-language batches: a pack equals its rows collated alone, and the module plans packs with the rows'
image tokens counted."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from collators import CollatorRegistry, PackedVisionLanguageCollator
from engine import UniversalDataModule
from task_spec import TaskSpec
from tests.collators.test_multimodal import IMAGE, encoded


def rows():
    return [{"input_ids": [5, 6], "image": encoded(20, 30, 0)},
            {"input_ids": [7, IMAGE, 8, IMAGE, 9], "images": [encoded(16, 16, 1), encoded(40, 20, 2)],
             "prompt_length": 2},
            {"input_ids": [10, 11, 12]}]


def test_a_pack_equals_its_rows_collated_alone():
    registry = CollatorRegistry.get_instance()
    pack = registry.get_collator(TaskSpec.vlm_tiny(), collator_name="vision_language_packed")(rows())
    alone = [registry.get_collator(TaskSpec.vlm_tiny())([row]) for row in rows()]
    lengths = [batch["input_ids"].shape[1] for batch in alone]
    assert pack["cu_seq_lens_q"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert pack["max_length_q"] == pack["max_length_k"] == max(lengths)
    for (start, end), batch in zip(zip(pack["cu_seq_lens_q"][:-1], pack["cu_seq_lens_q"][1:]), alone):
        assert torch.equal(pack["input_ids"][0, start:end], batch["input_ids"][0])
        assert torch.equal(pack["position_ids"][0, start:end], torch.arange(end - start))
        labels = batch["labels"][0].clone()
        labels[0] = -100  # no row learns its first token from the previous row's last
        assert torch.equal(pack["labels"][0, start:end], labels)
    assert torch.equal(pack["pixel_values"], torch.cat([batch["pixel_values"] for batch in alone]))
    assert pack["images_per_row"].tolist() == [1, 2, 0]


class Captions(Dataset):
    """Rows of 0 to 2 images (16 image tokens each) and 1 to 3 text tokens."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> dict:
        return {"images": [encoded(12, 12, index % 4)] * (index % 3), "input_ids": [5, 6, 7][: 1 + index % 3]}


def test_the_module_packs_rows_by_their_length_with_image_tokens():
    dm = UniversalDataModule(Captions(), task_spec=TaskSpec.vlm_tiny(), batching="packed", max_tokens=40,
                             num_workers=0, seed=1)
    dm.setup("fit")
    assert isinstance(dm.collator, PackedVisionLanguageCollator)
    seen = 0
    for batch in dm.train_dataloader():
        assert batch["input_ids"].shape[1] <= 40  # within the budget, image tokens included
        assert (batch["input_ids"] == IMAGE).sum() == 16 * batch["images_per_row"].sum()
        seen += len(batch["images_per_row"])
    assert seen == len(Captions())
