"""Images left encoded by the collator, for decoding on the device after collation (``decode_device``).

The loader's workers then only read bytes; ``torchvision.io.decode_jpeg(..., device="cuda")`` decodes the batch's
JPEGs at once on the GPU, and :class:`engine.tools.device.DeviceDecode` resizes and normalizes them there with the
collator's own image step, so the pixels match the worker path up to the decoder's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from collators._vlm_images import ImagePipeline, encoded_bytes

ENCODED_KEY = "encoded_images"
"""Batch key of the encoded images: a list of 1-D uint8 tensors, the batch's images in row order."""
FLIPS_KEY = "image_flips"
"""Batch key of the flips drawn in the worker (bool ``[N]``), applied after decoding."""
JPEG_MAGIC = b"\xff\xd8\xff"


def check_decode_device(device: Any, images: ImagePipeline) -> str | None:
    """``device`` as a string, after refusing what cannot decode there: CUDA absent, or an image processor (which
    runs on PIL or CPU tensors in the workers)."""
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"decode_device should be a device such as 'cuda' or None, but got "
                         f"decode_device={device!r}") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"decode_device={device!r} decodes images on the GPU after collation, but CUDA is not "
                         f"available here (torch.cuda.is_available() is False); pass decode_device=None to decode "
                         f"in the loader's workers")
    if images.image_processor is not None:
        raise ValueError(f"decode_device={device!r} resizes and normalizes on the device with the collator's own "
                         f"image step, which an image_processor replaces; drop one of them")
    return str(parsed)


def encoded_batch(images: Sequence[Any], where: Sequence[str], flips: Sequence[bool], field: str) -> dict[str, Any]:
    """The batch's images as encoded JPEG bytes (1-D uint8 tensors) and the drawn flips, for the device step."""
    encoded = []
    for image, name in zip(images, where):
        data = encoded_bytes(image, name)
        if data is None:
            raise TypeError(f"{name} is a decoded {type(image).__name__}, but decode_device decodes encoded JPEG "
                            f"bytes on the device; hand the images over encoded, or pass decode_device=None")
        if not data.startswith(JPEG_MAGIC):
            raise ValueError(f"{name} is not a JPEG (it starts {data[:8]!r}), and decode_device decodes JPEGs only "
                             f"(torchvision.io.decode_jpeg); pass decode_device=None to decode it in the workers")
        encoded.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return {ENCODED_KEY: encoded, FLIPS_KEY: torch.tensor(list(flips), dtype=torch.bool)}
