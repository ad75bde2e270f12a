"""RowTransform: the seeding rule, the generator keyword, the global state kept, rows not mutated; a transformed
Hugging Face source takes the row path and seeds its split views by the dataset index."""

import random

import datasets
import numpy as np
import pytest
import torch

from collators.columns import RowBatch
from engine.core.rng import derive_seed
from engine.sampling.base import BatchIndices
from engine.sources.transforms import RowTransform, TransformFailed, split_transforms, takes_generator
from engine.sources.wrappers import HFSource, TensorListSource, TorchSource


def noisy(row):
    return {**row, "x": row["x"] + torch.rand(()) + random.random() + float(np.random.rand())}


def noisy_with(row, *, generator):
    return {**row, "x": row["x"] + torch.rand((), generator=generator)}


def rows(count=4):
    return [{"x": torch.tensor(float(index))} for index in range(count)]


def batch(indices, epoch):
    indices = BatchIndices(indices)
    indices.epoch = epoch
    return indices


class TestSeeding:
    def test_training_rows_are_seeded_by_seed_epoch_and_index_evaluation_rows_without_the_epoch(self):
        train = RowTransform(noisy, seed=3, role="train")
        val = RowTransform(noisy, seed=3, role="val")
        assert train.row_seed(7, 2) == derive_seed(3, "transform", "train", 2, 7) != train.row_seed(7, 1)
        assert val.row_seed(7, 0) == val.row_seed(7, 5) == derive_seed(3, "transform", "val", 7)

    def test_a_row_gets_the_same_values_alone_or_in_any_batch(self):
        transform = RowTransform(noisy, seed=0, role="train")
        together = transform(rows(), [10, 11, 12, 13], epoch=1)
        alone = [transform([row], [index], epoch=1)[0] for row, index in zip(rows(), [10, 11, 12, 13])]
        reversed_order = transform(rows()[::-1], [13, 12, 11, 10], epoch=1)[::-1]
        assert [r["x"] for r in together] == [r["x"] for r in alone] == [r["x"] for r in reversed_order]
        assert [r["x"] for r in together] != [r["x"] for r in transform(rows(), [10, 11, 12, 13], epoch=2)]

    def test_a_transform_with_a_generator_keyword_gets_a_seeded_generator_and_the_global_state_is_not_used(self):
        transform = RowTransform(noisy_with, seed=1, role="train")
        assert transform.uses_generator and not takes_generator(noisy)
        state = torch.get_rng_state()
        out = transform(rows(2), [4, 5], epoch=0)
        assert torch.equal(torch.get_rng_state(), state)
        expected = torch.rand((), generator=torch.Generator().manual_seed(transform.row_seed(5, 0)))
        assert torch.equal(out[1]["x"], 1 + expected)

    def test_the_global_state_is_restored_also_when_the_transform_raises(self):
        def failing(row):
            torch.rand(3), random.random(), np.random.rand()
            raise KeyError("pixel_values")

        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
        with pytest.raises(TransformFailed) as caught:
            RowTransform(failing, seed=0, role="test")(rows(2), [8, 9], epoch=0)
        assert caught.value.index == 8 and isinstance(caught.value.error, KeyError)
        assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
        assert np.array_equal(np.random.get_state()[1], states[2])

    def test_a_transform_that_sets_a_key_does_not_change_the_sources_row(self):
        def set_key(row):
            row["x"] = torch.tensor(-1.0)
            return row

        given = rows(1)
        assert RowTransform(set_key, seed=0, role="train")(given, [0], epoch=0)[0]["x"] == -1
        assert given[0]["x"] == 0


