"""Every collator the registry builds pickles cleanly under every start method: pickled with torch's reductions, as
a spawn or forkserver worker receives it, it gives the same batch afterwards in this process, in its copy, and in a
spawned loader worker."""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)
from PIL import Image
from torch.utils.data import DataLoader

from collators import CollatorRegistry
from task_spec import TaskSpec


def token_rows():
    return [{"input_ids": list(range(5, 5 + n))} for n in (3, 7, 5, 4)]


def labelled_token_rows():
    return [{**row, "labels": index % 2} for index, row in enumerate(token_rows())]


def images():
    generator = torch.Generator().manual_seed(0)
    return [{"pixel_values": torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=generator), "labels": i}
            for i in range(4)]


def waves():
    generator = torch.Generator().manual_seed(0)
    return [{"input_values": torch.rand(n, generator=generator) - 0.5, "labels": i}
            for i, n in enumerate((900, 1200, 700, 1000))]


def captions():
    buffers = []
    for index in range(4):
        buffer = io.BytesIO()
        Image.fromarray(np.full((12 + 4 * index, 16, 3), 40 * index, dtype=np.uint8)).save(buffer, format="JPEG")
        buffers.append(buffer.getvalue())
    return [{"input_ids": [1] * (index % 2) + [5, 6, 7][: index + 1], "image": data} for index, data in
            enumerate(buffers)]


PAIRS = TaskSpec(name="pairs", task_type="classification", modality="multimodal", special_tokens={"pad_token_id": 0},
                 additional_config={"num_classes": 4, "image_size": 8})


def labelled_captions():
    return [{**row, "labels": index} for index, row in enumerate(captions())]


CASES = {
    "default": [(None, {}, lambda: [{"x": torch.arange(3) + i, "y": i} for i in range(4)])],
    "text": [(TaskSpec.lm_tiny(), {}, token_rows), (TaskSpec.mlm_tiny(), {}, token_rows),
             (TaskSpec.cls_tiny(), {}, labelled_token_rows)],
    "vision": [(TaskSpec.vision_tiny(), {}, images), (TaskSpec.vision_tiny(), {"keep_uint8": True}, images),
               (TaskSpec.vision_tiny(), {"normalization": "imagenet"}, images)],
    "audio_waveform": [(TaskSpec.audio_tiny(), {}, waves), (TaskSpec.audio_tiny(), {"features": "mel"}, waves),
                       (TaskSpec.audio_tiny(), {"features": None}, waves)],
    "vision_language": [(TaskSpec.vlm_tiny(), {}, captions), (TaskSpec.vlm_tiny(), {"flip_probability": 0.5}, captions),
                        (PAIRS, {}, labelled_captions)],
    "packed": [(TaskSpec.lm_tiny(), {}, token_rows), (TaskSpec.mlm_tiny(), {}, token_rows)],
    "vision_language_packed": [(TaskSpec.vlm_tiny(), {}, captions)],
}
CASE_IDS = [(name, index) for name, cases in CASES.items() for index in range(len(cases))]


def build(name, index):
    spec, kwargs, rows = CASES[name][index]
    return CollatorRegistry.get_instance().get_collator(spec, collator_name=name, **kwargs), rows()


def collate(collator, rows):
    """One batch, drawn from a fresh generator: equal calls give equal batches."""
    return collator(rows, generator=torch.Generator().manual_seed(0))


def assert_same(ours, theirs):
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():  # tensors, and the plain ints a packed batch carries (max_length)
        assert torch.equal(value, theirs[key]) if isinstance(value, torch.Tensor) else value == theirs[key], key


def torch_pickled(value) -> bytes:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def test_every_registered_collator_has_a_case():
    assert set(CollatorRegistry.get_instance().names()) <= set(CASES)


@pytest.mark.parametrize(("name", "index"), CASE_IDS)
def test_a_collator_pickled_with_torch_reductions_gives_the_same_batch_here_and_in_its_copy(name, index):
    collator, rows = build(name, index)
    expected = collate(collator, rows)
    copy = pickle.loads(torch_pickled(collator))
    assert_same(collate(collator, rows), expected)
    assert_same(collate(copy, rows), expected)


class ByName:
    """A loader's collate_fn over items ``(case, rows)``: each case's collator, as pickled to the worker."""

    def __init__(self, collators):
        self.collators = collators

    def __call__(self, item):
        case, rows = item
        return case, collate(self.collators[case], rows)


def test_a_spawned_loader_worker_gives_the_batches_of_this_process():
    built = {case: build(*case) for case in CASE_IDS}
    collators = {case: collator for case, (collator, _) in built.items()}
    items = [(case, rows) for case, (_, rows) in built.items()]
    expected = {case: collate(collator, rows) for case, (collator, rows) in built.items()}
    loader = DataLoader(items, batch_size=None, collate_fn=ByName(collators), num_workers=1,
                        multiprocessing_context="spawn", timeout=120)
    got = dict(loader)
    assert got.keys() == expected.keys()
    for case in CASE_IDS:
        assert_same(got[case], expected[case])
        assert_same(collate(collators[case], built[case][1]), expected[case])  # this process's collator is intact
