"""Loader overhead in a training loop: a simulated 10 ms step, our loader against batches already in memory.

The loop is ``for batch in loader: time.sleep(0.01)``; the same loop over a list of pre-built batches is the
anchor. Overhead = (loop with the loader - loop over memory) / loop over memory, from the best of several
epochs each (persistent workers, so epochs after the first: worker start-up is reported apart). Data: a
tokenized HF dataset (lengths 16..256), batch 64, causal-LM collation from Arrow columns.
Before timing, the workers=2 loader must give the same batches as the workers=0 loader of the same seed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from benchmarks._harness import OutputMismatch, check_same, result
from benchmarks.bench_hf_epoch import SPEC, build_dataset
from engine.datamodule.universal import UniversalDataModule

NAME = "loader_overhead"
BATCH, STEP_S, WORKERS = 64, 0.01, 2


def loop_seconds(batches: Iterable[Any]) -> float:
    start = time.perf_counter()
    for _ in batches:
        time.sleep(STEP_S)  # the training step
    return time.perf_counter() - start


def loader(ds: Any, workers: int) -> Any:
    module = UniversalDataModule(ds, task_spec=SPEC, batch_size=BATCH, num_workers=workers, seed=0,
                                 collator_kwargs={"pad_token_id": 0})
    return module.train_dataloader()


def verify(ds: Any) -> None:
    """Worker count changes nothing: the first epoch with 2 workers equals the one with none, batch by batch."""
    for index, (single, multi) in enumerate(zip(loader(ds, 0), loader(ds, WORKERS), strict=True)):
        if single.keys() != multi.keys():
            raise OutputMismatch(f"{NAME}: batch {index} keys differ between workers=0 and workers={WORKERS}")
        check_same(multi, single, list(single), f"{NAME} batch {index} (workers={WORKERS} vs 0)")


def run(quick: bool = False) -> list[dict[str, Any]]:
    steps, repeats = (60, 2) if quick else (150, 4)
    ds = build_dataset(steps * BATCH)
    verify(ds)
    out = []
    for workers in (WORKERS, 0):
        ours = loader(ds, workers)
        start = time.perf_counter()
        first = next(iter(ours))
        startup = time.perf_counter() - start
        del first
        memory = list(ours)  # an epoch's batches, pre-built
        ours_s = min(loop_seconds(ours) for _ in range(repeats))
        anchor_s = min(loop_seconds(memory) for _ in range(repeats))
        overhead = (ours_s - anchor_s) / anchor_s * 100
        per_step = (ours_s - anchor_s) / len(memory) * 1e3
        row = result(NAME, f"10 ms step, batch {BATCH}, workers={workers}", anchor="pre-built batches in memory",
                     anchor_s=anchor_s / len(memory), ours_s=ours_s / len(memory), target="overhead < 2%",
                     note=f"overhead {overhead:.1f}% ({per_step:.2f} ms/step over {len(memory)} steps); "
                          f"first batch {startup * 1e3:.0f} ms")
        row["met"] = overhead < 2.0
        if workers == 0:
            row.update(target="-", met=None, note=row["note"] + "; no workers: collation is on the step's path")
        out.append(row)
        del ours
    return out
