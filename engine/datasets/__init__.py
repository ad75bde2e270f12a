"""File-backed datasets (HDF5, image folders, image-text folders, text files); all but image-text folders with
LAZY, EAGER, CACHED and STREAMING loading modes.

They are torch Datasets, so they go wherever data does: ``UniversalDataModule(train_data=...)``,
``DataLoaderFactory().create_dataloader(...)`` or a plain ``DataLoader``. STREAMING datasets are
``IterableDataset``s (load them with ``shuffle=False``). See docs/datasets.md.
"""

from engine.datasets.base import DEFAULT_BLOCK_ROWS, DEFAULT_CACHE_BYTES, FileDataset
from engine.datasets.cache import ByteBudgetLRU
from engine.datasets.hdf5 import HDF5Dataset, StreamingHDF5Dataset
from engine.datasets.image_folder import IMAGE_EXTENSIONS, ImageFolderDataset, StreamingImageFolderDataset
from engine.datasets.image_text_folder import ImageTextFolder
from engine.datasets.modes import LoadingMode, resolve_mode
from engine.datasets.sizes import sizeof
from engine.datasets.streaming import ShardIterator, StreamingMixin, shard_blocks
from engine.datasets.text_files import StreamingTextFileDataset, TextFileDataset

__all__ = [
    "DEFAULT_BLOCK_ROWS",
    "DEFAULT_CACHE_BYTES",
    "IMAGE_EXTENSIONS",
    "ByteBudgetLRU",
    "FileDataset",
    "HDF5Dataset",
    "ImageFolderDataset",
    "ImageTextFolder",
    "LoadingMode",
    "ShardIterator",
    "StreamingHDF5Dataset",
    "StreamingImageFolderDataset",
    "StreamingMixin",
    "StreamingTextFileDataset",
    "TextFileDataset",
    "resolve_mode",
    "shard_blocks",
    "sizeof",
]
