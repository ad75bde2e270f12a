"""What a worker process adds to a training step: torch's own hand-off of a batch, against ours, on the same batches.

The step is ``bench_step_overhead``'s calibrated 10 ms of single-thread matmuls. Each configuration feeds it the
same batches of 64 (the first ``steps`` batches of ``num_workers=0``), against those batches already in memory:

- ``torch floor``: a plain ``torch`` ``DataLoader(num_workers=1/2)`` whose dataset returns the already-collated
  batch (fresh copies of its tensors, as a collator makes), so the worker does nothing but hand it over;
- ``torch floor, one buffer``: the same, each batch's tensors copied into one shared block first (``one_buffer``);
- ``torch floor, an int``: a worker that hands over an int: the queue and wake-ups alone, no tensors;
- ``torch floor, file_system`` and ``ours, file_system``: the workers share by file name (no socket round trip
  to the worker per block; the parent registers the block with torch's shm manager instead), for comparison;
- ``ours, a block per tensor``: our loader at ``num_workers=1/2`` with the plain ``SeededCollate`` (before);
- ``ours``: our loader as the factory builds it (``WorkerCollate``: one shared block per batch).

Columns: overhead = (loop over the loader - loop over memory) / loop over memory, the median over alternating
rounds (each configuration once per round); ``next ms`` = the median time the step waits in ``next()`` (the
parent's share: receiving, unpickling, rebuilding shared memory, our wrappers, torchdata's snapshots).
``--profile`` adds a cProfile breakdown of the parent's ``next()`` per configuration. Before timing, our loaders
must give the batches of ``num_workers=0``, bit for bit.

Run: ``PYTHONPATH=. python -m benchmarks.bench_worker_handoff [--quick] [--profile]`` or ``python -m benchmarks
--only worker_handoff``.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._harness import format_table, machine
from benchmarks.bench_step_overhead import BATCH, calibrate_step, image_case, ours, token_case, verify
from engine.seeded_collate import SeededCollate
from engine.workers.handoff import one_buffer

NAME = "worker_handoff"
WORKERS = (1, 2)
PROFILED = {
    "unpickle": ("~", "<built-in method _pickle.loads>"),
    "rebuild_storage_fd": ("torch/multiprocessing/reductions.py", "rebuild_storage_fd"),
    "torchdata snapshots": ("stateful_dataloader.py", "_take_snapshot"),
    "torchdata main state": ("stateful_dataloader.py", "_get_main_state"),
    "our wrapper (own time)": ("engine/loader.py", "__next__"),
}
"""Functions of the parent's ``next()`` that ``--profile`` times (ms per batch, with what they call; our wrapper's
own time without): (file, function)."""


class Precollated(Dataset):
    """Batch ``i`` of ``batches``, already collated: fresh copies of its tensors, optionally in one shared block."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], *, packed: bool = False) -> None:
        self.batches, self.packed = batches, packed

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        batch = {key: value.clone() for key, value in self.batches[index].items()}
        return one_buffer(batch) if self.packed else batch


