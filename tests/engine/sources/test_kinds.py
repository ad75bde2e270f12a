"""The kinds of data a new user hands over: each is read correctly or refused naming what is accepted."""

import re

import datasets
import pandas as pd
import pytest
import torch
from torch.utils.data import TensorDataset
from torchvision.datasets import FakeData

from engine import MultiDataModule, UniversalDataModule
from task_spec import TaskSpec

SPEC = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 2})
IDS = torch.randint(5, 50, (20, 6))
LABELS = torch.randint(0, 2, (20,))


def first_batch(dm):
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize("data", ["a sentence", b"bytes", 42, 3.5])
def test_non_datasets_are_refused_listing_the_accepted_kinds(data):
    with pytest.raises(TypeError, match="train_data should be a datasets.Dataset or DatasetDict, .* a pandas "
                                        f"DataFrame, .* but got {type(data).__name__}"):
        UniversalDataModule(data, task_spec=SPEC)


def test_the_role_is_named_for_other_data():
    with pytest.raises(TypeError, match="val_data should be a datasets.Dataset"):
        UniversalDataModule(TensorDataset(IDS, LABELS), val_data="oops", task_spec=SPEC)


def test_a_dataframe_goes_through_arrow():
    frame = pd.DataFrame({"input_ids": [[5, 6, 7], [8, 9]] * 10, "labels": [0, 1] * 10})
    dm = UniversalDataModule(frame, task_spec=SPEC, batch_size=4, shuffle=False)
    batch = first_batch(dm)
    assert batch["input_ids"].tolist()[:2] == [[5, 6, 7], [8, 9, 0]] and batch["labels"].tolist() == [0, 1, 0, 1]
    assert type(dm.datasets["train"]).__name__ == "HFSource"


def test_tuple_rows_map_onto_the_specs_input_and_target():
    batch = first_batch(UniversalDataModule(TensorDataset(IDS, LABELS), task_spec=SPEC, batch_size=4, shuffle=False))
    assert torch.equal(batch["input_ids"], IDS[:4]) and torch.equal(batch["labels"], LABELS[:4])


def test_torchvision_datasets_give_image_tensors_and_labels():
    spec = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 10})
    images = FakeData(size=12, image_size=(3, 8, 8), num_classes=10)
    batch = first_batch(UniversalDataModule(images, task_spec=spec, batch_size=4, shuffle=False))
    assert batch["pixel_values"].shape == (4, 3, 8, 8) and batch["labels"].tolist() == [images[i][1] for i in range(4)]


def test_tuples_that_do_not_fit_the_spec_are_refused():
    with pytest.raises(ValueError, match=r"rows are tuples of 3 values, but the spec's fields are \('input_ids', "
                                         r"'labels'\)"):
        UniversalDataModule(TensorDataset(IDS, LABELS, LABELS), task_spec=SPEC)


class TestDictOfColumns:
    """A dict is one dataset's columns when its keys are the spec's fields; otherwise {name: dataset}."""

    def test_column_tensors_are_one_dataset(self):
        dm = UniversalDataModule({"input_ids": IDS, "labels": LABELS}, task_spec=SPEC, batch_size=4, shuffle=False)
        batch = first_batch(dm)
        assert torch.equal(batch["input_ids"], IDS[:4]) and batch["labels"].tolist() == \
            LABELS[:4].tolist()

    def test_columns_of_unequal_lengths_are_refused_naming_each(self):
        with pytest.raises(ValueError, match=r"equal lengths, but got \{'input_ids': 20, 'labels': 5\}"):
            UniversalDataModule({"input_ids": IDS, "labels": LABELS[:5]}, task_spec=SPEC)

    def test_named_datasets_stay_named(self):
        named = {"first": TensorDataset(IDS, LABELS), "second": TensorDataset(IDS, LABELS)}
        dm = MultiDataModule(named, task_spec=SPEC, batch_size=4)
        assert sorted(dm.children) == ["first", "second"]
        with pytest.raises(TypeError, match=r"named datasets \['first', 'second'\]; pass mix=.*use MultiDataModule"):
            UniversalDataModule(named, task_spec=SPEC, batch_size=4)


