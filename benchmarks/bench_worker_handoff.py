"""What a worker process adds to a training step: torch's own hand-off of a batch, against ours, on the same batches.

The step is ``bench_step_overhead``'s calibrated 10 ms of single-thread matmuls. Each configuration feeds it the
same batches of 64 (the first ``steps`` batches of ``num_workers=0``), against those batches already in memory:

- ``torch floor``: a plain ``torch`` ``DataLoader(num_workers=1/2)`` whose dataset returns the already-collated
  batch (fresh copies of its tensors, as a collator makes), so the worker does nothing but hand it over; torch
  sends each tensor's shared-memory block (one descriptor round trip with the worker each);
- ``torch floor, one buffer``: the same, the batch's tensors first copied into one shared block (``one_buffer``);
- ``torch floor, inline``: the same, the batch sent as bytes through the queue's pipe (``hand_off``), the pipe
  widened to 1 MiB as ours is;
- ``torch floor, an int``: a worker that hands over an int: the queue and wake-ups alone, no tensors;
- ``torch floor, file_system, one buffer``: the worker shares by file name (no round trip with the worker; the
  parent registers the block with torch's shm manager instead), for comparison;
- ``ours before``: our loader with the plain ``SeededCollate`` (torch sends each block, as before);
- ``ours, always one shared block``: our loader sending every batch as one shared block;
- ``ours``: our loader as the factory builds it (``WorkerCollate``: inline up to 1 MiB, else one shared block).

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
from torch.utils.data import DataLoader, Dataset, get_worker_info

from benchmarks._harness import format_table, machine
from benchmarks.bench_step_overhead import BATCH, calibrate_step, image_case, ours, token_case, verify
from engine.collation.handoff import hand_off, one_buffer, widen_result_pipe
from engine.collation.seeded_collate import SeededCollate

NAME = "worker_handoff"
WORKERS = (1, 2)
PROFILED = {
    "unpickle": ("~", "<built-in method _pickle.loads>"),
    "rebuild_storage_fd": ("torch/multiprocessing/reductions.py", "rebuild_storage_fd"),
    "torchdata snapshots": ("stateful_dataloader.py", "_take_snapshot"),
    "torchdata main state": ("stateful_dataloader.py", "_get_main_state"),
    "our wrapper (own time)": ("engine/loading/loader.py", "__next__"),
    "waiting for the queue": ("~", "<method 'poll' of 'select.poll' objects>"),
    "inline rebuild": ("engine/collation/handoff.py", "rebuild_inline"),
}
"""Functions of the parent's ``next()`` that ``--profile`` times (ms per batch, with what they call; our wrapper's
own time without): (file, function)."""


class Precollated(Dataset):
    """Batch ``i`` of ``batches``, already collated: fresh copies of its tensors, sent by torch as they are
    (``how=None``), in one shared block (``"one buffer"``) or as bytes (``"inline"``, :func:`hand_off`)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], how: str | None = None) -> None:
        self.batches, self.how = batches, how

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Any:
        batch = {key: value.clone() for key, value in self.batches[index].items()}
        if self.how == "one buffer":
            return one_buffer(batch)
        return hand_off(batch) if self.how == "inline" else batch


class OneBlockCollate(SeededCollate):
    """Our collate function in a worker with every batch in one shared block (``one_buffer``), never inline."""

    def __call__(self, rows: list[Any]) -> Any:
        batch = super().__call__(rows)
        return one_buffer(batch) if get_worker_info() is not None else batch


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


class WidePipe:
    """A torch loader whose pipe from the workers is widened as ours is (``widen_result_pipe``)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        iterator = iter(self.loader)
        widen_result_pipe(iterator)
        return iterator


def _collating(loader: Any, collate: type) -> Any:
    """Our loader with another collate class around its collator: ``SeededCollate`` is how it was before
    ``WorkerCollate`` (torch sends each block), ``OneBlockCollate`` always sends one shared block."""
    loader.collate_fn = collate(loader.collate_fn.collate_fn)
    return loader


def configurations(data: Any, options: dict[str, Any], memory: list[Any]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for workers in WORKERS:
        mode = {"num_workers": workers}
        runs[f"torch floor, workers={workers}"] = _torch_loader(Precollated(memory), workers)
        runs[f"torch floor, one buffer, workers={workers}"] = _torch_loader(Precollated(memory, "one buffer"), workers)
        inline = _torch_loader(Precollated(memory, "inline"), workers)
        runs[f"torch floor, inline, workers={workers}"] = WidePipe(inline)
        runs[f"ours before (torch sends each block), workers={workers}"] = _collating(ours(data, options, mode),
                                                                                    SeededCollate)
        runs[f"ours, workers={workers}"] = ours(data, options, mode)
    runs["ours, always one shared block, workers=1"] = _collating(ours(data, options, {"num_workers": 1}),
                                                                  OneBlockCollate)
    runs["torch floor, an int, workers=1"] = _torch_loader(Numbers(len(memory)), 1)
    runs["torch floor, file_system, one buffer, workers=1"] = _torch_loader(Precollated(memory, "one buffer"), 1,
                                                                           file_system_worker)
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
