"""The one module that touches the internals of torch, torchdata and Lightning.

Everything else in the engine uses these small functions, so a new library version is checked in one place.
Each says what it reaches into, why the public API does not do it, and the versions it was checked against:
torch 2.9, torchdata 0.11, Lightning 2.6 (the ranges in ``pyproject.toml``, enforced by :func:`check_versions`:
torch's and torchdata's when this module is imported, Lightning's where it is imported, by :func:`lightning`).
The collators' use of torch's ``collate(..., collate_fn_map=...)``, the extension point torch's ``default_collate``
documents, stays in ``collators/default.py``: collators sit below the engine.
"""

from __future__ import annotations

from importlib import metadata
from types import ModuleType
from typing import Any

import torch
from packaging.version import Version
from torch.utils.data import _utils as torch_data_utils

SUPPORTED: dict[str, tuple[str, str]] = {
    "torch": ("2.9", "2.10"),
    "torchdata": ("0.11", "0.12"),
    "lightning": ("2.6", "2.7"),
}
"""``package -> (lowest supported, first unsupported)`` release: the versions the functions below were checked
against, and the ranges ``pyproject.toml`` declares."""


def check_versions(installed: dict[str, str] | None = None, packages: tuple[str, ...] = tuple(SUPPORTED)) -> None:
    """Raise ImportError when one of ``packages`` (torch, torchdata, Lightning) is outside the supported range,
    naming the package, its version and the range, rather than risk a silent misbehaviour in the internals used
    here."""
    for package in packages:
        low, high = SUPPORTED[package]
        version = (installed or {}).get(package) or metadata.version(package)
        release = Version(Version(version).base_version)
        if not Version(low) <= release < Version(high):
            raise ImportError(f"{package} {version} is not supported: this engine needs {package}>={low},<{high} "
                              f"(it relies on internals checked against those releases); install a supported "
                              f"version, e.g. pip install '{package}>={low},<{high}'")


check_versions(packages=("torch", "torchdata"))  # every loader uses both; Lightning is checked where imported


def lightning() -> ModuleType:
    """The ``lightning`` package, after refusing an unsupported version. The modules whose classes subclass
    Lightning's (``UniversalDataModule``, ``MultiDataModule``, the callbacks) import it through here, so Lightning
    is imported, and checked, only where it is used: a plain loop that never reads those names never imports it."""
    check_versions(packages=("lightning",))
    import lightning as lightning_package

    return lightning_package

# --- torch's DataLoader iterators -------------------------------------------------------------------------------


def _worker_iterator_class() -> type:
    from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter

    return _StatefulMultiProcessingDataLoaderIter


class WorkerProcessIterator(_worker_iterator_class()):  # type: ignore[misc]
    """torchdata's iterator over worker processes, whose shutdown does not wait on workers it can no longer reach.

    An iterator that a garbage collection finds in a reference cycle (a kept traceback, a notebook's last error)
    has its index queues finalized before its own ``__del__`` runs: the "stop" it then sends its workers never
    leaves the process, and torch waits 5 s per worker before killing them, in whatever code triggered the
    collection. Such workers are idle (the pass was dropped): they are stopped at once instead. torchdata 0.11:
    ``_workers``, ``_index_queues`` (``multiprocessing.Queue._close``, the finalizer of its feeder thread),
    ``_shutdown``, ``_worker_pids_set`` and ``_utils.python_exit_status``."""

    def _shutdown_workers(self) -> None:
        # torch's module, imported with this one: an import here fails once the interpreter is shutting down
        if not self._shutdown and torch_data_utils.python_exit_status is False:
            cut_off = [worker for worker, queue in zip(self._workers, self._index_queues)
                       if not _feeds(queue) and worker.is_alive()]
            if cut_off:
                unregister_worker_pids(self)  # torch's SIGCHLD handler would raise for them wherever the GC ran
                for worker in cut_off:
                    worker.terminate()
        super()._shutdown_workers()


class BuildsWorkerProcessIterators:
    """Mixin of a ``StatefulDataLoader`` subclass: its iterator over worker processes is a
    :class:`WorkerProcessIterator`, built from the loader's pending state as torchdata builds its own. torchdata
    0.11: ``_get_iterator``, ``next_iter_state``, ``check_worker_number_rationality``."""

    def _get_iterator(self) -> Any:
        if not self.num_workers:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        iterator = WorkerProcessIterator(self, self.next_iter_state)
        self.next_iter_state = None
        return iterator


