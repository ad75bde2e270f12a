"""What a training step pays for its loader: a compute-bound 10 ms step fed by each loader mode, against the same
batches already in memory.

The step is single-thread matmuls (``torch.set_num_threads(1)``), calibrated to 10 ms on this machine; the step
releases the GIL, as a real model's step does. Each configuration iterates ``steps`` batches of 64, and the
configurations take turns (alternating runs). Each pass is timed in chunks of 50 steps (20 for the anchors), and
each chunk is paired with a chunk of as many steps over the same batches already in memory, run right before or
right after it, in turn: so the two sides of a pair are at most a second apart, and the machine's drift over a
run (the step alone varies by about 6% between rounds here) cancels. Overhead of a pair = (loader chunk - memory
chunk) / memory chunk; the table shows the median over pairs and, in the note, the middle half of them (``ours
ms`` is the memory chunks' median step time scaled by that overhead). Three untimed steps before each memory
chunk let a loader with threads or workers fill its prefetch queue, so its background work is not charged to the
memory side; the few batches it prefetched then are not charged to the loader's chunk either, which
understates the background work's share by about prefetch depth / chunk (2-4 batches in 50). For
``num_workers=0`` the note splits what a step pays: the median ``next()`` right after a step, and how much longer
the step right after ``next()`` takes than the step after that one. For ``num_threads=1`` (the recommended mode) it
splits it too: the median ``next()`` right after a step (the queue hand-off, next to a bare ``queue.Queue``
hand-off between two threads, the floor of any thread on this machine); how much longer a step waits without
running than a step over batches in memory (its wall time less its thread's CPU time: the GIL, while the loader
thread runs Python); how much more CPU the step itself takes; and the loader thread's CPU per batch while the
steps run beside it.

Cases (the reference setup first): 20,000 token rows as ``List[Tensor]`` (lengths 32..512, ``TaskSpec.lm_tiny()``);
a tokenized HF Arrow dataset (lengths 16..256, a causal-LM spec); uint8 images (3x32x32, ``vision_tiny``). Ours
runs with ``num_workers`` 0, 1 and 2 and with ``num_threads=1``; the anchors are a plain ``torch`` ``DataLoader``
with ``DataCollatorWithPadding`` (text) or per-image torchvision transforms + ``default_collate`` (images), with 0
and 2 workers (timed on their first 60 steps per round, against the memory loop's time for as many). Before
timing, every mode of ours must give the batches of ``num_workers=0``, bit for bit.

Run: ``PYTHONPATH=. python -m benchmarks.bench_step_overhead [--quick] [--only tokens|arrow|images ...]`` or
``python -m benchmarks --only step_overhead``.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import DataCollatorWithPadding

from benchmarks._harness import OutputMismatch, check_same, format_table, machine, tokenizer
from benchmarks.bench_hf_epoch import SPEC as ARROW_SPEC
from benchmarks.bench_hf_epoch import build_dataset
from benchmarks.bench_vision import PerSampleFloat
from engine.datamodule.universal import UniversalDataModule
from task_spec import TaskSpec

NAME = "step_overhead"
BATCH, STEP_S = 64, 0.010
OURS = {"workers=0": {"num_workers": 0}, "workers=1": {"num_workers": 1}, "workers=2": {"num_workers": 2},
        "threads=1": {"num_threads": 1}}
ANCHOR_STEPS = 60
"""Steps per run of the anchors (the whole epoch for ours)."""
CHUNK, ANCHOR_CHUNK, SETTLE, PAIRS, ANCHOR_REPEATS = 50, 20, 3, 18, 3
"""Steps per timed chunk of ours and of the anchors, each paired with a chunk over batches in memory; untimed
memory steps before each memory chunk; pairs per configuration of ours at least (passes are repeated until
there are as many); passes of the anchors."""
RECOMMENDED = "threads=1"
"""The configuration docs/performance.md recommends for a 2-core machine (target <= 1%; <= 2% for the others)."""


def calibrate_step(seconds: float = STEP_S) -> Callable[[], None]:
    """A step of single-thread matmuls that takes about ``seconds`` here (best of a few timings)."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    best = min(_timed(lambda: [a @ a for _ in range(20)]) for _ in range(10)) / 20
    count = max(1, round(seconds / best))

    def step() -> None:
        for _ in range(count):
            torch.mm(a, a)

    return step


