"""ImageTextFolder: a folder of images with their captions, as image-text rows whose images stay encoded.

A caption is a same-named ``.txt`` file beside its image (``cat.jpg`` and ``cat.txt``, as ``img2dataset``'s
``files`` output writes them), or a row of a ``metadata.jsonl`` / ``metadata.csv`` whose ``file_name`` names the
image relative to the metadata file's folder (as ``datasets``' ``imagefolder`` reads it; the row's other columns
are kept). Rows are ``{"image": encoded bytes, "text": caption, "__key__": the image's path without its
extension, ...metadata}``: the image is read, not decoded, so decoding runs in the collator, in the loader's
workers.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from engine.datasets.image_folder import IMAGE_EXTENSIONS, _image_files

__all__ = ["METADATA_FILES", "ImageTextFolder"]

METADATA_FILES = ("metadata.jsonl", "metadata.csv")
"""The metadata files read below the root, as ``datasets``' imagefolder names them."""


class ImageTextFolder(Dataset):
    """The images below ``root`` (recursively, hidden entries skipped, sorted by path) with their captions.

    Args:
        root: The folder of images, with a ``.txt`` caption beside each image or metadata files below it.
        text_field: The row's field of the caption, and the metadata column it is read from.
        extensions: File endings read as images, case-insensitive.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: ``root`` holds no images, an image has no caption, or a metadata row names no image, or one
            named twice.

    Example:
        >>> rows = ImageTextFolder("demo/data/captioned")  # doctest: +SKIP
        >>> sorted(rows[0])  # doctest: +SKIP
        ['__key__', 'image', 'text']
    """

    def __init__(self, root: str | os.PathLike[str], *, text_field: str = "text",
                 extensions: Sequence[str] = IMAGE_EXTENSIONS) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image-text folder not found: {str(self.root)!r} is not a directory")
        if isinstance(extensions, str) or not extensions:
            raise ValueError(f"extensions should be a non-empty sequence such as ('.jpg', '.png'), but got "
                             f"extensions={extensions!r}")
        self.text_field = text_field
        endings = tuple(ext.lower() if ext.startswith(".") else f".{ext.lower()}" for ext in extensions)
        paths = _image_files(self.root, endings)
        if not paths:
            raise ValueError(f"{str(self.root)!r} holds no images with extensions {endings}; add images or pass "
                             f"extensions=...")
        metadata = _metadata(self.root)
        self.paths = [os.path.relpath(path, self.root) for path in paths]
        self.records: list[dict[str, Any]] = []
        for path, relative in zip(paths, self.paths):
            record = dict(metadata.pop(relative, {}))
            caption = Path(path).with_suffix(".txt")
            if caption.is_file():
                record[text_field] = caption.read_text(encoding="utf-8").strip()
            if not isinstance(record.get(text_field), str):
                raise ValueError(f"image {relative!r} of {str(self.root)!r} has no caption: put it in "
                                 f"{caption.name!r} beside the image, or in the {text_field!r} column of a "
                                 f"{' or '.join(METADATA_FILES)} row whose file_name is {relative!r}")
            self.records.append(record)
        if metadata:
            raise ValueError(f"metadata rows of {str(self.root)!r} name images that are not there: "
                             f"{sorted(metadata)[:5]}; fix their file_name (relative to the metadata file's "
                             f"folder), or add the images")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        relative = self.paths[index]
        image = (self.root / relative).read_bytes()
        return {"image": image, "__key__": os.path.splitext(relative)[0], **self.records[index]}

    def row_places(self, indices: Sequence[int]) -> list[str]:
        """The image file of each row, as a record of a row left out (a corrupt image) names it."""
        return [f"file {str(self.root / self.paths[index])!r}" for index in indices]

    def fingerprint(self) -> str:
        """A hash of every image's path, size and modification time, and of the captions: a changed image or
        caption is another dataset (a saved state of it is refused)."""
        digest = hashlib.blake2b(digest_size=12)
        for relative, record in zip(self.paths, self.records):
            stat = (self.root / relative).stat()
            digest.update(f"{relative}\x00{stat.st_size}\x00{stat.st_mtime_ns}\x00".encode())
            digest.update(json.dumps(record, sort_keys=True, default=str).encode())
        return digest.hexdigest()


def _metadata(root: Path) -> dict[str, dict[str, Any]]:
    """``{image path relative to root: its metadata row without file_name}`` of every metadata file below
    ``root``."""
    found: dict[str, dict[str, Any]] = {}
    for directory, subdirs, files in os.walk(root, followlinks=True):
        subdirs[:] = sorted(name for name in subdirs if not name.startswith("."))
        for name in METADATA_FILES:
            if name not in files:
                continue
            path = Path(directory) / name
            if name.endswith(".jsonl"):
                with open(path, encoding="utf-8") as handle:
                    rows = [json.loads(line) for line in handle if line.strip()]
            else:
                with open(path, encoding="utf-8", newline="") as handle:
                    rows = list(csv.DictReader(handle))
            for number, row in enumerate(rows):
                if "file_name" not in row:
                    raise ValueError(f"row {number} of {str(path)!r} has no 'file_name' column naming its image; "
                                     f"got columns {sorted(row)}")
                relative = os.path.normpath(os.path.relpath(Path(directory) / row.pop("file_name"), root))
                if relative in found:
                    raise ValueError(f"the image {relative!r} is named by two metadata rows ({str(path)!r}); name "
                                     f"each image once")
                found[relative] = row
    return found
