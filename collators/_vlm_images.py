"""Images of vision-language rows to model inputs: decoded, resized, optionally flipped (seeded) and normalized.

An image arrives as encoded bytes (JPEG, PNG, WebP), the ``{"bytes": ..., "path": ...}`` struct that ``datasets``
writes for its ``Image`` feature, a PIL image or a uint8 CHW tensor. Bytes are decoded by
``torchvision.io.decode_image`` (faster than PIL, and the same library the device path uses); every image becomes
RGB uint8 CHW. Resizing keeps uint8 (``torchvision.transforms.v2.functional.resize``, bicubic with antialias), and
the scale and normalization run once on the stacked batch. A transformers image processor, when given, replaces
the resize and normalization: it receives the decoded images and its ``pixel_values`` are used as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from collators.images import NORMALIZATION_PRESETS, stats
from collators.vision import check_image_size

RESIZE_MODES = ("fixed", "longest", "tile")
"""``fixed``: every image to ``image_size`` (without one, images keep their size); ``longest``: the longest side
to ``max_image_size``, the aspect kept and each side rounded to a multiple of ``patch_size`` (so images of a batch
differ in size); ``tile``: each image resized to a grid of ``image_size`` tiles (at most ``max_tiles``) that
follows its aspect, and cut into them."""


class ImagePipeline:
    """Decode, resize and normalize the images of a batch; picklable (options only).

    Args:
        image_size: ``(H, W)`` every image is resized to (``resize='fixed'``; None keeps each image's size), or
            the size of one tile (``resize='tile'``).
        resize: One of :data:`RESIZE_MODES`.
        max_image_size: Longest side for ``resize='longest'``.
        max_tiles: Most tiles of one image for ``resize='tile'``.
        patch_size: Side of one image token's patch; image tokens per image are ``(H / p) * (W / p)``.
        image_tokens: Image tokens per image when every image has one size (overrides the patch count).
        normalization: A name in ``NORMALIZATION_PRESETS`` (``'clip'`` too), unless ``mean``/``std`` are given.
        mean: Per-channel mean, with ``std``.
        std: Per-channel standard deviation.
        flip_probability: Chance of a horizontal flip per image, drawn from the batch's generator (seeded).
        image_processor: A transformers image processor that replaces resize and normalization.
    """

    def __init__(self, *, image_size: int | Sequence[int] | None = None, resize: str = "fixed",
                 max_image_size: int | None = None, max_tiles: int | None = None, patch_size: int | None = None,
                 image_tokens: int | None = None,
                 normalization: str | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, flip_probability: float = 0.0,
                 image_processor: Any = None) -> None:
        if resize not in RESIZE_MODES:
            raise ValueError(f"resize should be one of {', '.join(map(repr, RESIZE_MODES))}, but got resize={resize!r}")
        for name, value in (("max_image_size", max_image_size), ("max_tiles", max_tiles), ("patch_size", patch_size),
                            ("image_tokens", image_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} should be a positive int or None, but got {name}={value!r}")
        if not 0.0 <= flip_probability <= 1.0:
            raise ValueError(f"flip_probability should be in [0, 1], but got flip_probability={flip_probability!r}")
        self.image_processor = image_processor
        self.image_size = _size(image_size)
        if resize == "tile" and self.image_size is None:
            raise ValueError("resize='tile' needs image_size=(H, W), the size of one tile (or the spec's "
                             "additional_config['image_size']), but got image_size=None")
        if resize == "tile" and max_tiles is None:
            raise ValueError("resize='tile' needs max_tiles, the most tiles of one image, but got max_tiles=None")
        if resize == "longest" and (max_image_size is None or patch_size is None):
            raise ValueError(f"resize='longest' needs max_image_size and patch_size, but got max_image_size="
                             f"{max_image_size!r}, patch_size={patch_size!r}")
        if image_tokens is None and patch_size is None:
            raise ValueError("the number of image tokens per image needs image_tokens=N or patch_size=P (tokens = "
                             "(H / P) * (W / P)), but got neither; pass one (or set them in the spec's "
                             "additional_config)")
        if image_tokens is not None and resize == "longest":
            raise ValueError(f"image_tokens={image_tokens} fixes one count for every image, but resize='longest' "
                             f"gives images of different sizes; drop image_tokens (the patch grid counts them)")
        if self.image_size is not None and patch_size is not None and image_tokens is None and any(
                side % patch_size for side in self.image_size):
            raise ValueError(f"image_size={list(self.image_size)} should be a multiple of patch_size={patch_size} "
                             f"on both sides, so each patch is one image token; change one of them")
        if (mean is None) != (std is None):
            raise ValueError(f"give mean and std together, but got mean={mean!r}, std={std!r}")
        if mean is None:
            normalization = "imagenet" if normalization is None else normalization
            presets = {**NORMALIZATION_PRESETS, **EXTRA_PRESETS}
            if normalization not in presets:
                raise ValueError(f"normalization should be one of {', '.join(map(repr, presets))}, but got "
                                 f"normalization={normalization!r}; or pass mean=[...] and std=[...]")
            mean, std = presets[normalization]
        self.mean, self.std = stats("mean", mean), stats("std", std)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std should have 3 values (RGB) and std should be positive, but got "
                             f"mean={self.mean}, std={self.std}")
        self.resize, self.max_image_size, self.max_tiles = resize, max_image_size, max_tiles
        self.patch_size = patch_size
        self.image_tokens, self.flip_probability = image_tokens, float(flip_probability)

    @property
    def varies(self) -> bool:
        """Whether images of one batch may differ in size (then the batch carries ``image_sizes``): resized by
        their longest side, or kept at their own size."""
        return self.image_processor is None and (self.resize == "longest" or (
            self.resize == "fixed" and self.image_size is None))

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """The size an image of ``height`` x ``width`` is resized to (for tiles: the whole grid's)."""
        if self.resize == "fixed":
            return self.image_size if self.image_size is not None else (height, width)
        if self.resize == "tile":
            assert self.image_size is not None and self.max_tiles is not None
            tile_height, tile_width = self.image_size
            rows, cols = max(1, round(height / tile_height)), max(1, round(width / tile_width))
            while rows * cols > self.max_tiles:  # shrink the longer side of the grid first: the aspect is kept
                if rows * tile_height >= cols * tile_width:
                    rows -= 1
                else:
                    cols -= 1
            return rows * tile_height, cols * tile_width
        longest, patch = self.max_image_size, self.patch_size
        assert longest is not None and patch is not None
        scale = longest / max(height, width)
        return (max(patch, round(height * scale / patch) * patch), max(patch, round(width * scale / patch) * patch))

    def tokens(self, size: tuple[int, int]) -> int:
        """Image tokens of an image resized to ``size`` (with tiles: of all its tiles)."""
        tiles = 1
        if self.resize == "tile" and self.image_processor is None:
            assert self.image_size is not None
            tiles = (size[0] // self.image_size[0]) * (size[1] // self.image_size[1])
            size = self.image_size
        if self.image_tokens is not None:
            return tiles * self.image_tokens
        assert self.patch_size is not None
        return tiles * (size[0] // self.patch_size) * (size[1] // self.patch_size)

    def tiles(self, image: torch.Tensor) -> list[torch.Tensor]:
        """A resized image cut into its ``image_size`` tiles, row by row."""
        assert self.image_size is not None
        height, width = self.image_size
        return [image[..., top:top + height, left:left + width] for top in range(0, image.shape[-2], height)
                for left in range(0, image.shape[-1], width)]

    def sizes(self, images: Sequence[Any], where: Sequence[str]) -> list[tuple[int, int]]:
        """The resized size of each image, read from its header without decoding its pixels where it is encoded."""
        if self.image_processor is not None:
            return [self._processor_size()] * len(images)
        if self.resize == "fixed" and self.image_size is not None:
            return [self.image_size] * len(images)
        return [self.target_size(*image_hw(image, name)) for image, name in zip(images, where)]

    def _processor_size(self) -> tuple[int, int]:
        """The output size of the image processor: its crop size when it crops, else its size."""
        processor = self.image_processor
        size = processor.crop_size if getattr(processor, "do_center_crop", False) else getattr(processor, "size", None)
        read = (lambda key: size.get(key)) if isinstance(size, Mapping) else (lambda key: getattr(size, key, None))
        height, width = read("height"), read("width")
        if height is None or width is None:
            height = width = read("shortest_edge")
        if height is None:
            raise ValueError(f"the image processor's output size cannot be read from its size={size!r}; pass "
                             f"image_tokens=N")
        return int(height), int(width)

    def __call__(self, images: Sequence[Any], where: Sequence[str], flips: Sequence[bool]) -> torch.Tensor:
        """``pixel_values [N, 3, H, W]`` of ``images`` (float32, normalized; padded at the bottom and right to the
        largest image when sizes vary), the images of ``flips`` mirrored left to right."""
        decoded = [decode(image, name) for image, name in zip(images, where)]
        if self.image_processor is not None:
            flipped = [image.flip(-1) if flip else image for image, flip in zip(decoded, flips)]
            return self.image_processor(images=flipped, return_tensors="pt")["pixel_values"]
        return self.finish([self.resized(image) for image in decoded], flips)

    def resized(self, image: torch.Tensor) -> torch.Tensor:
        """One CHW image at its target size (bicubic, antialiased), on its own device; uint8 stays uint8."""
        import torchvision.transforms.v2.functional as TF

        size = self.target_size(*image.shape[-2:])
        if tuple(image.shape[-2:]) == size:
            return image
        return TF.resize(image, list(size), interpolation=TF.InterpolationMode.BICUBIC, antialias=True)

    def finish(self, resized: Sequence[torch.Tensor], flips: Sequence[bool]) -> torch.Tensor:
        """Flip the resized images of ``flips``, cut them into tiles (``resize='tile'``), pad them to one size, scale
        to [0, 1] (uint8 by 1/255; float images are in [0, 1] already) and normalize."""
        resized = [image.flip(-1) if flip else image for image, flip in zip(resized, flips)]
        if self.resize == "tile":
            resized = [tile for image in resized for tile in self.tiles(image)]
        height = max(image.shape[-2] for image in resized)
        width = max(image.shape[-1] for image in resized)
        device = resized[0].device
        floats = any(image.is_floating_point() for image in resized)
        batch = torch.zeros((len(resized), 3, height, width), dtype=torch.float32 if floats else torch.uint8,
                            device=device)
        for index, image in enumerate(resized):
            batch[index, :, : image.shape[-2], : image.shape[-1]] = (
                image.to(torch.float32).div_(255) if floats and not image.is_floating_point() else image)
        mean = torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        pixels = (batch if floats else batch.to(torch.float32).div_(255)).sub_(mean).div_(std)
        if self.varies:  # padding stays zero after normalization, so a model's mask of image_sizes need not undo it
            for index, image in enumerate(resized):
                pixels[index, :, image.shape[-2]:, :] = 0
                pixels[index, :, :, image.shape[-1]:] = 0
        return pixels

    def draw_flips(self, count: int, generator: torch.Generator | None) -> list[bool]:
        """Which images to flip: one draw per image from ``generator``, so the same seed flips the same images."""
        if self.flip_probability == 0.0:
            return [False] * count
        if generator is None:
            raise ValueError(f"flip_probability={self.flip_probability} draws from the batch's generator, but the "
                             f"collator got generator=None; call it as collator(rows, generator=...) (the data module "
                             f"does) or pass flip_probability=0")
        return (torch.rand(count, generator=generator) < self.flip_probability).tolist()

    def __repr__(self) -> str:
        return (f"ImagePipeline(image_size={self.image_size}, resize={self.resize!r}, max_image_size="
                f"{self.max_image_size}, max_tiles={self.max_tiles}, patch_size={self.patch_size}, "
                f"image_tokens={self.image_tokens}, "
                f"mean={self.mean}, std={self.std}, flip_probability={self.flip_probability}, "
                f"image_processor={type(self.image_processor).__name__ if self.image_processor else None})")


EXTRA_PRESETS = {"clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
                 "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}
"""Statistics of vision-language encoders: CLIP's, and SigLIP's 0.5/0.5."""


def _size(size: Any) -> tuple[int, int] | None:
    """``image_size`` as ``(H, W)``, checked as the vision collator checks it; a ``[C, H, W]`` spec size drops C."""
    checked = check_image_size(size)
    return None if checked is None else (int(checked[-2]), int(checked[-1]))


def encoded_bytes(image: Any, where: str) -> bytes | None:
    """The encoded bytes of ``image`` (bytes, or a ``datasets`` Image struct, read from its path when it has no
    bytes); None for a decoded image (PIL or tensor)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, Mapping) and ("bytes" in image or "path" in image):
        if image.get("bytes") is not None:
            return bytes(image["bytes"])
        if image.get("path") is not None:
            return Path(image["path"]).read_bytes()
        raise ValueError(f"{where} is an image struct with neither bytes nor path: {dict(image)!r}")
    return None


def decode(image: Any, where: str) -> torch.Tensor:
    """One image as RGB CHW (uint8, or float in [0, 1] as given): bytes by ``torchvision.io.decode_image``, PIL
    converted, tensors checked."""
    data = encoded_bytes(image, where)
    if data is not None:
        from torchvision.io import ImageReadMode, decode_image

        try:
            return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        except RuntimeError as error:
            raise ValueError(f"{where} could not be decoded as an image ({len(data)} bytes starting "
                             f"{data[:8]!r}): {error}") from error
    if isinstance(image, torch.Tensor):
        if not (image.dtype == torch.uint8 or image.is_floating_point()) or image.ndim != 3 or image.shape[0] not in (
                1, 3):
            raise TypeError(f"{where} should be a uint8 (or float in [0, 1]) CHW tensor with 1 or 3 channels, but "
                            f"got a {image.dtype} tensor of shape {tuple(image.shape)}")
        if image.is_floating_point() and image.numel() and not 0 <= float(image.min()) <= float(image.max()) <= 1:
            raise ValueError(f"{where} is a float image with values in [{float(image.min()):.4g}, "
                             f"{float(image.max()):.4g}], but float images should hold values in [0, 1] (the "
                             f"collator normalizes them); pass uint8 images, or divide by 255")
        return image.expand(3, -1, -1) if image.shape[0] == 1 else image
    from PIL import Image

    if isinstance(image, Image.Image):
        import torchvision.transforms.v2.functional as TF

        return TF.pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))
    raise TypeError(f"{where} should be encoded bytes, a {{'bytes', 'path'}} struct, a PIL image or a uint8 CHW "
                    f"tensor, but got {type(image).__name__}")


def image_hw(image: Any, where: str) -> tuple[int, int]:
    """``(H, W)`` of an image; encoded images are measured from their header (PIL opens lazily), not decoded."""
    data = encoded_bytes(image, where)
    if data is not None:
        import io

        from PIL import Image

        with Image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
        return height, width
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    width, height = image.size
    return height, width


def grid(size: tuple[int, int], patch_size: int | None) -> tuple[int, int]:
    """Patches along height and width of an image of ``size`` (``(0, 0)`` without a patch size)."""
    if patch_size is None:
        return (0, 0)
    return (math.ceil(size[0] / patch_size), math.ceil(size[1] / patch_size))
