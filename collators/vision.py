"""Image collation: tensors, numpy arrays and PIL images to one normalized float32 ``[B, C, H, W]`` batch.

Scaling and normalization use ``torchvision.transforms.v2.functional`` (``to_image``, ``to_dtype(scale=True)``,
``normalize``), applied once to the stacked batch rather than per image. With ``keep_uint8=True`` the batch stays
uint8 (a quarter of the bytes to copy and transfer) and :func:`normalize_batch` finishes it on the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from collators._extra import add_extra_keys
from collators.default import MISSING, collate_labels
from task_spec import TaskSpec

NORMALIZATION_PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""``name -> (mean, std)`` per channel, for images scaled to [0, 1]."""

_PIL_CONVERT = {"1": "L", "LA": "L", "L": "L", "RGB": "RGB", **dict.fromkeys(("RGBA", "RGBa", "P", "PA", "CMYK",
                                                                            "YCbCr", "LAB", "HSV"), "RGB")}
"""PIL mode -> the mode it is read as; alpha is dropped (not composited)."""
_RESIZE_FIX = "resize every image to one size in a dataset transform, e.g. torchvision.transforms.v2.Resize((H, W))"


class VisionCollator:
    """Stack images into float32 ``[B, C, H, W]`` scaled to [0, 1] and normalized; labels to int64 ``[B]``.

    Rows are dicts holding the image under ``input_field`` (labels under ``target_field`` are optional, but all rows
    or none must have them), ``(image, label)`` tuples, or bare images. An image is a CHW tensor (uint8 is
    scaled by 1/255; float is taken as already in [0, 1]), an HWC numpy array (uint8 or float), a 2-D HW
    grayscale tensor/array (becomes 1xHxW), or a PIL image. PIL modes: 'L' gives 1 channel and 'RGB' 3;
    '1' and 'LA' become 'L'; 'RGBA', 'P', 'CMYK', ... become 'RGB' (alpha is dropped, not composited: pass
    a 4-channel tensor with 4-value mean/std to keep it). Other keys in dict rows pass through to the batch.

    Grayscale: mean/std must have one value per channel. A 1-channel image with 3-value stats raises unless
    ``grayscale_to_rgb=True``, which repeats the channel three times (as ``Grayscale(num_output_channels=3)``).

    Args:
        normalize: Subtract ``mean`` and divide by ``std`` per channel; False only scales to [0, 1].
        mean: Per-channel mean; give with ``std`` instead of a preset name.
        std: Per-channel standard deviation (all positive).
        normalization: A name in :data:`NORMALIZATION_PRESETS`; 'imagenet' when neither it nor mean/std is given.
        input_field: Key of the image in dict rows and in the batch.
        target_field: Key of the label in dict rows and in the batch; None ignores labels.
        grayscale_to_rgb: Repeat 1-channel images to 3 channels.
        keep_uint8: Return uint8 ``[B, C, H, W]`` unscaled and unnormalized (every image must be uint8); finish on
            the device with :meth:`normalize_on_device` or :func:`normalize_batch`.

    Raises:
        ValueError: Unknown preset, bad mean/std, images of different shapes or a channel/stat mismatch.
        TypeError: An image of an unsupported type or dtype.

    Example:
        >>> collator = VisionCollator(normalization="cifar10")
        >>> batch = collator([{"pixel_values": torch.zeros(3, 8, 8, dtype=torch.uint8), "labels": 1}] * 2)
        >>> batch["pixel_values"].shape, batch["labels"].tolist()
        (torch.Size([2, 3, 8, 8]), [1, 1])
    """

    def __init__(
        self,
        *,
        normalize: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        normalization: str | None = None,
        input_field: str = "pixel_values",
        target_field: str | None = "labels",
        grayscale_to_rgb: bool = False,
        keep_uint8: bool = False,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError(f"give mean and std together, but got mean={mean!r}, std={std!r}")
        if mean is not None and normalization is not None:
            raise ValueError(f"give either normalization={normalization!r} or mean/std, not both; "
                             f"to override the preset pass only mean=... and std=...")
        if mean is None:
            normalization = "imagenet" if normalization is None else normalization
            if normalization not in NORMALIZATION_PRESETS:
                raise ValueError(
                    f"normalization should be one of {', '.join(map(repr, NORMALIZATION_PRESETS))}, but got "
                    f"normalization={normalization!r}; or pass mean=[...] and std=[...] for custom statistics"
                )
            mean, std = NORMALIZATION_PRESETS[normalization]
        self.mean, self.std = _stats("mean", mean), _stats("std", std)
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"mean and std should have one value per channel and std should be positive, but got "
                             f"mean={self.mean}, std={self.std}")
        self.normalize, self.normalization = bool(normalize), normalization
        self.input_field, self.target_field = input_field, target_field
        self.grayscale_to_rgb, self.keep_uint8 = bool(grayscale_to_rgb), bool(keep_uint8)

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Collate ``rows``; ``generator`` is accepted for the collator contract and unused (nothing is random)."""
        if len(rows) == 0:
            raise ValueError("VisionCollator got an empty list of rows; a batch needs at least one row")
        images, labels = [], []
        for index, row in enumerate(rows):
            image, label = self._split(row, index)
            image = _to_chw(image, index, self.input_field)
            if self.grayscale_to_rgb and image.shape[0] == 1:
                image = image.expand(3, -1, -1)
            images.append(image)
            labels.append(label)
        for index, image in enumerate(images):
            if image.shape != images[0].shape:
                raise ValueError(
                    f"row {index}: {self.input_field!r} has shape {tuple(image.shape)} but row 0 has shape "
                    f"{tuple(images[0].shape)}; {_RESIZE_FIX}"
                )
        channels = images[0].shape[0]
        if self.normalize and channels != len(self.mean):
            source = f"normalization={self.normalization!r}" if self.normalization else "mean/std"
            raise ValueError(
                f"row 0: {self.input_field!r} has {channels} channel(s) but mean/std have {len(self.mean)} values "
                f"({source}); pass grayscale_to_rgb=True to repeat a single channel, mean/std with {channels} "
                f"value(s), or normalize=False"
            )
        all_uint8 = all(image.dtype == torch.uint8 for image in images)
        if self.keep_uint8:
            if not all_uint8:
                index = next(i for i, image in enumerate(images) if image.dtype != torch.uint8)
                raise TypeError(
                    f"row {index}: keep_uint8=True needs uint8 images, but {self.input_field!r} is "
                    f"{images[index].dtype}; pass keep_uint8=False or convert the images to uint8"
                )
            batch = {self.input_field: torch.stack(images)}
        else:
            # Stacking copies, so the in-place normalize below never reaches the caller's rows.
            if not all_uint8:
                images = [TF.to_dtype(image, torch.float32, scale=True) for image in images]
            pixels = TF.to_dtype(torch.stack(images), torch.float32, scale=True)
            if self.normalize:
                pixels = TF.normalize(pixels, list(self.mean), list(self.std), inplace=True)
            batch = {self.input_field: pixels}
        if any(label is not MISSING for label in labels):
            batch[str(self.target_field)] = collate_labels(labels, key=str(self.target_field))
        return add_extra_keys(batch, rows, {self.input_field, str(self.target_field)})

    def normalize_on_device(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Finish a ``keep_uint8`` batch wherever it lives: scale to [0, 1], then normalize if ``normalize``."""
        return normalize_batch(pixel_values, *((self.mean, self.std) if self.normalize else ()))

    def _split(self, row: Any, index: int) -> tuple[Any, Any]:
        if isinstance(row, Mapping):
            if self.input_field not in row:
                raise KeyError(f"row {index} has no {self.input_field!r} key (keys: {sorted(row)}); pass input_field= "
                               f"naming the image key, or set the spec's input_fields")
            label = row.get(self.target_field, MISSING) if self.target_field is not None else MISSING
            return row[self.input_field], label
        if isinstance(row, (tuple, list)):
            if len(row) == 2:
                return row[0], (row[1] if self.target_field is not None else MISSING)
            if len(row) == 1:
                return row[0], MISSING
            raise ValueError(f"row {index} is a {type(row).__name__} of length {len(row)}; expected (image, label)")
        return row, MISSING

    def __repr__(self) -> str:
        stats = f"normalization={self.normalization!r}, " if self.normalization else ""
        return (
            f"VisionCollator(normalize={self.normalize}, {stats}mean={self.mean}, std={self.std}, "
            f"input_field={self.input_field!r}, target_field={self.target_field!r}, "
            f"grayscale_to_rgb={self.grayscale_to_rgb}, keep_uint8={self.keep_uint8})"
        )


