"""The thread executor: fetch and collate in background threads of this process, off the training step's path.

A ``torchdata.nodes`` pipeline (the batch sampler -> fetch + collate in a :class:`~torchdata.nodes.Mapper` run by
a :class:`~torchdata.nodes.Prefetcher` thread, or a thread :class:`~torchdata.nodes.ParallelMapper` for several
threads -> :class:`~torchdata.nodes.PinMemory` when pinning) prepares the next batches while the step runs. There
is no process hand-off and nothing is pickled, so it suits work that is cheap or releases the GIL (flat buffers,
Arrow columns, vectorized padding); Python-heavy transforms still want worker processes.

Batches are those of ``num_workers=0``, bit for bit: the sampler and the per-batch seeds are the same objects.
The state is the one ``num_workers=0`` saves (torchdata's single-process layout), and the sampler's position in it
counts the batches *delivered* to the caller, not the ones prefetched: each batch travels with the sampler state
taken just after it was drawn.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from torchdata import nodes

from engine.core.compat import (
    batches_yielded,
    iterator_finished,
    live_iterator,
    sampler_state_of,
    single_process_state,
    stop_pipeline,
)
from engine.sampling.base import EpochBatchSampler


class _FetchCollate:
    """The work of one batch in a pipeline thread: read its rows, collate them, keep the sampler state with it."""

    def __init__(self, dataset: Any, collate_fn: Any) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn
        self.batched = callable(getattr(dataset, "__getitems__", None))

    def __call__(self, item: tuple[list[int], dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
        indices, sampler_state = item
        rows = self.dataset.__getitems__(indices) if self.batched else [self.dataset[i] for i in indices]
        return self.collate_fn(rows), sampler_state


class _SampledBatches:
    """The sampler's batches of one pass, each with the sampler's state just after it; stops drawing (without
    finishing the sampler's pass) once the loader started another pass, so a stale thread never moves it.

    It draws one batch ahead, so the sampler has finished its pass (its epoch bookkeeping) before the last batch
    is handed on: a ``set_epoch`` the caller makes after the last batch never meets the thread in the sampler.
    """

    def __init__(self, threads: Threads, sampler: EpochBatchSampler, pass_id: int) -> None:
        self.threads, self.sampler, self.pass_id = threads, sampler, pass_id

    def _draw(self, batches: Iterator[Any]) -> tuple[Any, Any] | None:
        with self.threads._sampler_lock:
            if self.threads._pass_id != self.pass_id:
                return None
            batch = next(batches, None)
            return None if batch is None else (batch, self.sampler.state_dict())

    def __iter__(self) -> Iterator[tuple[list[int], dict[str, Any]]]:
        batches = iter(self.sampler)
        current = self._draw(batches)
        while current is not None:
            following = self._draw(batches)
            yield current
            current = following


class Threads:
    """The executor of a loader whose batches ``num_threads`` background threads of this process prepare, each
    ``prefetch_factor`` batches ahead.

    Iterating, ``len``, ``batch_sampler`` (Lightning's ``set_epoch`` reaches ``batch_sampler.sampler``),
    ``state_dict`` and ``load_state_dict`` behave as for ``num_workers=0``, including a pass whose iterator a
    framework dropped (the pass continues at the next ``iter``) and a pass that finished (the next epoch follows).
    The loader's batch sampler must be one of the engine's resumable ones (:class:`EpochBatchSampler`).
    """

    def __init__(self, num_threads: int, prefetch_factor: int) -> None:
        self.num_threads, self.prefetch_factor = num_threads, prefetch_factor
        self._sampler_lock = threading.Lock()
        self._pass_id = 0
        self._pending: dict[str, Any] | None = None  # a loaded or parked state, applied at the next start_pass
        self._loader: Any = None

    def attach(self, loader: Any) -> None:
        if not isinstance(loader.batch_sampler, EpochBatchSampler):
            raise TypeError(f"Threads loads through one of the engine's resumable batch samplers, but the loader's "
                            f"is a {type(loader.batch_sampler).__name__}; use num_threads=0")
        self._loader = weakref.ref(loader)  # no cycle: the loader goes as soon as the caller drops it
        self._delivered = single_process_state(loader.batch_sampler.state_dict(), 0, False)

    @property
    def loader(self) -> Any:
        return self._loader()

    def start_pass(self) -> _ThreadPass:
        loader = self.loader
        current = live_iterator(loader)
        if current is not None:
            current.close()  # an abandoned pass still counts as an epoch, as with num_workers=0
        pending, self._pending = self._pending, None
        if pending is not None:
            loader.batch_sampler.load_state_dict(sampler_state_of(pending))  # after any set_epoch, as torchdata does
        self._delivered = single_process_state(loader.batch_sampler.state_dict(), batches_yielded(pending), False)
        thread_pass = _ThreadPass(self)
        loader.__dict__["_live_iterator"] = thread_pass
        return thread_pass

    def dropped(self, iterator: Any) -> None:
        iterator.close()
        if not iterator_finished(self._delivered) and self._pending is None:
            self._pending = self._delivered  # continue the dropped pass

    @property
    def delivered_epoch(self) -> int:
        """The epoch of the position :meth:`state_dict` reports (the sampler itself may have run ahead)."""
        return int(sampler_state_of(self.state_dict())["epoch"])

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed to the caller (num_workers=0's layout)."""
        return self._pending if self._pending is not None else self._delivered

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` at the next ``start_pass``; the sampler's part is checked now. A state saved
        after its pass ended goes to the sampler at once: the next epoch starts from its beginning."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict should be a dict from loader.state_dict(), but got "
                            f"{type(state_dict).__name__}")
        loader = self.loader
        sampler_state = sampler_state_of(state_dict)
        if sampler_state is None:
            raise ValueError(f"state_dict has no sampler state (keys {sorted(state_dict)}); pass a dict saved by "
                             f"loader.state_dict()")
        loader.batch_sampler.check_state(sampler_state)
        current = loader.__dict__.pop("_live_iterator", None)
        if current is not None:
            current.close()
        if iterator_finished(state_dict):
            loader.batch_sampler.load_state_dict(sampler_state)
            self._pending = None
            self._delivered = single_process_state(loader.batch_sampler.state_dict(), 0, True)
        else:
            self._pending = single_process_state(dict(sampler_state), batches_yielded(state_dict), False)


class _ThreadPass(Iterator[Any]):
    """One pass of a :class:`Threads` executor: the running pipeline, and the bookkeeping of what it delivered."""

    def __init__(self, threads: Threads) -> None:
        self.threads, self.loader = threads, threads.loader
        with threads._sampler_lock:
            threads._pass_id += 1
            self.pass_id = threads._pass_id
        source = nodes.IterableWrapper(_SampledBatches(threads, self.loader.batch_sampler, self.pass_id))
        work = _FetchCollate(self.loader.dataset, self.loader.collate_fn)
        # snapshot_frequency=0: torchdata's per-item snapshots are not needed, each batch carries its position
        if threads.num_threads == 1:
            node: nodes.BaseNode = nodes.Prefetcher(nodes.Mapper(source, work), threads.prefetch_factor,
                                                    snapshot_frequency=0)
        else:
            node = nodes.ParallelMapper(source, work, num_workers=threads.num_threads, in_order=True,
                                        method="thread", max_concurrent=threads.num_threads, snapshot_frequency=0)
            node = nodes.Prefetcher(node, threads.prefetch_factor * threads.num_threads, snapshot_frequency=0)
        if self.loader.pin_memory:
            node = nodes.PinMemory(node, snapshot_frequency=0)
        self.node: nodes.BaseNode | None = node
        node.reset()
        self.num_yielded = batches_yielded(threads._delivered)

    def __next__(self) -> Any:
        retired = getattr(self.loader.batch_sampler, "retired", None)
        if retired is not None:  # the module loaded another state: prefetched batches are stale
            self.close()
            raise RuntimeError(retired)
        if self.node is None or self.threads._pass_id != self.pass_id:
            raise StopIteration
        try:
            batch, sampler_state = next(self.node)
        except StopIteration:
            self.close()
            finished = self.loader.batch_sampler.state_dict()
            self.threads._delivered = single_process_state(finished, self.num_yielded, True)
            raise
        except BaseException:
            self.close()
            raise
        self.num_yielded += 1
        self.threads._delivered = single_process_state(sampler_state, self.num_yielded, False)
        return batch

    def close(self) -> None:
        """Stop the pipeline's threads; the sampler is not drawn from again by this pass."""
        with self.threads._sampler_lock:
            if self.threads._pass_id == self.pass_id:
                self.threads._pass_id += 1
        node, self.node = self.node, None
        if node is not None:
            stop_pipeline(node)

    def __len__(self) -> int:
        return len(self.loader)