def _feeds(queue: Any) -> bool:
    """Whether a put on ``queue`` still reaches its reader: its feeder thread was never started, or was not
    finalized. Python 3.11: ``multiprocessing.Queue._close``, a ``util.Finalize``."""
    close = getattr(queue, "_close", None)
    return close is None or close.still_active()


class WatchesItsIterator:
    """Mixin of a ``DataLoader`` subclass: ``_iterator`` (the DataLoader's slot for its live iterator, which
    Lightning sets to None at the end of ``fit``) as a property, so the loader sees its pass dropped and can keep
    the position in :meth:`_dropped`. torch 2.9: ``DataLoader.__iter__`` and Lightning 2.6 read and write
    ``loader._iterator``."""

    @property
    def _iterator(self) -> Any:
        return self.__dict__.get("_live_iterator")

    @_iterator.setter
    def _iterator(self, iterator: Any) -> None:
        current = self.__dict__.get("_live_iterator")
        if iterator is None and current is not None:
            self._dropped(current)
        self.__dict__["_live_iterator"] = iterator

    def _dropped(self, iterator: Any) -> None:
        raise NotImplementedError


def live_iterator(loader: Any) -> Any:
    """The loader's live iterator (its persistent workers' pass), or None. torch 2.9: ``DataLoader._iterator``."""
    return getattr(loader, "_iterator", None)


def forget_iterator(loader: Any) -> None:
    """Make the loader's next ``iter()`` start a new iterator (and new workers). torch 2.9: ``_iterator = None``."""
    loader._iterator = None


def worker_processes(iterator: Any) -> list[Any]:
    """The worker processes of a loader iterator (none without workers). torch 2.9: ``_workers``."""
    return list(getattr(iterator, "_workers", None) or [])


def raised_in_worker(error: BaseException) -> bool:
    """Whether ``error`` is a worker's own exception that the loader raised again in this process (the worker
    lives on). torch 2.9: ``ExceptionWrapper.reraise`` writes "Caught <type> in DataLoader worker process <n>"."""
    return str(error).startswith("Caught ") and "in DataLoader worker process" in str(error).split("\n", 1)[0]


def shuts_down_workers(candidate: Any) -> bool:
    """Whether ``candidate`` is a loader iterator that can shut its workers down. torch 2.9: ``_shutdown_workers``."""
    return callable(getattr(candidate, "_shutdown_workers", None))


def shutdown_workers(iterator: Any, *, after_a_death: bool = False) -> None:
    """Stop the iterator's workers now. ``after_a_death``: their pids are unregistered first from torch's SIGCHLD
    handler (which raises for a dead registered worker wherever the main thread is). torch 2.9:
    ``_worker_pids_set``, ``signal_handling._remove_worker_pids`` and ``_shutdown_workers``."""
    if after_a_death:
        unregister_worker_pids(iterator)
    if shuts_down_workers(iterator):
        iterator._shutdown_workers()


def unregister_worker_pids(iterator: Any) -> None:
    """Take the iterator's worker pids out of torch's SIGCHLD handler, so a signal that arrives after a death was
    named raises nothing later, in unrelated code. torch 2.9: ``signal_handling._remove_worker_pids``."""
    from torch.utils.data._utils import signal_handling

    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


def pass_finished(iterator: Any, planned: int | None) -> bool:
    """Whether the iterator's pass ended: it raised StopIteration, or yielded all ``planned`` batches (Lightning
    stops at ``len(loader)``, before StopIteration). torchdata 0.11: ``_finished`` and ``_num_yielded``."""
    if getattr(iterator, "_finished", False):
        return True
    return planned is not None and iterator._num_yielded >= planned


def result_pipe(iterator: Any) -> Any:
    """The read end of the pipe the iterator's workers send batches through, or None without workers.
    torch 2.9: ``_worker_result_queue._reader``."""
    queue = getattr(iterator, "_worker_result_queue", None)
    return None if queue is None else queue._reader


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """A new block of shared memory of ``nbytes`` bytes, as torch's workers allocate one to share a tensor.
    torch 2.9: ``UntypedStorage._new_shared``."""
    return torch.UntypedStorage._new_shared(nbytes)


def pin_memory(data: Any) -> Any:
    """``data`` with its tensors pinned, containers kept, as a pinning loader pins a batch.
    torch 2.9: ``torch.utils.data._utils.pin_memory.pin_memory``."""
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin(data)


