"""Data given as paths: .csv, .json/.jsonl and .parquet files, or a folder of images or audio files, read by
``datasets`` into Arrow (its own readers fill Arrow tables chunk by chunk; no Python row is built here)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
"""The suffixes a path may end in, and the ``datasets`` builder that reads each."""

FOLDER_KINDS = {
    "image": (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"),
    "audio": (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aif", ".aiff"),
    "csv": (".csv", ".tsv"),
    "json": (".json", ".jsonl", ".ndjson"),
    "parquet": (".parquet",),
    "arrow": (".arrow",),
}
"""The kinds of data file a folder may hold, by suffix. ``datasets`` reads a folder with the builder of its most
numerous kind and leaves the others out without a word, so a folder must hold one kind. Other files (notes such as
README.md) are not data."""

METADATA_FILES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
"""Files that imagefolder and audiofolder read as the labels and columns of the images or audio beside them."""

ACCEPTED_PATHS = (f"a path ending in {', '.join(FILE_BUILDERS)} or a folder of images or audio files "
                  f"(read by datasets' imagefolder/audiofolder)")


def _is_path(value: Any) -> bool:
    """A ``pathlib.Path`` (any os.PathLike), or a string that names something that exists or reads as a path (it
    holds a folder separator, or ends in a suffix such as ``.csv``), so that a missing one is named as missing: any
    other string is left to the other kinds (and refused there, with the kinds accepted)."""
    if isinstance(value, os.PathLike):
        return True
    if not isinstance(value, str):
        return False
    looks_like_path = "/" in value or os.sep in value or (Path(value).suffix and not any(c.isspace() for c in value))
    return bool(looks_like_path) or os.path.exists(value)


def is_path_data(data: Any) -> bool:
    """Whether ``data`` is a path, or a non-empty list or tuple of paths, to read with :func:`load_paths`."""
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_is_path(item) for item in data)
    return _is_path(data)


def load_paths(data: str | os.PathLike | Sequence[str | os.PathLike], what: str = "train_data") -> Any:
    """The ``datasets.Dataset`` that ``data`` (one path or a list of them) names.

    Files are read with ``datasets.load_dataset(builder, data_files=[...], split="train")``: csv for .csv, json
    for .json and .jsonl (JSON lines, or one JSON list of records), parquet for .parquet. A folder is read with
    ``datasets.load_dataset(folder)``, which picks the builder from the files it holds (imagefolder for images,
    audiofolder for audio); labels come from the names of its subfolders. A folder's images are read as RGB, as
    :class:`engine.datasets.ImageFolderDataset` reads them by default, so grayscale and colour images stack.

    Raises:
        FileNotFoundError: A path that does not exist.
        ValueError: A file with another suffix, files of different kinds in one list, a folder beside files, a
            folder that holds no file datasets reads, a folder that holds several kinds of data file (images and
            csv files, ...), or a folder that holds several splits (train/, test/, ...: pass each split's folder as
            its own argument).
    """
    import datasets

    paths = [Path(item) for item in (data if isinstance(data, (list, tuple)) else [data])]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: '{path}'; {what} should name an existing file or "
                                    f"folder ({ACCEPTED_PATHS}), but got {what}='{path}'")
    folders = [path for path in paths if path.is_dir()]
    if folders:
        if len(paths) > 1:
            raise ValueError(f"{what} should be one folder or a list of files, but got {len(paths)} paths with the "
                             f"folder '{folders[0]}' among them; pass one folder")
        return _load_folder(folders[0], what)
    for path in paths:
        if path.suffix.lower() not in FILE_BUILDERS:
            raise ValueError(f"{what} names the file '{path}', whose suffix {path.suffix!r} is not accepted: give "
                             f"{ACCEPTED_PATHS}, or read it yourself into a datasets.Dataset")
    builders = sorted({FILE_BUILDERS[path.suffix.lower()] for path in paths})
    if len(builders) > 1:
        raise ValueError(f"{what} mixes files of kinds {builders} ({', '.join(str(path) for path in paths)}); give "
                         f"files of one kind, or read them into one datasets.Dataset yourself")
    try:
        dataset = datasets.load_dataset(builders[0], data_files=[str(path) for path in paths], split="train")
    except Exception as error:  # datasets' own words for an empty file: 'Instruction "train" corresponds to no data!'
        _refuse_empty(paths, what, error)
        raise
    if len(dataset) == 0:
        _refuse_empty(paths, what)
    return dataset


_TEXT_SUFFIXES = (".csv", ".json", ".jsonl", ".txt", ".tsv")


def _data_rows(path: Path) -> int | None:
    """How many data rows ``path`` holds as far as a cheap look tells (0 for a file with nothing, a header only,
    or an empty JSON list), or None where it cannot tell (left to the reader's own error)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:
            return None
    if suffix not in _TEXT_SUFFIXES:
        return None
    if path.stat().st_size > 2**16:
        return 1  # more than a header; not read here
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if suffix in (".csv", ".tsv"):
        return max(len(lines) - 1, 0)  # the first line is the header
    if suffix == ".json" and text in ("[]", "{}"):
        return 0
    return len(lines)


def _refuse_empty(paths: list[Path], what: str, error: BaseException | None = None) -> None:
    """Raise naming the files that hold no data rows when every one of ``paths`` holds none; return otherwise."""
    files = [path for path in paths if path.is_file()]
    if not files or any(_data_rows(path) != 0 for path in files):
        return
    names = ", ".join(f"'{path}'" for path in files)
    raise ValueError(f"{what} should hold at least one data row, but the file{'s' if len(files) > 1 else ''} "
                     f"{names} {'have' if len(files) > 1 else 'has'} no data rows (nothing, or a header only); add "
                     f"rows, or leave {what} out") from error


def check_one_kind(folder: Path, what: str) -> None:
    """Refuse a folder whose data files are of several kinds (:data:`FOLDER_KINDS`), naming each kind with its count
    and a file of it. Hidden files and folders, and folders named ``__*``, are skipped as ``datasets`` skips them;
    imagefolder's metadata files (:data:`METADATA_FILES`) belong with the images."""
    kinds = {suffix: kind for kind, suffixes in FOLDER_KINDS.items() for suffix in suffixes}
    counts: dict[str, int] = {}
    examples: dict[str, Path] = {}
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith((".", "__")))
        for name in sorted(files):
            kind = kinds.get(Path(name).suffix.lower())
            if kind is None or name.startswith(".") or name in METADATA_FILES:
                continue
            counts[kind] = counts.get(kind, 0) + 1
            examples.setdefault(kind, Path(root) / name)
    if len(counts) < 2:
        return
    found = sorted(counts, key=lambda kind: -counts[kind])
    listed = [f"{counts[kind]} {kind} files (e.g. '{examples[kind]}')" for kind in found]
    raise ValueError(
        f"{what} should be a folder of one kind of data file, but got the folder '{folder}' with "
        f"{', '.join(listed[:-1])} and {listed[-1]}; datasets would read one kind and leave the others out. Give one "
        f"kind: pass a sub-folder that holds only it, or move the other files out (csv, json and parquet files may "
        f"also be passed as a list, e.g. sorted(Path('{folder}').glob('**/*.csv')))"
    )


