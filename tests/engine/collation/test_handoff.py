"""A batch's tensors cross from a worker process to the parent in one shared buffer (``WorkerCollate``), and the
batches stay those of ``num_workers=0``, bit for bit."""

from __future__ import annotations

import fcntl
import os
import signal
import types
import warnings
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.multiprocessing import reductions
from torch.utils.data._utils import signal_handling

from engine import UniversalDataModule
from engine.collation import handoff
from engine.collation.handoff import InlineBatch, WorkerCollate, hand_off, one_buffer
from engine.collation.seeded_collate import SeededCollate
from engine.loading.loader import CheckedBatches
from task_spec import TaskSpec

DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32, torch.float16, torch.float64)


def assert_identical(ours: torch.Tensor, expected: torch.Tensor) -> None:
    assert ours.dtype == expected.dtype and ours.shape == expected.shape and ours.stride() == expected.stride()
    assert torch.equal(ours, expected)


def storages(batch: dict[str, torch.Tensor]) -> set[int]:
    return {tensor.untyped_storage().data_ptr() for tensor in batch.values()}


@st.composite
def tensor_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    count = draw(st.integers(2, 5))
    batch = {}
    for number in range(count):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))  # () is a 0-d tensor; a 0 an empty one
        dtype = draw(st.sampled_from(DTYPES))
        generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
        batch[f"field{number}"] = (torch.rand(shape, generator=generator) * 200).to(dtype)
    return batch


class TestOneBuffer:
    @settings(max_examples=40, deadline=None)
    @given(tensor_batches())
    def test_a_dict_of_tensors_becomes_views_of_one_shared_block_with_the_same_values_and_layout(self, batch):
        originals = {key: tensor.clone() for key, tensor in batch.items()}
        packed = one_buffer(batch)
        assert list(packed) == list(batch)
        for key, tensor in batch.items():
            assert_identical(packed[key], tensor)
            assert_identical(tensor, originals[key])  # the input is not changed
        assert len(storages(packed)) == 1
        if len(storages(batch)) == 1:  # all empty (no storage at all): nothing to share, left as it is
            assert packed is batch
        else:
            assert all(tensor.is_shared() and tensor.storage_offset() * tensor.element_size() % 64 == 0
                       for tensor in packed.values())
            assert not storages(packed) & storages(batch)  # a new block: the caller's tensors are not shared

    def test_lists_and_tuples_keep_their_type(self):
        tensors = [torch.arange(6).view(2, 3), torch.ones(4, dtype=torch.bool)]
        for kind in (list, tuple):
            packed = one_buffer(kind(tensors))
            assert type(packed) is kind
            for ours, expected in zip(packed, tensors):
                assert_identical(ours, expected)
            assert packed[0].untyped_storage().data_ptr() == packed[1].untyped_storage().data_ptr()

    @pytest.mark.parametrize("batch", [
        {"input_ids": torch.arange(4)},  # one tensor: nothing to gain
        {"a": torch.arange(6).view(2, 3).t(), "b": torch.arange(3)},  # not contiguous: its strides are kept by torch
        {"a": torch.ones(2, requires_grad=True), "b": torch.arange(3)},
        {"a": torch.arange(3), "b": "text"},
        {"a": torch.arange(3), "b": {"nested": torch.arange(2)}},
        torch.arange(5),
        dict(zip("ab", torch.arange(8).split(4))),  # already views of one block, as the text collators make
    ], ids=["one-tensor", "non-contiguous", "requires-grad", "a-string", "nested", "a-tensor", "one-block"])
    def test_anything_else_is_returned_as_it_is(self, batch):
        assert one_buffer(batch) is batch

    def test_a_mapping_subclass_keeps_its_type_by_being_left_alone(self):
        class Fields(dict):
            pass

        batch = Fields(a=torch.arange(2), b=torch.arange(3))
        assert one_buffer(batch) is batch

    def test_pickled_for_the_parent_it_rebuilds_one_storage_and_the_same_batch(self, monkeypatch):
        batch = {"input_ids": torch.arange(64 * 7).view(64, 7), "attention_mask": torch.ones(64, 7, dtype=torch.int64),
                 "labels": torch.full((64, 7), -100)}
        per_tensor, packed = bytes(ForkingPickler.dumps(batch)), bytes(ForkingPickler.dumps(one_buffer(batch)))
        rebuilt_storages = counting_rebuilds(monkeypatch)
        plain = ForkingPickler.loads(per_tensor)
        assert len(rebuilt_storages) == 3  # torch's own hand-off: a shared block (and a round trip) per tensor
        rebuilt = ForkingPickler.loads(packed)
        assert len(rebuilt_storages) == 3 + 1
        for key, tensor in batch.items():
            assert_identical(rebuilt[key], tensor)
            assert_identical(plain[key], tensor)