class TestHowADictIsRead:
    """The rule, without a spec: tensors, arrays and lists of values are columns; datasets are named datasets;
    lists of tensors (either) go by their keys; a dict that reads both ways is refused naming both."""

    def test_column_tensors_without_a_spec_are_one_dataset(self):
        dm = UniversalDataModule({"input_ids": IDS, "labels": LABELS}, batch_size=4, shuffle=False)
        batch = first_batch(dm)
        assert torch.equal(batch["input_ids"], IDS[:4]) and torch.equal(batch["labels"], LABELS[:4])
        assert dm.split_sizes["train"] == 20

    def test_arrays_and_value_lists_under_any_keys_are_one_dataset(self):
        columns = {"ids": IDS.numpy(), "score": [float(i) for i in range(20)], "note": ["a b"] * 20}
        dm = UniversalDataModule(columns, batch_size=4, shuffle=False)
        assert dm.split_sizes["train"] == 20 and dm.datasets["train"][3]["note"] == "a b"
        with pytest.raises(TypeError, match="MultiDataModule takes train_data={name: data}"):
            MultiDataModule(columns)

    def test_tensor_columns_of_unequal_lengths_are_refused_as_columns(self):
        with pytest.raises(ValueError, match=r"the columns should have equal lengths, but got \{'a': 20, 'b': 5\}"):
            UniversalDataModule({"a": IDS, "b": LABELS[:5]})

    def test_lists_of_tensors_under_column_names_are_columns(self):
        rows = [IDS[i, : 3 + i % 3] for i in range(20)]
        dm = UniversalDataModule({"input_ids": rows, "labels": list(LABELS)}, task_spec=SPEC, batch_size=4,
                                 shuffle=False)
        assert first_batch(dm)["input_ids"][1].tolist() == rows[1].tolist() + [0]

    def test_lists_of_tensors_under_other_names_are_named_datasets(self):
        named = {"wiki": list(IDS), "code": list(IDS)}
        assert sorted(MultiDataModule(named, task_spec=SPEC.replace(task_type="causal_lm", loss_type="cross_entropy"),
                                      batch_size=4).children) == ["code", "wiki"]
        with pytest.raises(TypeError, match=r"named datasets \['code', 'wiki'\]; pass mix=.*use MultiDataModule"):
            UniversalDataModule(named)

    def test_an_ambiguous_dict_is_refused_naming_both_readings(self):
        data = {"input_ids": list(IDS), "wiki": list(IDS)}
        expected = ("train_data={'input_ids': ..., 'wiki': ...} reads two ways: as one dataset's columns (every "
                    "value has 20 items) or as named datasets (every value is a list of tensors), and its keys do not "
                    "decide ('input_ids' names a column, 'wiki' does not); for columns, pass "
                    "datasets.Dataset.from_dict(train_data) or torch.utils.data.StackDataset(**train_data), or a "
                    "TaskSpec whose input_fields/target_field name the keys; for named datasets, use "
                    "MultiDataModule(train_data, ...)")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            UniversalDataModule(data)
        assert sorted(MultiDataModule(data, batch_size=4).children) == ["input_ids", "wiki"]  # named, as asked

    def test_columns_mixed_with_datasets_are_refused(self):
        with pytest.raises(ValueError, match=re.escape(
                "train_data mixes columns ('labels') and datasets ('more'); give one dataset's columns (a tensor, "
                "array or list with one value per row under each key) or {name: dataset}")):
            UniversalDataModule({"labels": LABELS, "more": TensorDataset(IDS, LABELS)}, task_spec=SPEC)

    def test_a_value_that_is_neither_is_named(self):
        with pytest.raises(TypeError, match=re.escape(
                "train_data['labels'] should be a column (a tensor, array or list with one value per row) or a "
                "dataset, but got int: 3")):
            UniversalDataModule({"input_ids": IDS, "labels": 3}, task_spec=SPEC)


class TestDatasetDictSplits:
    def frame(self):
        return datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 8, "labels": [0, 1] * 4})

    @pytest.mark.parametrize("name", ["validation", "val", "valid", "dev", "eval"])
    def test_the_common_validation_names_are_recognised(self, name):
        splits = datasets.DatasetDict({"train": self.frame(), name: self.frame().select(range(3))})
        assert UniversalDataModule(splits, task_spec=SPEC).split_sizes["val"] == 3

    def test_two_validation_splits_or_an_unknown_split_are_refused(self):
        with pytest.raises(ValueError, match=r"several validation splits \['validation', 'dev'\]"):
            UniversalDataModule(datasets.DatasetDict({"train": self.frame(), "validation": self.frame(),
                                                      "dev": self.frame()}), task_spec=SPEC)
        with pytest.raises(ValueError, match=r"splits \['holdout'\] would be ignored"):
            UniversalDataModule(datasets.DatasetDict({"train": self.frame(), "holdout": self.frame()}),
                                task_spec=SPEC)
