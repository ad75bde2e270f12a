"""Loading modes of :mod:`engine.datasets`: first and later epochs of LAZY, EAGER, CACHED and STREAMING.

For each dataset kind (an HDF5 file, an image folder of JPEGs, text files), generated in a temporary folder, and
each mode, a loader from :class:`engine.DataLoaderFactory` (batch size 64, main process, seeded shuffle for the
map-style modes; STREAMING reads in file order) runs three epochs. "first" is construction plus the first epoch
(so EAGER pays for reading everything); "later" is the best later epoch. Each is the best of a few repetitions
(taken round the modes) with a fresh dataset; the files are in the OS page cache after the first, as they would
be on a warm machine. CACHED runs twice: with a budget that holds every row, and with half of that (its
later-epoch hit rate shows what a cache smaller than the data buys under shuffling). The anchor of every case is
LAZY in the same phase; ``ratio`` is anchor ms / ours ms (> 1: faster than LAZY), as in the other benchmarks.
Before timing, every mode is checked to give LAZY's rows.

Run standalone with ``python benchmarks/bench_loading_modes.py [--quick]`` (one torch thread, as ``python -m
benchmarks`` runs it).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from PIL import Image

from collators import DefaultCollator, VisionCollator
from engine import DataLoaderConfig, DataLoaderFactory
from engine.datasets import HDF5Dataset, ImageFolderDataset, LoadingMode, TextFileDataset, sizeof

BATCH_SIZE = 64
SIZES = {True: {"hdf5": 2048, "image_folder": 256, "text_files": 8000},
         False: {"hdf5": 8192, "image_folder": 768, "text_files": 40000}}
"""Rows per dataset kind, for quick and full runs."""
WORDS = ("river", "stone", "market", "lantern", "harbor", "meadow", "engine", "window", "orchard", "signal",
         "copper", "thunder", "village", "paper", "garden", "station", "winter", "violet", "bridge", "candle")
TARGETS = {"eager first": 0.67, "eager later": 1.0, "cached first": 0.8, "cached later": 1.0,
           "streaming first": 0.9, "streaming later": 0.9}
"""Smallest ratio (LAZY ms / ours ms) each mode and phase should reach; CACHED with half the data is for reference."""
VARIANTS = ("lazy", "eager", "cached", "cached-half", "streaming")
WHY = {"eager": "reads every row up front, then serves rows from memory",
       "cached": "LRU budget holds every row",
       "cached-half": "for reference: LRU budget holds half the rows, which shuffling defeats",
       "streaming": "sequential blocks in file order (no shuffle); the factory seeds each stream batch by hashing "
                    "its rows (engine/collation/seeded_collate.py), included in this time"}


@dataclass
class Kind:
    """One dataset kind: how to build it in a mode, and the collator its batches go through."""

    name: str
    build: Callable[..., Any]
    collate: Any
    rows: int
    nbytes: int = 0


def _write_hdf5(root: Path, rows: int) -> Kind:
    rng = np.random.default_rng(0)
    with h5py.File(root / "data.h5", "w") as file:
        file["images"] = rng.integers(0, 256, (rows, 3, 32, 32), dtype=np.uint8)
        file["labels"] = rng.integers(0, 10, rows)
    return Kind("hdf5", partial(HDF5Dataset, root / "data.h5"), DefaultCollator(), rows)


def _write_images(root: Path, rows: int) -> Kind:
    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, 64, dtype=np.float32)
    for index in range(rows):
        folder = root / "images" / f"class_{index % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        smooth = base[None, :, None] * rng.random(3)[None, None, :] + base[:, None, None] * rng.random(3)
        pixels = np.clip(smooth / 2 + rng.normal(0, 12, (64, 64, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:05d}.jpg", quality=90)
    return Kind("image_folder", partial(ImageFolderDataset, root / "images"), VisionCollator(keep_uint8=True), rows)


def _write_text(root: Path, rows: int) -> Kind:
    rng = np.random.default_rng(0)
    folder = root / "text"
    folder.mkdir()
    for part, lines in enumerate(np.array_split(np.arange(rows), 4)):
        text = "".join(" ".join(rng.choice(WORDS, rng.integers(5, 40))) + "\n" for _ in lines)
        (folder / f"part_{part}.txt").write_text(text, encoding="utf-8")
    return Kind("text_files", partial(TextFileDataset, folder), DefaultCollator(), rows)


def _all_rows(dataset: Any) -> list[Any]:
    if dataset.mode is LoadingMode.STREAMING:
        return list(dataset)
    return dataset.__getitems__(range(len(dataset)))


def _same(first: Any, second: Any) -> bool:
    if isinstance(first, dict):
        return first.keys() == second.keys() and all(_same(first[key], second[key]) for key in first)
    if isinstance(first, torch.Tensor):
        return first.dtype == second.dtype and torch.equal(first, second)
    return first == second


def verify(kind: Kind) -> None:
    """Raise unless every mode gives the rows of LAZY, in file order and (map-style) in a shuffled order.

    Also records the data's bytes, for the cache budgets.
    """
    expected = _all_rows(kind.build(mode=LoadingMode.LAZY))
    kind.nbytes = sum(sizeof(row) for row in expected)
    order = np.random.default_rng(0).permutation(len(expected)).tolist()
    for mode in LoadingMode:
        dataset = kind.build(mode=mode)
        checks = [(_all_rows(dataset), expected)]
        if mode is not LoadingMode.STREAMING:
            checks.append((dataset.__getitems__(order), [expected[i] for i in order]))
        for rows, wanted in checks:
            if len(rows) != len(wanted) or not all(_same(a, b) for a, b in zip(rows, wanted)):
                raise RuntimeError(f"{kind.name}: mode {mode.name} does not give the rows of LAZY")


def _drain(loader: Any) -> None:
    for _ in loader:
        pass


def time_mode(kind: Kind, variant: str, epochs: int = 3) -> tuple[float, float, float | None]:
    """(first ms, later ms, later-epoch cache hit rate) of one mode on a fresh dataset; later = best later epoch."""
    mode = LoadingMode.CACHED if variant.startswith("cached") else LoadingMode[variant.upper()]
    budget = kind.nbytes // 2 if variant == "cached-half" else 2 * kind.nbytes + 2**20
    start = time.perf_counter()
    dataset = kind.build(mode=mode, cache_bytes=budget)
    config = DataLoaderConfig(batch_size=BATCH_SIZE, shuffle=mode is not LoadingMode.STREAMING, seed=0,
                              collate_fn=kind.collate)
    loader = DataLoaderFactory().create_dataloader(dataset, config)
    _drain(loader)
    first = time.perf_counter() - start
    if dataset.cache is not None:
        dataset.cache.reset_stats()
    laters = []
    for _ in range(epochs - 1):
        start = time.perf_counter()
        _drain(loader)
        laters.append(time.perf_counter() - start)
    hit_rate = dataset.cache.stats()["hit_rate"] if dataset.cache is not None else None
    return 1000 * first, 1000 * min(laters), hit_rate


def run(quick: bool) -> list[dict[str, Any]]:
    """Benchmark rows (one per kind, mode and phase); ``quick`` uses smaller data and fewer repetitions."""
    results = []
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = SIZES[quick]
        kinds = [_write_hdf5(root, sizes["hdf5"]), _write_images(root, sizes["image_folder"]),
                 _write_text(root, sizes["text_files"])]
        for kind in kinds:
            verify(kind)
            # Repetitions go round the modes, so a burst of load on a shared machine hits every mode alike.
            runs = [{variant: time_mode(kind, variant) for variant in VARIANTS} for _ in range(repeats)]
            timings = {variant: (min(r[variant][0] for r in runs), min(r[variant][1] for r in runs),
                                 runs[-1][variant][2]) for variant in VARIANTS}
            for variant, (first, later, hit_rate) in timings.items():
                if variant != "lazy":
                    results += _rows(kind, variant, first, later, hit_rate, timings["lazy"])
    return results


def _rows(kind: Kind, variant: str, first: float, later: float, hit_rate: float | None,
          lazy: tuple[float, float, float | None]) -> list[dict[str, Any]]:
    rows = []
    for phase, ours, anchor in (("first", first, lazy[0]), ("later", later, lazy[1])):
        minimum = TARGETS.get(f"{variant} {phase}")
        note = WHY[variant] + (f"; later-epoch hit rate {hit_rate:.0%}" if hit_rate is not None else "")
        rows.append({
            "benchmark": "loading_modes",
            "case": f"{kind.name} {variant}, {phase} epoch ({kind.rows} rows)",
            "anchor": f"lazy, {phase} epoch",
            "anchor_ms": round(anchor, 3),
            "ours_ms": round(ours, 3),
            "ratio": round(anchor / ours, 3),
            "throughput": f"{kind.rows / ours * 1000:,.0f} rows/s",
            "target": None if minimum is None else f">= {minimum:g}x lazy's speed",
            "met": None if minimum is None else bool(anchor / ours >= minimum),
            "note": note + ("; includes construction" if phase == "first" else ""),
        })
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find the benchmarks package
    from benchmarks._harness import format_table

    torch.set_num_threads(1)
    print(format_table(run(quick="--quick" in sys.argv[1:])))
