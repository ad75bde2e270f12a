"""A file-backed dataset's own ``transform=`` is the deterministic part (it runs before CACHED and EAGER hold the
rows); the module's ``train_transform`` runs after any cache, so augmentation is fresh every epoch in every
loading mode, and the same in every mode."""

import pytest
import torch
from torchvision.transforms import v2

from engine import UniversalDataModule
from engine.datasets import ImageFolderDataset, LoadingMode
from task_spec import TaskSpec

AUGMENT = v2.Compose([v2.RandomResizedCrop(32, scale=(0.4, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                      v2.ColorJitter(brightness=0.5, contrast=0.5)])


def two_epochs(root, mode, workers=0):
    """The augmented images of two passes in storage order, and the labels of the first."""
    images = ImageFolderDataset(root, mode=mode, transform=v2.Resize((32, 32), antialias=True))
    dm = UniversalDataModule(images, task_spec=TaskSpec.vision_tiny(), batch_size=4, shuffle=False, seed=9,
                             num_workers=workers, train_transform=AUGMENT)
    loader = dm.train_dataloader()
    epochs = [[batch for batch in loader] for _ in range(2)]
    pixels = [torch.cat([batch["pixel_values"] for batch in epoch]) for epoch in epochs]
    return pixels, torch.cat([batch["labels"] for batch in epochs[0]])


@pytest.mark.parametrize(("mode", "workers"), [(LoadingMode.EAGER, 0), (LoadingMode.CACHED, 0),
                                               (LoadingMode.CACHED, 2)], ids=["eager", "cached", "cached-2-workers"])
def test_augmentation_is_fresh_every_epoch_and_the_same_as_lazy(image_root, mode, workers):
    root, _ = image_root
    (first, second), labels = two_epochs(root, mode, workers)
    assert first.shape == (9, 3, 32, 32) and labels.tolist() == ImageFolderDataset(root).targets.tolist()
    assert all(not torch.equal(a, b) for a, b in zip(first, second))  # every image augmented anew
    (lazy_first, lazy_second), _ = two_epochs(root, LoadingMode.LAZY)
    assert torch.equal(first, lazy_first) and torch.equal(second, lazy_second)


def test_the_cache_holds_the_deterministic_rows_not_the_augmented_ones(image_root):
    root, _ = image_root
    resize = v2.Resize((32, 32), antialias=True)
    images = ImageFolderDataset(root, mode=LoadingMode.CACHED, transform=resize)
    dm = UniversalDataModule(images, task_spec=TaskSpec.vision_tiny(), batch_size=4, shuffle=False,
                             train_transform=AUGMENT)
    list(dm.train_dataloader())
    stored = ImageFolderDataset(root, transform=resize)
    for index in range(len(stored)):
        assert torch.equal(images.cache.get(index)["pixel_values"], stored[index]["pixel_values"])
