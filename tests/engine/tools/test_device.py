import pytest
import torch
import torchvision.transforms.v2.functional as TF
from torchvision.transforms import Normalize

from collators.vision import NORMALIZATION_PRESETS, VisionCollator
from engine.tools.device import DeviceNormalize, normalize_on_device

IMAGENET = NORMALIZATION_PRESETS["imagenet"]


def images(count=16, channels=3, size=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, channels, size, size), dtype=torch.uint8, generator=generator)


def torchvision_per_sample(pixels, mean, std):
    """The reference: each image scaled to [0, 1] float, then torchvision's Normalize, then stacked."""
    normalize = Normalize(mean, std)
    return torch.stack([normalize(TF.to_dtype(image, torch.float32, scale=True)) for image in pixels])


class TestEqualsTorchvision:
    @pytest.mark.parametrize("stats", ["imagenet", "cifar10"])
    def test_within_1e_6_of_per_sample_normalize(self, stats):
        mean, std = NORMALIZATION_PRESETS[stats]
        pixels = images(8, size=224)
        got = normalize_on_device({"pixel_values": pixels}, mean=mean, std=std)["pixel_values"]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, torchvision_per_sample(pixels, mean, std), atol=1e-6, rtol=0)

    def test_uint8_collate_then_device_equals_the_float_collator(self):
        rows = [{"pixel_values": image, "labels": i} for i, image in enumerate(images(6))]
        uint8 = VisionCollator(keep_uint8=True, normalization="cifar10")
        batch = uint8(rows)
        assert batch["pixel_values"].dtype == torch.uint8
        done = DeviceNormalize.from_collator(uint8)(batch)
        expected = VisionCollator(normalization="cifar10")(rows)
        torch.testing.assert_close(done["pixel_values"], expected["pixel_values"], atol=1e-6, rtol=0)
        assert torch.equal(done["labels"], expected["labels"])

    def test_grayscale_and_video_shapes(self):
        gray = images(4, channels=1)
        got = normalize_on_device(gray, mean=[0.5], std=[0.25])
        torch.testing.assert_close(got, torchvision_per_sample(gray, [0.5], [0.25]), atol=1e-6, rtol=0)
        video = images(6).reshape(2, 3, 3, 64, 64)  # [B, T, C, H, W]
        got = DeviceNormalize(mean=IMAGENET[0], std=IMAGENET[1])(video)
        torch.testing.assert_close(got.flatten(0, 1), torchvision_per_sample(video.flatten(0, 1), *IMAGENET),
                                   atol=1e-6, rtol=0)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    def test_on_cuda_equals_cpu(self):
        pixels = images(8, size=224)
        normalize = DeviceNormalize(mean=IMAGENET[0], std=IMAGENET[1])
        on_device = normalize({"pixel_values": pixels.pin_memory().to("cuda", non_blocking=True)})["pixel_values"]
        torch.testing.assert_close(on_device.cpu(), torchvision_per_sample(pixels, *IMAGENET), atol=1e-6, rtol=0)


class TestBehaviour:
    def test_float_batches_pass_through_and_the_callers_dict_is_kept(self):
        normalize = DeviceNormalize(mean=IMAGENET[0], std=IMAGENET[1])
        floats = torch.rand(2, 3, 4, 4)
        assert normalize({"pixel_values": floats})["pixel_values"] is floats
        batch = {"pixel_values": images(2), "labels": torch.tensor([0, 1])}
        out = normalize(batch)
        assert batch["pixel_values"].dtype == torch.uint8 and out["labels"] is batch["labels"]

    def test_from_collator(self):
        assert DeviceNormalize.from_collator(VisionCollator()) is None
        assert DeviceNormalize.from_collator(lambda rows: rows) is None
        scale_only = DeviceNormalize.from_collator(VisionCollator(keep_uint8=True, normalize=False, input_field="x"))
        assert scale_only.key == "x"
        out = scale_only({"x": torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)})["x"]
        assert out.unique().tolist() == [1.0]

    def test_bfloat16_result(self):
        out = normalize_on_device(images(2), mean=IMAGENET[0], std=IMAGENET[1], dtype=torch.bfloat16)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), torchvision_per_sample(images(2), *IMAGENET), atol=0, rtol=1e-2)

    def test_errors_name_the_problem(self):
        normalize = DeviceNormalize(mean=IMAGENET[0], std=IMAGENET[1])
        with pytest.raises(ValueError, match=r"with C=3 channels .* but got shape \(2, 1, 4, 4\)"):
            normalize(images(2, channels=1, size=4))
        with pytest.raises(KeyError, match=r"the batch has no 'pixel_values' \(keys: \['image'\]\)"):
            normalize({"image": images(1)})
        with pytest.raises(TypeError, match="expects a dict batch or a tensor, but got list"):
            normalize([images(1)])
        with pytest.raises(ValueError, match="std should be positive"):
            DeviceNormalize(mean=[0.5], std=[0.0])
        with pytest.raises(TypeError, match="dtype should be a floating dtype"):
            DeviceNormalize(mean=[0.5], std=[0.5], dtype=torch.int32)

