"""Image collation: tensors, numpy arrays and PIL images to one normalized float32 ``[B, C, H, W]`` batch.

Scaling and normalization use ``torchvision.transforms.v2.functional`` (``to_image``, ``to_dtype(scale=True)``,
``normalize``), applied once to the stacked batch rather than per image, imported when a batch first needs them; a
uint8 batch takes one compiled pass of the same float32 operations (:func:`collators._kernels.scale_normalize`),
equal bit for bit, and imports no torchvision. With ``keep_uint8=True`` the batch stays uint8 (a quarter of the
bytes to copy and transfer) and :func:`normalize_batch` finishes it on the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from collators._extra import add_extra_keys
from collators.default import MISSING, check_targets_present, collate_labels
from collators.images import (
    NORMALIZATION_PRESETS,
    RESIZE_FIX,
    check_float_range,
    normalize_batch,
    scale_uint8,
    stack_plain,
    stats,
    to_chw,
    transforms,
)
from collators.targets import row_name
from task_spec import TaskSpec

__all__ = ["NORMALIZATION_PRESETS", "VisionCollator", "create_vision_collator", "normalize_batch"]


class VisionCollator:
    """Stack images into float32 ``[B, C, H, W]`` scaled to [0, 1] and normalized; labels to int64 ``[B]``.

    Rows are dicts holding the image under ``input_field`` (labels under ``target_field`` are optional, but all rows
    or none must have them: rows without any, or with None, are a batch for prediction and give no labels, unless
    ``require_targets`` and the batch serves the train, val or test split),
    ``(image, label)`` tuples, or bare images. An image is a CHW tensor (uint8 is scaled by 1/255; float must
    already be in [0, 1], up to a tolerance of 0.5 for resizing overshoot, or it raises), an HWC numpy array
    (uint8 or float), a 2-D HW grayscale tensor/array (becomes 1xHxW), or a PIL image. PIL modes: 'L' gives 1
    channel and 'RGB' 3; '1' and 'LA' become 'L'; 'RGBA', 'P', 'CMYK', ... become 'RGB' (alpha is dropped, not
    composited: pass a 4-channel tensor with 4-value mean/std to keep it). Other keys in dict rows pass through to
    the batch.

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
        num_classes: Int labels must lie in ``[0, num_classes)`` (or be -100, ignored); None skips the check.
        require_targets: A batch of the train, val or test split (the engine's batches say which, ``rows.role``) must
            carry a label in every row; the registry's factory sets it for a supervised spec.
        image_size: ``(H, W)`` or ``(C, H, W)`` (an int: square) that the images of a validation, test or prediction
            batch must have (the engine's batches say which split); the factory reads the spec's. None: no check.

    Raises:
        ValueError: Unknown preset, bad mean/std, images of different shapes, a channel/stat mismatch, float
            images far outside [0, 1] (0..255 floats, or normalized already), labels outside the classes, float
            labels that are NaN or infinite, a training, validation or test row without its label, or evaluation
            images of another size than ``image_size``.
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
        num_classes: int | None = None,
        require_targets: bool = False,
        image_size: int | Sequence[int] | None = None,
    ) -> None:
        self.image_size = check_image_size(image_size)
        if require_targets and target_field is None:
            raise ValueError("require_targets=True needs the key of the label, but got target_field=None; pass "
                             "target_field=... or require_targets=False")
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
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                        or num_classes < 1):
            raise ValueError(f"num_classes should be an int >= 1 or None, but got num_classes={num_classes!r}")
        self.num_classes = num_classes
        self.mean, self.std = stats("mean", mean), stats("std", std)
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"mean and std should have one value per channel and std should be positive, but got "
                             f"mean={self.mean}, std={self.std}")
        self.normalize, self.normalization = bool(normalize), normalization
        self.input_field, self.target_field, self.require_targets = input_field, target_field, bool(require_targets)
        self.grayscale_to_rgb, self.keep_uint8 = bool(grayscale_to_rgb), bool(keep_uint8)
        self._make_statistics()

    def _make_statistics(self) -> None:
        # torchvision's normalize makes these from the lists on every call: [C, 1, 1] float32, made once here
        self._mean_tensor = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std_tensor = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        self._statistics = self._mean_tensor.flatten().numpy(), self._std_tensor.flatten().numpy()

    def __getstate__(self) -> dict[str, Any]:
        """The options only: the statistics are made again from ``mean`` and ``std`` on unpickling. Pickled with
        torch's reductions (as a spawn or forkserver worker receives it), a tensor is moved to shared memory, which
        would leave the numpy views in ``_statistics`` pointing at freed memory in this process too."""
        return {key: value for key, value in self.__dict__.items()
                if key not in ("_mean_tensor", "_std_tensor", "_statistics")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._make_statistics()

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Collate ``rows``; ``generator`` is accepted for the collator contract and unused (nothing is random)."""
        if len(rows) == 0:
            raise ValueError("VisionCollator got an empty list of rows; a batch needs at least one row")
        images, labels = self._images_and_labels(rows)
        check_targets_present(labels, rows, str(self.target_field), self.require_targets)
        stacked = stack_plain(images)  # plain CHW tensors of one dtype and shape: one stack, nothing per image
        if stacked is None or (self.grayscale_to_rgb and stacked.shape[1] == 1) or (
                self.keep_uint8 and stacked.dtype != torch.uint8):
            stacked, floats = self._stack_each(images)
        else:
            self._check_channels(tuple(stacked.shape[1:]))
            floats = [] if stacked.dtype == torch.uint8 else list(range(len(images)))
        self._check_eval_size(stacked, rows)
        batch = {self.input_field: stacked if self.keep_uint8 else self._scaled(stacked, floats)}
        if any(label is not MISSING for label in labels):
            batch[str(self.target_field)] = collate_labels(labels, key=str(self.target_field),
                                                           num_classes=self.num_classes, rows=rows)
        return add_extra_keys(batch, rows, {self.input_field, str(self.target_field)})

    def _check_eval_size(self, stacked: torch.Tensor, rows: Sequence[Any]) -> None:
        """Refuse a validation, test or prediction batch whose images are not ``image_size``: the model trains on
        that size (a train transform crops to it), and evaluating other sizes would measure something else."""
        role = getattr(rows, "role", None)
        size = self.image_size
        if size is None or role not in EVAL_ROLES or tuple(stacked.shape[-len(size):]) == size:
            return
        height, width = size[-2:]
        key = self.input_field
        raise ValueError(
            f"{row_name(rows, 0)}: {key!r} should have the spec's image_size={list(size)} (the size the model trains "
            f"on), but got {key} of shape {list(stacked.shape[1:])} in a {role} batch; add eval_transform="
            f"v2.Compose([v2.Resize({min(height, width)}), v2.CenterCrop(({height}, {width}))]) "
            f"(torchvision.transforms.v2) so the {role} images have that size, or correct "
            f"additional_config['image_size']"
        )

    def _scaled(self, stacked: torch.Tensor, floats: list[int]) -> torch.Tensor:
        """The stacked batch as float32 in [0, 1], normalized when asked: a uint8 batch in one compiled pass, others
        by torchvision's ops (in place: the stack is a copy, so the caller's rows are never touched)."""
        if stacked.dtype == torch.uint8 and stacked.is_contiguous():
            channels = stacked.shape[1]
            return scale_uint8(stacked, *(self._statistics if self.normalize else (
                np.zeros(channels, np.float32), np.ones(channels, np.float32))))
        pixels = transforms().to_dtype(stacked, torch.float32, scale=True)
        if floats:
            check_float_range(pixels, floats, self.input_field)
        if self.normalize:  # the ops of torchvision's normalize, with the statistics made once
            pixels = pixels.sub_(self._mean_tensor).div_(self._std_tensor)
        return pixels

    def _stack_each(self, images: list[Any]) -> tuple[torch.Tensor, list[int]]:
        """The per-image path: each image to CHW (numpy, PIL, 2-D, mixed dtypes), checked, then stacked; returns the
        stack (uint8 when every image is, else float32 with uint8 images scaled) and the rows that were float."""
        images = [to_chw(image, index, self.input_field) for index, image in enumerate(images)]
        if self.grayscale_to_rgb:
            images = [image.expand(3, -1, -1) if image.shape[0] == 1 else image for image in images]
        self._check_same_channels(images)
        for index, image in enumerate(images):
            if image.shape != images[0].shape:
                raise ValueError(
                    f"row {index}: {self.input_field!r} has shape {tuple(image.shape)} but row 0 has shape "
                    f"{tuple(images[0].shape)}; {RESIZE_FIX}"
                )
        self._check_channels(tuple(images[0].shape))
        floats = [index for index, image in enumerate(images) if image.dtype != torch.uint8]
        if self.keep_uint8 and floats:
            raise TypeError(
                f"row {floats[0]}: keep_uint8=True needs uint8 images, but {self.input_field!r} is "
                f"{images[floats[0]].dtype}; pass keep_uint8=False or convert the images to uint8"
            )
        if floats:
            to_dtype = transforms().to_dtype
            images = [to_dtype(image, torch.float32, scale=True) for image in images]
        return torch.stack(images), floats

    def _check_same_channels(self, images: list[torch.Tensor]) -> None:
        """Refuse images whose channel counts differ (a grayscale or RGBA image among RGB ones): resizing would not
        help, converting them to one mode does."""
        counts = [image.shape[0] for image in images]
        if len(set(counts)) < 2:
            return
        usual = max(set(counts), key=counts.count)
        index = next(i for i, count in enumerate(counts) if count != usual)
        modes = {3: ("RGB", "v2.RGB()"), 1: ("L", "v2.Grayscale()")}
        if usual in modes:
            mode, op = modes[usual]
            how = (f"convert every image to {mode} in a dataset transform (torchvision's {op}, or PIL's "
                   f"image.convert({mode!r}))")
        else:
            how = f"give every image {usual} channels"
        if usual == 3 and counts[index] == 1:
            how += ", or pass grayscale_to_rgb=True to repeat a single channel"
        raise ValueError(f"row {index}: {self.input_field!r} has {counts[index]} channel(s) where the other images "
                         f"have {usual} (shape {tuple(images[index].shape)}); {how}")

    def _check_channels(self, shape: tuple[int, ...]) -> None:
        channels = shape[0]
        if len(shape) == 3 and channels > 4 and shape[-1] in (1, 3, 4):
            raise ValueError(
                f"row 0: {self.input_field!r} should be a CHW image, but got shape {shape}, which looks "
                f"channels-last (HWC); permute it with image.permute(2, 0, 1) in a dataset transform, or read the "
                f"images with torchvision's v2.ToImage() (CHW from PIL images and HWC numpy arrays)"
            )
        if self.normalize and channels != len(self.mean):
            source = f"normalization={self.normalization!r}" if self.normalization else "mean/std"
            raise ValueError(
                f"row 0: {self.input_field!r} has {channels} channel(s) but mean/std have {len(self.mean)} values "
                f"({source}); pass grayscale_to_rgb=True to repeat a single channel, mean/std with {channels} "
                f"value(s), or normalize=False"
            )

    def _images_and_labels(self, rows: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The image of each row and its label (:data:`MISSING` where it has none). Plain dict rows, the common case,
        are read by two list comprehensions; other rows go through :meth:`_split` one by one."""
        field, target = self.input_field, self.target_field
        if all(type(row) is dict and field in row for row in rows):
            images = [row[field] for row in rows]
            if target is None:
                return images, [MISSING] * len(rows)
            labels = [row.get(target) for row in rows]
            return images, [MISSING if label is None else label for label in labels]
        pairs = [self._split(row, index) for index, row in enumerate(rows)]
        return [image for image, _ in pairs], [label for _, label in pairs]

    def normalize_on_device(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Finish a ``keep_uint8`` batch wherever it lives: scale to [0, 1], then normalize if ``normalize``."""
        return normalize_batch(pixel_values, *((self.mean, self.std) if self.normalize else ()))

    def _split(self, row: Any, index: int) -> tuple[Any, Any]:
        if isinstance(row, Mapping):
            if self.input_field not in row:
                raise KeyError(f"row {index} has no {self.input_field!r} key (keys: {sorted(row)}); pass input_field= "
                               f"naming the image key, or set the spec's input_fields")
            label = row.get(self.target_field) if self.target_field is not None else None
            return row[self.input_field], MISSING if label is None else label
        if isinstance(row, (tuple, list)):
            if len(row) == 2:
                return row[0], (row[1] if self.target_field is not None and row[1] is not None else MISSING)
            if len(row) == 1:
                return row[0], MISSING
            raise ValueError(f"row {index} is a {type(row).__name__} of length {len(row)}; expected (image, label)")
        return row, MISSING

    def __repr__(self) -> str:
        stats = f"normalization={self.normalization!r}, " if self.normalization else ""
        return (
            f"VisionCollator(normalize={self.normalize}, {stats}mean={self.mean}, std={self.std}, "
            f"input_field={self.input_field!r}, target_field={self.target_field!r}, "
            f"grayscale_to_rgb={self.grayscale_to_rgb}, keep_uint8={self.keep_uint8}, num_classes={self.num_classes}, "
            f"require_targets={self.require_targets}, image_size={self.image_size})"
        )


EVAL_ROLES = ("val", "test", "predict")
"""The splits whose batches must have the spec's ``image_size``."""


def check_image_size(size: Any) -> tuple[int, ...] | None:
    """``image_size`` as a tuple: ``(H, W)`` or ``(C, H, W)`` (an int ``s`` is ``(s, s)``); None stays None."""
    if size is None:
        return None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return (size, size)
    if isinstance(size, (list, tuple)) and len(size) in (2, 3) and all(
            isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in size):
        return tuple(size)
    raise ValueError(f"image_size should be a positive int, [height, width] or [channels, height, width], but got "
                     f"image_size={size!r}")


def create_vision_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> VisionCollator:
    """Factory for the registry: a :class:`VisionCollator` with defaults from ``task_spec``, overridden by kwargs.

    From the spec: ``input_fields[0]`` as ``input_field``, ``target_field``, ``num_classes`` (with a
    cross-entropy loss), ``require_targets`` for a supervised task, ``additional_config['image_size']``, and
    ``preprocessing_config['normalization']`` unless ``mean``/``std`` or ``normalization`` are passed.
    """
    if task_spec is not None:
        kwargs.setdefault("input_field", task_spec.input_fields[0])
        kwargs.setdefault("target_field", task_spec.target_field)
        kwargs.setdefault("require_targets", task_spec.is_supervised and kwargs["target_field"] is not None)
        kwargs.setdefault("image_size", task_spec.additional_config.get("image_size"))
        if task_spec.loss_type == "cross_entropy":
            kwargs.setdefault("num_classes", task_spec.num_classes)
        preset = task_spec.preprocessing_config.get("normalization")
        if preset is not None and kwargs.get("normalization") is None and "mean" not in kwargs and "std" not in kwargs:
            kwargs["normalization"] = preset
    return VisionCollator(**kwargs)