def _timed(function: Callable[[], Any]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def loop_seconds(batches: Iterable[Any], step: Callable[[], None], steps: int) -> float:
    """Seconds for ``steps`` training steps fed from ``batches`` (a new pass)."""
    start = time.perf_counter()
    for count, _ in enumerate(batches, 1):
        step()
        if count == steps:
            break
    return time.perf_counter() - start


class TokenRows(Dataset):
    """The anchor's view of the token rows: ``{"input_ids": tensor}`` per row, as a tokenizer would give."""

    def __init__(self, rows: list[torch.Tensor]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index]}


class ImageRows(Dataset):
    """uint8 CHW images and integer labels, one dict per row."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=generator)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"pixel_values": self.images[index], "labels": index % 4}


def token_case(rows: int) -> tuple[Any, dict[str, Any], Callable[[int], DataLoader]]:
    rng = np.random.default_rng(0)
    data = [torch.from_numpy(rng.integers(0, 50_000, int(n))) for n in rng.integers(32, 513, rows)]
    anchor_rows, collate = TokenRows(data), DataCollatorWithPadding(tokenizer())
    return data, {"task_spec": TaskSpec.lm_tiny()}, lambda workers: _anchor(anchor_rows, collate, workers)


def arrow_case(rows: int) -> tuple[Any, dict[str, Any], Callable[[int], DataLoader]]:
    ds = build_dataset(rows)
    collate = DataCollatorWithPadding(tokenizer())
    return ds, {"task_spec": ARROW_SPEC, "tokenizer": tokenizer()}, lambda workers: _anchor(ds, collate, workers)


def image_case(rows: int) -> tuple[Any, dict[str, Any], Callable[[int], DataLoader]]:
    images = ImageRows(rows)
    return images, {"task_spec": TaskSpec.vision_tiny()}, lambda workers: _anchor(images, PerSampleFloat(), workers)


def _anchor(data: Any, collate: Any, workers: int) -> DataLoader:
    return DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collate, num_workers=workers,
                      persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))


def ours(data: Any, options: dict[str, Any], mode: dict[str, int]) -> Any:
    return UniversalDataModule(data, batch_size=BATCH, seed=0, **options, **mode).train_dataloader()


def verify(loaders: dict[str, Any], reference: list[Any], steps: int) -> None:
    """Every mode of ours gives the batches of workers=0 (first ``steps`` of the first epoch), bit for bit."""
    for name, loader in loaders.items():
        for index, (batch, expected) in enumerate(zip(loader, reference, strict=False)):
            check_same(batch, expected, list(expected), f"{NAME} {name} batch {index}")
            if index + 1 == steps:
                break
        else:
            raise OutputMismatch(f"{NAME}: {name} gave fewer than {steps} batches")


def paired_overheads(loader: Any, memory: list[Any], step: Callable[[], None], steps: int,
                     chunk: int) -> tuple[list[float], list[float]]:
    """One pass of ``steps`` steps fed by ``loader``, timed in chunks of ``chunk`` steps, each paired with a chunk
    of as many steps over the same batches in ``memory`` run right before or right after it (in turn, so a steady
    drift of the machine cancels). Before each memory chunk, ``SETTLE`` untimed steps let the loader fill its
    prefetch queue, so its background work is not charged to the memory chunk. Returns the overhead of each pair
    and the memory chunks' seconds per step."""
    batches, overheads, memory_steps = iter(loader), [], []
    for pair, first in enumerate(range(0, steps, chunk)):
        count = min(chunk, steps - first)
        if pair % 2:
            loader_s = loop_seconds(batches, step, count)
            memory_s = _memory_chunk(memory, first, count, step)
        else:
            memory_s = _memory_chunk(memory, first, count, step)
            loader_s = loop_seconds(batches, step, count)
        overheads.append((loader_s - memory_s) / memory_s)
        memory_steps.append(memory_s / count)
    return overheads, memory_steps


