"""DataLoaderConfig: what the user asks of a loader, and the rules that turn it into DataLoader arguments."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.checks import check_int
from engine.core.rng import drawn_seed


@dataclass
class DataLoaderConfig:
    """Options for :class:`engine.DataLoaderFactory`; ``None`` means "decide from the machine".

    Example:
        >>> kwargs, reasons = DataLoaderConfig(batch_size=32, num_workers=0).resolve()
        >>> kwargs["prefetch_factor"], reasons["prefetch_factor"]
        (None, 'prefetching applies only with workers')
    """

    batch_size: int = 32
    """Rows per batch."""
    shuffle: bool = False
    """Seeded shuffle with a new order each epoch (derived from ``seed`` and the epoch)."""
    num_workers: int = 0
    """Worker processes; 0 loads in the main process."""
    pin_memory: bool | None = None
    """Page-locked host memory for faster GPU copies; None means "when CUDA is available"."""
    prefetch_factor: int | None = 2
    """Batches each worker prepares ahead; applies only with workers."""
    persistent_workers: bool | None = None
    """Keep workers between epochs; None means "when num_workers > 0"."""
    seed: int | None = 0
    """Seed of the shuffle, of per-batch randomness and of workers. None draws one (``secrets.randbits(31)``) when
    the config is made and records it here, so ``config.seed`` always says the seed in use."""
    collate_fn: Callable[..., Any] | None = None
    """Turns a list of rows into a batch; None uses the default collator."""
    drop_last: bool = False
    """Drop the last incomplete batch."""
    timeout: float = 0
    """Seconds to wait for a batch from workers (0 waits forever)."""
    multiprocessing_context: str | None = None
    """'fork', 'spawn' or 'forkserver'; None uses the platform default."""
    num_threads: int = 0
    """Background threads of this process that fetch and collate the next batches while the step runs (a
    ``torchdata.nodes`` pipeline, the :class:`engine.loading.pipeline.Threads` executor); 0 loads on the step's
    path. For work that is cheap or releases the GIL; not combined with ``num_workers``."""

    def __post_init__(self) -> None:
        self.batch_size = check_int("batch_size", self.batch_size, minimum=1)  # numpy ints become ints
        self.num_workers = check_int("num_workers", self.num_workers, minimum=0)
        self.num_threads = check_int("num_threads", self.num_threads, minimum=0)
        if self.num_threads and self.num_workers:
            raise ValueError(
                f"DataLoaderConfig.num_threads={self.num_threads} and num_workers={self.num_workers} cannot be "
                f"combined: choose threads in this process (cheap or GIL-releasing loading) or worker processes "
                f"(Python-heavy transforms), and set the other to 0"
            )
        if self.prefetch_factor is not None:
            self.prefetch_factor = check_int("prefetch_factor", self.prefetch_factor, minimum=1)
        self.seed = drawn_seed(self.seed)
        for name in ("shuffle", "drop_last"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"DataLoaderConfig.{name} should be a bool, but got {name}={getattr(self, name)!r}")
        for name in ("pin_memory", "persistent_workers"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"DataLoaderConfig.{name} should be True, False or None (auto), but got {value!r}")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError(
                "DataLoaderConfig.persistent_workers=True needs worker processes, but num_workers=0; "
                "set num_workers > 0 or leave persistent_workers=None"
            )
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise TypeError(f"DataLoaderConfig.collate_fn should be callable, but got {self.collate_fn!r}")
        if not isinstance(self.timeout, (int, float)) or self.timeout < 0:
            raise ValueError(f"DataLoaderConfig.timeout should be a number >= 0, but got timeout={self.timeout!r}")
        contexts = ("fork", "spawn", "forkserver")
        if self.multiprocessing_context is not None and self.multiprocessing_context not in contexts:
            raise ValueError(
                f"DataLoaderConfig.multiprocessing_context should be one of {contexts} or None, "
                f"but got {self.multiprocessing_context!r}"
            )

    def resolve(self) -> tuple[dict[str, Any], dict[str, str]]:
        """DataLoader keyword arguments after the automatic rules, and the reason for each choice."""
        reasons: dict[str, str] = {}
        workers = self.num_workers > 0
        cuda = torch.cuda.is_available()
        if self.pin_memory is None:
            pin_memory = cuda
            reasons["pin_memory"] = "CUDA is available" if cuda else "no CUDA device, pinning would not help"
        elif self.pin_memory and not cuda:
            pin_memory = False
            reasons["pin_memory"] = "pin_memory=True was asked, but there is no CUDA device; not pinning"
            warnings.warn(reasons["pin_memory"], UserWarning, stacklevel=3)
        else:
            pin_memory = self.pin_memory
            reasons["pin_memory"] = f"pin_memory={self.pin_memory} was given"
        if self.persistent_workers is None:
            persistent = workers
            reasons["persistent_workers"] = (
                "workers are kept between epochs" if workers else "no workers to keep"
            )
        else:
            persistent = self.persistent_workers
            reasons["persistent_workers"] = f"persistent_workers={persistent} was given"
        prefetch = self.prefetch_factor if workers else None
        reasons["prefetch_factor"] = (
            f"each worker prepares {prefetch} batches ahead" if workers
            else f"each thread prepares {self.prefetch_factor or 2} batches ahead" if self.num_threads
            else "prefetching applies only with workers"
        )
        reasons["num_threads"] = (
            f"{self.num_threads} background thread(s) of this process fetch and collate ahead of the step"
            if self.num_threads else "batches are loaded on the step's path" if not workers
            else "worker processes load the batches")
        kwargs = {
            "num_workers": self.num_workers,
            "pin_memory": pin_memory,
            "persistent_workers": persistent,
            "prefetch_factor": prefetch,
            "timeout": self.timeout,
            "multiprocessing_context": self.multiprocessing_context if workers else None,
        }
        return kwargs, reasons



