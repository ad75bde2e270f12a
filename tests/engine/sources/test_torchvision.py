"""torchvision datasets as a user hands them over: (image, target) rows, PIL or tensor, into the vision preset."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import FakeData, ImageFolder
from torchvision.transforms import v2

from collators.vision import NORMALIZATION_PRESETS
from engine import UniversalDataModule
from task_spec import TaskSpec

SPEC = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 2})


def write_folder(root: Path) -> list[np.ndarray]:
    """cat/ and dog/ with three 10x12 RGB images each (PNG, and one JPEG per class); the pixels, in file order."""
    rng = np.random.default_rng(0)
    written = []
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{'jpg' if i == 2 else 'png'}")
            written.append(pixels)
    return written


def batches(data, num_workers, spec=SPEC):
    dm = UniversalDataModule(data, task_spec=spec, batch_size=3, shuffle=False, num_workers=num_workers)
    return dm, list(dm.train_dataloader())


@pytest.mark.parametrize("num_workers", [0, 2])
class TestImageFolder:
    def test_without_a_transform_pil_images_become_uint8_tensors(self, tmp_path, num_workers):
        written = write_folder(tmp_path / "pets")
        folder = ImageFolder(tmp_path / "pets")
        dm, (cats, dogs) = batches(folder, num_workers)
        assert folder.classes == ["cat", "dog"] and cats["labels"].tolist() == [0, 0, 0]
        assert dogs["labels"].tolist() == [1, 1, 1] and cats["pixel_values"].shape == (3, 3, 10, 12)
        row = dm.datasets["train"][0]["pixel_values"]
        assert row.dtype == torch.uint8 and torch.equal(row, torch.from_numpy(written[0]).permute(2, 0, 1))
        decoded = torch.stack([v2.functional.pil_to_tensor(folder[i][0]) for i in range(3)]).float() / 255
        reference = v2.functional.normalize(decoded, *NORMALIZATION_PRESETS["cifar10"])  # the preset's statistics
        assert torch.allclose(cats["pixel_values"], reference, atol=1e-6)  # JPEG included: torchvision's own decode

    def test_its_own_transform_gives_tensors_of_the_size_it_asks(self, tmp_path, num_workers):
        write_folder(tmp_path / "pets")
        folder = ImageFolder(tmp_path / "pets", transform=v2.Compose([v2.ToImage(), v2.Resize((16, 16))]))
        _, (cats, dogs) = batches(folder, num_workers)
        assert cats["pixel_values"].shape == (3, 3, 16, 16) and cats["pixel_values"].dtype == torch.float32
        assert cats["labels"].tolist() == [0, 0, 0] and dogs["labels"].tolist() == [1, 1, 1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fake_data_needs_no_download(num_workers):
    images = FakeData(size=6, image_size=(3, 8, 8), num_classes=2, random_offset=3)
    _, loaded = batches(images, num_workers)
    assert [batch["pixel_values"].shape for batch in loaded] == [(3, 3, 8, 8)] * 2
    assert torch.cat([batch["labels"] for batch in loaded]).tolist() == [int(images[i][1]) for i in range(6)]


class PaletteImages(torch.utils.data.Dataset):
    """(palette image, palette mask) rows, as a segmentation dataset gives them: the image's indices stand for
    colours, the mask's for classes."""

    def __init__(self):
        rgb = np.zeros((4, 4, 3), dtype=np.uint8)
        rgb[:2] = (204, 0, 51)  # a web-palette colour, kept exactly by convert("P")
        self.image = Image.fromarray(rgb).convert("P")
        self.mask = Image.fromarray(np.eye(4, dtype=np.uint8)).convert("P")

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return self.image, self.mask


def test_a_palette_input_is_read_as_colours_and_a_palette_target_keeps_its_indices():
    dm = UniversalDataModule(PaletteImages(), task_spec=SPEC, batch_size=2)
    dm.setup()
    row = dm.datasets["train"][0]
    assert torch.equal(row["pixel_values"], torch.from_numpy(np.array(PaletteImages().image.convert("RGB")))
                       .permute(2, 0, 1)) and row["pixel_values"][:, 0, 0].tolist() == [204, 0, 51]
    assert torch.equal(row["labels"], torch.eye(4, dtype=torch.uint8)[None])