class TestSources:
    def test_a_transformed_hf_source_takes_the_row_path_and_its_view_seeds_by_dataset_index(self):
        data = datasets.Dataset.from_dict({"input_ids": [[i, i + 1] for i in range(10)], "labels": list(range(10))})
        source = HFSource(data)
        assert type(source.handing_columns().__getitems__([0, 1])).__name__ == "ColumnBatch"
        transform = RowTransform(lambda row: row, seed=0, role="val")
        view = source.handing_columns().view(np.array([6, 2, 9])).for_role("val", transform)
        fetched = view.__getitems__(batch([0, 2], epoch=0))
        assert isinstance(fetched, RowBatch) and [row["labels"] for row in fetched] == [6, 9]
        assert [view.dataset_index(p) for p in range(3)] == [6, 2, 9]

    def test_the_epoch_travels_with_the_batch_indices(self):
        tensors = [torch.zeros(2) for _ in range(3)]
        source = TensorListSource(tensors, key="x").for_role("train", RowTransform(noisy, seed=0, role="train"))
        epoch0, epoch1 = source.__getitems__(batch([0, 1], 0)), source.__getitems__(batch([0, 1], 1))
        assert not torch.equal(epoch0[0]["x"], epoch1[0]["x"])
        assert torch.equal(source.__getitems__(batch([1], 1))[0]["x"], epoch1[1]["x"])
        assert torch.equal(source[0]["x"], epoch0[0]["x"])  # a plain index reads epoch 0
        assert torch.equal(tensors[0], torch.zeros(2))

    def test_for_role_copies_the_source(self):
        source = TensorListSource([torch.zeros(2)])
        train = source.for_role("train", None)
        assert train is not source and source.role == "data" and train.role == "train"
        assert train.buffer is source.buffer


def test_split_transforms_gives_val_test_and_predict_the_eval_transform():
    transforms = split_transforms(noisy, noisy_with, seed=0)
    assert {role: t.transform for role, t in transforms.items()} == {
        "train": noisy, "val": noisy_with, "test": noisy_with, "predict": noisy_with}
    assert [t.argument for t in transforms.values()] == ["train_transform"] + ["eval_transform"] * 3
    assert split_transforms(None, None, seed=0) == {}


def double_in_place(row):
    row["x"].mul_(2)
    return row


def fresh_rows(count):
    """A torch dataset whose every read makes its rows afresh: changing them in place harms nothing."""
    class Fresh(torch.utils.data.Dataset):
        def __len__(self):
            return count

        def __getitem__(self, index):
            return {"x": torch.full((2,), float(index)), "y": np.full(2, index)}
    return Fresh()


class TestWritesInPlace:
    def test_a_transform_that_changes_a_stored_tensor_in_place_is_refused_naming_the_row_and_the_fix(self):
        tensors = [torch.ones(2) * i for i in range(4)]
        source = TensorListSource(tensors, key="x").for_role("train", RowTransform(double_in_place, seed=0,
                                                                                   role="train"))
        with pytest.raises(ValueError, match=r"train_transform should return new values and leave the row it is "
                                             r"given as it is, but got train_transform\(row\) changing row\['x'\] of "
                                             r"row 1 of the train data in place; .* Assign a new tensor \(row\['x'\] "
                                             r"= row\['x'\] \* 2, not row\['x'\]\.mul_\(2\)\)"):
            source.__getitems__(batch([1, 2], 0))

    def test_a_torch_dataset_of_stored_tensors_is_refused_too(self):
        stored = [{"x": torch.ones(2)} for _ in range(3)]
        source = TorchSource(stored).for_role("val", RowTransform(double_in_place, seed=0, role="val"))
        with pytest.raises(ValueError, match=r"eval_transform should return new values .* row 0 of the val data"):
            source.__getitems__(batch([0], 0))

    def test_rows_made_afresh_by_each_read_may_be_changed_in_place(self):
        source = TorchSource(fresh_rows(4)).for_role("train", RowTransform(double_in_place, seed=0, role="train"))
        for epoch in range(2):
            assert [row["x"].tolist() for row in source.__getitems__(batch([1, 3], epoch))] == [[2, 2], [6, 6]]

    def test_a_copy_for_another_source_checks_its_rows_afresh(self):
        import copy

        fresh = RowTransform(double_in_place, seed=0, role="train")
        TorchSource(fresh_rows(2)).for_role("train", fresh).__getitems__(batch([0], 0))
        assert fresh.fresh_keys == {"x"}
        stored = TensorListSource([torch.ones(2)] * 2, key="x").for_role("train", copy.copy(fresh))
        with pytest.raises(ValueError, match=r"train_transform should return new values"):
            stored.__getitems__(batch([0], 0))

    def test_a_transform_writing_into_a_stored_numpy_array_writes_into_a_copy(self):
        def add_one(row):
            row["x"] += 1
            return row

        column = np.zeros((4, 2))
        source = TorchSource(torch.utils.data.StackDataset(x=column)).for_role(
            "train", RowTransform(add_one, seed=0, role="train"))
        for epoch in range(2):
            assert [row["x"].tolist() for row in source.__getitems__(batch([0, 1], epoch))] == [[1, 1], [1, 1]]
        assert not column.any()
