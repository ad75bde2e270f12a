"""Choose the loading mode by measuring: load real batches with each candidate and keep the fastest.

Rules of thumb (75% of the cores, 4 per GPU) guess from the machine; the right mode depends on what one row
costs to read and collate, and on the step it feeds, which only the user's dataset, collator and model can tell.
The candidates are worker processes (``num_workers``) and background threads of this process (``num_threads``).
Each gets a fresh engine loader (``DataLoaderFactory``); worker start-up and the first ``warmup_batches`` are left
out of the timing, because persistent workers pay them once per run, not per batch. Given ``step_s``, every batch
is followed by a step of that length (a sleep, which releases the GIL as a model's step does), so what is measured
is what loading adds to a step, not how fast the loader runs alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.checks import check_int
from engine.core.compat import shutdown_workers, shuts_down_workers
from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory
from engine.tools.monitor import batch_counts


@dataclass(frozen=True)
class WorkerMeasurement:
    """Throughput of one worker count."""

    num_workers: int
    batches: int
    """Batches timed (after warm-up)."""
    samples: int
    seconds: float
    startup_s: float
    """Time to the first batch (worker start-up and first fetch); not part of the throughput."""
    num_threads: int = 0
    """Background threads of this process (0: worker processes, or none)."""
    step_s: float = 0.0
    """The simulated step after each batch, included in ``seconds``."""

    @property
    def mode(self) -> str:
        """``'num_threads=N'`` or ``'num_workers=N'``."""
        return f"num_threads={self.num_threads}" if self.num_threads else f"num_workers={self.num_workers}"

    @property
    def loading_per_batch_s(self) -> float:
        """Seconds per batch beyond the step: what loading costs the training loop."""
        return self.seconds / self.batches - self.step_s if self.batches else float("inf")

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class WorkerRecommendation:
    """The fastest measured mode and the tables it was chosen from."""

    num_workers: int
    """Worker processes of the chosen mode (0 when threads or the main process won)."""
    table: dict[int, WorkerMeasurement]
    """Each worker-count candidate's measurement, in the order measured."""
    reason: str
    num_threads: int = 0
    """Background threads of the chosen mode (0 unless threads won)."""
    threads_table: dict[int, WorkerMeasurement] = field(default_factory=dict)
    """Each thread-count candidate's measurement."""

    @property
    def measurements(self) -> list[WorkerMeasurement]:
        """Every candidate's measurement: worker counts, then thread counts."""
        return [*self.table.values(), *self.threads_table.values()]

    @property
    def mode(self) -> str:
        """The chosen mode, ``'num_threads=N'`` or ``'num_workers=N'``."""
        return f"num_threads={self.num_threads}" if self.num_threads else f"num_workers={self.num_workers}"

    @property
    def loader_options(self) -> dict[str, int]:
        """``{'num_workers': ..., 'num_threads': ...}`` to pass to ``UniversalDataModule`` or ``DataLoaderConfig``."""
        return {"num_workers": self.num_workers, "num_threads": self.num_threads}

    def __str__(self) -> str:
        rows = [f"  {m.mode:>14}: {m.samples_per_s:10.1f} samples/s  {m.batches_per_s:8.1f} batches/s  "
                f"{m.loading_per_batch_s * 1e3:7.3f} ms loading/batch  (startup {m.startup_s:.2f}s, {m.batches} "
                f"batches)" for m in self.measurements]
        return "\n".join([f"{self.mode}: {self.reason}", *rows])


def _from_module(module: Any) -> tuple[Any, Any, DataLoaderConfig | None]:
    """Train data, collator and train config of a data module (its ``datasets['train']`` after setup)."""
    module.setup()
    datasets = getattr(module, "datasets", {}) or {}
    if "train" not in datasets:
        raise ValueError("recommend_num_workers measures the training data, but the data module has none; pass "
                         "train_data=... or give the dataset directly")
    return datasets["train"], getattr(module, "collator", None), getattr(module, "train_config", None)


def measure_workers(dataset: Any, config: DataLoaderConfig, *, max_batches: int, warmup_batches: int,
                    step_s: float = 0.0) -> WorkerMeasurement:
    """Time ``max_batches`` batches of a fresh loader built from ``config``, after ``warmup_batches``; with
    ``step_s``, each batch is followed by a GIL-releasing pause of that length (the step it feeds)."""
    loader = DataLoaderFactory().create_dataloader(dataset, config)
    start = time.perf_counter()
    iterator = iter(loader)
    try:
        total = len(loader)
    except TypeError:
        total = None
    # A short epoch must still leave batches to time: warm up on at most all but one of them.
    warmup = max(1, min(warmup_batches, total - 1)) if total is not None and total > 1 else 1
    batches = samples = 0
    try:
        for _ in range(warmup):
            next(iterator, None)
        startup = time.perf_counter() - start
        timed_from = time.perf_counter()
        for batch in iterator:
            batches += 1
            samples += batch_counts(batch)[0]
            if step_s:
                time.sleep(step_s)
            if batches >= max_batches:
                break
        seconds = time.perf_counter() - timed_from
    finally:
        if shuts_down_workers(iterator):
            shutdown_workers(iterator)
        elif callable(getattr(iterator, "close", None)):  # a thread loader's pass
            iterator.close()
    return WorkerMeasurement(config.num_workers, batches, samples, seconds, startup, config.num_threads, step_s)


