import warnings

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler

from engine import DataLoaderConfig, DataLoaderFactory
from engine.sampling.epochs import set_epoch


class Curriculum(Dataset):
    """Rows depend on the epoch: each carries the epoch it was read in."""

    def __init__(self, size=8):
        self.size = size
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return {"index": torch.tensor(index), "epoch": torch.tensor(self.epoch)}


class NoEpochAttribute(Curriculum):
    """A curriculum dataset whose epoch cannot be read back (stored under another name)."""

    def __init__(self, size=8):
        super().__init__(size)
        del self.epoch
        self.stage = 0

    def set_epoch(self, epoch):
        self.stage = epoch

    def __getitem__(self, index):
        return {"index": torch.tensor(index), "epoch": torch.tensor(self.stage)}


def epochs_seen(loader):
    return sorted({e for batch in loader for e in batch["epoch"].tolist()})


def engine_loader(dataset, workers=0, shuffle=True):
    return DataLoaderFactory().create_dataloader(
        dataset, DataLoaderConfig(batch_size=4, num_workers=workers, shuffle=shuffle, seed=5))


class TestSingleProcess:
    def test_reaches_the_sampler_and_the_wrapped_dataset(self):
        dataset = Curriculum()
        loader = engine_loader(dataset)
        reached = set_epoch(loader, 2)
        assert reached == ["batch_sampler", "dataset.dataset"]  # each sampler once, through its handle or not
        assert dataset.epoch == 2 and loader.batch_sampler.epoch == 2
        order = [batch["index"].tolist() for batch in loader]
        assert order == loader.batch_sampler.epoch_batches(2)
        assert [batch["epoch"].tolist() for batch in loader] == [[2] * 4, [2] * 4]  # pinned epochs are not advanced

    def test_each_epoch_reads_its_own_rows(self):
        loader = engine_loader(Curriculum())
        for epoch in range(3):
            set_epoch(loader, epoch)
            assert epochs_seen(loader) == [epoch]

    def test_torch_distributed_sampler_and_plain_dataset(self):
        dataset = Curriculum()
        sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler)
        assert set_epoch(loader, 3) == ["sampler", "dataset"]
        assert sampler.epoch == 3 and dataset.epoch == 3
        expected = list(DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0).__iter__())
        assert expected != list(sampler)  # epoch 3 orders differently from epoch 0

    def test_concatenated_datasets_are_all_reached(self):
        parts = [Curriculum(4), Curriculum(4)]
        loader = DataLoader(ConcatDataset(parts), batch_size=4)
        reached = set_epoch(loader, 1)
        assert reached == ["dataset.datasets[0]", "dataset.datasets[1]"]
        assert [part.epoch for part in parts] == [1, 1]

    @pytest.mark.parametrize(("epoch", "error"), [(-1, ValueError), (1.0, TypeError), (True, TypeError),
                                                  ("1", TypeError)])
    def test_rejects_bad_epochs(self, epoch, error):
        with pytest.raises(error, match="epoch should be a non-negative integer, but got epoch="):
            set_epoch(engine_loader(Curriculum()), epoch)

    def test_rejects_non_loaders(self):
        with pytest.raises(TypeError, match="set_epoch takes a DataLoader, but got list"):
            set_epoch([1, 2], 0)


class TestPersistentWorkers:
    def test_workers_see_each_new_epoch(self):
        loader = engine_loader(Curriculum(), workers=2)
        assert loader.persistent_workers
        set_epoch(loader, 0)
        assert epochs_seen(loader) == [0]
        first_workers = loader._iterator
        for epoch in (1, 2):
            assert "workers restarted" in set_epoch(loader, epoch)
            assert epochs_seen(loader) == [epoch]
        assert loader._iterator is not first_workers

    def test_dataset_without_readable_epoch_is_still_reached(self):
        loader = engine_loader(NoEpochAttribute(), workers=2)
        assert epochs_seen(loader) == [0]
        assert "workers restarted" in set_epoch(loader, 4)
        assert epochs_seen(loader) == [4]

    def test_without_restart_workers_keep_the_stale_epoch(self):
        # The limitation this module exists for (datasets #6673): the parent's set_epoch stays in the parent.
        loader = engine_loader(Curriculum(), workers=2)
        assert epochs_seen(loader) == [0]
        with pytest.warns(UserWarning, match="persistent workers keep the copy they started with"):
            set_epoch(loader, 1, restart_workers=False)
        assert epochs_seen(loader) == [0]

    def test_unchanged_dataset_epoch_keeps_the_workers(self):
        loader = engine_loader(Curriculum(), workers=2)
        assert epochs_seen(loader) == [0]
        workers = loader._iterator
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert "workers restarted" not in set_epoch(loader, 0)
        assert loader._iterator is workers

    def test_mid_epoch_call_warns_and_keeps_the_running_workers(self):
        loader = engine_loader(Curriculum(16), workers=2)
        iterator = iter(loader)
        first = next(iterator)
        with pytest.warns(UserWarning, match="in the middle of an epoch"):
            reached = set_epoch(loader, 1)
        assert "workers restarted" not in reached
        rest = [first, *iterator]
        assert len(rest) == 4 and all(batch["epoch"].tolist() == [0] * 4 for batch in rest)
        # The workers still hold epoch 0; repeating set_epoch between epochs restarts them, same epoch or not.
        assert "workers restarted" in set_epoch(loader, 1)
        assert epochs_seen(loader) == [1]
