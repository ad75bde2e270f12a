"""The step functions against the seed's formulas (shared/seeds/UPSTREAM.md), computed here, not hard-coded."""

import math
import typing

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from engine import DataLoaderConfig, DataLoaderFactory
from engine.multi.loader import MultiDataLoader
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.tools.steps import Batch, get_epoch_length, get_train_dataloader_steps, get_val_dataloader_steps


class Unsized(IterableDataset):
    def __iter__(self):
        return iter(range(7))


class PreBatched(IterableDataset):
    """Yields whole batches and says how big they are, as upstream's ``dataset.batch_size`` fallback expects."""

    batch_size = 16

    def __iter__(self):
        return iter([torch.zeros(16)] * 3)


def batches_of(rows, batch_size, drop_last):
    return rows // batch_size if drop_last else math.ceil(rows / batch_size)


def factory_loader(rows=50, batch_size=8, drop_last=False, **kwargs):
    config = DataLoaderConfig(batch_size=batch_size, drop_last=drop_last, shuffle=True, seed=1)
    return DataLoaderFactory().create_dataloader(TensorDataset(torch.arange(rows)), config, **kwargs)


def test_batch_is_a_dict_alias():
    assert Batch == dict[str, typing.Any]


class TestEpochLength:
    @pytest.mark.parametrize("drop_last", [False, True])
    def test_length_is_the_loaders_batch_count(self, drop_last):
        loader = DataLoader(range(50), batch_size=8, drop_last=drop_last)
        assert get_epoch_length(loader) == batches_of(50, 8, drop_last) == len(loader)
        assert get_epoch_length(factory_loader(drop_last=drop_last)) == batches_of(50, 8, drop_last)

    def test_given_length_wins(self):
        assert get_epoch_length(DataLoader(range(50), batch_size=8), length=3) == 3
        assert get_epoch_length(DataLoader(Unsized(), batch_size=2), length=4) == 4

    def test_unknown_length_names_the_argument(self):
        with pytest.raises(ValueError, match=r"its dataset \(Unsized\) has no __len__\. Pass length=<batches"):
            get_epoch_length(DataLoader(Unsized(), batch_size=2))
        with pytest.raises(ValueError, match="length should be a non-negative integer, but got length=-1"):
            get_epoch_length(range(3), length=-1)