# --- torchdata's saved state --------------------------------------------------------------------------------------

ITERATOR_FINISHED = "_iterator_finished"
"""torchdata 0.11's flag: the state was saved after the loader's pass ended."""


def single_process_state(sampler_state: dict[str, Any], num_yielded: int, finished: bool) -> dict[str, Any]:
    """A state in the layout torchdata 0.11's single-process ``StatefulDataLoader`` saves, so either loader loads
    it."""
    return {"_index_sampler_state": sampler_state, "_sampler_iter_state": None, "_sampler_iter_yielded": num_yielded,
            "_num_yielded": num_yielded, "_IterableDataset_len_called": None, "_shared_seed": None,
            "fetcher_state": None, "dataset_state": None, ITERATOR_FINISHED: finished}


def batches_yielded(state: Any) -> int:
    """The batches a saved loader state had yielded in its pass. torchdata 0.11: ``_num_yielded``."""
    return int(state.get("_num_yielded", 0)) if state else 0


def _main_state(state: Any) -> Any:
    snapshot = state.get("_snapshot")
    return (snapshot.get("_main_snapshot") or {}) if isinstance(snapshot, dict) else state


def sampler_state_of(state: Any) -> Any:
    """The batch sampler's state inside a saved loader state (single- or multi-process layout), if any.
    torchdata 0.11: ``_index_sampler_state``, under ``_snapshot/_main_snapshot`` with workers."""
    return _main_state(state).get("_index_sampler_state")


def saved_num_workers(state: Any) -> int:
    """The number of worker processes of the loader that saved ``state``. torchdata 0.11: ``_num_workers``."""
    return int(_main_state(state).get("_num_workers", 0)) if "_snapshot" in state else 0


def steps_since_snapshot(state: Any) -> int:
    """Batches a worker loader yielded after its last snapshot. torchdata 0.11: ``_steps_since_snapshot``."""
    return int(state.get("_steps_since_snapshot", 0) or 0)


def iterator_finished(state: Any) -> bool:
    """Whether the state was saved after its pass ended. torchdata 0.11: ``_iterator_finished``."""
    return bool(state.get(ITERATOR_FINISHED))


def stop_pipeline(node: Any) -> None:
    """Join the threads of a ``torchdata.nodes`` pipeline now (torchdata joins them when they are garbage-collected).
    torchdata 0.11: each node's running iterator ``_it`` (one level deeper for ``ParallelMapper``) and its
    ``_shutdown``."""
    while node is not None:
        running = getattr(node, "_it", None)
        while running is not None and not callable(getattr(running, "_shutdown", None)):
            running = getattr(running, "_it", None)
        if running is not None:
            running._shutdown()
        node = getattr(node, "source", None)


# --- Lightning ----------------------------------------------------------------------------------------------------


def record_hparams(module: Any, configuration: dict[str, Any]) -> None:
    """Store ``configuration`` where Lightning's checkpoints read a data module's hyperparameters
    (``datamodule_hyper_parameters``), without logging them. ``save_hyperparameters()`` would walk the caller's
    frames, and reading a frame's locals keeps them alive (the caller's earlier loaders and their workers).
    Lightning 2.6: ``_set_hparams``, ``_hparams``, ``_hparams_initial``, ``_log_hyperparams``."""
    import copy

    module._log_hyperparams = False
    module._set_hparams(dict(configuration))
    module._hparams_initial = copy.deepcopy(module._hparams)


def replaces_samplers(trainer: Any) -> bool:
    """Whether the trainer would replace a loader's sampler with a ``DistributedSampler``
    (``use_distributed_sampler=True``, Lightning's default). Lightning 2.6: ``_accelerator_connector``."""
    connector = getattr(trainer, "_accelerator_connector", None)
    return bool(getattr(connector, "use_distributed_sampler", False))


def set_replaces_samplers(trainer: Any, replace: bool) -> None:
    """Set the trainer's ``use_distributed_sampler``, which Lightning takes only as a ``Trainer`` argument. It is
    read each time the trainer prepares a loader (``_DataConnector._requires_distributed_sampler``), which it does
    after the data module's ``setup``, so a module whose loaders are rank-aware already turns it off there and back
    on at its ``teardown``. Lightning 2.6: ``_accelerator_connector.use_distributed_sampler``."""
    trainer._accelerator_connector.use_distributed_sampler = bool(replace)