def counting_rebuilds(monkeypatch) -> list[tuple]:
    """The shared-memory blocks that unpickling rebuilds (torch's functions, patched by name after pickling)."""
    rebuilt: list[tuple] = []

    def counting(rebuild):
        def counted(*args):
            rebuilt.append(args)
            return rebuild(*args)
        return counted

    for name in ("rebuild_storage_fd", "rebuild_storage_filename"):
        monkeypatch.setattr(reductions, name, counting(getattr(reductions, name)))
    return rebuilt


class TestHandOff:
    @settings(max_examples=40, deadline=None)
    @given(tensor_batches())
    def test_a_small_batch_crosses_as_bytes_and_unpickles_as_the_same_batch(self, batch):
        message = bytes(ForkingPickler.dumps(hand_off(batch)))
        rebuilt = ForkingPickler.loads(message)
        assert type(rebuilt) is dict and list(rebuilt) == list(batch)
        for key, tensor in batch.items():
            assert_identical(rebuilt[key], tensor)

    def test_no_shared_memory_crosses_for_a_small_batch_and_one_block_for_a_large_one(self, monkeypatch):
        batch = {"pixel_values": torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8),
                 "labels": torch.arange(64)}
        small = hand_off(batch)
        assert type(small) is InlineBatch
        monkeypatch.setattr(handoff, "INLINE_BYTES", 1024)  # the same batch is now a large one
        large = hand_off(batch)
        assert type(large) is dict and len(storages(large)) == 1
        messages = bytes(ForkingPickler.dumps(small)), bytes(ForkingPickler.dumps(large))
        rebuilt = counting_rebuilds(monkeypatch)
        for message, blocks in zip(messages, (0, 1)):
            del rebuilt[:]
            received = ForkingPickler.loads(message)
            assert len(rebuilt) == blocks
            for key, tensor in batch.items():
                assert_identical(received[key], tensor)

    @pytest.mark.parametrize("kind", [list, tuple])
    def test_lists_and_tuples_of_tensors_keep_their_type(self, kind):
        tensors = kind([torch.arange(6).view(2, 3), torch.ones(4, dtype=torch.bool), torch.tensor(3.5)])
        received = ForkingPickler.loads(bytes(ForkingPickler.dumps(hand_off(tensors))))
        assert type(received) is kind
        for ours, expected in zip(received, tensors):
            assert_identical(ours, expected)

    def test_a_batch_of_anything_else_is_sent_as_it_is(self):
        batch = {"input_ids": torch.arange(4), "text": ["a", "b"]}
        assert hand_off(batch) is batch


class TestWorkerCollate:
    def test_in_the_parent_process_it_is_the_seeded_collate(self):
        rows = [torch.arange(3), torch.arange(3)]
        collate = WorkerCollate(lambda rows: {"a": torch.stack(rows), "b": torch.stack(rows) + 1})
        batch = collate(rows)
        assert isinstance(collate, SeededCollate) and len(storages(batch)) == 2

    @pytest.mark.parametrize("workers", [1, 2])
    def test_worker_batches_arrive_in_one_buffer_equal_to_those_of_no_workers(self, workers):
        def module(**kwargs):
            return UniversalDataModule(Images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, val_split=0, seed=3,
                                       **kwargs)

        plain = module(num_workers=0).train_dataloader()
        assert type(plain.collate_fn) is SeededCollate
        reference = [list(plain), list(plain)]  # two passes: the second in a new order
        assert all(len(storages(batch)) == 2 for batch in reference[0])  # the collator's pixel_values and labels
        loader = module(num_workers=workers).train_dataloader()
        assert type(loader.collate_fn) is WorkerCollate
        for expected_pass in reference:  # the second pass runs through the persistent workers
            batches = list(loader)
            assert len(batches) == len(expected_pass) == 5
            for ours, expected in zip(batches, expected_pass):
                assert list(ours) == list(expected)
                for key in expected:
                    assert_identical(ours[key], expected[key])
                assert len(storages(ours)) == 1


