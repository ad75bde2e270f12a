"""Batches of column data read with one gather per column: a dict of column tensors or arrays, and a
``TensorDataset`` as tuple rows. Each batch equals the rows read one by one, and no row aliases the user's columns."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from engine import UniversalDataModule
from engine.sources.kinds import ColumnRows, TupleRows, columns_dataset, gather
from task_spec import TaskSpec

IMAGES = torch.randint(0, 256, (12, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
LABELS = torch.arange(12) % 4
INDICES = [7, 0, 11, 3, 3, 5]


def same_rows(ours, expected):
    assert len(ours) == len(expected)
    for row, other in zip(ours, expected):
        assert list(row) == list(other)
        for key in row:
            assert type(row[key]) is type(other[key])
            if isinstance(row[key], (torch.Tensor, np.ndarray)):
                assert row[key].dtype == other[key].dtype and row[key].shape == other[key].shape
                assert (row[key] == other[key]).all()
            else:
                assert row[key] == other[key]


class TestGather:
    @pytest.mark.parametrize("column", [IMAGES, IMAGES.numpy(), LABELS, LABELS.numpy(), ["a", "b", "c"] * 4],
                             ids=["tensor", "array", "labels", "label_array", "list"])
    def test_equals_indexing_row_by_row(self, column):
        same_rows([{"x": value} for value in gather(column, INDICES)], [{"x": column[i]} for i in INDICES])

    def test_an_index_past_the_end_raises(self):
        with pytest.raises(IndexError):
            gather(IMAGES, [0, 12])


class TestColumnRows:
    def test_a_dict_of_columns_reads_batches_as_its_rows(self):
        dataset = columns_dataset({"pixel_values": IMAGES, "labels": LABELS, "name": [str(i) for i in range(12)]})
        assert isinstance(dataset, ColumnRows)
        same_rows(dataset.__getitems__(INDICES), [dataset[i] for i in INDICES])

    def test_rows_do_not_alias_the_columns(self):
        images = IMAGES.clone()
        rows = columns_dataset({"pixel_values": images, "labels": LABELS}).__getitems__([0, 1])
        rows[0]["pixel_values"].zero_()
        assert torch.equal(images, IMAGES)

    def test_a_tensor_dataset_reads_batches_as_its_rows(self):
        rows = TupleRows(TensorDataset(IMAGES, LABELS), ("pixel_values", "labels"), "labels")
        same_rows(rows.__getitems__(INDICES), [rows[i] for i in INDICES])

    def test_a_tensor_dataset_that_does_not_fit_the_fields_is_refused_naming_the_row(self):
        rows = TupleRows(TensorDataset(IMAGES, LABELS, LABELS), ("pixel_values", "labels"), "labels")
        with pytest.raises(ValueError, match="row 7 is a tuple of 3 values"):
            rows.__getitems__(INDICES)


class TestModuleBatches:
    @pytest.mark.parametrize("data", [{"pixel_values": IMAGES, "labels": LABELS}, TensorDataset(IMAGES, LABELS)],
                             ids=["dict_of_columns", "tensor_dataset"])
    def test_batches_equal_those_of_the_same_rows_as_a_list_dataset(self, data):
        options = dict(task_spec=TaskSpec.vision_tiny(), batch_size=5, seed=3)
        rows = [{"pixel_values": image, "labels": int(label)} for image, label in zip(IMAGES, LABELS)]
        for ours, expected in zip(UniversalDataModule(data, **options).train_dataloader(),
                                  UniversalDataModule(_ListRows(rows), **options).train_dataloader(), strict=True):
            assert torch.equal(ours["pixel_values"], expected["pixel_values"])
            assert torch.equal(ours["labels"], expected["labels"])


class _ListRows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]
