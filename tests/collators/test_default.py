"""Tests for collators.default: agreement with default_collate, dict keys, strings, ragged errors, labels."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

from collators.default import MISSING, DefaultCollator, collate_labels, create_default_collator
from task_spec import TaskSpec


def keep_as_list(batch: list, *, collate_fn_map: dict | None = None) -> list:
    return list(batch)


def _assert_same(ours: object, theirs: object) -> None:
    assert type(ours) is type(theirs)
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        for key in theirs:
            _assert_same(ours[key], theirs[key])
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _assert_same(a, b)
    else:
        assert ours == theirs


class TestAgreesWithDefaultCollate:
    @pytest.mark.parametrize(
        "rows",
        [
            [torch.arange(3), torch.arange(3, 6)],
            [(torch.ones(2),), (torch.zeros(2),)],
            [(torch.ones(2), 1), (torch.zeros(2), 0)],
            [{"x": torch.ones(2), "y": 1.5, "n": 3}, {"x": torch.zeros(2), "y": 2.5, "n": 4}],
            [{"x": np.ones(3), "meta": {"id": 1, "name": "a"}}, {"x": np.zeros(3), "meta": {"id": 2, "name": "b"}}],
            [[1, 2], [3, 4]],
            [1, 2, 3],
        ],
        ids=["tensors", "one_tuple", "pairs", "dicts", "nested", "lists", "ints"],
    )
    def test_same_result(self, rows: list) -> None:
        _assert_same(DefaultCollator()(rows), default_collate(rows))

    def test_list_of_tensors_stacks(self) -> None:
        batch = DefaultCollator()([torch.ones(2, 3), torch.zeros(2, 3)])
        assert isinstance(batch, torch.Tensor) and batch.shape == (2, 2, 3)

    def test_tensor_dataset_rows_keep_list_so_batch0_works(self) -> None:
        dataset = TensorDataset(torch.arange(8.0).view(4, 2))
        batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=DefaultCollator())))
        assert isinstance(batch, list) and len(batch) == 1
        torch.testing.assert_close(batch[0], dataset.tensors[0])


class TestDicts:
    def test_all_keys_kept_and_strings_stay_lists(self) -> None:
        rows = [{"text": "a", "x": torch.ones(2), "y": 0}, {"text": "b", "x": torch.ones(2), "y": 1}]
        batch = DefaultCollator()(rows)
        assert list(batch) == ["text", "x", "y"]
        assert batch["text"] == ["a", "b"] and batch["y"].tolist() == [0, 1]

    def test_missing_key_names_row_and_key(self) -> None:
        rows = [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1}]
        with pytest.raises(ValueError, match=r"row 2 is missing key 'b' that row 0 has"):
            DefaultCollator()(rows)

    def test_extra_key_is_not_dropped_silently(self) -> None:
        # default_collate would return only row 0's keys and lose 'c'.
        with pytest.raises(ValueError, match=r"row 1 has key 'c' that row 0 lacks \(row 0 keys: \['a'\]\)"):
            DefaultCollator()([{"a": 1}, {"a": 2, "c": 3}])


class TestErrors:
    def test_ragged_dict_values_suggest_task_spec(self) -> None:
        rows = [{"input_ids": torch.ones(3)}, {"input_ids": torch.ones(3)}, {"input_ids": torch.ones(5)}]
        with pytest.raises(ValueError, match=r"key 'input_ids': row 2 has shape \(5,\) but row 0 has shape \(3,\); "
                                             r"rows of different lengths need padding: pass a task_spec"):
            DefaultCollator()(rows)

    def test_ragged_tuple_and_bare_rows(self) -> None:
        with pytest.raises(ValueError, match=r"position 0: row 1 has shape \(3,\) but row 0 has shape \(2,\)"):
            DefaultCollator()([(torch.ones(2), 1), (torch.ones(3), 1)])
        with pytest.raises(ValueError, match=r"rows: row 1 has shape \(1, 2\) but row 0 has shape \(2,\)"):
            DefaultCollator()([torch.ones(2), torch.ones(1, 2)])
        with pytest.raises(ValueError, match=r"key 'ids': row 1 has length 1 but row 0 has length 2"):
            DefaultCollator()([{"ids": [1, 2]}, {"ids": [1]}])

    def test_nested_ragged_names_path(self) -> None:
        rows = [{"m": {"v": np.ones(2)}}, {"m": {"v": np.ones(4)}}]
        with pytest.raises(ValueError, match=r"key 'm' > key 'v': row 1 has shape \(4,\)"):
            DefaultCollator()(rows)

    def test_uncollatable_type(self) -> None:
        with pytest.raises(TypeError, match=r"key 'x': row 0 holds NoneType: None, which default_collate cannot "
                                            r"batch; .*collate_fn_map=\{NoneType: fn\}"):
            DefaultCollator()([{"x": None}, {"x": None}])

    def test_empty(self) -> None:
        with pytest.raises(ValueError, match="at least one row"):
            DefaultCollator()([])


class TestContract:
    def test_rows_not_mutated_and_outputs_not_aliased(self) -> None:
        rows = [{"x": torch.ones(2), "a": np.ones(2)}, {"x": torch.ones(2), "a": np.ones(2)}]
        batch = DefaultCollator()(rows)
        batch["x"].fill_(3.0)
        batch["a"].fill_(3.0)
        assert all(row["x"].eq(1).all() and (row["a"] == 1).all() for row in rows)
        assert set(rows[0]) == {"x", "a"}

    def test_pickle_round_trip_generator_and_factory(self) -> None:
        collator = create_default_collator(task_spec=TaskSpec.vision_tiny(), collate_fn_map={type(None): keep_as_list})
        clone = pickle.loads(pickle.dumps(collator))
        assert repr(clone) == repr(collator) and "collate_fn_map" in repr(collator)
        batch = clone([{"x": None, "y": 1}, {"x": None, "y": 2}], generator=torch.Generator().manual_seed(0))
        assert batch["x"] == [None, None] and batch["y"].tolist() == [1, 2]
        assert repr(create_default_collator()) == "DefaultCollator()"


class TestCollateLabels:
    def test_ints_floats_and_scalars(self) -> None:
        ints = collate_labels([1, np.int64(2), torch.tensor(3), np.array([4]), True], key="labels")
        assert ints.dtype == torch.int64 and ints.tolist() == [1, 2, 3, 4, 1]
        floats = collate_labels([0.5, 1], key="labels")
        assert floats.dtype == torch.float32 and floats.tolist() == [0.5, 1.0]

    def test_errors(self) -> None:
        with pytest.raises(ValueError, match=r"row 1: 'labels' should be one class index or value, but got shape"):
            collate_labels([1, torch.tensor([1, 2])], key="labels")
        with pytest.raises(TypeError, match=r"row 0: 'y' should be an int class index or a float target, but got str"):
            collate_labels(["cat"], key="y")
        with pytest.raises(ValueError, match=r"row 1 has no 'labels' but row 0 has one"):
            collate_labels([1, MISSING], key="labels")
