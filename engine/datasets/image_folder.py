"""ImageFolderDataset: ``root/<class>/<image>`` files as uint8 CHW tensors and class ids, in any loading mode."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image, read_file

from engine.datasets.base import DEFAULT_BLOCK_ROWS, DEFAULT_CACHE_BYTES, FileDataset
from engine.datasets.modes import LoadingMode
from engine.datasets.streaming import StreamingMixin

__all__ = ["IMAGE_EXTENSIONS", "ImageFolderDataset", "StreamingImageFolderDataset"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
"""File endings read as images by default (compared case-insensitively)."""
_READ_MODES = {"RGB": (ImageReadMode.RGB, "RGB"), "GRAY": (ImageReadMode.GRAY, "L"),
               "UNCHANGED": (ImageReadMode.UNCHANGED, None)}


class ImageFolderDataset(FileDataset):
    """One class per subfolder of ``root`` (sorted names -> ids 0, 1, ...); rows are
    ``{'pixel_values': uint8 [C, H, W], 'labels': int}``, ready for ``VisionCollator`` (``keep_uint8=True`` keeps
    the batch uint8 for normalization on the device).

    Images are found recursively in each class folder (hidden files and folders skipped) and sorted by path.
    They are decoded with ``torchvision.io.decode_image`` (JPEG, PNG, GIF, WebP), falling back to PIL for the
    other formats. Paths and labels are held as numpy arrays (no Python object per image for workers to copy);
    EAGER holds every decoded image in one flat uint8 buffer.

    Args:
        root: The folder whose subfolders are the classes.
        mode: A :class:`LoadingMode` (or its name); STREAMING returns a :class:`StreamingImageFolderDataset`.
        extensions: File endings read as images, case-insensitive.
        image_mode: ``'RGB'`` (3 channels, the default, so images of any source stack), ``'GRAY'`` (1 channel) or
            ``'UNCHANGED'``.
        transform: Applied to each decoded uint8 CHW tensor before it is returned, cached or held (EAGER), e.g.
            ``torchvision.transforms.v2.Resize((64, 64))`` so images of different sizes stack. This is the
            deterministic part: what CACHED and EAGER hold is its result, so a random one would be frozen. Do
            random augmentation in ``UniversalDataModule(train_transform=...)``, which runs after any cache and
            is seeded per (epoch, row) (docs/transforms.md). Must pickle.
        cache_bytes: CACHED mode's byte budget per process.
        block_rows: STREAMING's rows per block.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: ``root`` has no class subfolders, a class folder holds no images, or an argument is invalid.
        OSError: An image cannot be decoded (the message names its path); raised when it is read.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        mode: LoadingMode | str = LoadingMode.LAZY,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
        image_mode: str = "RGB",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        block_rows: int = DEFAULT_BLOCK_ROWS,
    ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder not found: {str(self.root)!r} is not a directory")
        if isinstance(extensions, str) or not extensions:
            raise ValueError(f"extensions should be a non-empty sequence such as ('.jpg', '.png'), but got "
                             f"extensions={extensions!r}")
        self.extensions = tuple(ext.lower() if ext.startswith(".") else f".{ext.lower()}" for ext in extensions)
        if image_mode not in _READ_MODES:
            raise ValueError(f"image_mode should be one of {list(_READ_MODES)}, but got image_mode={image_mode!r}")
        self.image_mode, self.transform = image_mode, transform
        self.classes = sorted(entry.name for entry in os.scandir(self.root)
                              if entry.is_dir() and not entry.name.startswith("."))
        if not self.classes:
            raise ValueError(f"{str(self.root)!r} has no class subfolders; put each class's images in "
                             f"root/<class name>/ (a single class needs one subfolder too)")
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        paths, labels = [], []
        for name in self.classes:
            found = _image_files(self.root / name, self.extensions)
            if not found:
                raise ValueError(f"class folder {str(self.root / name)!r} holds no images with extensions "
                                 f"{self.extensions}; add images, remove the folder, or pass extensions=...")
            paths += found
            labels += [self.class_to_idx[name]] * len(found)
        self._paths = np.array([os.fsencode(path) for path in paths])
        self.targets = np.array(labels, dtype=np.int64)
        self._init_mode(len(paths), mode, cache_bytes, block_rows)

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(path, class id)`` of every image, in row order (as torchvision's ``ImageFolder.samples``)."""
        return [(os.fsdecode(path), int(label)) for path, label in zip(self._paths, self.targets)]

    def _decode(self, index: int) -> torch.Tensor:
        path = os.fsdecode(self._paths[index])
        read_mode, pil_mode = _READ_MODES[self.image_mode]
        try:
            image = decode_image(read_file(path), mode=read_mode)
        except (RuntimeError, ValueError):  # a format torchvision does not decode (BMP, TIFF, ...), or corrupt
            try:
                with Image.open(path) as pil:
                    pil = pil.convert(pil_mode) if pil_mode is not None and pil.mode != pil_mode else pil
                    image = torch.from_numpy(np.array(pil)).reshape(pil.height, pil.width, -1).permute(2, 0, 1)
            except Exception as error:  # PIL raises many types for unreadable data; the path is what matters
                raise OSError(f"cannot read image {path!r}: {type(error).__name__}: {error}") from error
        if image.ndim == 4:  # an animated GIF: its first frame
            image = image[0]
        image = image.contiguous()
        return self.transform(image) if self.transform is not None else image

    def _read_rows(self, indices: np.ndarray) -> list[dict[str, Any]]:
        return [{"pixel_values": self._decode(i), "labels": int(self.targets[i])} for i in indices.tolist()]

    def _load_all(self) -> None:
        images = [self._decode(i) for i in range(self.num_rows)]
        self._shapes = np.array([image.shape for image in images], dtype=np.int64)
        sizes = np.array([image.numel() for image in images], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)])
        self._buffer = torch.cat([image.reshape(-1) for image in images])

    def _memory_rows(self, indices: np.ndarray) -> list[dict[str, Any]]:
        rows = []
        for i in indices.tolist():
            start, stop = int(self._offsets[i]), int(self._offsets[i + 1])
            rows.append({"pixel_values": self._buffer[start:stop].view(*self._shapes[i].tolist()),
                         "labels": int(self.targets[i])})
        return rows

    def _describe(self) -> str:
        return f"{str(self.root)!r}, classes={len(self.classes)}"


def _image_files(folder: Path, extensions: tuple[str, ...]) -> list[str]:
    """Image files under ``folder`` (recursively, following links, skipping hidden entries), sorted."""
    found = []
    for directory, subdirs, files in os.walk(folder, followlinks=True):
        subdirs[:] = [name for name in subdirs if not name.startswith(".")]
        found += [os.path.join(directory, name) for name in files
                  if not name.startswith(".") and name.lower().endswith(extensions)]
    return sorted(found)


class StreamingImageFolderDataset(StreamingMixin, ImageFolderDataset):
    """:class:`ImageFolderDataset` with ``mode=STREAMING``: an ``IterableDataset`` decoding images in row order
    (classes in sorted order, then paths), each image once across workers and ranks."""


ImageFolderDataset._streaming_class = StreamingImageFolderDataset