def _memory_chunk(memory: list[Any], first: int, count: int, step: Callable[[], None]) -> float:
    """Seconds of ``count`` steps over ``memory[first:]``, after ``SETTLE`` untimed ones."""
    loop_seconds(memory[:SETTLE], step, SETTLE)
    return loop_seconds(memory[first:first + count], step, count)


def where_it_goes(loader: Any, step: Callable[[], None], steps: int) -> tuple[float, float]:
    """For a ``num_workers=0`` loader, what a step pays split in two, over one pass: the median ``next()`` right
    after a step, and the median excess of a step right after ``next()`` over the next step right after it (the
    batch's cache pollution)."""
    batches, waits, excess = iter(loader), [], []
    for _ in range(steps):
        start = time.perf_counter()
        if next(batches, None) is None:
            break
        fetched = time.perf_counter()
        step()
        first = time.perf_counter()
        step()
        waits.append(fetched - start)
        excess.append((first - fetched) - (time.perf_counter() - first))
    return float(np.median(waits)), float(np.median(excess))


def where_the_thread_goes(loader: Any, memory: list[Any], step: Callable[[], None]) -> dict[str, float]:
    """For a ``num_threads=1`` loader, what a step pays, over one pass; each step fed by the loader is followed by a
    step over a batch in ``memory`` (nothing fetched, the loader thread idle with its queue full), and the two are
    compared pair by pair so the machine's drift cancels. Medians, in seconds (the thread builds one batch per step,
    so a median step is a typical one, and a vCPU taken away for a while does not count): ``next`` (right after a
    step: the queue hand-off); ``wait`` (how much more the step waits without running, its wall time less its
    thread's CPU time: the GIL, while the loader thread runs Python); ``cpu`` (how much more CPU the step itself
    takes: the loader thread's work beside it slowing the step's); and ``thread`` (the loader thread's CPU per batch
    while the steps run: the process's CPU less the stepping thread's)."""

    def timed_step() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        step()
        cpu = time.thread_time() - cpu
        return time.perf_counter() - wall - cpu, cpu

    fetches, waits, cpus = [], [], []
    process, own = time.process_time(), time.thread_time()
    iterator = iter(loader)
    for _ in memory:
        start = time.perf_counter()
        if next(iterator, None) is None:
            break
        fetches.append(time.perf_counter() - start)
        (wait, cpu), (memory_wait, memory_cpu) = timed_step(), timed_step()
        waits.append(wait - memory_wait)
        cpus.append(cpu - memory_cpu)
    thread = ((time.process_time() - process) - (time.thread_time() - own)) / len(fetches)
    return {"next": float(np.median(fetches)), "wait": float(np.median(waits)), "cpu": float(np.median(cpus)),
            "thread": thread}


def bare_handoff(step: Callable[[], None], steps: int) -> float:
    """The floor of any thread hand-off here: the median ``queue.Queue.get`` right after a step, of an item a
    producer thread put there (nothing built, nothing else running)."""
    handed: queue.Queue[int] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                handed.put(0, timeout=0.01)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    waits = []
    for _ in range(steps):
        step()
        start = time.perf_counter()
        handed.get()
        waits.append(time.perf_counter() - start)
    stop.set()
    producer.join()
    return float(np.median(waits))


