"""Started (spawn, forkserver) loader workers receive their target and arguments through a shared-memory block, so
the start-up pipe carries a few hundred bytes whatever the data's size and the parent never waits on a worker's
imports before starting the next; arguments over the block limit travel whole in the pipe. Either way a worker
gets what it was given, and no block is left behind."""

import pickle
from multiprocessing import context as contexts
from multiprocessing import shared_memory

import pytest
import torch

from engine import DataLoaderConfig, DataLoaderFactory
from engine.loading import starting


def pickled_for_a_child(process):
    """The process as multiprocessing pickles it into a started child's pipe (only while it is starting one)."""
    contexts.set_spawning_popen(object())
    try:
        return pickle.dumps(process)
    finally:
        contexts.set_spawning_popen(None)


@pytest.mark.parametrize("method", sorted(starting.CONTEXTS))
def test_the_pipe_carries_the_block_name_and_the_child_gets_the_arguments_and_unlinks_the_block(method):
    rows = list(range(200_000))  # about 1 MB pickled, far over a pipe's buffer
    process = starting.worker_context(method).Process(target=sorted, args=(rows,), kwargs={"reverse": True})
    pickled = pickled_for_a_child(process)
    assert len(pickled) < 4096
    child = pickle.loads(pickled)
    assert child._target is sorted and child._args == (rows,) and child._kwargs == {"reverse": True}


def test_the_block_is_unlinked_once_the_child_has_read_it():
    process = starting.worker_context("spawn").Process(target=sorted, args=([3, 1, 2],))
    state = process.__getstate__.__func__  # the parent's side, as pickling calls it
    contexts.set_spawning_popen(object())
    try:
        sent = state(process)
    finally:
        contexts.set_spawning_popen(None)
    name, size = sent["_pickled_arguments"]
    assert size > 0
    child = object.__new__(type(process))
    child.__setstate__(dict(sent))
    assert child._args == ([3, 1, 2],)
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_arguments_over_the_block_limit_travel_whole_in_the_pipe(monkeypatch):
    monkeypatch.setattr(starting, "LARGEST_BLOCK", 16)
    rows = list(range(1000))
    process = starting.worker_context("spawn").Process(target=sorted, args=(rows,))
    pickled = pickled_for_a_child(process)
    assert len(pickled) > len(pickle.dumps(rows))
    assert pickle.loads(pickled)._args == (rows,)


def test_fork_keeps_multiprocessing_s_own_start():
    assert starting.worker_context("fork") is None


def test_spawned_workers_over_data_larger_than_a_pipe_give_the_batches_of_the_main_process():
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 100, (8,), generator=generator) for _ in range(1500)]  # ~100 KB pickled as descriptors

    def batches(workers):
        config = DataLoaderConfig(batch_size=64, shuffle=True, seed=5, num_workers=workers,
                                  multiprocessing_context="spawn" if workers else None, timeout=120 if workers else 0)
        return list(DataLoaderFactory().create_dataloader(rows, config))

    expected, got = batches(0), batches(2)
    assert len(got) == len(expected) == 24
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(got, expected))
