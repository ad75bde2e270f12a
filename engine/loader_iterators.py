"""The iterators a map-style loader hands out: torchdata's, without torch's per-batch profiler range while no
profiler runs.

torch's ``DataLoader`` wraps every ``next()`` in ``record_function("enumerate(DataLoader)#...")``. With no
profiler running the range records nothing, yet entering and leaving it dispatches two profiler ops, and on the
training loop's path, with cold caches after a step, that measured about 60 us per batch here: a quarter of what the
whole ``num_workers=0`` loader costs for 64 token rows (``benchmarks/bench_loader_stages.py``). torch's own
``IterDataPipe`` skips its range the same way, by asking ``torch.autograd._profiler_enabled()`` first. While a
profiler runs (``torch.profiler.profile``, Lightning's ``PyTorchProfiler``), ``next()`` is torch's, range included.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data.dataloader import _DatasetKind
from torchdata.stateful_dataloader.stateful_dataloader import (
    _StatefulMultiProcessingDataLoaderIter,
    _StatefulSingleProcessDataLoaderIter,
)


class _WithoutIdleProfilerRange:
    """``__next__`` as torch's and torchdata's, minus the profiler range when no profiler runs (map-style data:
    an iterable dataset's length warning stays on torch's path)."""

    def __next__(self) -> Any:
        if torch.autograd._profiler_enabled() or self._dataset_kind == _DatasetKind.Iterable:
            return super().__next__()
        try:
            if self._sampler_iter is None:
                self._reset()
            data = self._next_data()
        except StopIteration:
            self._finished = True  # as torchdata's iterator marks a finished pass
            raise
        self._num_yielded += 1
        return data


class SingleProcessIterator(_WithoutIdleProfilerRange, _StatefulSingleProcessDataLoaderIter):
    """torchdata's ``num_workers=0`` iterator; see the module's docstring."""


class MultiProcessIterator(_WithoutIdleProfilerRange, _StatefulMultiProcessingDataLoaderIter):
    """torchdata's worker-process iterator; see the module's docstring."""


def loader_iterator(loader: Any) -> Any:
    """The iterator for ``loader`` (a ``StatefulDataLoader``), as its ``_get_iterator`` builds one."""
    if loader.num_workers == 0:
        iterator = SingleProcessIterator(loader, loader.next_iter_state)
    else:
        loader.check_worker_number_rationality()
        iterator = MultiProcessIterator(loader, loader.next_iter_state)
    loader.next_iter_state = None
    return iterator