def measure(case: str, data: Any, options: dict[str, Any], anchor: Callable[[int], DataLoader], *, steps: int,
            repeats: int, step: Callable[[], None]) -> list[dict[str, Any]]:
    loaders = {name: ours(data, options, mode) for name, mode in OURS.items()}
    memory = [batch for _, batch in zip(range(steps), ours(data, options, {"num_workers": 0}))]
    verify(loaders, memory, min(steps, 8))
    runs: dict[str, Any] = {**loaders, "anchor workers=0": anchor(0), "anchor workers=2": anchor(2)}
    for loader in runs.values():  # worker start-up and first passes are not part of a step's cost
        loop_seconds(loader, lambda: None, 2)
    # the anchors are many times slower: they run fewer steps, in shorter chunks
    overheads: dict[str, list[float]] = {name: [] for name in runs}
    memory_steps: list[float] = []
    for repeat in range(repeats):  # alternating: each configuration once per round
        for name, loader in runs.items():
            anchor_run = name.startswith("anchor")
            if anchor_run and repeat >= ANCHOR_REPEATS:
                continue
            pairs, per_step = paired_overheads(loader, memory, step, min(steps, ANCHOR_STEPS) if anchor_run else steps,
                                               ANCHOR_CHUNK if anchor_run else CHUNK)
            overheads[name] += pairs
            memory_steps += per_step
    base = float(np.median(memory_steps))
    wait, excess = where_it_goes(loaders["workers=0"], step, steps)
    thread = where_the_thread_goes(loaders[RECOMMENDED], memory, step)
    floor = bare_handoff(step, min(steps, 100))
    where = {  # what a step pays, split, for the modes where it can be
        "workers=0": f"; next() after a step {wait * 1e3:.2f} ms, the step after it {excess * 1e3:+.2f} ms",
        RECOMMENDED: f"; next() after a step {thread['next'] * 1e3:.2f} ms (a bare queue.Queue hand-off: "
                     f"{floor * 1e3:.2f} ms), the step waits {thread['wait'] * 1e3:+.2f} ms and computes "
                     f"{thread['cpu'] * 1e3:+.2f} ms, the thread's CPU {thread['thread'] * 1e3:.2f} ms per batch",
    }
    rows = []
    for name, pairs in overheads.items():
        overhead = float(np.median(pairs)) * 100  # the median over pairs: a burst of load hits few of them
        seconds = base * (1 + overhead / 100)
        target = None if name.startswith("anchor") else (1.0 if name == RECOMMENDED else 2.0)
        rows.append({
            "benchmark": NAME, "case": f"{case}, {name}", "anchor": "batches in memory",
            "anchor_ms": base * 1e3, "ours_ms": seconds * 1e3, "ratio": base / seconds,
            "throughput": f"{overhead:+.1f}% ({(seconds - base) * 1e3:+.2f} ms/step)",
            "target": None if target is None else f"overhead <= {target:g}%",
            "met": None if target is None else bool(overhead <= target),
            "note": f"{len(pairs)} pairs, middle half {np.percentile(pairs, 25) * 100:+.1f}.."
                    f"{np.percentile(pairs, 75) * 100:+.1f}%" + where.get(name, ""),
        })
    return rows


CASES = {"tokens": ("tokens List[Tensor]", token_case), "arrow": ("HF Arrow", arrow_case),
         "images": ("images uint8", image_case)}
"""``--only`` name -> (case, builder)."""


def run(quick: bool = False, only: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the table for every case, or for the cases named in ``only`` (keys of :data:`CASES`)."""
    sizes = {"tokens": 4_000, "arrow": 3_200, "images": 3_200} if quick else \
        {"tokens": 20_000, "arrow": 6_400, "images": 6_400}
    names = list(CASES) if only is None else list(only)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise ValueError(f"only should name cases among {list(CASES)}, but got {unknown}")
    out = []
    for name in names:
        (case, build), rows = CASES[name], sizes[name]
        data, options, anchor = build(rows)
        step = calibrate_step()  # per case: the load of a shared machine changes what 10 ms of matmuls is
        steps = rows // BATCH
        repeats = ANCHOR_REPEATS if quick else max(ANCHOR_REPEATS, -(-PAIRS // -(-steps // CHUNK)))
        out += measure(case, data, options, anchor, steps=steps, repeats=repeats, step=step)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows")
    parser.add_argument("--only", action="append", choices=list(CASES), help="run only this case (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("\n".join(machine()))
    print(format_table(run(quick=args.quick, only=args.only)))