def _load_folder(folder: Path, what: str) -> Any:
    import datasets

    check_one_kind(folder, what)
    try:
        splits = datasets.load_dataset(str(folder))
    except FileNotFoundError as error:  # datasets' EmptyDatasetError, DataFilesNotFoundError: nothing it reads
        kinds = sorted({path.suffix.lower() or path.name for path in folder.rglob("*") if path.is_file()})
        raise ValueError(f"{what} is the folder '{folder}', which holds no file of a kind datasets reads (it holds "
                         f"{kinds or 'no files'}); {what} should be {ACCEPTED_PATHS}") from error
    except (datasets.exceptions.DatasetGenerationError, ValueError, StopIteration) as error:
        if "torchcodec" not in str(error.__cause__):
            _refuse_empty(sorted(folder.rglob("*")), what, error)
            raise
        raise ImportError(f"{what} is the folder '{folder}', which datasets reads with audiofolder, and in this "
                          f"datasets version that needs torchcodec with FFmpeg ({error.__cause__}); install them, or "
                          f"give datasets.Dataset.from_dict({{'audio': paths, 'label': labels}}).cast_column('audio', "
                          f"datasets.Audio()), whose audio this module decodes with soundfile") from error
    if all(len(split) == 0 for split in splits.values()):
        _refuse_empty(sorted(folder.rglob("*")), what)
    if list(splits) != ["train"]:
        raise ValueError(f"{what} is the folder '{folder}', which holds the splits {list(splits)}; pass each split's "
                         f"folder on its own, e.g. train_data='{folder / 'train'}', val_data=...")
    rows = splits["train"]
    image = rows.features.get("image")
    if isinstance(image, datasets.Image) and image.mode is None:  # imagefolder's column: RGB, as ImageFolderDataset
        rows = rows.cast_column("image", datasets.Image(mode="RGB", decode=image.decode))
    return rows