class TestTrainSteps:
    @pytest.mark.parametrize("rows", [50, 64])
    @pytest.mark.parametrize("drop_last", [False, True])
    @pytest.mark.parametrize(("accum", "dp_size"), [(1, 1), (4, 1), (2, 8)])
    @pytest.mark.parametrize("steps_per_epoch", [None, 1])
    def test_seed_semantics(self, rows, drop_last, accum, dp_size, steps_per_epoch):
        batch_size = 8
        for loader in (DataLoader(range(rows), batch_size=batch_size, drop_last=drop_last),
                       factory_loader(rows, batch_size, drop_last)):
            global_batch, steps, returned_accum = get_train_dataloader_steps(loader, steps_per_epoch, accum, dp_size)
            assert global_batch == batch_size * dp_size * accum
            # Given steps count optimizer steps (x accum); the loader's length counts batches (not multiplied);
            # dp_size never divides (each rank's loader is already sharded).
            expected = steps_per_epoch * accum if steps_per_epoch else batches_of(rows, batch_size, drop_last)
            assert (steps, returned_accum) == (expected, accum)

    def test_sharded_loader_counts_its_own_batches(self):
        rank_loader = factory_loader(50, 4, rank=1, num_replicas=4)
        assert get_train_dataloader_steps(rank_loader, None, dp_size=4) == (4 * 4, math.ceil(math.ceil(50 / 4) / 4), 1)

    def test_batch_size_of_a_pre_batched_iterable_comes_from_its_dataset(self):
        loader = DataLoader(PreBatched(), batch_size=None)
        assert get_train_dataloader_steps(loader, 5, 2, dp_size=3) == (16 * 3 * 2, 5 * 2, 2)

    def test_unknown_length_names_train_steps_per_epoch(self):
        with pytest.raises(ValueError, match=r"Pass train_steps_per_epoch=<batches per epoch>"):
            get_train_dataloader_steps(DataLoader(Unsized(), batch_size=2), None)
        assert get_train_dataloader_steps(DataLoader(Unsized(), batch_size=2), 10) == (2, 10, 1)

    def test_length_grouped_sampler_has_a_batch_size(self):
        sampler = LengthGroupedBatchSampler(list(range(1, 41)), batch_size=5, seed=0)
        loader = factory_loader(40, batch_sampler=sampler)
        assert get_train_dataloader_steps(loader, None, dp_size=2) == (5 * 2, len(sampler), 1)

    def test_token_budget_loader_has_no_fixed_batch_size(self):
        lengths = [5 + i % 20 for i in range(60)]
        sampler = TokenBudgetBatchSampler(lengths, max_tokens=64, seed=0)
        loader = factory_loader(60, batch_sampler=sampler)
        mean = sum(len(b) for b in sampler.epoch_batches(0)) / len(sampler.epoch_batches(0))
        with pytest.raises(ValueError, match=rf"max_tokens=64 tokens.*{mean:.1f} rows on average.*Pass batch_size="):
            get_train_dataloader_steps(loader, None)
        assert get_train_dataloader_steps(loader, None, 2, batch_size=4) == (4 * 2, len(sampler), 2)

    def test_no_batch_size_anywhere(self):
        with pytest.raises(ValueError, match="cannot tell the batch size of this DataLoader"):
            get_train_dataloader_steps(DataLoader(Unsized(), batch_size=None), 3)

    def test_more_steps_than_batches_warns(self):
        with pytest.warns(UserWarning, match=r"train_steps_per_epoch=4 x gradient_accumulation_steps=2 = 8 batches, "
                                             r"but the loader has only 7"):
            get_train_dataloader_steps(DataLoader(range(50), batch_size=8), 4, 2)

    @pytest.mark.parametrize(("kwargs", "error", "match"), [
        (dict(train_steps_per_epoch=0), ValueError, "train_steps_per_epoch should be a positive integer"),
        (dict(train_steps_per_epoch=None, gradient_accumulation_steps=0), ValueError,
         "gradient_accumulation_steps should be"),
        (dict(train_steps_per_epoch=None, dp_size=1.5), TypeError,
         r"dp_size should be a positive integer, but got dp_size=1\.5"),
    ])
    def test_invalid_counts(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            get_train_dataloader_steps(DataLoader(range(10), batch_size=2), **kwargs)

    def test_multi_loader(self):
        same = MultiDataLoader({"a": factory_loader(40, 8), "b": factory_loader(24, 8)})
        assert get_train_dataloader_steps(same, None, 2, dp_size=2) == (8 * 2 * 2, 5 + 3, 2)
        mixed = MultiDataLoader({"a": factory_loader(40, 8), "b": factory_loader(24, 4)})
        with pytest.raises(ValueError, match=r"different batch sizes \{'a': 8, 'b': 4\}"):
            get_train_dataloader_steps(mixed, None)
        assert get_train_dataloader_steps(mixed, None, batch_size=6) == (6, 5 + 6, 1)


class TestValSteps:
    @pytest.mark.parametrize("rows", [10, 37])
    @pytest.mark.parametrize("dp_size", [1, 2, 4])
    @pytest.mark.parametrize("sanity", [0, 1, 2, 5])
    @pytest.mark.parametrize("val_steps_per_epoch", [None, 3])
    def test_seed_semantics(self, rows, dp_size, sanity, val_steps_per_epoch):
        loader = DataLoader(range(rows), batch_size=4)
        n = val_steps_per_epoch if val_steps_per_epoch is not None else math.ceil(rows / 4)
        expected = (n // dp_size, math.ceil(sanity / dp_size))  # both divided by dp_size, unlike train
        assert get_val_dataloader_steps(loader, val_steps_per_epoch, sanity, dp_size) == expected

    def test_zero_means_no_validation(self):
        assert get_val_dataloader_steps(DataLoader(range(10), batch_size=2), 0, 2) == (0, 2)

    def test_unknown_length_names_val_steps_per_epoch(self):
        with pytest.raises(ValueError, match=r"Pass val_steps_per_epoch=<batches per epoch>"):
            get_val_dataloader_steps(DataLoader(Unsized(), batch_size=2), None)
        assert get_val_dataloader_steps(DataLoader(Unsized(), batch_size=2), 6, dp_size=4) == (1, 0)

    def test_invalid_counts_and_overrun(self):
        with pytest.raises(ValueError, match="num_sanity_val_steps should be a non-negative integer"):
            get_val_dataloader_steps(range(3), None, -1)
        with pytest.warns(UserWarning, match="val_steps_per_epoch=9, but the loader has only 3 batches"):
            get_val_dataloader_steps(range(3), 9)
