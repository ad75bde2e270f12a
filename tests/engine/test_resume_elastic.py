"""Elastic resume of a module: a state saved with K worker processes continues exactly with K' (the sampler runs
in the parent, so the batches do not depend on workers); through a Lightning checkpoint too; global batches are
checked when the number of ranks changes; streams and several named datasets refuse, naming why.
Resuming on another number of ranks with real processes: tests/distributed/test_elastic.py."""

import pickle

import datasets
import pytest
import torch

from engine import MultiDataModule, SeededBatchSampler, UniversalDataModule
from engine.loading.config import DataLoaderConfig
from engine.loading.factory import DataLoaderFactory
from engine.loading.state import check_compatible, module_identity
from tests.engine.test_resume import SPEC, module, rows, run
from tests.engine.test_resume_lightning import Recorder, trainer

MODES = {"plain": {}, "grouped": {"batching": "grouped"}, "token_budget": {"batching": "token_budget",
                                                                          "max_tokens": 96}}


@pytest.mark.parametrize(("before", "after", "batching"), [(2, 0, "plain"), (0, 2, "plain"), (2, 0, "grouped"),
                                                            (0, 2, "token_budget")])
def test_resume_with_another_number_of_workers_continues_exactly(before, after, batching):
    options = MODES[batching]
    reference = run(module(0, **options), 9)  # 5 batches per epoch (token_budget: its own count)
    first = module(before, **options)
    assert run(first, 3) == reference[:3]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(after, **options)
    resumed.load_state_dict(state)
    assert run(resumed, 6) == reference[3:]


def test_a_hugging_face_dataset_resumes_with_another_number_of_workers():
    data = datasets.Dataset.from_dict({"input_ids": [row.tolist() for row in rows()]})
    reference = run(module(0, data=data), 7)
    first = module(2, data=data)
    assert run(first, 2) == reference[:2]
    resumed = module(0, data=data)
    resumed.load_state_dict(first.state_dict())
    assert run(resumed, 5) == reference[2:]


def test_a_state_saved_at_the_end_of_an_epoch_with_workers_goes_on_with_the_next_epoch_without():
    reference = run(module(0), 8)
    first = module(2)
    assert run(first, 5) == reference[:5]  # the whole first epoch
    resumed = module(0)
    resumed.load_state_dict(first.state_dict())
    assert run(resumed, 3) == reference[5:]


def test_lightning_checkpoint_resumes_with_another_number_of_workers(tmp_path):
    full = Recorder()
    trainer(enable_checkpointing=False, max_steps=8).fit(full, datamodule=module(0))
    first = trainer(enable_checkpointing=False, max_steps=3)
    first.fit(Recorder(), datamodule=module(2))
    first.save_checkpoint(tmp_path / "step3.ckpt")  # mid-epoch: 5 batches per epoch
    resumed = Recorder()
    trainer(enable_checkpointing=False, max_steps=8).fit(resumed, datamodule=module(0),
                                                         ckpt_path=tmp_path / "step3.ckpt")
    assert resumed.seen == full.seen[3:]


