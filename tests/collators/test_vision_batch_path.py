"""The vision collator's batch path: plain CHW tensors stacked once, scaled and normalized on the batch, labels read
in one call. Each test compares it, bit for bit, with the per-image reference (torchvision v2 transforms per image,
then ``default_collate``) or with the collator's own per-image path on the same values (numpy, PIL, tensor
subclasses and mixed rows take that path). Runs are derandomized, and nothing is written to a ``.hypothesis``
database. No timing here: ``benchmarks/bench_loader_stages.py`` measures the stages.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from PIL import Image
from torch.utils.data import default_collate
from torchvision import tv_tensors
from torchvision.transforms import v2

from collators.default import collate_labels
from collators.vision import NORMALIZATION_PRESETS, VisionCollator

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hypothesis-collators")  # not .hypothesis/ in the checkout
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
STATS = {**NORMALIZATION_PRESETS, "custom": ((0.5, 0.25, 0.125), (0.3, 0.7, 1.9))}


def reference(images: list, labels: list, stats: tuple | None) -> dict[str, torch.Tensor]:
    """torchvision's per-image pipeline (``Normalize`` left out when ``stats`` is None), then ``default_collate``."""
    steps = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    pipeline = v2.Compose(steps + ([v2.Normalize(*stats)] if stats is not None else []))
    rows = [{"pixel_values": pipeline(image).as_subclass(torch.Tensor), "labels": label}
            for image, label in zip(images, labels)]
    return default_collate(rows)


def every_value_images(count: int = 6, seed: int = 0) -> list[torch.Tensor]:
    """uint8 3x16x16 images that hold all 256 values in every channel (each image a shuffled 0..255 per channel)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.stack([torch.randperm(256, generator=generator).to(torch.uint8).view(16, 16) for _ in range(3)])
            for _ in range(count)]


class TestUint8AgainstTorchvision:
    @pytest.mark.parametrize("name", list(STATS))
    def test_every_uint8_value_normalizes_bit_for_bit(self, name: str) -> None:
        images = every_value_images()
        labels = [index % 4 for index in range(len(images))]
        mean, std = STATS[name]
        batch = VisionCollator(mean=mean, std=std)([{"pixel_values": im, "labels": la} for im, la in zip(images,
                                                                                                         labels)])
        expected = reference(images, labels, (mean, std))
        assert torch.equal(batch["pixel_values"], expected["pixel_values"])
        assert torch.equal(batch["labels"], expected["labels"]) and batch["labels"].dtype == torch.int64

    def test_scaling_only_and_keep_uint8(self) -> None:
        images = every_value_images(count=3)
        scaled = VisionCollator(normalize=False)(images)["pixel_values"]
        assert torch.equal(scaled, reference(images, [0] * 3, None)["pixel_values"])
        kept = VisionCollator(keep_uint8=True)(images)["pixel_values"]
        assert kept.dtype == torch.uint8 and torch.equal(kept, torch.stack(images))

    @pytest.mark.parametrize("channels", [1, 2, 4])
    def test_other_channel_counts_scale_and_normalize_bit_for_bit(self, channels: int) -> None:
        """The compiled pass over a uint8 batch: one statistic per channel, or none (scaling only)."""
        generator = torch.Generator().manual_seed(channels)
        images = [torch.randperm(256 * channels, generator=generator).remainder(256).to(torch.uint8)
                  .view(channels, 16, 16) for _ in range(3)]
        mean = torch.rand(channels, generator=generator).tolist()
        std = (torch.rand(channels, generator=generator) * 0.5 + 0.05).tolist()
        batch = VisionCollator(mean=mean, std=std)(images)["pixel_values"]
        assert torch.equal(batch, reference(images, [0] * 3, (mean, std))["pixel_values"])
        scaled = VisionCollator(normalize=False)(images)["pixel_values"]  # 3 default statistics, unused
        assert torch.equal(scaled, reference(images, [0] * 3, None)["pixel_values"])

    @pytest.mark.parametrize("name", list(STATS))
    def test_a_loader_workers_numpy_twin_gives_the_same_bits(self, name: str, monkeypatch) -> None:
        """A loader worker without the compiled pass scales with its numpy twin: torchvision's values, bit for bit."""
        from collators import _kernels, compiled

        monkeypatch.setattr(_kernels.scale_normalize, "dispatcher", None)
        monkeypatch.setattr(compiled, "get_worker_info", lambda: object())
        images = every_value_images()
        mean, std = STATS[name]
        batch = VisionCollator(mean=mean, std=std)(images)["pixel_values"]
        assert torch.equal(batch, reference(images, [0] * len(images), (mean, std))["pixel_values"])
        scaled = VisionCollator(normalize=False)(images)["pixel_values"]
        assert torch.equal(scaled, reference(images, [0] * len(images), None)["pixel_values"])

    def test_the_compiled_pass_refuses_statistics_of_another_length(self) -> None:
        from collators.images import scale_uint8

        with pytest.raises(ValueError, match=r"C values of mean and std, but got a batch of shape \(2, 3, 4, 4\)"):
            scale_uint8(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), np.zeros(2, np.float32), np.ones(2, np.float32))

    def test_equals_the_per_image_path_of_the_same_values(self) -> None:
        # numpy HWC arrays and tv_tensors.Image take the per-image path (to_chw); plain tensors the batch path
        images = every_value_images(count=4, seed=1)
        collator = VisionCollator(normalization="cifar10")
        batch = collator(images)["pixel_values"]
        assert torch.equal(batch, collator([image.permute(1, 2, 0).numpy() for image in images])["pixel_values"])
        assert torch.equal(batch, collator([tv_tensors.Image(image) for image in images])["pixel_values"])

    def test_grayscale_to_rgb_on_plain_tensors_repeats_the_channel(self) -> None:
        gray = [image[:1] for image in every_value_images(count=3)]
        batch = VisionCollator(grayscale_to_rgb=True)(gray)["pixel_values"]
        assert torch.equal(batch, VisionCollator()([image.repeat(3, 1, 1) for image in gray])["pixel_values"])