class Images(torch.utils.data.Dataset):
    """uint8 CHW images and integer labels, one dict per row."""

    def __len__(self):
        return 37

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return {"pixel_values": torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=generator),
                "labels": index % 4}


class KilledAtRow13(torch.utils.data.Dataset):
    """Row 13's read kills its worker process (SIGKILL, as the out-of-memory killer does)."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        if index == 13 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"input_ids": torch.arange(1, 4) + index}


def test_after_a_worker_death_is_named_no_later_signal_raises_again():
    # torch's SIGCHLD handler raises for any dead worker still registered, wherever the main thread is: after the
    # named error the pass's workers are stopped and unregistered, so nothing raises later, elsewhere
    dm = UniversalDataModule(KilledAtRow13(), task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0, shuffle=False,
                             num_workers=2)
    iterator = iter(dm.train_dataloader())
    with pytest.raises(RuntimeError, match=r"a worker process of the train loader died: worker [01] \(pid \d+\) "
                                           r"was killed by SIGKILL"):
        for _ in range(10):
            next(iterator)
    signal_handling._error_if_any_worker_fails()  # what the SIGCHLD handler runs: no worker of ours is registered
    assert all(not worker.is_alive() for worker in iterator._workers)


class Exited:
    """A worker process as the loader's iterator holds it: killed (exit code -9), or still running (None)."""

    def __init__(self, pid: int, exitcode: int | None) -> None:
        self.pid, self.exitcode = pid, exitcode


class LostBatch:
    """An iterator whose next batch cannot be received: its shared memory's descriptor is fetched from the worker's
    socket, and the worker is gone (what torch raises then is a connection error, not its own RuntimeError)."""

    _worker_pids_set = False

    def __init__(self, workers: list[Exited]) -> None:
        self._workers, self.shut_down = workers, False

    def __next__(self):
        raise ConnectionResetError(104, "Connection reset by peer")

    def _shutdown_workers(self) -> None:
        self.shut_down = True


class Rows(list):
    role = "train"


class Loader(types.SimpleNamespace):
    """What CheckedBatches reads of its loader (which it holds by a weak reference)."""


def test_a_batch_lost_with_its_dead_worker_is_named_as_the_death():
    batches = LostBatch([Exited(101, None), Exited(102, -9)])
    checked = CheckedBatches(batches, Loader(dataset=Rows(range(8)), batch_sampler=None, skipped=None))
    expected = (r"a worker process of the train loader died: worker 1 \(pid 102\) was killed by SIGKILL "
                r"\(DataLoader worker \(pid\(s\) 102\) exited before its batch was received: ConnectionResetError: "
                r".*Connection reset by peer\)")
    with pytest.raises(RuntimeError, match=expected):
        next(checked)
    assert batches.shut_down


def test_a_connection_error_with_every_worker_alive_is_not_called_a_death():
    batches = LostBatch([Exited(101, None)])
    checked = CheckedBatches(batches, Loader(dataset=Rows(range(8)), batch_sampler=None, skipped=None))
    with pytest.raises(ConnectionResetError):
        next(checked)


def test_the_pipe_from_the_workers_holds_a_whole_inline_batch():
    dm = UniversalDataModule(Images(), task_spec=TaskSpec.vision_tiny(), batch_size=8, val_split=0, num_workers=1)
    loader = dm.train_dataloader()
    next(iter(loader))
    pipe = loader._iterator._worker_result_queue._reader.fileno()
    assert fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ) == handoff.PIPE_BYTES > handoff.INLINE_BYTES


def test_a_pipe_that_cannot_be_widened_warns_once(tmp_path):
    with open(tmp_path / "not-a-pipe", "w") as file:  # F_SETPIPE_SZ fails on a regular file
        class Iterator:  # torch's iterator, as far as the pipe goes (weakly referenced, as torch's are)
            _worker_result_queue = types.SimpleNamespace(_reader=file)

        iterator = Iterator()
        with pytest.warns(RuntimeWarning, match=r"the pipe from the loader's workers could not be widened to 1048576 "
                                                r"bytes \(.*\); batches cross 64 KiB at a time"):
            handoff.widen_result_pipe(iterator)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handoff.widen_result_pipe(iterator)  # the same iterator again (the next epoch): no second warning