class Numbers(Dataset):
    """An int per batch: what the hand-off costs without tensors."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        return index


def _torch_loader(dataset: Dataset, workers: int, init: Callable[[int], None] | None = None) -> DataLoader:
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=True, worker_init_fn=init)


def file_system_worker(worker_id: int) -> None:
    """A worker that shares tensors by file name (``file_system``): the parent opens the block itself, with no
    socket round trip to the worker (the strategy is per process: the parent's own is left alone)."""
    torch.multiprocessing.set_sharing_strategy("file_system")


class FileSystemWorker:
    """A loader's ``worker_init_fn``, then :func:`file_system_worker`."""

    def __init__(self, init: Callable[[int], None]) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        self.init(worker_id)
        file_system_worker(worker_id)


def _file_system(loader: Any) -> Any:
    loader.worker_init_fn = FileSystemWorker(loader.worker_init_fn)
    return loader


def _per_tensor(loader: Any) -> Any:
    """Our loader with the plain ``SeededCollate`` (each tensor its own shared block), as before ``WorkerCollate``."""
    loader.collate_fn = SeededCollate(loader.collate_fn.collate_fn)
    return loader


def configurations(data: Any, options: dict[str, Any], memory: list[Any]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for workers in WORKERS:
        runs[f"torch floor, workers={workers}"] = _torch_loader(Precollated(memory), workers)
        runs[f"torch floor, one buffer, workers={workers}"] = _torch_loader(Precollated(memory, packed=True), workers)
        mode = {"num_workers": workers}
        runs[f"ours, a block per tensor, workers={workers}"] = _per_tensor(ours(data, options, mode))
        runs[f"ours, workers={workers}"] = ours(data, options, mode)
    runs["torch floor, an int, workers=1"] = _torch_loader(Numbers(len(memory)), 1)
    runs["torch floor, file_system, workers=1"] = _torch_loader(Precollated(memory), 1, file_system_worker)
    runs["torch floor, file_system, one buffer, workers=1"] = _torch_loader(Precollated(memory, packed=True), 1,
                                                                           file_system_worker)
    runs["ours, file_system, workers=1"] = _file_system(ours(data, options, {"num_workers": 1}))
    return runs


def timed_pass(batches: Iterable[Any], step: Callable[[], None], steps: int) -> tuple[float, list[float]]:
    """Seconds for ``steps`` steps fed from a new pass over ``batches``, and each wait in ``next()``."""
    waits = []
    iterator = iter(batches)
    start = time.perf_counter()
    for _ in range(steps):
        began = time.perf_counter()
        next(iterator)
        waits.append(time.perf_counter() - began)
        step()
    return time.perf_counter() - start, waits


def profile_next(loader: Any, steps: int, step: Callable[[], None]) -> dict[str, float]:
    """Cumulative ms per batch that the parent's ``next()`` spends in each of :data:`PROFILED`."""
    profiler = cProfile.Profile()
    iterator = iter(loader)
    for _ in range(steps):
        profiler.enable()
        next(iterator)
        profiler.disable()
        step()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive, tottime, cumtime, callers)}
    out = {name: 0.0 for name in PROFILED}
    for (file, _, function), (_, _, own, cumulative, _) in stats.items():
        for name, (where, wanted) in PROFILED.items():
            if function == wanted and file.endswith(where):
                out[name] += (own if name.startswith("our wrapper") else cumulative) / steps * 1e3
    return out


def measure(case: str, data: Any, options: dict[str, Any], *, steps: int, repeats: int,
            step: Callable[[], None], profile: bool = False) -> list[dict[str, Any]]:
    memory = [batch for _, batch in zip(range(steps), ours(data, options, {"num_workers": 0}))]
    runs = configurations(data, options, memory)
    verify({name: loader for name, loader in runs.items() if name.startswith("ours")}, memory, min(steps, 8))
    runs = {"memory": memory, **runs}
    for loader in runs.values():  # worker start-up is not part of a step's cost
        timed_pass(loader, lambda: None, 2)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    waits: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # alternating: each configuration once per round, against that round's memory loop
        for name, loader in runs.items():
            total, each = timed_pass(loader, step, steps)
            seconds[name].append(total)
            waits[name].extend(each)
    memory_s = seconds.pop("memory")
    base = float(np.median(memory_s)) / steps
    rows = []
    for name, times in seconds.items():
        overhead = float(np.median([(t - m) / m for t, m in zip(times, memory_s)])) * 100
        note = f"next() median {np.median(waits[name]) * 1e3:.3f} ms (memory {np.median(waits['memory']) * 1e3:.3f})"
        if profile:
            parts = profile_next(runs[name], min(steps, 100), step)
            note += "; per batch: " + ", ".join(f"{key} {value:.3f} ms" for key, value in parts.items())
        rows.append({
            "benchmark": NAME, "case": f"{case}, {name}", "anchor": "batches in memory",
            "anchor_ms": base * 1e3, "ours_ms": base * (1 + overhead / 100) * 1e3, "ratio": 1 / (1 + overhead / 100),
            "throughput": f"{overhead:+.1f}% ({base * overhead / 100 * 1e3:+.2f} ms/step)",
            "target": "overhead <= 2%" if name.startswith("ours,") else None,
            "met": bool(overhead <= 2) if name.startswith("ours,") else None, "note": note,
        })
    return rows


def run(quick: bool = False, profile: bool = False) -> list[dict[str, Any]]:
    token_rows, image_rows, repeats = (3_200, 3_200, 3) if quick else (12_800, 6_400, 5)
    out = []
    cases = (("tokens List[Tensor]", token_case, token_rows), ("images uint8", image_case, image_rows))
    for case, build, rows in cases:
        data, options, _ = build(rows)
        step = calibrate_step()
        out += measure(case, data, options, steps=rows // BATCH, repeats=repeats, step=step, profile=profile)
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("\n".join(machine()))
    print(format_table(run(quick="--quick" in sys.argv, profile="--profile" in sys.argv)))
