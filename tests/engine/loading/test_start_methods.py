"""Loader workers started by 'spawn' (the default on macOS and Windows) or 'forkserver' give the batches of the
main process with the module's own text collator, random masks included. Each case starts two worker processes."""

import datasets
import pytest
import torch

from engine import UniversalDataModule
from task_spec import TaskSpec


def token_tensors():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 12, (16,), generator=generator)
    return [torch.randint(5, 500, (int(n),), generator=generator) for n in lengths]


def hf_rows():
    return datasets.Dataset.from_dict({"input_ids": [list(range(5, 8 + i % 5)) for i in range(16)]})


def pictures():
    generator = torch.Generator().manual_seed(0)
    return {"pixel_values": [torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=generator)
                             for _ in range(16)], "labels": [i % 4 for i in range(16)]}


def batches(data, spec, workers=0, context=None):
    dm = UniversalDataModule(data, task_spec=spec, batch_size=4, val_split=0, shuffle=True, seed=3,
                             num_workers=workers, persistent_workers=False, multiprocessing_context=context,
                             timeout=120 if workers else 0)
    return list(dm.train_dataloader())


@pytest.mark.parametrize(("data", "spec", "context"), [
    (hf_rows, TaskSpec.mlm_tiny, "spawn"),
    (token_tensors, TaskSpec.mlm_tiny, "forkserver"),
    (pictures, TaskSpec.vision_tiny, "spawn"),  # the vision collator's statistics once came back as freed memory
])
def test_started_workers_give_the_batches_of_the_main_process(data, spec, context):
    expected = batches(data(), spec())
    got = batches(data(), spec(), workers=2, context=context)
    assert len(got) == len(expected) == 4
    for ours, theirs in zip(got, expected):
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)
