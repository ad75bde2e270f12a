"""Started loader workers (spawn, forkserver) that start together: each worker's arguments travel in a shared-memory
block instead of its start-up pipe.

multiprocessing starts such a worker by writing the pickled process (its target and arguments: the dataset, the
collate function, the queues) into a pipe to the child, and waits until the child has read it. The child reads it
as it unpickles it, and unpickling imports what the arguments need (torch: seconds in a fresh interpreter). When the
pickle is larger than the pipe's buffer (64 KiB on Linux: a dataset of a thousand tensors, each pickled as a
shared-memory descriptor), the parent waits on each worker's imports before it starts the next, so the workers
start one after the other, and the first batch, asked for once every worker has started, waits for them all.
Here each worker's target and arguments are pickled with multiprocessing's own pickler (tensors still travel as
shared-memory descriptors) into a block of :mod:`multiprocessing.shared_memory`; the pipe carries the block's
name, which the worker reads and unlinks as it starts. A block left unread (a worker killed while it starts) is
unlinked by multiprocessing's resource tracker when the parent exits. Arguments larger than :data:`LARGEST_BLOCK`
(a block as large as the data could exceed a small ``/dev/shm``) travel in the pipe as one ``bytes`` object,
which the worker reads whole before it imports anything they need.
"""

from __future__ import annotations

import multiprocessing
import pickle
from multiprocessing import context as contexts
from multiprocessing import reduction, shared_memory
from typing import Any

LARGEST_BLOCK = 4 << 20
"""The largest pickled arguments (bytes) sent through a shared-memory block."""
_PICKLED = "_pickled_arguments"
"""The state key of a pickled process's target and arguments: ``(name, size)`` of their block, or their bytes."""


class _ArgumentsInBlock:
    """A started process whose target and arguments are pickled into a shared-memory block (see the module)."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        pickled = reduction.ForkingPickler.dumps((state.pop("_target"), state.pop("_args"), state.pop("_kwargs")))
        if len(pickled) > LARGEST_BLOCK:
            state[_PICKLED] = bytes(pickled)
            return state
        block = shared_memory.SharedMemory(create=True, size=len(pickled))
        try:
            block.buf[:len(pickled)] = pickled
        finally:
            block.close()
        state[_PICKLED] = (block.name, len(pickled))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        pickled = state.pop(_PICKLED)
        self.__dict__.update(state)
        if isinstance(pickled, tuple):
            name, size = pickled
            block = shared_memory.SharedMemory(name=name)
            try:
                pickled = bytes(block.buf[:size])
            finally:
                block.close()
                block.unlink()
        self._target, self._args, self._kwargs = pickle.loads(pickled)


class _SpawnProcess(_ArgumentsInBlock, contexts.SpawnProcess):
    """A spawned process whose arguments travel in a shared-memory block."""


class _SpawnContext(contexts.SpawnContext):
    Process = _SpawnProcess


CONTEXTS: dict[str, type[contexts.BaseContext]] = {"spawn": _SpawnContext}
if "forkserver" in multiprocessing.get_all_start_methods():

    class _ForkServerProcess(_ArgumentsInBlock, contexts.ForkServerProcess):
        """A forkserver's process whose arguments travel in a shared-memory block."""

    class _ForkServerContext(contexts.ForkServerContext):
        Process = _ForkServerProcess

    CONTEXTS["forkserver"] = _ForkServerContext


def worker_context(method: str) -> contexts.BaseContext | None:
    """The multiprocessing context that starts a loader's workers under start method ``method``: for 'spawn' and
    'forkserver', one whose workers receive their arguments through a shared-memory block (they then start
    together); None for 'fork' (a forked worker inherits its arguments)."""
    found = CONTEXTS.get(method)
    return None if found is None else found()