def recommend_num_workers(
    dataset_or_module: Any,
    collate_fn: Any = None,
    candidates: tuple[int, ...] = (0, 1, 2, 4),
    *,
    threads: tuple[int, ...] = (1,),
    step_s: float | None = None,
    batch_size: int | None = None,
    max_batches: int = 20,
    warmup_batches: int = 2,
    seed: int = 0,
) -> WorkerRecommendation:
    """Measure each loading mode (worker counts and thread counts) on your data and return the fastest.

    Args:
        dataset_or_module: A dataset (anything the engine loads) or a data module, whose training split,
            collator and batch size are used.
        collate_fn: The collator to time (for a module, its own one unless given).
        candidates: Worker counts to try (distinct ints >= 0).
        threads: Thread counts to try (``num_threads``, distinct ints >= 1); ``()`` measures workers only.
        step_s: Seconds of your training step. Given, each batch is followed by a pause of that length and the
            mode that adds least to a step wins; None times the loaders alone (highest samples/s wins).
        batch_size: Rows per batch; None takes the module's, else 32.
        max_batches: Batches timed per candidate, after warm-up. More gives steadier numbers.
        warmup_batches: Batches fetched (worker start-up included) before timing starts.
        seed: Seed of the shuffled order used for the measurement.

    Returns:
        A :class:`WorkerRecommendation`: its ``loader_options`` (``num_workers``, ``num_threads``) are the best of
        its ``measurements``; on a tie, the mode with fewer processes and threads.

    Example:
        >>> import torch
        >>> result = recommend_num_workers([torch.ones(4)] * 64, candidates=(0,), threads=(1,), batch_size=8,
        ...                                max_batches=2)
        >>> sorted(result.loader_options), list(result.table), list(result.threads_table)
        (['num_threads', 'num_workers'], [0], [1])
    """
    if not candidates or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in candidates):
        raise ValueError(f"candidates should be a non-empty tuple of ints >= 0, but got candidates={candidates!r}")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates should be distinct, but got candidates={candidates!r}")
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in threads) or len(set(threads)) != len(
            threads):
        raise ValueError(f"threads should be a tuple of distinct ints >= 1 (or () for none), but got "
                         f"threads={threads!r}")
    if step_s is not None and (isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or step_s < 0):
        raise ValueError(f"step_s should be the seconds of a training step (a number >= 0) or None, but got "
                         f"step_s={step_s!r}")
    check_int("max_batches", max_batches, minimum=1)
    children = getattr(dataset_or_module, "children", None)
    if children:  # several named datasets share the loader setting: the mode the most demanding child needs
        results = {name: recommend_num_workers(child, collate_fn, candidates, threads=threads, step_s=step_s,
                                               batch_size=batch_size, max_batches=max_batches,
                                               warmup_batches=warmup_batches, seed=seed)
                   for name, child in children.items()}
        name, best = max(results.items(), key=lambda item: (item[1].num_workers, item[1].num_threads))
        others = ", ".join(f"{other}: {result.mode}" for other, result in results.items())
        return WorkerRecommendation(best.num_workers, best.table,
                                    f"the most any named dataset needs ({others}); {name}: {best.reason}",
                                    best.num_threads, best.threads_table)
    dataset, base = dataset_or_module, None
    if callable(getattr(dataset_or_module, "train_dataloader", None)):
        dataset, own_collate, base = _from_module(dataset_or_module)
        collate_fn = collate_fn if collate_fn is not None else own_collate
    size = batch_size if batch_size is not None else (base.batch_size if base is not None else 32)

    def measure(workers: int, num_threads: int) -> WorkerMeasurement:
        config = DataLoaderConfig(
            batch_size=size, num_workers=workers, num_threads=num_threads, shuffle=True, seed=seed,
            collate_fn=collate_fn, pin_memory=base.pin_memory if base is not None else None,
            prefetch_factor=(base.prefetch_factor if base is not None else None) or 2,
            persistent_workers=False if workers else None,
        )
        return measure_workers(dataset, config, max_batches=max_batches, warmup_batches=warmup_batches,
                               step_s=step_s or 0.0)

    table = {workers: measure(workers, 0) for workers in candidates}
    threads_table = {count: measure(0, count) for count in threads}
    measured = [m for m in (*table.values(), *threads_table.values()) if m.batches]
    if not measured:
        raise ValueError(f"the data gives too few batches of {size} rows to time after warm-up; pass a smaller "
                         f"batch_size or more rows")
    best = _best(measured, step_s)
    return WorkerRecommendation(best.num_workers, table, _reason(best, measured, step_s), best.num_threads,
                                threads_table)


def _best(measured: list[WorkerMeasurement], step_s: float | None) -> WorkerMeasurement:
    """Least loading per step (with a step) or most samples/s; ties go to fewer processes, then fewer threads."""
    return max(measured, key=lambda m: (-m.loading_per_batch_s if step_s is not None else m.samples_per_s,
                                        -m.num_workers, -m.num_threads))


def _reason(best: WorkerMeasurement, measured: list[WorkerMeasurement], step_s: float | None) -> str:
    if step_s is not None:
        reason = (f"adds the least to a {step_s * 1e3:.1f} ms step ({best.loading_per_batch_s * 1e3:.3f} ms per "
                  f"batch) of {len(measured)} modes measured on this data and collator")
    else:
        reason = (f"highest measured throughput ({best.samples_per_s:.1f} samples/s) of {len(measured)} modes "
                  f"measured on this data and collator")
    if best.num_threads:
        reason += "; threads prepare batches in this process while the step runs, with no per-batch process hand-off"
    elif best.num_workers:
        reason += "; reading and collating a batch costs more than handing it over from a worker process"
    else:
        reason += "; loading on the step's path costs less here than handing batches over from threads or processes"
    cores = os.cpu_count() or 1
    if best.num_workers > cores:
        reason += f"; more workers than the {cores} CPU cores seen here"
    return reason
