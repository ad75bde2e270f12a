"""The iterators a map-style loader hands out (``num_workers=0`` and worker processes): torchdata's, without
torch's per-batch profiler range while no profiler runs.

torch's ``DataLoader`` wraps every ``next()`` in ``record_function("enumerate(DataLoader)#...")``. With no
profiler running the range records nothing, yet entering and leaving it dispatches two profiler ops, and on the
training loop's path, with cold caches after a step, those are two cold calls per batch beside the loader's own
work (``benchmarks/bench_loader_stages.py`` times the whole loader). torch's own
``IterDataPipe`` skips its range the same way, by asking ``torch.autograd._profiler_enabled()`` first. While a
profiler runs (``torch.profiler.profile``, Lightning's ``PyTorchProfiler``), ``next()`` is torch's, range included.

With worker processes, torchdata also snapshots the sampler's state in this process for every batch it sends
(``snapshot_every_n_steps=1``). It asks ``isinstance(obj, Stateful)`` of the sampler and of its iterator, and on
Python 3.11 a check against a runtime-checkable protocol walks the protocol's attributes twice per call, for every
batch. The same test is made here by looking the two methods up.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data.dataloader import _DatasetKind
from torchdata.stateful_dataloader.stateful_dataloader import (
    _INDEX_SAMPLER_STATE,
    _ITERABLEDATASET_LEN_CALLED,
    _SAMPLER_ITER_STATE,
    _SAMPLER_ITER_YIELDED,
    _SHARED_SEED,
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

    def _get_main_state(self) -> dict[str, Any]:
        """torchdata's snapshot of this process's part of the state, with the same content."""
        return {
            self._NUM_WORKERS: self._num_workers,
            _SAMPLER_ITER_STATE: state_of(self._sampler_iter),
            _INDEX_SAMPLER_STATE: state_of(self._index_sampler),
            _SAMPLER_ITER_YIELDED: self._sampler_iter_yielded,
            _ITERABLEDATASET_LEN_CALLED: self._IterableDataset_len_called,
            _SHARED_SEED: self._shared_seed,
            self._BASE_SEED: self._base_seed,
        }


def state_of(obj: Any) -> dict[str, Any] | None:
    """``obj.state_dict()`` when ``obj`` has ``state_dict`` and ``load_state_dict`` (what ``isinstance(obj,
    Stateful)`` tests: both attributes present and not None), else None, as torchdata's ``try_to_serialize``."""
    if getattr(obj, "state_dict", None) is None or getattr(obj, "load_state_dict", None) is None:
        return None
    return obj.state_dict()


def loader_iterator(loader: Any) -> Any:
    """The iterator for ``loader`` (a ``StatefulDataLoader``), as its ``_get_iterator`` builds one."""
    if loader.num_workers == 0:
        iterator = SingleProcessIterator(loader, loader.next_iter_state)
    else:
        loader.check_worker_number_rationality()
        iterator = MultiProcessIterator(loader, loader.next_iter_state)
    loader.next_iter_state = None
    return iterator