KINDS = ("uint8", "float32", "float64", "numpy_uint8", "numpy_float32", "tv_image", "pil")
LABEL_KINDS = ("int", "tensor_int64", "tensor_int32", "numpy_int64")


def make_image(kind: str, seed: int, height: int, width: int) -> object:
    generator = torch.Generator().manual_seed(seed)
    uint8 = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
    unit = torch.rand(3, height, width, generator=generator)
    return {
        "uint8": uint8, "float32": unit, "float64": unit.double(), "tv_image": tv_tensors.Image(uint8),
        "numpy_uint8": uint8.permute(1, 2, 0).numpy(), "numpy_float32": unit.permute(1, 2, 0).numpy(),
        "pil": Image.fromarray(uint8.permute(1, 2, 0).numpy(), mode="RGB"),
    }[kind]


def make_label(kind: str, value: int) -> object:
    return {"int": value, "tensor_int64": torch.tensor(value), "tensor_int32": torch.tensor(value, dtype=torch.int32),
            "numpy_int64": np.int64(value)}[kind]


class TestAnyMixOfRows:
    @PROPERTY
    @given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6), label_kind=st.sampled_from(LABEL_KINDS),
           mixed_labels=st.booleans(), size=st.tuples(st.integers(1, 6), st.integers(1, 6)),
           stats=st.sampled_from(list(STATS)), seed=st.integers(0, 2**16))
    def test_batch_equals_torchvision_per_image(self, kinds, label_kind, mixed_labels, size, stats, seed) -> None:
        images = [make_image(kind, seed + index, *size) for index, kind in enumerate(kinds)]
        values = [(seed + index) % 4 for index in range(len(kinds))]
        label_kinds = [LABEL_KINDS[(LABEL_KINDS.index(label_kind) + index * mixed_labels) % len(LABEL_KINDS)]
                       for index in range(len(kinds))]
        labels = [make_label(kind, value) for kind, value in zip(label_kinds, values)]
        mean, std = STATS[stats]
        batch = VisionCollator(mean=mean, std=std, num_classes=4)(
            [{"pixel_values": image, "labels": label} for image, label in zip(images, labels)])
        expected = reference(images, values, (mean, std))
        assert torch.equal(batch["pixel_values"], expected["pixel_values"])
        assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == values


class TestBatchPathErrors:
    def test_channels_are_checked_on_plain_tensors(self) -> None:
        with pytest.raises(ValueError, match=r"row 0: 'pixel_values' has 1 channel\(s\) but mean/std have 3 values"):
            VisionCollator()([torch.zeros(1, 4, 4, dtype=torch.uint8)] * 2)

    def test_keep_uint8_names_the_float_row_of_an_all_float_batch(self) -> None:
        with pytest.raises(TypeError, match=r"row 0: keep_uint8=True needs uint8 images, but 'pixel_values' is "
                                            r"torch.float32"):
            VisionCollator(keep_uint8=True)([torch.zeros(3, 2, 2)] * 2)

    def test_an_out_of_range_float_row_is_named(self) -> None:
        rows = [torch.rand(3, 4, 4), torch.rand(3, 4, 4), torch.full((3, 4, 4), 200.0)]
        with pytest.raises(ValueError, match=r"row 2: float 'pixel_values' should hold values in \[0, 1\].*0\.\.255"):
            VisionCollator()(rows)

    def test_integer_images_other_than_uint8_are_refused(self) -> None:
        with pytest.raises(TypeError, match=r"row 0: 'pixel_values' has dtype torch.int16; expected uint8"):
            VisionCollator()([torch.zeros(3, 2, 2, dtype=torch.int16)] * 2)


class TestLabelsInOneCall:
    @pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16,
                                       torch.float64])
    def test_0d_tensors_equal_the_per_label_path(self, dtype: torch.dtype) -> None:
        values = torch.tensor([0, 1, 1, 0, 1], dtype=dtype)
        labels = list(values.unbind(0))  # 0-d tensors, as rows of a column give them
        ours = collate_labels(labels, key="labels")
        per_label = collate_labels([label.reshape(1) for label in labels], key="labels")  # 1-element: per label
        assert ours.dtype == per_label.dtype and torch.equal(ours, per_label)

    def test_python_ints_equal_the_per_label_path_and_bools_stay_on_it(self) -> None:
        ints = [3, 0, 2, -100]
        assert torch.equal(collate_labels(ints, key="labels", num_classes=4),
                           collate_labels([np.int64(value) for value in ints], key="labels", num_classes=4))
        assert collate_labels([True, False], key="labels").tolist() == [1, 0]

    def test_class_check_applies_to_labels_read_in_one_call(self) -> None:
        with pytest.raises(ValueError, match=r"row 1: 'labels' should be a class index in \[0, 4\)"):
            collate_labels([1, 4, 2], key="labels", num_classes=4)
        with pytest.raises(ValueError, match=r"row 2: 'labels' should be a class index in \[0, 4\)"):
            collate_labels(list(torch.tensor([1, 2, -3]).unbind(0)), key="labels", num_classes=4)

    def test_uint64_past_int64_raises_rather_than_wrapping(self) -> None:
        labels = [torch.tensor(1, dtype=torch.uint64), torch.tensor(2**63, dtype=torch.uint64)]
        with pytest.raises(ValueError, match="Overflow"):
            collate_labels(labels, key="labels")
