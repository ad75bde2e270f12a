"""The engine's one loader: torchdata's ``StatefulDataLoader``, whose batches an executor makes.

Two executors share one protocol (:class:`Executor`): :class:`TorchdataIterators`, torchdata's own iterators, which
load in this process (``num_workers=0``) or in ``num_workers`` worker processes, and
:class:`engine.loading.pipeline.Threads`, a ``torchdata.nodes`` pipeline in background threads of this process
(``num_threads``). The loader adds what every executor needs:

- a pass whose iterator a framework dropped continues at the next ``iter`` (Lightning ends ``fit`` by setting
  ``loader._iterator = None``; the position is kept rather than answered by a new pass);
- the rows its source left out (``on_error='skip'``) are recorded, and a worker that died is named;
- a stream is told, in this (the parent) process, that a pass starts, and the ranks of a sharded stream end their
  pass together.
"""

from __future__ import annotations

import signal
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch.distributed as dist
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.collation.handoff import widen_result_pipe
from engine.collation.seeded_collate import SeededCollate
from engine.core.compat import (
    BuildsWorkerProcessIterators,
    WatchesItsIterator,
    forget_iterator,
    iterator_finished,
    live_iterator,
    raised_in_worker,
    sampler_state_of,
    saved_num_workers,
    shutdown_workers,
    shuts_down_workers,
    steps_since_snapshot,
    unregister_worker_pids,
    worker_processes,
)
from engine.core.distributed import resolve_world, stop_together
from engine.core.skipped_rows import SkipReport, WithSkippedRows
from engine.core.stage_times import StageTimes, TimesItsStages
from engine.core.stateful import SHARED_LEAF, SavedAsOneLeaf, rank_leaf


class Executor(Protocol):
    """How a :class:`ResumableLoader`'s batches are made, and the position of its pass kept.

    An executor serves the one loader it is attached to; the loader calls it for each of these and adds the rest
    (skipped rows, worker deaths, a stream's pass).
    """

    def attach(self, loader: ResumableLoader) -> None:
        """Serve ``loader`` (called once, when the loader is built); raise if it cannot."""

    def start_pass(self) -> Iterator[Any]:
        """The iterator of a new pass, or of the pass a loaded or dropped state continues."""

    def dropped(self, iterator: Any) -> None:
        """A framework dropped ``iterator`` (the live pass): keep its position for the next ``start_pass``."""

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the caller."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` at the next ``start_pass``."""


