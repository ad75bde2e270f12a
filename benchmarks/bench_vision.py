"""Host-side image collate: uint8 stack (normalize later, on the device) vs the per-sample float path.

Anchor: what a torchvision pipeline does in the loader, per image ``ToDtype(float32, scale=True)`` and
``Normalize``, then ``default_collate``. Ours: ``VisionCollator(keep_uint8=True)``, then
:class:`engine.tools.device.DeviceNormalize` after the transfer. Outputs are checked equal (1e-6) before timing.
Timed with one thread, as in a DataLoader worker (torch sets one thread per worker); min over repeats.
With CUDA, also the pinned H2D copy (uint8 vs float32) and the on-device normalize.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision.transforms.v2 as T
from torch.utils.data import default_collate

from collators.vision import NORMALIZATION_PRESETS, VisionCollator
from engine.tools.device import DeviceNormalize

MEAN, STD = NORMALIZATION_PRESETS["imagenet"]
TARGET = ">= 20x cheaper host collate than per-sample float Normalize; equal within 1e-6"


class PerSampleFloat:
    """The anchor: torchvision transforms per image (as in a Dataset's __getitem__), then default_collate."""

    def __init__(self, mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> None:
        self.transform = T.Compose([T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)])

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return default_collate([{"pixel_values": self.transform(row["pixel_values"]), "labels": row["labels"]}
                                for row in rows])


def best_ms(function: Callable[[], Any], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    function()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def make_rows(batch: int, size: int) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator)
    return [{"pixel_values": image.clone(), "labels": i % 10} for i, image in enumerate(images)]


def row(case: str, anchor: str, anchor_ms: float, ours_ms: float, items: int, met: bool, note: str) -> dict[str, Any]:
    return {"benchmark": "vision", "case": case, "anchor": anchor, "anchor_ms": round(anchor_ms, 3),
            "ours_ms": round(ours_ms, 3), "ratio": round(anchor_ms / ours_ms, 2),
            "throughput": f"{items / ours_ms * 1e3:,.0f} images/s", "target": TARGET, "met": met, "note": note}


def cuda_rows(batch: dict[str, torch.Tensor], normalize: DeviceNormalize, repeats: int) -> list[dict[str, Any]]:
    """Pinned H2D of the uint8 batch vs its float32 form, and the normalize on the device."""
    pixels = batch["pixel_values"]
    pinned_uint8, pinned_float = pixels.pin_memory(), normalize(pixels).pin_memory()
    sync = torch.cuda.synchronize
    h2d_uint8 = best_ms(lambda: pinned_uint8.to("cuda", non_blocking=True), repeats, sync)
    h2d_float = best_ms(lambda: pinned_float.to("cuda", non_blocking=True), repeats, sync)
    on_device = pinned_uint8.to("cuda")
    device_ms = best_ms(lambda: normalize(on_device), repeats, sync)
    both_ms = best_ms(lambda: normalize(pinned_uint8.to("cuda", non_blocking=True)), repeats, sync)
    reference = torch.stack([T.Normalize(MEAN, STD)(T.ToDtype(torch.float32, scale=True)(p)) for p in pixels])
    error = (normalize(on_device).cpu() - reference).abs().max().item()
    count, name, shape = len(pixels), torch.cuda.get_device_name(), f"{len(pixels)}x3x{pixels.shape[-1]}^2"
    return [
        row(f"H2D pinned non_blocking, uint8 {shape} ({name})", "float32 batch H2D", h2d_float, h2d_uint8, count,
            True, f"uint8 moves 1/4 of the bytes ({pinned_uint8.nbytes / 2**20:.1f} MiB)"),
        row(f"uint8 H2D + normalize on {name}, {shape}", "float32 batch H2D", h2d_float, both_ms, count,
            error <= 1e-6, f"normalize alone {device_ms:.3f} ms on the device; max |diff| vs torchvision {error:.1e}"),
    ]


def run(quick: bool = False) -> list[dict[str, Any]]:
    size, count, repeats = 224, 64, (5 if quick else 20)
    rows = make_rows(count, size)
    anchor, uint8, batch_float = PerSampleFloat(), VisionCollator(keep_uint8=True), VisionCollator()
    normalize = DeviceNormalize.from_collator(uint8)
    expected = anchor(rows)
    ours = uint8(rows)
    error = (normalize(ours)["pixel_values"] - expected["pixel_values"]).abs().max().item()
    equal = error <= 1e-6 and torch.equal(ours["labels"], expected["labels"])
    if not equal:
        raise AssertionError(f"uint8 + device normalize differs from torchvision by {error:.2e} (> 1e-6)")
    threads, shape = torch.get_num_threads(), f"{count}x3x{size}x{size}"
    anchor_name = "per-sample torchvision ToDtype+Normalize, default_collate"
    results = []
    try:
        for used in sorted({1, threads}):  # 1 thread: as in a DataLoader worker
            torch.set_num_threads(used)
            anchor_ms, uint8_ms = best_ms(lambda: anchor(rows), repeats), best_ms(lambda: uint8(rows), repeats)
            results.append(row(f"uint8 collate (keep_uint8=True), {shape}, {used} thread(s)", anchor_name, anchor_ms,
                               uint8_ms, count, anchor_ms / uint8_ms >= 20,
                               f"max |diff| after device normalize {error:.1e} (<= 1e-6)"))
        torch.set_num_threads(1)
        anchor_ms = best_ms(lambda: anchor(rows), repeats)
        float_ms, cpu_norm_ms = best_ms(lambda: batch_float(rows), repeats), best_ms(lambda: normalize(ours), repeats)
    finally:
        torch.set_num_threads(threads)
    results += [
        row(f"batched float collate (keep_uint8=False), {shape}, 1 thread", anchor_name, anchor_ms, float_ms, count,
            True, "for reference: normalizing the stacked batch once on the host"),
        row(f"uint8 collate + DeviceNormalize on CPU, {shape}, 1 thread", anchor_name, anchor_ms,
            uint8_ms + cpu_norm_ms, count, True, f"for reference without a GPU: normalize alone {cpu_norm_ms:.2f} ms"),
    ]
    if torch.cuda.is_available():
        results += cuda_rows(ours, normalize, repeats)
    return results


if __name__ == "__main__":
    import sys

    for result in run(quick="--quick" in sys.argv):
        print(result)
