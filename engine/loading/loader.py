"""The loader classes the factory builds: torchdata's ``StatefulDataLoader``, with the two things it lacks here.

``ResumableLoader`` keeps the position of a pass whose iterator a framework dropped (Lightning does at the end of
``fit``), records the rows its source left out (``on_error='skip'``) and names a worker that died, and
``PassAwareLoader`` tells a stream, in the parent process, that a pass starts.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from engine.collation.handoff import widen_result_pipe
from engine.core.compat import (
    WatchesItsIterator,
    iterator_finished,
    live_iterator,
    sampler_state_of,
    saved_num_workers,
    shutdown_workers,
    shuts_down_workers,
    steps_since_snapshot,
    unregister_worker_pids,
    worker_processes,
)
from engine.core.distributed import stop_together
from engine.sources.bad_rows import SkipReport, WithSkippedRows


class KeepsDroppedPass(WatchesItsIterator):
    """A loader that sees Lightning drop its pass (the iterator set to None at the end of ``fit``) and keeps the
    position in :meth:`_dropped`; with the skipped-rows record of its loads."""

    skipped: SkipReport | None = None
    """Where the rows its source leaves out are recorded (the module's ``dm.skipped``; one of its own if unset)."""


class ResumableLoader(KeepsDroppedPass, StatefulDataLoader):
    """A ``StatefulDataLoader`` whose position survives its iterator being dropped.

    Lightning ends ``fit`` by shutting the workers down and setting ``loader._iterator = None``. torchdata would
    then answer ``state_dict()`` by starting a new iterator, whose state is a new pass (with workers, one whose
    sampler already ran ahead to fill the prefetch queue), so a checkpoint taken after ``Trainer.fit(max_steps=...)``
    would lose the position. The dropped iterator's state is kept instead: ``state_dict()`` reports it, and the
    next iteration continues that pass. Replacing the iterator by iterating again is not dropping it: an
    abandoned pass of a plain loop still counts as an epoch.
    """

    _parked: dict[str, Any] | None = None

    def _dropped(self, iterator: Any) -> None:
        self._parked = iterator.state_dict()

    def __iter__(self) -> Any:
        parked, self._parked = self._parked, None
        if live_iterator(self) is None and parked is not None and self.next_iter_state is None \
                and not iterator_finished(parked):
            self.next_iter_state = parked  # continue the dropped pass (a finished one: the next epoch follows)
        try:
            batches = super().__iter__()
        except RuntimeError as error:  # a worker died while the pass started its workers (torch's SIGCHLD handler)
            if not str(error).startswith("DataLoader worker"):
                raise
            shutdown_workers(raising_iterator(error), after_a_death=True)
            raise RuntimeError(worker_death(getattr(self.dataset, "role", "data"), [], error)) from error
        widen_result_pipe(batches)
        return checked(batches, self)

    def state_dict(self) -> dict[str, Any]:
        if live_iterator(self) is None and self._parked is not None and self.next_iter_state is None:
            return self._parked
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torchdata's, with the sampler's part checked now rather than at the first batch, and a state saved
        after its pass ended applied to the sampler alone: torchdata would build an iterator for it, see it
        finished and build another, and with workers the first has already drawn from the sampler, which would
        skip an epoch. The sampler's state says all there is: the next epoch, from its start. So does a state saved
        with another number of workers (the sampler runs here, in the parent; torchdata would refuse it): the
        workers start fresh and the sampler continues."""
        sampler_state = sampler_state_of(state_dict) if isinstance(state_dict, dict) else None
        check = getattr(self.batch_sampler, "check_state", None)
        if sampler_state is not None and check is not None:
            check(sampler_state)
        other_workers = sampler_state is not None and saved_num_workers(state_dict) != self.num_workers
        if other_workers and steps_since_snapshot(state_dict):
            workers = saved_num_workers(state_dict)
            raise ValueError(f"the loader state was saved with num_workers={workers} and "
                             f"{steps_since_snapshot(state_dict)} steps after its last snapshot; it can only resume "
                             f"with num_workers={workers}; pass num_workers={workers} to resume it")
        if sampler_state is not None and check is not None and (iterator_finished(state_dict) or other_workers):
            super().load_state_dict({})
            self.batch_sampler.load_state_dict(sampler_state)
        else:
            super().load_state_dict(state_dict)
        self._parked = None


class PassAwareLoader(StatefulDataLoader):
    """A loader that tells its iterable dataset, in this (the parent) process, that a pass starts: state such as
    the epoch that ``datasets`` shares with worker processes must be set here, never in the workers. When the
    dataset is one rank's share of a stream, every rank ends the pass together (see ``stop_together``)."""

    def __iter__(self) -> Any:
        self.dataset.begin_pass()
        batches = super().__iter__()
        widen_result_pipe(batches)
        if getattr(self.dataset, "world_size", 1) > 1 and dist.is_available() and dist.is_initialized():
            return stop_together(batches)
        return batches


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
    :class:`SkipReport` (checking the cap for this pass), and turns a worker's death into an error naming the
    split and the likely fix. Everything else (``state_dict``, ...) is the wrapped iterator's."""

    def __init__(self, batches: Any, loader: Any) -> None:
        self._batches, self._report = batches, loader.skipped
        self._split = getattr(loader.dataset, "role", "data")
        replicas = getattr(loader.batch_sampler, "num_replicas", 1)
        self._rows_in_pass = -(-len(loader.dataset) // replicas)
        self._in_pass: list[Any] = []

    def __iter__(self) -> CheckedBatches:
        return self

    def __next__(self) -> Any:
        # torch reports a dead worker from its SIGCHLD handler, which raises wherever the main thread is: the whole
        # step is inside the try, not only the wait for the next batch.
        try:
            batch = next(self._batches)
            if type(batch) is WithSkippedRows:
                self._report.add(batch.skipped)
                self._in_pass.extend(batch.skipped)
                self._report.check_cap(self._split, len(self._in_pass), self._rows_in_pass, self._in_pass)
                batch = batch.batch
            return batch
        except (RuntimeError, OSError, EOFError) as error:
            if isinstance(error, RuntimeError) and not str(error).startswith("DataLoader worker"):
                raise
            workers = worker_processes(self._batches)
            unregister_worker_pids(self._batches)  # from here on, torch's SIGCHLD handler raises nothing for this pass
            if not isinstance(error, RuntimeError):  # a batch whose worker died before its shared memory was fetched
                dead = dead_workers(workers)
                if not dead:
                    raise
                error = RuntimeError(f"DataLoader worker (pid(s) {', '.join(str(w.pid) for w in dead)}) exited "
                                     f"before its batch was received: {type(error).__name__}: {error}")
            message = worker_death(self._split, workers, error)
            shutdown_workers(self._batches, after_a_death=True)
            raise RuntimeError(message) from error

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
