"""The kinds of data a new user hands over: each is read correctly or refused naming what is accepted."""

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
        with pytest.raises(TypeError, match=r"holds several named datasets \['first', 'second'\]; use MultiDataModule"):
            UniversalDataModule(named, task_spec=SPEC, batch_size=4)


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
