"""Device-side image work: uint8 batches normalized after transfer, and encoded JPEGs decoded on the device.

A uint8 batch is a quarter of the bytes of its float32 form to collate, pin and copy to the GPU; the
scaling and normalization then run on the device as one subtract and one divide with mean and std scaled
by 255 (timm's ``PrefetchLoader`` trick), equal to torchvision's ``Normalize`` on ``x / 255`` within 1e-6.
Lightning runs :class:`DeviceNormalize` from ``on_after_batch_transfer``; plain loops call
:func:`normalize_on_device` after ``batch[key].to(device, non_blocking=True)`` (or
``engine.tools.transfer.move_to_device``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class DeviceNormalize:
    """Turn the uint8 ``[..., C, H, W]`` images under ``key`` into normalized float, on whatever device they are.

    Only uint8 tensors are touched: a batch whose images are already float (normalized by the collator) passes
    through unchanged, so the hook is safe to leave on. The scaled mean/std are cached per device.

    Args:
        mean: Per-channel mean, for images scaled to [0, 1].
        std: Per-channel standard deviation (all positive).
        key: Key of the images in the batch (a dict); a bare tensor batch is normalized as is.
        dtype: Floating dtype of the result.

    Example:
        >>> normalize = DeviceNormalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
        >>> batch = {"pixel_values": torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), "labels": torch.tensor([0, 1])}
        >>> normalize(batch)["pixel_values"].unique().tolist()
        [1.0]
    """

    def __init__(self, *, mean: Sequence[float], std: Sequence[float], key: str = "pixel_values",
                 dtype: torch.dtype = torch.float32) -> None:
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if not mean or len(mean) != len(std) or min(std) <= 0:
            raise ValueError(f"mean and std should have one value per channel and std should be positive, but got "
                             f"mean={mean}, std={std}")
        if not dtype.is_floating_point:
            raise TypeError(f"dtype should be a floating dtype, but got dtype={dtype}")
        self.mean, self.std, self.key, self.dtype = mean, std, key, dtype
        self._compute = torch.promote_types(dtype, torch.float32)
        self._stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_collator(cls, collator: Any) -> DeviceNormalize | None:
        """The normalization a ``VisionCollator(keep_uint8=True)`` leaves to the device; None for any other."""
        if not getattr(collator, "keep_uint8", False):
            return None
        channels = len(collator.mean)
        mean, std = (collator.mean, collator.std) if collator.normalize else ((0.0,) * channels, (1.0,) * channels)
        return cls(mean=mean, std=std, key=collator.input_field)

    def _scaled(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._stats:
            shape = (len(self.mean), 1, 1)
            mean = torch.tensor(self.mean, dtype=torch.float64).mul(255).reshape(shape)
            std = torch.tensor(self.std, dtype=torch.float64).mul(255).reshape(shape)
            self._stats[device] = (mean.to(device, self._compute), std.to(device, self._compute))
        return self._stats[device]

    def images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalize one uint8 image tensor ``[..., C, H, W]``; any other dtype is returned as it is."""
        if pixels.dtype != torch.uint8:
            return pixels
        if pixels.ndim < 3 or pixels.shape[-3] != len(self.mean):
            raise ValueError(f"{self.key!r} should be [..., C, H, W] with C={len(self.mean)} channels (one per "
                             f"mean/std value), but got shape {tuple(pixels.shape)}")
        mean, std = self._scaled(pixels.device)
        return pixels.to(self._compute).sub_(mean).div_(std).to(self.dtype)  # bf16/fp16: rounded once, at the end

    def __call__(self, batch: Any) -> Any:
        """``batch`` with its images normalized: a new dict (the caller's is not changed), or a tensor."""
        if isinstance(batch, torch.Tensor):
            return self.images(batch)
        if not isinstance(batch, Mapping):
            raise TypeError(f"DeviceNormalize expects a dict batch or a tensor, but got {type(batch).__name__}")
        if self.key not in batch:
            raise KeyError(f"the batch has no {self.key!r} (keys: {sorted(batch)}); pass key= naming the images")
        return {**batch, self.key: self.images(batch[self.key])}

    def __repr__(self) -> str:
        return f"DeviceNormalize(mean={self.mean}, std={self.std}, key={self.key!r}, dtype={self.dtype})"


def normalize_on_device(batch: Any, *, mean: Sequence[float], std: Sequence[float], key: str = "pixel_values",
                        dtype: torch.dtype = torch.float32) -> Any:
    """Normalize the uint8 images of a batch already on its device (see :class:`DeviceNormalize`).

    Example:
        >>> batch = {"pixel_values": torch.zeros(1, 1, 2, 2, dtype=torch.uint8)}
        >>> normalize_on_device(batch, mean=[0.5], std=[0.25])["pixel_values"].flatten().tolist()
        [-2.0, -2.0, -2.0, -2.0]
    """
    return DeviceNormalize(mean=mean, std=std, key=key, dtype=dtype)(batch)



class DeviceDecode:
    """Decode the JPEGs a vision-language collator left encoded (``decode_device``), then resize and normalize them
    with the collator's image step, on ``device``: ``torchvision.io.decode_jpeg`` decodes the batch's list at once.

    Run it on the batch before it moves to the device (the encoded bytes must be on the CPU; the data module does it
    in ``on_before_batch_transfer``). The result has ``pixel_values`` on ``device`` in place of the encoded images.

    Args:
        images: The collator's :class:`collators._vlm_images.ImagePipeline`.
        device: Where to decode (``'cuda'``; ``'cpu'`` runs the same steps on the CPU).
        key: Key of the pixels in the batch.
    """

    def __init__(self, images: Any, device: str, key: str = "pixel_values") -> None:
        self.images, self.device, self.key = images, torch.device(device), key

    @classmethod
    def from_collator(cls, collator: Any) -> DeviceDecode | None:
        """The decoding a collator with ``decode_device`` leaves to the device; None for any other collator."""
        device = getattr(collator, "decode_device", None)
        return None if device is None else cls(collator.images, device, collator.image_field)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A new batch with ``pixel_values`` decoded on the device (the caller's batch is not changed)."""
        from torchvision.io import ImageReadMode, decode_jpeg

        from collators.multimodal import ENCODED_KEY, FLIPS_KEY

        if ENCODED_KEY not in batch:
            raise KeyError(f"the batch has no {ENCODED_KEY!r} (keys: {sorted(batch)}); DeviceDecode finishes the "
                           f"batches of a collator built with decode_device=...")
        out = {key: value for key, value in batch.items() if key not in (ENCODED_KEY, FLIPS_KEY)}
        encoded, flips = batch[ENCODED_KEY], batch[FLIPS_KEY].tolist()
        if not encoded:
            size = self.images.image_size or (0, 0)
            out[self.key] = torch.zeros((0, 3, *size), device=self.device)
            return out
        decoded = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=self.device)
        out[self.key] = self.images.finish([self.images.resized(image) for image in decoded], flips)
        return out

    def __repr__(self) -> str:
        return f"DeviceDecode(device={str(self.device)!r}, key={self.key!r})"
