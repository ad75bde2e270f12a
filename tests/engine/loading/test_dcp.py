"""The data state in torch.distributed.checkpoint (DCP), in one process: ``dcp.save({"data": dm})`` and a fresh
module (or loader) given to ``dcp.load`` serves exactly the next batches, and a checkpoint of other data or options
is refused as a loaded state always is. Two processes saving and one loading:
tests/distributed/test_dcp_two_processes.py."""

import io

import datasets
import pytest
import torch
import torch.distributed.checkpoint as dcp

from engine import DataLoaderConfig, DataLoaderFactory, DataModule
from engine.core.stateful import SHARED_LEAF, rank_leaf
from task_spec import TaskSpec

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # one process: intended

SPEC = TaskSpec.lm_tiny()


def rows():
    return [torch.arange(1, 2 + n % 11) for n in range(60)]


def module(**kwargs):
    return DataModule(rows(), **{"task_spec": SPEC, "batch_size": 4, "val_split": 8, "seed": 3, **kwargs})


def tensors(batches):
    return [batch["input_ids"].tolist() if isinstance(batch, dict) else batch.tolist() for batch in batches]


def save_after(stateful, loader, steps, folder):
    """Serve ``steps`` batches of ``loader``, save ``stateful`` with DCP into ``folder``; the rest of the pass."""
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    dcp.save({"data": stateful}, checkpoint_id=folder)
    return tensors(batches)


class TestModule:
    @pytest.mark.parametrize("steps", [0, 3])  # before the first batch, mid-epoch
    def test_a_fresh_module_serves_the_next_batches(self, tmp_path, steps):
        dm = module()
        rest = save_after(dm, dm.train_dataloader(), steps, tmp_path)
        fresh = module()
        dcp.load({"data": fresh}, checkpoint_id=tmp_path)
        assert tensors(fresh.train_dataloader()) == rest
        assert tensors(fresh.train_dataloader()) == tensors(dm.train_dataloader())  # and the next epoch

    def test_a_state_saved_after_the_last_batch_of_an_epoch_continues_with_the_next_epoch(self, tmp_path):
        dm = module()
        assert save_after(dm, dm.train_dataloader(), 13, tmp_path) == []  # 52 rows: 13 batches
        fresh = module()
        dcp.load({"data": fresh}, checkpoint_id=tmp_path)
        assert tensors(fresh.train_dataloader()) == tensors(dm.train_dataloader())

    def test_the_state_is_one_leaf_present_before_the_first_batch(self):
        fresh, ran = module(), module()
        next(iter(ran.train_dataloader()))
        assert list(fresh.state_dict()) == list(ran.state_dict()) == [SHARED_LEAF]

    def test_a_checkpoint_of_another_seed_is_refused(self, tmp_path):
        dm = module()
        save_after(dm, dm.train_dataloader(), 2, tmp_path)
        with pytest.raises(ValueError, match="seed was 3 when saved and is 4 now"):
            dcp.load({"data": module(seed=4)}, checkpoint_id=tmp_path)

    def test_a_checkpoint_of_other_batching_is_refused(self, tmp_path):
        dm = module()
        save_after(dm, dm.train_dataloader(), 2, tmp_path)
        with pytest.raises(ValueError, match="batching was 'plain' when saved and is 'grouped' now"):
            dcp.load({"data": module(batching="grouped")}, checkpoint_id=tmp_path)

    def test_a_stream_saves_each_rank_its_own_leaf(self):
        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 12}).to_iterable_dataset()
        dm = DataModule(stream, task_spec=SPEC, batch_size=4)
        assert dm.per_rank_state and list(dm.state_dict()) == [rank_leaf(0)]


class TestPlainLoader:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_a_fresh_loader_serves_the_next_batches(self, tmp_path, num_workers):
        config = DataLoaderConfig(batch_size=4, shuffle=True, seed=5, num_workers=num_workers)
        data = [torch.full((3,), n) for n in range(60)]
        loader = DataLoaderFactory().create_dataloader(data, config)
        rest = save_after(loader, loader, 5, tmp_path)
        fresh = DataLoaderFactory().create_dataloader(data, config)
        dcp.load({"data": fresh}, checkpoint_id=tmp_path)
        assert [batch.tolist() for batch in fresh] == rest and len(rest) == 10


class TestForms:
    def test_the_readable_state_loads_too(self):
        dm = module()
        batches = iter(dm.train_dataloader())
        next(batches)
        fresh = module()
        fresh.load_state_dict(dm.data_state())
        assert tensors(fresh.train_dataloader()) == tensors(batches)

    def test_the_leaf_holds_the_readable_state(self):
        dm = module()
        next(iter(dm.train_dataloader()))
        leaf = dm.state_dict()[SHARED_LEAF]
        assert isinstance(leaf, bytes)
        assert torch.load(io.BytesIO(leaf), weights_only=True) == dm.data_state()

    def test_another_ranks_stream_state_is_refused(self):
        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 12}).to_iterable_dataset()
        dm = DataModule(stream, task_spec=SPEC, batch_size=4)
        with pytest.raises(ValueError, match=r"but this rank reads 'rank0': each rank of a stream resumes its own"):
            dm.load_state_dict({rank_leaf(1): dm.state_dict()[rank_leaf(0)]})

    def test_a_leaf_that_is_not_bytes_is_refused(self):
        with pytest.raises(TypeError, match=r"the saved state's 'state' should be the bytes state_dict\(\) wrote, "
                                            r"but got dict"):
            module().load_state_dict({SHARED_LEAF: {"seed": 3}})


class TestSeveralDatasets:
    def test_a_fresh_multi_module_continues_the_schedule_from_dcp(self, tmp_path):
        from tests.engine.multi.test_module import module as multi_module
        from tests.engine.multi.test_module import take

        reference = take(multi_module(), 11)
        first = multi_module()
        assert take(first, 5) == reference[:5]
        dcp.save({"data": first}, checkpoint_id=tmp_path)
        assert list(first.state_dict()) == [SHARED_LEAF]
        fresh = multi_module()
        dcp.load({"data": fresh}, checkpoint_id=tmp_path)
        assert take(fresh, 6) == reference[5:]