@pytest.mark.parametrize(("workers_before", "workers_after"), [(2, 2), (0, 2), (2, 0)])
def test_a_loader_state_saved_on_two_ranks_finishes_its_epoch_on_one(workers_before, workers_after):
    """Ranks and workers changed together, at the loader: torchdata's own path when the workers match (the
    sampler converts the state at iter()), the sampler alone when they differ."""
    data = [torch.tensor([row]) for row in range(37)]  # each row is its id; the default collator stacks them

    def loader(ranks, rank, workers):
        sampler = SeededBatchSampler(37, 8 // ranks, shuffle=True, seed=1, num_replicas=ranks, rank=rank)
        config = DataLoaderConfig(batch_size=8 // ranks, num_workers=workers, seed=1)
        return DataLoaderFactory().create_dataloader(data, config, batch_sampler=sampler)

    saving, served = [loader(2, rank, workers_before) for rank in range(2)], []
    for each in saving:
        iterator = iter(each)
        served += [int(row) for _ in range(2) for row in next(iterator).flatten()]
    resumed = loader(1, 0, workers_after)
    resumed.load_state_dict(saving[0].state_dict())
    rest = [int(row) for batch in resumed for row in batch.flatten()]
    assert len(served) == 16 and sorted(served + rest) == list(range(37))  # each row once


class TestGlobalBatch:
    def identity(self, world_size, batch_size, batching="plain", max_tokens=None):
        return module_identity(seed=1, data_fingerprint="d", split_plan=None, world_size=world_size,
                               config=DataLoaderConfig(batch_size=batch_size, num_workers=world_size % 2),
                               uneven="pad", batching=batching, max_tokens=max_tokens)

    def test_the_same_global_batch_on_other_ranks_and_workers_is_accepted(self):
        check_compatible(self.identity(2, 8), self.identity(1, 16), elastic=True)
        check_compatible(self.identity(1, 16), self.identity(4, 4), elastic=True)
        check_compatible(self.identity(2, 32, "token_budget", 100), self.identity(4, 32, "token_budget", 50),
                         elastic=True)  # batch_size is no batch of a token budget
        check_compatible(self.identity(2, 32, "packed", 100), self.identity(1, 32, "packed", 200), elastic=True)
        check_compatible(self.identity(2, 32, "packed", 100), self.identity(4, 32, "packed", 50),
                         elastic=True)  # nor of packed bins: there it sizes the evaluation batches only

    def test_batch_size_is_not_compared_where_tokens_cut_the_batches(self):
        for batching in ("token_budget", "packed"):
            check_compatible(self.identity(2, 32, batching, 100), self.identity(2, 64, batching, 100))
            check_compatible(self.identity(2, 32, batching, 100), self.identity(2, 64, batching, 100), elastic=True)
        with pytest.raises(ValueError, match="does not match this data module"):  # another mode: compared
            check_compatible(self.identity(2, 32, "packed", 100), self.identity(2, 64, "plain", 100))

    def test_packing_keeps_its_global_token_budget_not_a_batch_size(self):
        with pytest.raises(ValueError, match=r"max_tokens x world_size\) was 200 \(100 x 2\).*Resume with "
                                             r"max_tokens=200 \(200 / 1 ranks\)"):
            check_compatible(self.identity(2, 32, "packed", 100), self.identity(1, 32, "packed", 100), elastic=True)

    def test_another_global_batch_names_the_per_rank_batch_to_pass(self):
        with pytest.raises(ValueError, match=r"global batch \(batch_size x world_size\) was 16 \(8 x 2\) when saved "
                                             r"and is 8 \(8 x 1\) now.*Resume with batch_size=16"):
            check_compatible(self.identity(2, 8), self.identity(1, 8), elastic=True)
        with pytest.raises(ValueError, match="16 does not divide among 3 ranks"):
            check_compatible(self.identity(2, 8), self.identity(3, 5), elastic=True)
        with pytest.raises(ValueError, match=r"max_tokens x world_size\) was 200.*Resume with max_tokens=50"):
            check_compatible(self.identity(2, 32, "token_budget", 100), self.identity(4, 32, "token_budget", 100),
                             elastic=True)
        with pytest.raises(ValueError, match=r"max_tokens x world_size\) was 200.*Resume with max_tokens=200"):
            check_compatible(self.identity(2, 8, "packed", 100), self.identity(1, 16, "packed", 100), elastic=True)

    def test_without_elastic_the_ranks_must_match(self):
        with pytest.raises(ValueError, match="world_size was 2 when saved and is 1 now"):
            check_compatible(self.identity(2, 8), self.identity(1, 16))


def stream_module(workers):
    stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 12}).to_iterable_dataset(num_shards=2)
    return UniversalDataModule(stream, task_spec=SPEC, batch_size=2, num_workers=workers, seed=3)


def test_a_stream_refuses_another_number_of_workers_and_says_why():
    first = stream_module(0)
    next(iter(first.train_dataloader()))
    with pytest.raises(ValueError, match=r"num_workers was 0 when saved and is 1 now \(a stream's position"):
        stream_module(1).load_state_dict(first.state_dict())


def test_several_named_datasets_refuse_another_number_of_workers():
    def named(workers):
        return MultiDataModule({"a": rows(count=12), "b": rows(count=12, seed=1)}, task_spec=SPEC, batch_size=4,
                               num_workers=workers, seed=3)
    state = named(0).state_dict()
    with pytest.raises(ValueError, match="num_workers was 0 when saved and is 2 now"):
        named(2).load_state_dict(state)


@pytest.mark.parametrize("mode", ["lazy", "cached"])
def test_a_file_backed_dataset_saved_on_two_ranks_with_workers_finishes_its_epoch_on_one_without(tmp_path, mode):
    """The elastic rule lives in the sampler, so a file-backed source resumes like any other: an HDF5 file whose
    row ``i`` holds ``i``, read by 2 ranks with 2 workers each, then by 1 rank in the main process."""
    import h5py
    import numpy as np

    from engine.datasets import HDF5Dataset

    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as file:
        file["x"] = np.arange(37, dtype=np.int64)

    def loader(ranks, rank, workers):
        sampler = SeededBatchSampler(37, 8 // ranks, shuffle=True, seed=2, num_replicas=ranks, rank=rank)
        config = DataLoaderConfig(batch_size=8 // ranks, num_workers=workers, seed=2)
        return DataLoaderFactory().create_dataloader(HDF5Dataset(path, ["x"], mode=mode), config,
                                                     batch_sampler=sampler)

    saving, served = [loader(2, rank, 2) for rank in range(2)], []
    for each in saving:
        iterator = iter(each)
        served += [int(row) for _ in range(3) for row in next(iterator)["x"]]
    resumed = loader(1, 0, 0)
    resumed.load_state_dict(saving[0].state_dict())
    rest = [int(row) for batch in resumed for row in batch["x"]]
    assert len(served) == 24 and sorted(served + rest) == list(range(37))  # each row exactly once
