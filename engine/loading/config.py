"""DataLoaderConfig: what the user asks of a loader, and the rules that turn it into DataLoader arguments."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from engine.core.rng import drawn_seed
from engine.loading.settings import LOADER_SETTINGS, check_loader_fields, loader_fields


@loader_fields
class DataLoaderConfig:
    """Options for :class:`engine.DataLoaderFactory`; ``None`` means "decide from the machine". Its fields are the
    loader settings declared in :data:`engine.loading.settings.SETTINGS` (listed below), with their checks.

    Example:
        >>> kwargs, reasons = DataLoaderConfig(batch_size=32, num_workers=0).resolve()
        >>> kwargs["prefetch_factor"], reasons["prefetch_factor"]
        (None, 'prefetching applies only with workers')
    """

    def __post_init__(self) -> None:
        check_loader_fields(self)  # each field against its declaration (numpy ints become ints)
        if self.num_threads and self.num_workers:
            raise ValueError(
                f"DataLoaderConfig.num_threads={self.num_threads} and num_workers={self.num_workers} cannot be "
                f"combined: choose threads in this process (cheap or GIL-releasing loading) or worker processes "
                f"(Python-heavy transforms), and set the other to 0"
            )
        self.seed = drawn_seed(self.seed)
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError(
                "DataLoaderConfig.persistent_workers=True needs worker processes, but num_workers=0; "
                "set num_workers > 0 or leave persistent_workers=None"
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
            "multiprocessing_context": self.multiprocessing_context if workers else None,
        }
        kwargs.update({setting.name: getattr(self, setting.name) for setting in LOADER_SETTINGS
                       if setting.loader.to_dataloader})  # passed as given (timeout)
        return kwargs, reasons
