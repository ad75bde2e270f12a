import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from collators.columns import RowBatch
from engine import DataLoaderConfig, DataLoaderFactory
from engine.sampling.base import BatchIndices
from engine.sources.adapt import as_source
from engine.sources.kinds import unpack_dataset_dict
from engine.sources.wrappers import HFSource, TensorListSource, TorchSource


class Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(())


class TestTensorListSource:
    def test_rows_are_views_into_one_flat_buffer(self):
        tensors = [torch.arange(n) for n in (3, 1, 4)] + [torch.zeros(0, dtype=torch.long)]
        source = TensorListSource(tensors)
        assert source.buffer.numel() == 8 and len(source) == 4
        for index, tensor in enumerate(tensors):
            assert torch.equal(source[index], tensor)
            assert source[index].untyped_storage().data_ptr() == source.buffer.untyped_storage().data_ptr()

    def test_multi_dimensional_rows_keep_their_shapes(self):
        source = TensorListSource([torch.ones(2, 3), torch.zeros(4, 1)], key="x")
        assert source[0]["x"].shape == (2, 3) and source[1]["x"].shape == (4, 1)

    def test_scalar_rows_come_back_as_0_d_tensors_and_batch(self):
        source = TensorListSource(list(torch.arange(5.0)))  # list(tensor) gives 0-d rows
        assert source[2].shape == () and float(source[2]) == 2.0
        loader = DataLoaderFactory().create_dataloader(list(torch.arange(5.0)), DataLoaderConfig(batch_size=2))
        assert [batch.tolist() for batch in loader] == [[0.0, 1.0], [2.0, 3.0], [4.0]]

    def test_view_shares_the_buffer_and_maps_positions(self):
        source = TensorListSource([torch.tensor([i]) for i in range(10)])
        view = source.view(np.array([7, 2]))
        assert view.buffer is source.buffer and [int(view[0]), int(view[1])] == [7, 2]
        assert int(view.view(np.array([1]))[0]) == 2


class TestOtherSources:
    def test_hf_source_fetches_rows_in_one_take_and_views_with_select(self):
        source = as_source(datasets.Dataset.from_dict({"a": [1, 2, 3], "b": ["x", "y", "z"]}))
        assert isinstance(source, HFSource)
        assert source.__getitems__([2, 0]) == [{"a": 3, "b": "z"}, {"a": 1, "b": "x"}]
        assert source.view(np.array([1]))[0] == {"a": 2, "b": "y"}

    def test_torch_source_views_compose(self):
        source = as_source(TensorDataset(torch.arange(10)))
        assert isinstance(source, TorchSource)
        view = source.view(np.array([5, 6, 7])).view(np.array([2]))
        assert int(view[0][0]) == 7 and len(view) == 1

    def test_batches_carry_the_seed_of_their_indices(self):
        indices = BatchIndices([0, 1])
        indices.rng_seed = 1234
        rows = as_source([torch.zeros(1), torch.ones(1)]).__getitems__(indices)
        assert isinstance(rows, RowBatch) and rows.rng_seed == 1234

    @pytest.mark.parametrize(("data", "error", "match"), [
        ([1, 2], TypeError, "a list given as data should hold torch.Tensors, but item 0 is a int"),
        (Endless(), TypeError, "an IterableDataset has no length or random access"),
        (42, TypeError, "train_data should be a datasets.Dataset or DatasetDict, .* but got int"),
    ])
    def test_unsupported_data(self, data, error, match):
        with pytest.raises(error, match=match):
            as_source(data)


class TestDatasetDict:
    def test_validation_split_name_and_conflict(self):
        part = datasets.Dataset.from_dict({"a": [1]})
        train, val, test = unpack_dataset_dict(datasets.DatasetDict({"train": part, "val": part}), None, None)
        assert train is part and val is part and test is None
        with pytest.raises(ValueError, match="the DatasetDict has no 'train' split; its splits are \\['test'\\]"):
            unpack_dataset_dict(datasets.DatasetDict({"test": part}), None, None)
        with pytest.raises(ValueError, match="val_data was given, but the DatasetDict has a validation split"):
            unpack_dataset_dict(datasets.DatasetDict({"train": part, "validation": part}), part, None)
