"""Tests for collators.vision: input kinds, normalization against torchvision, grayscale, uint8 path, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from collators.registry import CollatorRegistry
from collators.vision import NORMALIZATION_PRESETS, VisionCollator, create_vision_collator, normalize_batch
from task_spec import TaskSpec


def _uint8_images(count: int = 4, shape: tuple[int, ...] = (3, 8, 8), seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8) for _ in range(count)]


class TestDifferentialAgainstTorchvision:
    @pytest.mark.parametrize("preset", ["imagenet", "cifar10"])
    def test_uint8_equals_per_sample_v2_pipeline(self, preset: str) -> None:
        images = _uint8_images()
        mean, std = NORMALIZATION_PRESETS[preset]
        pipeline = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
        expected = torch.stack([pipeline(image) for image in images])
        batch = VisionCollator(normalization=preset)([{"pixel_values": image} for image in images])
        torch.testing.assert_close(batch["pixel_values"], expected, atol=1e-6, rtol=0)

    def test_float_input_equals_normalize_without_rescaling(self) -> None:
        images = [torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        mean, std = NORMALIZATION_PRESETS["imagenet"]
        expected = torch.stack([v2.Normalize(mean, std)(image) for image in images])
        batch = VisionCollator()(images)
        torch.testing.assert_close(batch["pixel_values"], expected, atol=1e-6, rtol=0)

    def test_numpy_and_pil_equal_tensor_path(self) -> None:
        images = _uint8_images(count=2)
        hwc = [image.permute(1, 2, 0).numpy() for image in images]
        from_tensor = VisionCollator()(images)["pixel_values"]
        torch.testing.assert_close(VisionCollator()(hwc)["pixel_values"], from_tensor, atol=0, rtol=0)
        pils = [Image.fromarray(array, mode="RGB") for array in hwc]
        torch.testing.assert_close(VisionCollator()(pils)["pixel_values"], from_tensor, atol=0, rtol=0)


class TestInputKinds:
    def test_uint8_scaled_float_not_rescaled_without_normalize(self) -> None:
        collator = VisionCollator(normalize=False)
        full = torch.full((3, 2, 2), 255, dtype=torch.uint8)
        assert collator([full])["pixel_values"].unique().tolist() == [1.0]
        floats = torch.full((3, 2, 2), 0.25)
        assert collator([floats])["pixel_values"].unique().tolist() == [0.25]

    def test_float64_and_float_numpy_become_float32(self) -> None:
        rows = [np.full((4, 4, 3), 0.5), torch.full((3, 4, 4), 0.5, dtype=torch.float64)]
        batch = VisionCollator(normalize=False)(rows)
        assert batch["pixel_values"].dtype == torch.float32
        assert batch["pixel_values"].shape == (2, 3, 4, 4)
        assert batch["pixel_values"].unique().tolist() == [0.5]

    def test_mixed_uint8_and_float_rows(self) -> None:
        rows = [torch.full((1, 2, 2), 51, dtype=torch.uint8), torch.full((1, 2, 2), 0.2)]
        batch = VisionCollator(normalize=False)(rows)
        torch.testing.assert_close(batch["pixel_values"], torch.full((2, 1, 2, 2), 0.2))

    def test_2d_grayscale_tensor_and_array_get_one_channel(self) -> None:
        collator = VisionCollator(normalize=False)
        assert collator([torch.zeros(5, 6, dtype=torch.uint8)])["pixel_values"].shape == (1, 1, 5, 6)
        assert collator([np.zeros((5, 6), dtype=np.uint8)])["pixel_values"].shape == (1, 1, 5, 6)

    def test_pil_modes(self) -> None:
        collator = VisionCollator(normalize=False)
        assert collator([Image.new("L", (6, 5), 255)])["pixel_values"].shape == (1, 1, 5, 6)
        rgba = Image.new("RGBA", (6, 5), (255, 0, 51, 0))
        pixels = collator([rgba])["pixel_values"]
        # Alpha is dropped, not composited: the colour survives although alpha is 0.
        assert pixels.shape == (1, 3, 5, 6)
        torch.testing.assert_close(pixels[0, :, 0, 0], torch.tensor([1.0, 0.0, 0.2]))
        assert collator([rgba.convert("P")])["pixel_values"].shape == (1, 3, 5, 6)
        assert collator([Image.new("1", (6, 5), 1)])["pixel_values"].unique().tolist() == [1.0]

    def test_read_only_and_flipped_numpy_arrays(self) -> None:
        array = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
        array.flags.writeable = False
        expected = torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255
        torch.testing.assert_close(VisionCollator(normalize=False)([array])["pixel_values"][0], expected)
        flipped = VisionCollator(normalize=False)([array[::-1]])["pixel_values"][0]
        torch.testing.assert_close(flipped, expected.flip(1))

    def test_unsupported_inputs_raise_with_fix(self) -> None:
        collator = VisionCollator(normalize=False)
        with pytest.raises(TypeError, match=r"row 1: 'pixel_values' has dtype torch.int64; expected uint8"):
            collator([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 2, 2, dtype=torch.long)])
        with pytest.raises(TypeError, match=r"row 0: 'pixel_values' is a PIL image in mode 'I'.*convert"):
            collator([Image.new("I", (2, 2))])
        with pytest.raises(TypeError, match=r"row 0: 'pixel_values' should be a torch.Tensor .* but got str"):
            collator(["image.png"])
        with pytest.raises(ValueError, match=r"shape \(3, 8, 8\), which looks channels-first"):
            collator([np.zeros((3, 8, 8), dtype=np.uint8)])
        with pytest.raises(ValueError, match=r"should be a CHW or HW tensor, but got shape \(1, 3, 2, 2\)"):
            collator([torch.zeros(1, 3, 2, 2)])


class TestRowsAndLabels:
    def test_dict_rows_with_labels(self) -> None:
        images = _uint8_images(count=3)
        batch = VisionCollator()([{"pixel_values": image, "labels": i} for i, image in enumerate(images)])
        assert batch["pixel_values"].dtype == torch.float32 and batch["pixel_values"].shape == (3, 3, 8, 8)
        assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == [0, 1, 2]

    def test_rows_with_only_pixel_values_give_no_labels(self) -> None:
        batch = VisionCollator(normalize=True)([{"pixel_values": image} for image in _uint8_images(count=2)])
        assert set(batch) == {"pixel_values"}

    def test_tuples_and_bare_images(self) -> None:
        images = _uint8_images(count=2)
        tuples = VisionCollator()([(image, np.int64(3)) for image in images])
        assert tuples["labels"].tolist() == [3, 3] and tuples["labels"].dtype == torch.int64
        bare = VisionCollator()(images)
        assert set(bare) == {"pixel_values"}
        torch.testing.assert_close(bare["pixel_values"], tuples["pixel_values"])

    def test_label_in_some_rows_only_raises(self) -> None:
        image = _uint8_images(count=1)[0]
        with pytest.raises(ValueError, match=r"row 1 has no 'labels' but row 0 has one"):
            VisionCollator()([{"pixel_values": image, "labels": 1}, {"pixel_values": image}])

    def test_missing_input_field_names_row_and_keys(self) -> None:
        with pytest.raises(KeyError, match=r"row 0 has no 'pixel_values' key \(keys: \['image'\]\); pass input_field="):
            VisionCollator()([{"image": torch.zeros(3, 2, 2)}])

    def test_custom_keys(self) -> None:
        collator = VisionCollator(input_field="image", target_field="target")
        batch = collator([{"image": torch.zeros(3, 2, 2), "target": 1}])
        assert set(batch) == {"image", "target"}

    def test_mixed_shapes_name_first_offending_row(self) -> None:
        images = _uint8_images(count=2, shape=(3, 32, 32)) + _uint8_images(count=2, shape=(3, 16, 16))
        with pytest.raises(ValueError, match=r"row 2: 'pixel_values' has shape \(3, 16, 16\) but row 0 has shape "
                                             r"\(3, 32, 32\); resize .*Resize"):
            VisionCollator()(images)

    def test_empty_rows_raise(self) -> None:
        with pytest.raises(ValueError, match="at least one row"):
            VisionCollator()([])


class TestNormalizationOptions:
    def test_custom_mean_std(self) -> None:
        pixels = VisionCollator(mean=[0.5] * 3, std=[0.25] * 3)([torch.full((3, 2, 2), 1.0)])["pixel_values"]
        assert pixels.unique().tolist() == [2.0]

    def test_unknown_preset_lists_presets(self) -> None:
        with pytest.raises(ValueError, match=r"normalization should be one of 'imagenet', 'cifar10', but got "
                                             r"normalization='mnist'"):
            VisionCollator(normalization="mnist")

    def test_bad_stats_raise(self) -> None:
        with pytest.raises(ValueError, match="give mean and std together"):
            VisionCollator(mean=[0.5, 0.5, 0.5])
        with pytest.raises(ValueError, match="give either normalization='imagenet' or mean/std, not both"):
            VisionCollator(normalization="imagenet", mean=[0.5], std=[0.5])
        with pytest.raises(ValueError, match="std should be positive"):
            VisionCollator(mean=[0.5], std=[0.0])
        with pytest.raises(ValueError, match="one value per channel"):
            VisionCollator(mean=[0.5, 0.5], std=[0.5])

    def test_channel_count_must_match_stats(self) -> None:
        with pytest.raises(ValueError, match=r"row 0: 'pixel_values' has 4 channel\(s\) but mean/std have 3 values "
                                             r"\(normalization='imagenet'\)"):
            VisionCollator()([torch.zeros(4, 2, 2)])


class TestGrayscale:
    def test_one_channel_with_three_value_stats_raises(self) -> None:
        with pytest.raises(ValueError, match=r"has 1 channel\(s\) but mean/std have 3 values.*grayscale_to_rgb=True"):
            VisionCollator()([Image.new("L", (4, 4), 128)])

    def test_grayscale_to_rgb_repeats_channel(self) -> None:
        gray = torch.randint(0, 256, (1, 4, 4), dtype=torch.uint8)
        batch = VisionCollator(grayscale_to_rgb=True)([gray])["pixel_values"]
        rgb = VisionCollator()([gray.repeat(3, 1, 1)])["pixel_values"]
        torch.testing.assert_close(batch, rgb, atol=0, rtol=0)

    def test_one_value_stats_normalize_grayscale(self) -> None:
        pixels = VisionCollator(mean=[0.5], std=[0.5])([torch.full((4, 4), 255, dtype=torch.uint8)])["pixel_values"]
        assert pixels.shape == (1, 1, 4, 4) and pixels.unique().tolist() == [1.0]

    def test_grayscale_without_normalize_is_fine(self) -> None:
        assert VisionCollator(normalize=False)([torch.zeros(1, 2, 2)])["pixel_values"].shape == (1, 1, 2, 2)


class TestKeepUint8:
    @pytest.mark.parametrize("preset", ["imagenet", "cifar10"])
    def test_uint8_path_then_device_normalize_equals_float_path(self, preset: str) -> None:
        images = _uint8_images()
        rows = [{"pixel_values": image, "labels": 0} for image in images]
        fast = VisionCollator(normalization=preset, keep_uint8=True)
        batch = fast(rows)
        assert batch["pixel_values"].dtype == torch.uint8
        torch.testing.assert_close(batch["pixel_values"], torch.stack(images), atol=0, rtol=0)
        expected = VisionCollator(normalization=preset)(rows)["pixel_values"]
        torch.testing.assert_close(fast.normalize_on_device(batch["pixel_values"]), expected, atol=1e-6, rtol=0)
        mean, std = NORMALIZATION_PRESETS[preset]
        torch.testing.assert_close(normalize_batch(batch["pixel_values"], mean, std), expected, atol=1e-6, rtol=0)

    def test_normalize_false_only_scales(self) -> None:
        collator = VisionCollator(normalize=False, keep_uint8=True)
        pixels = collator([torch.full((3, 2, 2), 255, dtype=torch.uint8)])["pixel_values"]
        assert collator.normalize_on_device(pixels).unique().tolist() == [1.0]

    def test_float_rows_rejected(self) -> None:
        with pytest.raises(TypeError, match=r"row 1: keep_uint8=True needs uint8 images, but 'pixel_values' is "
                                            r"torch.float32"):
            VisionCollator(keep_uint8=True)([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 2, 2)])

    def test_normalize_batch_does_not_modify_its_input(self) -> None:
        pixels = torch.rand(2, 3, 4, 4)
        before = pixels.clone()
        out = normalize_batch(pixels, [0.5] * 3, [0.5] * 3)
        torch.testing.assert_close(pixels, before, atol=0, rtol=0)
        assert normalize_batch(pixels).data_ptr() != pixels.data_ptr()
        assert out.data_ptr() != pixels.data_ptr()


class TestContract:
    @pytest.mark.parametrize("options", [{}, {"normalize": False}, {"keep_uint8": True}])
    def test_rows_not_mutated_and_outputs_not_aliased(self, options: dict) -> None:
        tensors = _uint8_images(count=2) if options.get("keep_uint8") else [torch.rand(3, 4, 4) for _ in range(2)]
        rows = [{"pixel_values": tensor, "labels": 1} for tensor in tensors]
        snapshot = [tensor.clone() for tensor in tensors]
        batch = VisionCollator(**options)(rows)
        batch["pixel_values"].zero_() if options.get("keep_uint8") else batch["pixel_values"].fill_(7.0)
        for tensor, before in zip(tensors, snapshot):
            torch.testing.assert_close(tensor, before, atol=0, rtol=0)
        assert set(rows[0]) == {"pixel_values", "labels"}

    def test_numpy_rows_not_aliased(self) -> None:
        arrays = [np.full((2, 2, 1), 0.5, dtype=np.float32) for _ in range(2)]
        VisionCollator(normalize=False)(arrays)["pixel_values"].fill_(9.0)
        assert all((array == 0.5).all() for array in arrays)

    def test_pickle_round_trip_and_repr(self) -> None:
        collator = VisionCollator(normalization="cifar10", grayscale_to_rgb=True, keep_uint8=True)
        clone = pickle.loads(pickle.dumps(collator))
        assert repr(clone) == repr(collator)
        assert "normalization='cifar10'" in repr(collator) and "keep_uint8=True" in repr(collator)
        rows = _uint8_images(count=2)
        torch.testing.assert_close(clone(rows)["pixel_values"], collator(rows)["pixel_values"])

    def test_generator_accepted_and_global_rng_untouched(self) -> None:
        state = torch.get_rng_state()
        VisionCollator()(_uint8_images(count=2), generator=torch.Generator().manual_seed(1))
        assert torch.equal(torch.get_rng_state(), state)


class TestFactory:
    def test_spec_defaults(self) -> None:
        collator = create_vision_collator(task_spec=TaskSpec.vision_tiny())
        assert collator.normalization == "cifar10" and collator.mean == NORMALIZATION_PRESETS["cifar10"][0]
        assert collator.input_field == "pixel_values" and collator.target_field == "labels"

    def test_no_spec_defaults_to_imagenet(self) -> None:
        assert create_vision_collator().normalization == "imagenet"
        assert VisionCollator(normalize=True).normalization == "imagenet"

    def test_kwargs_override_spec(self) -> None:
        spec = TaskSpec.vision_tiny()
        assert create_vision_collator(task_spec=spec, normalization="imagenet").normalization == "imagenet"
        custom = create_vision_collator(task_spec=spec, mean=[0.5] * 3, std=[0.5] * 3)
        assert custom.normalization is None and custom.mean == (0.5, 0.5, 0.5)
        assert create_vision_collator(task_spec=spec, input_field="image").input_field == "image"

    def test_registry_call_without_spec(self) -> None:
        registry = CollatorRegistry()
        registry.register("default")(create_vision_collator)
        registry.register("vision", modality="vision")(create_vision_collator)
        collator = registry.get_collator(collator_name="vision", normalize=True, mean=[0.5, 0.5, 0.5], std=[0.5] * 3)
        pixels = collator([torch.full((3, 2, 2), 255, dtype=torch.uint8)])["pixel_values"]
        assert pixels.unique().tolist() == [1.0]

    def test_end_to_end_vision_tiny_keys_and_shapes(self) -> None:
        spec = TaskSpec.vision_tiny()
        collator = create_vision_collator(task_spec=spec)
        rows = [{"pixel_values": image, "labels": i % 4} for i, image in enumerate(_uint8_images(8, (3, 32, 32)))]
        batch = collator(rows)
        assert set(batch) == {"pixel_values", "labels"}
        assert batch["pixel_values"].shape == (8, *spec.additional_config["image_size"])
        assert batch["labels"].max() < spec.num_classes


class TestLayoutHints:
    """A channels-last tensor and a grayscale image among RGB ones are named with the fix that helps (not
    'resize every image', nor a channel count that is the image's height)."""

    @pytest.mark.parametrize("normalize", [True, False])
    def test_an_hwc_tensor_is_named_channels_last_with_the_permute(self, normalize) -> None:
        images = [torch.zeros(32, 32, 3, dtype=torch.uint8)] * 2
        with pytest.raises(ValueError, match=r"'pixel_values' should be a CHW image, but got shape \(32, 32, 3\), "
                                             r"which looks channels-last \(HWC\); permute it with "
                                             r"image.permute\(2, 0, 1\) .* v2.ToImage\(\)"):
            VisionCollator(normalize=normalize)(images)

    def test_a_grayscale_image_among_rgb_ones_names_the_conversion(self) -> None:
        images = [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 2 + [torch.zeros(1, 8, 8, dtype=torch.uint8)]
        with pytest.raises(ValueError, match=r"row 2: 'pixel_values' has 1 channel\(s\) where the other images have 3 "
                                             r"\(shape \(1, 8, 8\)\); convert every image to RGB .*v2.RGB\(\), or "
                                             r"PIL's image.convert\('RGB'\)\), or pass grayscale_to_rgb=True"):
            VisionCollator()(images)

    def test_an_rgba_image_among_rgb_ones_names_the_conversion(self) -> None:
        images = [torch.zeros(4, 8, 8, dtype=torch.uint8)] + [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 2
        with pytest.raises(ValueError, match=r"row 0: 'pixel_values' has 4 channel\(s\) where the other images have 3"):
            VisionCollator()(images)


class Batch(list):
    """Rows as the engine hands them: with their split and their indices in the data the user gave."""

    def __init__(self, rows, role):
        super().__init__(rows)
        self.role, self.indices = role, [20 + i for i in range(len(rows))]


class TestEvaluationImageSize:
    """Validation, test and prediction images must have the spec's image_size, the size the model trains on."""

    def rows(self, height, width):
        return [{"pixel_values": torch.zeros(3, height, width, dtype=torch.uint8), "labels": 0}] * 2

    @pytest.mark.parametrize("role", ["val", "test", "predict"])
    def test_an_evaluation_batch_of_another_size_is_refused_naming_the_transform_to_add(self, role):
        collate = create_vision_collator(TaskSpec.vision_tiny())
        assert collate.image_size == (3, 32, 32)
        with pytest.raises(ValueError, match=rf"^{role} row 20: 'pixel_values' should have the spec's "
                                             rf"image_size=\[3, 32, 32\] \(the size the model trains on\), but got "
                                             rf"pixel_values of shape \[3, 24, 20\] in a {role} batch; add "
                                             r"eval_transform=v2.Compose\(\[v2.Resize\(32\), v2.CenterCrop\(\(32, "
                                             r"32\)\)\]\)"):
            collate(Batch(self.rows(24, 20), role))

    def test_training_batches_plain_lists_and_the_right_size_pass(self):
        collate = create_vision_collator(TaskSpec.vision_tiny())
        collate(Batch(self.rows(24, 20), "train"))  # a train_transform crops them; not this check's business
        collate(self.rows(24, 20))  # no split: a plain call
        assert collate(Batch(self.rows(32, 32), "val"))["pixel_values"].shape == (2, 3, 32, 32)
        assert VisionCollator(image_size=[32, 32])(Batch(self.rows(32, 32), "test"))["pixel_values"].shape[0] == 2
        assert VisionCollator()(Batch(self.rows(24, 20), "val"))["pixel_values"].shape == (2, 3, 24, 20)

    @pytest.mark.parametrize("size", [0, [3, 32], [1, 2, 3, 4], "32", True])
    def test_a_bad_image_size_is_refused(self, size):
        if size == [3, 32]:
            assert VisionCollator(image_size=size).image_size == (3, 32)  # [height, width]
            return
        with pytest.raises(ValueError, match=r"image_size should be a positive int, \[height, width\] or \[channels, "
                                             r"height, width\], but got image_size="):
            VisionCollator(image_size=size)