def normalize_batch(
    pixel_values: torch.Tensor, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> torch.Tensor:
    """Scale a ``[..., C, H, W]`` batch to float32 [0, 1] (uint8 by 1/255) and normalize it if mean/std are given.

    Runs on the tensor's device and gives the same values as :class:`VisionCollator` with ``keep_uint8=False``.

    Example:
        >>> pixels = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
        >>> normalize_batch(pixels, [0.5] * 3, [0.5] * 3).unique().tolist()
        [1.0]
    """
    if (mean is None) != (std is None):
        raise ValueError(f"give mean and std together, but got mean={mean!r}, std={std!r}")
    pixels = TF.to_dtype(pixel_values, torch.float32, scale=True)
    if mean is None:
        return pixels.clone() if pixels is pixel_values else pixels
    return TF.normalize(pixels, list(mean), list(std), inplace=pixels is not pixel_values)


def create_vision_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> VisionCollator:
    """Factory for the registry: a :class:`VisionCollator` with defaults from ``task_spec``, overridden by kwargs.

    From the spec: ``input_fields[0]`` as ``input_field``, ``target_field``, and
    ``preprocessing_config['normalization']`` unless ``mean``/``std`` or ``normalization`` are passed.
    """
    if task_spec is not None:
        kwargs.setdefault("input_field", task_spec.input_fields[0])
        kwargs.setdefault("target_field", task_spec.target_field)
        preset = task_spec.preprocessing_config.get("normalization")
        if preset is not None and kwargs.get("normalization") is None and "mean" not in kwargs and "std" not in kwargs:
            kwargs["normalization"] = preset
    return VisionCollator(**kwargs)


def _stats(name: str, values: Sequence[float]) -> tuple[float, ...]:
    try:
        stats = tuple(float(value) for value in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} should be a sequence of numbers, one per channel, but got {values!r}") from None
    if not stats:
        raise ValueError(f"{name} should have one value per channel, but got an empty {name}={values!r}")
    return stats


def _to_chw(image: Any, index: int, key: str) -> torch.Tensor:
    """A CHW uint8 or floating tensor for one image; may share memory with it (the caller stacks, which copies)."""
    where = f"row {index}: {key!r}"
    if isinstance(image, Image.Image):
        if image.mode not in _PIL_CONVERT:
            raise TypeError(
                f"{where} is a PIL image in mode {image.mode!r}, which has no fixed [0, 1] scale; convert it "
                f"with image.convert('L') or image.convert('RGB'), or pass a float tensor in [0, 1]"
            )
        if image.mode != _PIL_CONVERT[image.mode]:
            image = image.convert(_PIL_CONVERT[image.mode])
        tensor = TF.to_image(image).as_subclass(torch.Tensor)
    elif isinstance(image, np.ndarray):
        if image.ndim == 3 and image.shape[-1] > 4 and image.shape[0] <= 4:
            raise ValueError(
                f"{where} is a numpy array of shape {image.shape}, which looks channels-first; numpy images are "
                f"read as HWC: pass image.transpose(1, 2, 0), or a CHW tensor via torch.from_numpy(image)"
            )
        if image.ndim not in (2, 3):
            raise ValueError(f"{where} should be an HWC or HW numpy array, but got shape {image.shape}")
        if not image.flags.writeable or any(stride < 0 for stride in image.strides):
            image = image.copy()  # torch.from_numpy rejects negative strides and warns on read-only arrays
        tensor = TF.to_image(image).as_subclass(torch.Tensor)
    elif isinstance(image, torch.Tensor):
        if image.ndim not in (2, 3):
            raise ValueError(f"{where} should be a CHW or HW tensor, but got shape {tuple(image.shape)}")
        tensor = image.unsqueeze(0) if image.ndim == 2 else image
    else:
        raise TypeError(
            f"{where} should be a torch.Tensor (CHW), numpy array (HWC) or PIL image, but got "
            f"{type(image).__name__}; convert it in a dataset transform"
        )
    if tensor.dtype != torch.uint8 and not tensor.is_floating_point():
        raise TypeError(
            f"{where} has dtype {tensor.dtype}; expected uint8 (0..255) or float (0..1): convert with "
            f".to(torch.uint8) if the values are 0..255, or to float divided by the maximum value"
        )
    return tensor

