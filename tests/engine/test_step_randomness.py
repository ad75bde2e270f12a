"""The training step's random numbers are its own: loading (any mode, any transform) never draws from, reseeds or
restores the global generators the step uses (torch's CPU generator, ``random``, NumPy's)."""

import random

import numpy as np
import pytest
import torch

from engine import UniversalDataModule
from task_spec import TaskSpec

MODES = [{"num_workers": 0}, {"num_workers": 2}, {"num_threads": 1}, {"num_threads": 2}]
MODE_IDS = ["workers0", "workers2", "threads1", "threads2"]


def images():
    generator = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (48, 3, 8, 8), dtype=torch.uint8, generator=generator)
    return {"pixel_values": pixels, "labels": torch.arange(48) % 4}


def flip_with_generator(row, generator):
    """An augmentation that draws from the generator it is given."""
    row = dict(row)
    if torch.rand((), generator=generator) < 0.5:
        row["pixel_values"] = row["pixel_values"].flip(-1)
    return row


def flip_with_global_rng(row):
    """An augmentation that draws from torch's global generator, as torchvision.transforms.v2 transforms do."""
    row = dict(row)
    if torch.rand(()) < 0.5:
        row["pixel_values"] = row["pixel_values"].flip(-1)
    return row


def step_draws(batches):
    """What a training step draws after each batch: dropout masks, noise, Python and NumPy numbers."""
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    draws = []
    for _ in batches:
        draws.append((torch.rand(4).tolist(), random.random(), float(np.random.rand())))
    return draws


def module(transform, **mode):
    return UniversalDataModule(images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, seed=1,
                               train_transform=transform, **mode)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("transform", [None, flip_with_generator], ids=["no_transform", "generator_transform"])
def test_the_steps_draws_are_the_same_with_and_without_the_loader(mode, transform):
    loader = module(transform, **mode).train_dataloader()
    without = step_draws(range(2 * len(loader)))
    with_loader = step_draws(batch for _ in range(2) for batch in loader)  # two epochs
    assert with_loader == without


@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_a_global_rng_transform_leaves_the_steps_draws_alone_in_this_process_and_in_workers(mode):
    loader = module(flip_with_global_rng, **mode).train_dataloader()
    assert step_draws(batch for _ in range(2) for batch in loader) == step_draws(range(2 * len(loader)))


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("argument", ["train_transform", "eval_transform"])
def test_a_global_rng_transform_in_threads_is_refused_naming_the_ways_out(num_threads, argument):
    with pytest.raises(ValueError, match=rf"{argument}=flip_with_global_rng draws from torch's global random "
                                         rf"generator.*num_threads={num_threads}.*num_workers.*generator="):
        UniversalDataModule(images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, val_split=8,
                            num_threads=num_threads, **{argument: flip_with_global_rng})


def test_threads_give_a_generator_transform_the_batches_of_workers_0():
    def batches(**mode):
        return [batch["pixel_values"] for _ in range(2) for batch in module(flip_with_generator, **mode)
                .train_dataloader()]

    reference = batches(num_workers=0)
    for threaded in (batches(num_threads=1), batches(num_threads=2)):
        assert all(torch.equal(a, b) for a, b in zip(threaded, reference, strict=True))
