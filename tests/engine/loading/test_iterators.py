"""The loader's iterators skip torch's per-batch profiler range while no profiler runs, and keep it (and every
batch and state) when one does."""

import pytest
import torch
import torch.autograd.profiler as autograd_profiler

from engine import UniversalDataModule
from engine.loading.iterators import MultiProcessIterator, SingleProcessIterator
from task_spec import TaskSpec

NEXT_RANGE = "enumerate(DataLoader)#"


def module(workers):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 40, (37,), generator=generator)
    data = [torch.randint(0, 500, (int(n),), generator=generator) for n in lengths]
    return UniversalDataModule(data, task_spec=TaskSpec.lm_tiny(), batch_size=4, seed=3, num_workers=workers)


def batches(loader, count=None):
    out = []
    for index, batch in enumerate(loader):
        out.append({key: value.clone() for key, value in batch.items()})
        if count is not None and index + 1 == count:
            break
    return out


def assert_same(first, second):
    assert len(first) == len(second)
    for left, right in zip(first, second):
        assert left.keys() == right.keys()
        for key in left:
            assert torch.equal(left[key], right[key]), key


@pytest.mark.parametrize("workers", [0, 2])
def test_no_profiler_range_is_entered_while_no_profiler_runs(workers, monkeypatch):
    entered = []
    original = autograd_profiler.record_function

    def counting(name, *args, **kwargs):
        entered.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(autograd_profiler, "record_function", counting)
    dm = module(workers)
    dm.setup()
    loader = dm.train_dataloader()
    iterator = iter(loader)  # with workers, wrapped to name a worker that dies
    assert isinstance(loader._iterator, MultiProcessIterator if workers else SingleProcessIterator)
    seen = batches(iterator)
    assert len(seen) == len(loader) == 10  # 37 rows in batches of 4, the last one short
    assert not [name for name in entered if name.startswith(NEXT_RANGE)]


@pytest.mark.parametrize("workers", [0, 2])
def test_under_a_profiler_the_range_is_recorded_and_batches_and_state_are_unchanged(workers):
    quiet, profiled = module(workers), module(workers)
    quiet.setup()
    profiled.setup()
    expected = batches(quiet.train_dataloader(), count=6)
    expected_state = quiet.train_dataloader().state_dict()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        seen = batches(profiled.train_dataloader(), count=6)
        state = profiled.train_dataloader().state_dict()
    assert_same(seen, expected)
    assert state == expected_state
    whole, resumed = module(workers), module(workers)
    whole.setup()
    resumed.setup()
    loader = resumed.train_dataloader()
    loader.load_state_dict(state)
    assert_same(batches(loader), batches(whole.train_dataloader())[6:])  # the state is at batch 7
    names = [event.name for event in profile.events()]
    assert sum(name.startswith(NEXT_RANGE) for name in names) >= 6


@pytest.mark.parametrize("workers", [0, 2])
def test_a_finished_pass_is_marked_finished_and_the_next_epoch_follows(workers):
    dm = module(workers)
    dm.setup()
    loader = dm.train_dataloader()
    first = batches(loader)
    state = loader.state_dict()
    assert state["_iterator_finished"] is True
    resumed = module(workers)
    resumed.setup()
    again = resumed.train_dataloader()
    again.load_state_dict(state)
    second = batches(loader)
    assert_same(batches(again), second)
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, second))  # a new epoch's order


def test_the_per_batch_snapshot_equals_torchdatas():
    from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter
    from torchdata.stateful_dataloader.worker import try_to_serialize

    from engine.loading.iterators import state_of

    dm = module(2)
    dm.setup()
    loader = dm.train_dataloader()
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    live = loader._iterator
    assert live._get_main_state() == _StatefulMultiProcessingDataLoaderIter._get_main_state(live)
    assert live._get_main_state()["_index_sampler_state"] is not None  # the engine's sampler has a state

    class OnlySave:
        def state_dict(self):
            return {"at": 1}

    class Both(OnlySave):
        def load_state_dict(self, state):
            pass

    class Disabled(Both):
        load_state_dict = None

    for obj in (OnlySave(), Both(), Disabled(), iter([1]), object()):
        assert state_of(obj) == try_to_serialize(obj)
