"""Small files for the dataset tests (an HDF5 file, an image folder) and helpers, given as fixtures (tests run
under ``--import-mode=importlib``, where a conftest is not importable)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from engine import DataLoaderConfig, DataLoaderFactory

ROWS = 37
"""Rows of the HDF5 file: not a multiple of the batch or block sizes used, so tails are exercised."""


@pytest.fixture
def h5_path(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as file:
        file["x"] = np.arange(ROWS * 12, dtype=np.float32).reshape(ROWS, 3, 4)
        file["y"] = np.arange(ROWS, dtype=np.int64) % 5
        file["group/z"] = np.arange(ROWS, dtype=np.int16) * -1
    return path


def _write_image(path, seed, size=(8, 6), mode="RGB", fmt=None):
    """A deterministic image of ``size`` (width, height); returns its pixels as a uint8 CHW tensor."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = {"RGB": 3, "L": 1}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode).save(path, format=fmt)
    return torch.from_numpy(pixels).permute(2, 0, 1)


@pytest.fixture
def image_root(tmp_path):
    """``root/{cat,dog,emu}/`` with 4, 3 and 2 lossless images (PNG, BMP, a nested folder, an upper-case suffix)."""
    root = tmp_path / "images"
    layout = {"dog": ["a.png", "b.PNG", "sub/c.png"], "cat": ["x.png", "y.bmp", "z.png", "w.png"],
              "emu": ["e1.png", "e2.png"]}
    pixels = {}
    for seed, (name, files) in enumerate(sorted((k, v) for k, v in layout.items())):
        for number, file in enumerate(files):
            path = root / name / file
            pixels[str(path)] = _write_image(path, seed * 10 + number)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / ".hidden.png").write_bytes(b"not read")
    return root, pixels


def _load(dataset, *, workers=0, context=None, batch_size=4, collate_fn=None):
    """Every batch of one epoch through the engine's factory (no shuffle)."""
    config = DataLoaderConfig(batch_size=batch_size, num_workers=workers, multiprocessing_context=context,
                              collate_fn=collate_fn, seed=0, persistent_workers=False if workers else None)
    return list(DataLoaderFactory().create_dataloader(dataset, config))


def _assert_rows_equal(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def _assert_batches_equal(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.fixture
def write_image():
    return _write_image


@pytest.fixture
def load():
    return _load


@pytest.fixture
def rows_equal():
    return _assert_rows_equal


@pytest.fixture
def batches_equal():
    return _assert_batches_equal
