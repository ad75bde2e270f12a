"""The vision-language collators: placeholder expansion and labels, image decoding and sizes, seeded flips, image-text
pairs, decoding on the device; checked against transformers' Llava processor and SigLIP image processor."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPImageProcessor, LlavaProcessor, SiglipImageProcessor

from collators import CollatorRegistry, ImageTextCollator, VisionLanguageCollator
from collators._vlm_images import ImagePipeline
from collators.multimodal import ENCODED_KEY
from engine.tools.device import DeviceDecode
from task_spec import TaskSpec
from tests.collators.conftest import build_tokenizer

IMAGE = 1  # TaskSpec.vlm_tiny()'s image_token_id


def picture(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth HWC uint8 RGB image (gradients, as photos are): JPEG keeps it close."""
    rows, cols = np.mgrid[0:height, 0:width]
    phase = seed * 0.7
    channels = [np.sin(rows / (3 + seed) + phase), np.cos(cols / (4 + seed) - phase), np.sin((rows + cols) / 5 + seed)]
    return ((np.stack(channels, -1) + 1) * 127.5).astype(np.uint8)


def encoded(height: int, width: int, seed: int, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(picture(height, width, seed)).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture
def image_tokenizer():
    """The collator tests' GPT-like tokenizer with ``<image>`` added as a special token."""
    tokenizer = build_tokenizer(pad_token="[PAD]", post_processor=False)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tokenizer


def collator(**kwargs):
    return CollatorRegistry.get_instance().get_collator(TaskSpec.vlm_tiny(), **kwargs)


class TestRegistry:
    def test_multimodal_specs_get_the_vision_language_collators(self):
        registry = CollatorRegistry.get_instance()
        pairs = TaskSpec(name="pairs", task_type="classification", modality="multimodal",
                         special_tokens={"pad_token_id": 0}, additional_config={"num_classes": 2, "image_size": 16})
        assert registry.resolve(TaskSpec.vlm_tiny()).chosen.name == "vision_language"
        assert isinstance(registry.get_collator(TaskSpec.vlm_tiny()), VisionLanguageCollator)
        assert isinstance(registry.get_collator(pairs), ImageTextCollator)

    def test_a_users_multimodal_registration_still_wins(self):
        registry = CollatorRegistry.get_instance()
        with registry.scoped():
            @registry.register("mine", modality="multimodal")
            def create_mine(task_spec=None, **kwargs):
                return lambda rows: rows

            assert registry.resolve(TaskSpec.vlm_tiny()).chosen.name == "mine"


    def test_ids_come_from_the_tokenizer_before_the_spec(self, image_tokenizer):
        registry = CollatorRegistry.get_instance()
        with_tokenizer = registry.get_collator(TaskSpec.vlm_tiny(), tokenizer=image_tokenizer)
        assert with_tokenizer.image_token_id == image_tokenizer.convert_tokens_to_ids("<image>") != IMAGE
        plain = build_tokenizer(pad_token=None, post_processor=False)  # neither <image> nor a pad token
        assert registry.get_collator(TaskSpec.vlm_tiny(), tokenizer=plain).image_token_id == IMAGE


class TestPlaceholders:
    def test_expansion_equals_llava_processors(self, image_tokenizer):
        """Each ``<image>`` becomes the image's (H / patch) * (W / patch) tokens, as LlavaProcessor expands it."""
        clip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = LlavaProcessor(image_processor=clip, tokenizer=image_tokenizer, patch_size=8,
                                   vision_feature_select_strategy="full")
        texts = ["<image> the cat sat", "a dog <image> ran <image> in the park"]
        images = [Image.fromarray(picture(40, 48, seed)) for seed in range(3)]
        theirs = processor(text=texts, images=images, padding=True, return_tensors="pt")
        collate = VisionLanguageCollator(images=ImagePipeline(image_processor=clip, patch_size=8),
                                         tokenizer=image_tokenizer)
        ours = collate([{"text": texts[0], "image": images[0]}, {"text": texts[1], "images": images[1:]}])
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
        assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
        assert torch.equal(ours["pixel_values"], theirs["pixel_values"])  # the processor's own pixels
        assert ours["images_per_row"].tolist() == [1, 2]

    def test_labels_ignore_image_tokens_padding_and_the_prompt(self):
        rows = [{"input_ids": [5, 6, 7], "image": encoded(20, 30, 0)},  # no placeholder: the image goes first
                {"input_ids": [8, IMAGE, 9, 10, 11], "image": encoded(40, 40, 1), "prompt_length": 2}]
        batch = collator()(rows)
        image_tokens = [IMAGE] * 16  # 32x32 in 8x8 patches
        assert batch["input_ids"].tolist() == [image_tokens + [5, 6, 7, 0], [8] + image_tokens + [9, 10, 11]]
        assert batch["labels"].tolist() == [[-100] * 16 + [5, 6, 7, -100], [-100] * 17 + [9, 10, 11]]
        assert batch["attention_mask"].tolist() == [[1] * 19 + [0], [1] * 20]

    def test_left_padding_pads_before_the_row(self):
        batch = collator(padding_side="left")([{"input_ids": [5], "image": encoded(8, 8, 0)},
                                               {"input_ids": [5, 6], "image": encoded(8, 8, 0)}])
        assert batch["input_ids"][0].tolist() == [0] + [IMAGE] * 16 + [5]
        assert batch["labels"][0].tolist()[:17] == [-100] * 17

    def test_several_images_stay_in_order(self):
        images = [encoded(24 + 8 * seed, 32, seed) for seed in range(3)]
        batch = collator()([{"input_ids": [IMAGE, 5], "image": images[0]},
                            {"input_ids": [IMAGE, 6, IMAGE], "images": images[1:]}])
        for index, image in enumerate(images):
            alone = collator()([{"input_ids": [IMAGE], "image": image}])["pixel_values"][0]
            assert torch.equal(batch["pixel_values"][index], alone)

    def test_a_placeholder_count_other_than_the_images_is_refused(self):
        with pytest.raises(ValueError, match=r"row 0 has 2 image placeholder\(s\) \(token id 1\) but 1 image\(s\)"):
            collator()([{"input_ids": [IMAGE, 5, IMAGE], "image": encoded(8, 8, 0)}])

    def test_a_row_longer_than_max_length_is_refused_not_cut(self):
        with pytest.raises(ValueError, match="row 0 has 19 tokens with its image tokens, more than max_length=18"):
            collator(max_length=18)([{"input_ids": [5, 6, 7], "image": encoded(8, 8, 0)}])

    def test_a_tokenizer_without_the_image_token_is_refused(self):
        with pytest.raises(ValueError, match="the tokenizer has no token '<image>'"):
            VisionLanguageCollator(images=ImagePipeline(image_size=8, patch_size=8), tokenizer=build_tokenizer())


class TestImages:
    def test_resize_and_normalization_equal_siglips_image_processor(self):
        """The same decoded image through our image step and SigLIP's processor (bicubic to 32x32, 0.5/0.5)."""
        data = encoded(45, 60, 2, "PNG")
        ours = collator(normalization="half")([{"input_ids": [5], "image": data}])["pixel_values"]
        theirs = SiglipImageProcessor(size={"height": 32, "width": 32})(
            images=[Image.open(io.BytesIO(data))], return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)

    def test_every_image_form_gives_the_same_pixels(self, tmp_path):
        data = encoded(20, 24, 3, "PNG")
        (tmp_path / "a.png").write_bytes(data)
        forms = [data, {"bytes": data, "path": None}, {"bytes": None, "path": str(tmp_path / "a.png")},
                 Image.open(io.BytesIO(data)), torch.from_numpy(picture(20, 24, 3)).permute(2, 0, 1).contiguous()]
        batches = [collator()([{"input_ids": [5], "image": form}])["pixel_values"] for form in forms]
        for batch in batches[1:]:
            assert torch.equal(batch, batches[0])

    def test_longest_side_sizes_vary_and_are_counted_in_tokens(self):
        spec = TaskSpec.vlm_tiny().replace(additional_config={"image_size": TaskSpec.REMOVE, "max_image_size": 32},
                                           preprocessing_config={"resize": "longest"})
        collate = CollatorRegistry.get_instance().get_collator(spec)
        batch = collate([{"input_ids": [IMAGE, 5], "image": encoded(16, 32, 0)},
                         {"input_ids": [IMAGE, 6], "image": encoded(40, 20, 1)}])
        assert batch["image_sizes"].tolist() == [[16, 32], [32, 16]]
        assert (batch["input_ids"] == IMAGE).sum(1).tolist() == [2 * 4, 4 * 2]
        assert batch["pixel_values"].shape == (2, 3, 32, 32)
        assert batch["pixel_values"][0, :, 16:].abs().sum() == 0  # padding below the first image

    def test_tiles_follow_the_aspect_within_max_tiles_and_count_their_tokens(self):
        spec = TaskSpec.vlm_tiny().replace(additional_config={"image_size": 16, "max_tiles": 4},
                                           preprocessing_config={"resize": "tile"})
        wide, square = encoded(16, 40, 0), encoded(64, 64, 1)
        batch = CollatorRegistry.get_instance().get_collator(spec)([{"input_ids": [IMAGE, 5], "image": wide},
                                                                    {"input_ids": [6], "image": square}])
        assert batch["image_grid"].tolist() == [[1, 2], [2, 2]]  # 4 x 4 tiles of the square shrink to 2 x 2
        assert batch["pixel_values"].shape == (6, 3, 16, 16)
        assert (batch["input_ids"] == IMAGE).sum(1).tolist() == [2 * 4, 4 * 4]
        whole = collator(image_size=(16, 32))([{"input_ids": [5], "image": wide}])["pixel_values"][0]
        assert torch.equal(batch["pixel_values"][0], whole[..., :16])
        assert torch.equal(batch["pixel_values"][1], whole[..., 16:])

    def test_without_an_image_size_images_keep_their_size_and_float_images_are_read_as_0_to_1(self):
        spec = TaskSpec(name="pairs", task_type="classification", modality="multimodal",
                        special_tokens={"pad_token_id": 0}, additional_config={"num_classes": 2},
                        preprocessing_config={"normalization": "half"})
        collate = CollatorRegistry.get_instance().get_collator(spec)
        floats = torch.rand(3, 4, 6, generator=torch.Generator().manual_seed(0))
        batch = collate([{"input_ids": [5], "image": floats, "labels": 0},
                         {"input_ids": [6], "image": torch.full((3, 4, 4), 255, dtype=torch.uint8), "labels": 1}])
        assert batch["image_sizes"].tolist() == [[4, 6], [4, 4]]
        torch.testing.assert_close(batch["pixel_values"][0], (floats - 0.5) / 0.5)
        assert batch["pixel_values"][1, :, :, :4].eq(1).all() and batch["pixel_values"][1, :, :, 4:].eq(0).all()
        with pytest.raises(ValueError, match=r"row 0's image is a float image with values in \[0, 255\]"):
            collate([{"input_ids": [5], "image": torch.where(floats > 0.5, 255.0, 0.0), "labels": 0}])

    def test_undecodable_bytes_name_the_row(self):
        with pytest.raises(ValueError, match="row 0's image 0 could not be decoded as an image"):
            collator()([{"input_ids": [5], "image": b"not an image"}])


class TestSeededFlips:
    def rows(self):
        return [{"input_ids": [5], "image": encoded(16, 16, seed)} for seed in range(8)]

    def test_the_same_seed_flips_the_same_images(self):
        collate = collator(flip_probability=0.5)
        first = collate(self.rows(), generator=torch.Generator().manual_seed(3))
        again = collate(self.rows(), generator=torch.Generator().manual_seed(3))
        other = collate(self.rows(), generator=torch.Generator().manual_seed(4))
        plain = collator()(self.rows())
        assert torch.equal(first["pixel_values"], again["pixel_values"])
        assert not torch.equal(first["pixel_values"], other["pixel_values"])
        for flipped, image in zip(first["pixel_values"], plain["pixel_values"]):
            assert torch.equal(flipped, image) or torch.equal(flipped, image.flip(-1))

    def test_flips_without_a_generator_are_refused(self):
        with pytest.raises(ValueError, match="flip_probability=0.5 draws from the batch's generator"):
            collator(flip_probability=0.5)(self.rows())


class TestImageTextPairs:
    def spec(self, **changes):
        return TaskSpec(name="pairs", task_type="classification", modality="multimodal",
                        special_tokens={"pad_token_id": 0}, additional_config={"num_classes": 3, "image_size": 16},
                        **changes)

    def test_classification_pairs_pad_text_and_stack_one_image_per_row(self):
        collate = CollatorRegistry.get_instance().get_collator(self.spec())
        batch = collate([{"input_ids": [5, 6, 7], "image": encoded(20, 20, 0), "labels": 2},
                         {"input_ids": [8], "image": encoded(30, 10, 1), "labels": 0}])
        assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
        assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
        assert batch["pixel_values"].shape == (2, 3, 16, 16)
        assert batch["labels"].tolist() == [2, 0]

    def test_contrastive_pairs_need_no_labels(self):
        collate = CollatorRegistry.get_instance().get_collator(self.spec(loss_type="contrastive", target_field=None))
        batch = collate([{"input_ids": [5], "image": encoded(20, 20, 0)},
                         {"input_ids": [6], "image": encoded(9, 9, 1)}])
        assert sorted(batch) == ["attention_mask", "input_ids", "pixel_values"]

    def test_a_pair_with_two_images_is_refused(self):
        collate = CollatorRegistry.get_instance().get_collator(self.spec())
        with pytest.raises(ValueError, match="row 0 should hold one image"):
            collate([{"input_ids": [5], "images": [encoded(8, 8, 0)] * 2, "labels": 1}])


class TestDeviceDecode:
    def rows(self):
        return [{"input_ids": [IMAGE, 5], "image": encoded(40, 30, 0)},
                {"input_ids": [6, IMAGE, 7, IMAGE], "images": [encoded(16, 16, 1), {"bytes": encoded(50, 60, 2)}]}]

    def test_decoding_after_collation_gives_the_workers_pixels(self):
        """The device step (run here on the CPU) decodes, resizes and normalizes as the worker path does."""
        workers = collator(flip_probability=0.5)(self.rows(), generator=torch.Generator().manual_seed(1))
        on_device = collator(decode_device="cpu", flip_probability=0.5)
        left = on_device(self.rows(), generator=torch.Generator().manual_seed(1))
        assert "pixel_values" not in left and len(left[ENCODED_KEY]) == 3
        decode = DeviceDecode.from_collator(collator(decode_device="cpu"))
        finished = decode(left)
        assert sorted(finished) == sorted(workers)
        for key, value in workers.items():
            assert torch.equal(finished[key], value), key

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
    def test_decoding_on_cuda_without_cuda_is_refused_at_construction(self):
        with pytest.raises(ValueError, match=r"decode_device='cuda' decodes images on the GPU after collation, but "
                                             r"CUDA is not available here"):
            collator(decode_device="cuda")

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
    def test_decoding_on_cuda_matches_the_workers_pixels_within_the_decoders_tolerance(self):
        workers = collator()(self.rows())
        on_device = collator(decode_device="cuda")
        finished = DeviceDecode.from_collator(on_device)(on_device(self.rows()))
        assert finished["pixel_values"].device.type == "cuda"
        # nvJPEG and libjpeg may round the inverse DCT and upsampled chroma differently: a few levels in 255
        difference = (finished["pixel_values"].cpu() - workers["pixel_values"]).abs()
        assert difference.max() <= 8 / 255 / 0.26130258  # 8 levels, over CLIP's smallest std

    def test_only_jpegs_and_encoded_images_are_left_to_the_device(self):
        with pytest.raises(ValueError, match="row 0's image 0 is not a JPEG"):
            collator(decode_device="cpu")([{"input_ids": [5], "image": encoded(8, 8, 0, "PNG")}])
        with pytest.raises(TypeError, match="row 0's image 0 is a decoded Tensor"):
            collator(decode_device="cpu")([{"input_ids": [5], "image": torch.zeros(3, 8, 8, dtype=torch.uint8)}])


def test_the_data_module_decodes_before_the_transfer():
    """With decode_device, the module's loader yields encoded images and its on_before_batch_transfer hook decodes
    them into the pixels the worker path gives."""
    from torch.utils.data import Dataset

    from engine import UniversalDataModule

    class Captions(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return {"input_ids": [5, 6], "image": encoded(20 + index, 24, index)}

    batches = {}
    for device in (None, "cpu"):
        dm = UniversalDataModule(Captions(), task_spec=TaskSpec.vlm_tiny(), batch_size=4, num_workers=0, seed=3,
                                 collator_kwargs={"decode_device": device} if device else None)
        batch = next(iter(dm.train_dataloader()))
        assert (ENCODED_KEY in batch) == (device is not None)
        batches[device] = dm.on_before_batch_transfer(batch, 0)
    assert torch.equal(batches["cpu"]["pixel_values"], batches[None]["pixel_values"])
