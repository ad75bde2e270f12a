"""Images to tensors for the vision collator: one stack for plain tensor images, else one CHW tensor per image;
the float range check, normalization.

Scaling and normalization use ``torchvision.transforms.v2.functional`` (``to_image``, ``to_dtype(scale=True)``,
``normalize``), applied once to the stacked batch rather than per image; a uint8 batch takes one compiled pass
of the same float32 operations (:func:`collators._kernels.scale_normalize`), equal bit for bit. torchvision is
imported at the first batch that needs it (:func:`transforms`), so a loader worker collating uint8 tensors never
imports it; nor PIL, which only a PIL image's process has loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch

from collators._kernels import scale_normalize

NORMALIZATION_PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""``name -> (mean, std)`` per channel, for images scaled to [0, 1]."""

_PIL_CONVERT = {"1": "L", "LA": "L", "L": "L", "RGB": "RGB", **dict.fromkeys(("RGBA", "RGBa", "P", "PA", "CMYK",
                                                                            "YCbCr", "LAB", "HSV"), "RGB")}
"""PIL mode -> the mode it is read as; alpha is dropped (not composited)."""
RESIZE_FIX = "resize every image to one size in a dataset transform, e.g. torchvision.transforms.v2.Resize((H, W))"


def transforms() -> ModuleType:
    """``torchvision.transforms.v2.functional``, imported at its first use: importing it imports all of torchvision
    (its models, datasets and ops, over a second in a fresh process), which a spawned loader worker whose rows are
    uint8 tensors (the compiled path) would pay before its first batch and never use."""
    import torchvision.transforms.v2.functional as TF

    return TF


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
    TF = transforms()
    pixels = TF.to_dtype(pixel_values, torch.float32, scale=True)
    if mean is None:
        return pixels.clone() if pixels is pixel_values else pixels
    return TF.normalize(pixels, list(mean), list(std), inplace=pixels is not pixel_values)


def scale_uint8(stacked: torch.Tensor, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """A uint8 ``[B, C, H, W]`` batch scaled to float32 [0, 1] by 1/255 (``to_dtype(scale=True)``), then
    ``(x - mean) / std`` per channel (float32 arrays; zeros and ones to scale only): the values of torchvision's
    ops, bit for bit, in one compiled pass (:func:`collators._kernels.scale_normalize`), or, in a loader worker
    without the compiled loops, by its numpy twin (a cast and three in-place ops)."""
    if stacked.ndim != 4 or not len(mean) == len(std) == stacked.shape[1]:
        raise ValueError(f"scale_uint8 needs a [B, C, H, W] batch and C values of mean and std, but got a batch of "
                         f"shape {tuple(stacked.shape)}, mean={mean.tolist()}, std={std.tolist()}")
    out = torch.empty(stacked.shape, dtype=torch.float32)
    batch, channels = stacked.shape[:2]
    scale_normalize(stacked.numpy().reshape(batch, channels, -1), np.float32(1.0 / 255), mean, std,
                    out.numpy().reshape(batch, channels, -1))
    return out


FLOAT_TOLERANCE = 0.5
"""How far float pixels may stray outside [0, 1]: bicubic/antialiased resizing of [0, 1] images overshoots
(by up to about 0.4 on sharp black/white edges), while the mistakes refused here are far outside it: 0..255
floats, or images normalized already (about -2..2.6 with ImageNet statistics)."""


def check_float_range(pixels: torch.Tensor, floats: Sequence[int], key: str) -> None:
    """Raise unless the float ``[B, C, H, W]`` batch lies in [0, 1] up to :data:`FLOAT_TOLERANCE` (NaN fails).

    One min/max over the batch; ``floats`` are the rows that were float (not scaled from uint8), searched for the
    culprit only when the batch fails.
    """
    low, high = (float(value) for value in torch.aminmax(pixels))
    if low >= -FLOAT_TOLERANCE and high <= 1 + FLOAT_TOLERANCE:
        return
    for index in floats:
        row_low, row_high = (float(value) for value in torch.aminmax(pixels[index]))
        if not (row_low >= -FLOAT_TOLERANCE and row_high <= 1 + FLOAT_TOLERANCE):
            break
    else:
        index, row_low, row_high = floats[0], low, high
    if row_low < -FLOAT_TOLERANCE:
        hint = "normalized already? pass images in [0, 1] (the collator normalizes them), or normalize=False"
    elif row_high > 2:
        hint = "0..255 values? pass the uint8 image (the collator scales it by 1/255), or divide it by 255"
    else:
        hint = "clamp it to [0, 1] with image.clamp(0, 1), or pass a uint8 image"
    raise ValueError(
        f"row {index}: float {key!r} should hold values in [0, 1] (give or take {FLOAT_TOLERANCE} of resizing "
        f"overshoot), but got {key} with min={row_low:.4g}, max={row_high:.4g}; {hint}"
    )


def stack_plain(images: list[Any]) -> torch.Tensor | None:
    """One ``torch.stack`` of ``images`` when every one is a plain CHW tensor of one dtype (uint8 or floating) and
    one shape, the common case, which needs nothing per image; None sends the caller to :func:`to_chw` per image
    (numpy, PIL, 2-D, tensor subclasses, mixed dtypes or shapes), which also names any offending row."""
    first = images[0]
    if type(first) is not torch.Tensor or first.ndim != 3:
        return None
    dtype, shape = first.dtype, first.shape
    if dtype != torch.uint8 and not dtype.is_floating_point:
        return None
    for image in images:
        if type(image) is not torch.Tensor or image.dtype != dtype or image.shape != shape:
            return None
    return torch.stack(images)


def stats(name: str, values: Sequence[float]) -> tuple[float, ...]:
    try:
        stats = tuple(float(value) for value in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} should be a sequence of numbers, one per channel, but got {values!r}") from None
    if not stats:
        raise ValueError(f"{name} should have one value per channel, but got an empty {name}={values!r}")
    return stats


def to_chw(image: Any, index: int, key: str) -> torch.Tensor:
    """A CHW uint8 or floating tensor for one image; may share memory with it (the caller stacks, which copies)."""
    where = f"row {index}: {key!r}"
    pil = sys.modules.get("PIL.Image")  # a PIL image exists only where PIL is loaded: a tensor's worker skips it
    if pil is not None and isinstance(image, pil.Image):
        if image.mode not in _PIL_CONVERT:
            raise TypeError(
                f"{where} is a PIL image in mode {image.mode!r}, which has no fixed [0, 1] scale; convert it "
                f"with image.convert('L') or image.convert('RGB'), or pass a float tensor in [0, 1]"
            )
        if image.mode != _PIL_CONVERT[image.mode]:
            image = image.convert(_PIL_CONVERT[image.mode])
        tensor = transforms().to_image(image).as_subclass(torch.Tensor)
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
        tensor = transforms().to_image(image).as_subclass(torch.Tensor)
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