class ResumableLoader(SavedAsOneLeaf, WatchesItsIterator, BuildsWorkerProcessIterators, StatefulDataLoader):
    """A ``StatefulDataLoader`` whose batches ``executor`` makes, and whose position survives its iterator being
    dropped.

    Args:
        dataset: a source (map-style, sampled by ``batch_sampler``) or a stream (an ``IterableDataset``).
        executor: :class:`TorchdataIterators` (the default: in this process, or in ``num_workers`` processes) or
            :class:`engine.loading.pipeline.Threads`.
        **kwargs: ``StatefulDataLoader``'s.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from engine import DataLoaderConfig, DataLoaderFactory
        >>> loader = DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(10.0)),
        ...                                                DataLoaderConfig(batch_size=4, num_threads=1))
        >>> type(loader.executor).__name__, [len(batch[0]) for batch in loader]
        ('Threads', [4, 4, 2])
    """

    skipped: SkipReport | None = None
    """Where the rows its source leaves out are recorded (the module's ``dm.skipped``; one of its own if unset)."""

    @property
    def stage_times(self) -> StageTimes:
        """Seconds per stage (fetch, decode, collate) of the batches this loader made, in workers too; the
        engine's collate step keeps them (see :mod:`engine.core.stage_times`)."""
        if isinstance(self.collate_fn, SeededCollate):
            return self.collate_fn.stage_times
        return self.__dict__.setdefault("_stage_times", StageTimes())

    def __init__(self, dataset: Any, *, executor: Executor | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.is_stream = isinstance(dataset, IterableDataset)
        self.executor = executor if executor is not None else TorchdataIterators()
        self.executor.attach(self)

    def __iter__(self) -> Any:
        begin_pass = getattr(self.dataset, "begin_pass", None)
        if callable(begin_pass):  # state such as the epoch that worker processes share is set here, never in them
            begin_pass()
        batches = checked(self.executor.start_pass(), self)
        if self.is_stream:  # the ranks of a sharded stream end the pass together
            sharded = getattr(self.dataset, "world_size", 1) > 1 and dist.is_available() and dist.is_initialized()
            return stop_together(batches) if sharded else batches
        return batches

    def _dropped(self, iterator: Any) -> None:
        self.executor.dropped(iterator)

    def data_state(self) -> dict[str, Any]:
        return self.executor.state_dict()

    def state_leaf(self) -> str:
        """``"state"`` over map-style data (its position is the global step's, the same on every rank); over a
        stream, ``"rank<r>"``: each rank's position in its own share."""
        if not self.is_stream:
            return SHARED_LEAF
        rank = getattr(self.dataset, "rank", None)
        return rank_leaf(resolve_world()[0] if rank is None else rank)

    def load_data_state(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from ``state_dict`` (from :meth:`data_state`) at the next ``iter``; the sampler's part is
        checked now rather than at the first batch."""
        self.executor.load_state_dict(state_dict)

    @property
    def delivered_epoch(self) -> int | None:
        """The epoch of the position :meth:`state_dict` reports, where the sampler itself may have run ahead
        (threads); None where the sampler's own epoch is that position."""
        return getattr(self.executor, "delivered_epoch", None)


class TorchdataIterators:
    """torchdata's iterators: the batches are loaded in this process (``num_workers=0``) or in the loader's
    ``num_workers`` worker processes.

    A dropped pass is kept as its iterator's state: torchdata would answer ``state_dict()`` by starting a new
    iterator, whose state is a new pass (with workers, one whose sampler already ran ahead to fill the prefetch
    queue), so a checkpoint taken after ``Trainer.fit(max_steps=...)`` would lose the position. Replacing the
    iterator by iterating again is not dropping it: an abandoned pass of a plain loop still counts as an epoch.
    A stream's pass is not kept: its position lives in the stream.
    """

    def __init__(self) -> None:
        self._parked: dict[str, Any] | None = None
        self._loader: Any = None

    def attach(self, loader: ResumableLoader) -> None:
        self._loader = weakref.ref(loader)  # no cycle: the loader and its workers go as soon as the caller drops it

    @property
    def loader(self) -> Any:
        return self._loader()

    def start_pass(self) -> Iterator[Any]:
        loader = self.loader
        parked, self._parked = self._parked, None
        if live_iterator(loader) is None and parked is not None and loader.next_iter_state is None \
                and not iterator_finished(parked):
            loader.next_iter_state = parked  # continue the dropped pass (a finished one: the next epoch follows)
        try:
            batches = StatefulDataLoader.__iter__(loader)
        except RuntimeError as error:  # a worker died while the pass started its workers (torch's SIGCHLD handler)
            if not str(error).startswith("DataLoader worker"):
                raise
            shutdown_workers(raising_iterator(error), after_a_death=True)
            raise RuntimeError(worker_death(getattr(loader.dataset, "role", "data"), [], error)) from error
        widen_result_pipe(batches)
        return batches

    def dropped(self, iterator: Any) -> None:
        if not self.loader.is_stream:
            self._parked = iterator.state_dict()

    def state_dict(self) -> dict[str, Any]:
        loader = self.loader
        if live_iterator(loader) is None and self._parked is not None and loader.next_iter_state is None:
            return self._parked
        return StatefulDataLoader.state_dict(loader)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torchdata's, with a state saved after its pass ended applied to the sampler alone: torchdata would
        build an iterator for it, see it finished and build another, and with workers the first has already drawn
        from the sampler, which would skip an epoch. The sampler's state says all there is: the next epoch, from
        its start. So does a state saved with another number of workers (the sampler runs here, in the parent;
        torchdata would refuse it): the workers start fresh and the sampler continues."""
        loader = self.loader
        sampler_state = sampler_state_of(state_dict) if isinstance(state_dict, dict) else None
        check = getattr(loader.batch_sampler, "check_state", None)
        if sampler_state is not None and check is not None:
            check(sampler_state)
        other_workers = sampler_state is not None and saved_num_workers(state_dict) != loader.num_workers
        if other_workers and steps_since_snapshot(state_dict):
            workers = saved_num_workers(state_dict)
            raise ValueError(f"the loader state was saved with num_workers={workers} and "
                             f"{steps_since_snapshot(state_dict)} steps after its last snapshot; it can only resume "
                             f"with num_workers={workers}; pass num_workers={workers} to resume it")
        if sampler_state is not None and check is not None and (iterator_finished(state_dict) or other_workers):
            StatefulDataLoader.load_state_dict(loader, {})
            loader.batch_sampler.load_state_dict(sampler_state)
        else:
            StatefulDataLoader.load_state_dict(loader, state_dict)
        self._parked = None


def checked(batches: Any, loader: Any) -> Any:
    """``batches`` (an iterator of ``loader``) as they are when nothing needs unwrapping and no worker can die, so
    the plain iterator costs nothing per step; else a :class:`CheckedBatches` over them."""
    skipping = getattr(loader.dataset, "on_error", "raise") != "raise"
    if not skipping and loader.num_workers == 0:
        return batches
    if skipping and loader.skipped is None:
        loader.skipped = SkipReport(loader.dataset.on_error)
    return CheckedBatches(batches, loader)


class CheckedBatches:
    """A loader's iterator, in the parent process: unwraps batches that carry skipped rows into the loader's
    :class:`SkipReport` (checking the cap for this pass) and a worker's shard-reader counts into the loader's
    source (:meth:`~engine.sources.shards.source.ShardedSource.add_worker_counts`, a mixture's
    :meth:`~engine.sources.mixed.MixedSource.add_worker_counts`), and turns a worker's death into an
    error naming the split and the likely fix. Everything else (``state_dict``, ...) is the wrapped iterator's."""

    def __init__(self, batches: Any, loader: Any) -> None:
        self._batches, self._report, self._dataset = batches, loader.skipped, loader.dataset
        self._stage_times = loader.stage_times if isinstance(loader, TimesItsStages) else None
        self._loader = weakref.ref(loader)
        self._split = getattr(loader.dataset, "role", "data")
        self._replicas = getattr(loader.batch_sampler, "num_replicas", 1)
        self._in_pass: list[Any] = []

    def __iter__(self) -> CheckedBatches:
        return self

    def __next__(self) -> Any:
        # torch reports a dead worker from its SIGCHLD handler, which raises wherever the main thread is: the whole
        # step is inside the try, not only the wait for the next batch.
        try:
            batch = next(self._batches)
            if type(batch) is WithSkippedRows:
                if batch.skipped:
                    self._report.add(batch.skipped)
                    self._leave_out(batch.skipped)
                    self._in_pass.extend(batch.skipped)
                    rows_in_pass = -(-len(self._dataset) // self._replicas)  # map-style data: a stream skips no rows
                    self._report.check_cap(self._split, len(self._in_pass), rows_in_pass, self._in_pass)
                if batch.reader_counts:  # a worker's shard reads, added to the parent's source
                    self._dataset.add_worker_counts(batch.reader_counts)
                if batch.stage_s and self._stage_times is not None:  # a worker's stage times, with the parent's
                    self._stage_times.add(batch.stage_s)
                batch = batch.batch
            return batch
        except StopIteration:
            raise
        except BaseException as error:
            death = self._death(error)
            self._stop()
            if death is not None:
                raise RuntimeError(death) from error
            raise

    def _leave_out(self, skipped: list[Any]) -> None:
        """A mixture's rows left out, taken off its served counts (they count the rows of the batches handed out)."""
        loader = self._loader()
        order = getattr(getattr(loader, "batch_sampler", None), "mixture", None)
        if order is not None:
            order.meter.leave_out([row.mixed_row for row in skipped if getattr(row, "mixed_row", None) is not None])

    def _death(self, error: BaseException) -> str | None:
        """The message naming the split and the likely fix when ``error`` means a worker died, else None. The
        workers' pids leave torch's SIGCHLD handler first, which from then on raises nothing for this pass."""
        if not isinstance(error, (RuntimeError, OSError, EOFError)) or raised_in_worker(error):
            return None
        if isinstance(error, RuntimeError) and not str(error).startswith("DataLoader worker"):
            return None
        workers = worker_processes(self._batches)
        unregister_worker_pids(self._batches)
        if not isinstance(error, RuntimeError):  # a batch whose worker died before its shared memory was fetched
            dead = dead_workers(workers)
            if not dead:
                return None
            error = RuntimeError(f"DataLoader worker (pid(s) {', '.join(str(w.pid) for w in dead)}) exited "
                                 f"before its batch was received: {type(error).__name__}: {error}")
        return worker_death(self._split, workers, error)

    def _stop(self) -> None:
        """Stop the workers of a pass that raised, before the error reaches the caller, whose traceback keeps this
        iterator alive: left running, they would be stopped only when a later garbage collection reaches it,
        which waits torch's 5 s per worker, in unrelated code. The loader's next ``iter()`` starts new workers,
        from the position before the failed batch."""
        if not shuts_down_workers(self._batches) or not worker_processes(self._batches):
            return
        shutdown_workers(self._batches)
        loader = self._loader()
        if loader is not None and live_iterator(loader) is self._batches:
            forget_iterator(loader)

    def __len__(self) -> int:
        return len(self._batches)

    def __getattr__(self, name: str) -> Any:
        if name == "_batches":  # not yet set (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._batches, name)


def dead_workers(workers: list[Any], wait: float = 2.0) -> list[Any]:
    """The worker processes that have exited, waiting up to ``wait`` seconds for one that is being killed."""
    deadline = time.monotonic() + wait
    while True:
        dead = [worker for worker in workers if worker.exitcode is not None]
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.01)


def raising_iterator(error: BaseException) -> Any:
    """The loader iterator whose construction raised ``error`` (the ``self`` of a frame of its traceback), if any."""
    traceback = error.__traceback__
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if shuts_down_workers(candidate):
            return candidate
        traceback = traceback.tb_next
    return None


def worker_death(split: str, workers: list[Any], error: Exception) -> str:
    """The message for a worker that died: which one, by which signal or exit code, and what to do."""
    dead = []
    for number, worker in enumerate(workers):
        code = getattr(worker, "exitcode", None)
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            dead.append(f"worker {number} (pid {worker.pid}) was killed by {name}")
        elif code:
            dead.append(f"worker {number} (pid {worker.pid}) exited with code {code}")
    what = f": {'; '.join(dead)} ({error})" if dead else f" ({error})"
    return (f"a worker process of the {split} loader died{what}. A worker killed by SIGKILL is most "
            f"often stopped by the out-of-memory killer: lower num_workers, prefetch_factor or batch_size. A row "
            f"that crashes its process (a decoder's segfault) cannot be left out by on_error; find it with "
            f"num_workers=0")
