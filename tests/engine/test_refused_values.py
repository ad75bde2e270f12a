"""Values that would train on the wrong thing without a word are refused, naming the split, the row's index in the
data the user gave, the field and the fix: training, validation and test batches of a supervised task without their
targets (a transform that dropped them, NaN read as null), non-finite targets, and audio that is NaN or at int16
scale. At setup where the data's columns show it, else at the first batch that holds it, with 0 and 2 workers."""

from __future__ import annotations

import datasets
import numpy as np
import pandas as pd
import pytest
import torch

from engine import UniversalDataModule
from engine.sources.splits import plan_splits
from task_spec import TaskSpec

REGRESSION = TaskSpec.cls_tiny().replace(name="score", task_type="regression", loss_type="mse")
VISION_REGRESSION = TaskSpec.vision_tiny().replace(task_type="regression", loss_type="mse")


def without_labels(row):
    return {"pixel_values": row["pixel_values"]}


class Rows(torch.utils.data.Dataset):
    """Rows read one by one (nothing to check at setup): ``bad`` rows hold ``value`` under ``key``."""

    def __init__(self, make, bad, key, value, count=16):
        self.make, self.bad, self.key, self.value, self.count = make, set(bad), key, value, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        row = self.make(index)
        if index in self.bad:
            row[self.key] = self.value
        return row


def image_row(index):
    return {"pixel_values": torch.full((3, 8, 8), index, dtype=torch.uint8), "labels": index % 4}


def token_row(index):
    return {"input_ids": torch.arange(5, 9 + index % 3), "labels": float(index)}


def wave_row(index):
    return {"input_values": torch.sin(torch.arange(400 + index) / 7.0) * 0.5, "labels": index % 4}


def first_batch_of(dm, role="train"):
    loader = dm.train_dataloader() if role == "train" else dm.val_dataloader()
    return next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
class TestMissingTargets:
    def test_a_transform_that_drops_the_target_is_refused_naming_the_row(self, workers):
        rows = {"pixel_values": [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 16, "labels": [1] * 16}
        spec = TaskSpec.vision_tiny().replace(additional_config={"image_size": [3, 8, 8]})  # the val images' size
        dm = UniversalDataModule(rows, task_spec=spec, batch_size=4, shuffle=False, val_split=4,
                                 train_transform=without_labels, num_workers=workers)
        dm.setup()
        first = int(dm.split_plan.train[0])  # the row's index in the data given, not its position in the split
        with pytest.raises(ValueError, match=rf"train row {first}: 'labels' should be the row's target \(every "
                                             r"train, val and test row of a supervised task needs one\), but got no "
                                             r"'labels' \(the row's keys: \['pixel_values'\]\); .*train_transform"):
            first_batch_of(dm)
        assert sorted(first_batch_of(dm, "val")) == ["labels", "pixel_values"]  # eval_transform is not the train one

    def test_a_batch_whose_targets_are_all_none_is_refused_in_training(self, workers):
        data = Rows(token_row, bad=range(4, 8), key="labels", value=None)
        dm = UniversalDataModule(data, task_spec=REGRESSION, batch_size=4, shuffle=False, num_workers=workers)
        loader = iter(dm.train_dataloader())
        assert next(loader)["labels"].tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(ValueError, match=r"train row 4: 'labels' should be the row's target .*, but got "
                                             r"labels=None"):
            next(loader)

    def test_audio_and_vision_batches_without_targets_are_refused(self, workers):
        data = Rows(image_row, bad=range(16), key="labels", value=None)
        dm = UniversalDataModule(data, task_spec=TaskSpec.vision_tiny(), batch_size=4, num_workers=workers, seed=3)
        with pytest.raises(ValueError, match=r"train row \d+: 'labels' should be the row's target .*labels=None"):
            first_batch_of(dm)
        data = Rows(wave_row, bad=range(16), key="labels", value=None)
        dm = UniversalDataModule(data, task_spec=TaskSpec.audio_tiny(), batch_size=4, num_workers=workers,
                                 val_data=data)
        with pytest.raises(ValueError, match=r"val row 0: 'labels' should be the row's target .*labels=None"):
            first_batch_of(dm, "val")


class TestMissingTargetsAtSetup:
    def test_nan_targets_that_pandas_reads_as_null_are_refused_at_setup(self):
        frame = pd.DataFrame({"input_ids": [[5, 6, 7]] * 12, "labels": [float(i) for i in range(12)]})
        frame.loc[9, "labels"] = float("nan")
        data = datasets.Dataset.from_pandas(frame)
        assert data[9]["labels"] is None  # Arrow stores pandas' NaN as null
        dm = UniversalDataModule(data, task_spec=REGRESSION, batch_size=4, val_split=4, seed=0)
        role = "val" if 9 in plan_splits(12, val_split=4, seed=0).val else "train"
        with pytest.raises(ValueError, match=rf"{role} row 9: 'labels' should be the row's target .*, but got "
                                             r"labels=None .*NaN"):
            dm.setup()

    def test_a_transform_may_fill_the_targets_so_its_split_is_left_to_the_batches(self):
        frame = pd.DataFrame({"input_ids": [[5, 6, 7]] * 8, "labels": [1.0] * 7 + [float("nan")]})
        dm = UniversalDataModule(datasets.Dataset.from_pandas(frame), task_spec=REGRESSION, batch_size=8,
                                 shuffle=False, train_transform=filled)
        assert first_batch_of(dm)["labels"].tolist() == [1.0] * 7 + [0.0]

    def test_prediction_data_needs_no_targets(self):
        data = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 4})
        dm = UniversalDataModule(predict_data=data, task_spec=REGRESSION, batch_size=4)
        assert sorted(next(iter(dm.predict_dataloader()))) == ["attention_mask", "input_ids"]


class TestTestSplitTargets:
    """test_step computes metrics against the labels: the test split is held to the rule of train and val."""

    def test_a_test_batch_without_targets_is_refused_naming_the_row(self):
        data = Rows(token_row, bad=range(4, 8), key="labels", value=None)
        dm = UniversalDataModule(Rows(token_row, bad=(), key="labels", value=None), test_data=data,
                                 task_spec=REGRESSION, batch_size=4)
        loader = iter(dm.test_dataloader())
        assert next(loader)["labels"].tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(ValueError, match=r"test row 4: 'labels' should be the row's target \(every train, val "
                                             r"and test row of a supervised task needs one\), but got labels=None "
                                             r".*; fill or drop the rows without a target, or pass them as "
                                             r"predict_data"):
            next(loader)

    def test_an_eval_transform_that_drops_the_target_is_refused_on_a_test_split(self):
        rows = {"pixel_values": [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 16, "labels": [1] * 16}
        dm = UniversalDataModule(rows, task_spec=TaskSpec.vision_tiny(), batch_size=4, test_split=4,
                                 eval_transform=without_labels)
        dm.setup()
        first = int(dm.split_plan.test[0])
        with pytest.raises(ValueError, match=rf"test row {first}: 'labels' should be the row's target .*, but got "
                                             r"no 'labels' \(the row's keys: \['pixel_values'\]\)"):
            next(iter(dm.test_dataloader()))

    def test_a_null_target_in_a_test_column_is_refused_at_setup(self):
        frame = pd.DataFrame({"input_ids": [[5, 6, 7]] * 6, "labels": [1.0, 2.0, float("nan"), 4.0, 5.0, 6.0]})
        dm = UniversalDataModule(Rows(token_row, bad=(), key="labels", value=None),
                                 test_data=datasets.Dataset.from_pandas(frame), task_spec=REGRESSION, batch_size=2)
        with pytest.raises(ValueError, match=r"test row 2: 'labels' should be the row's target .*, but got "
                                             r"labels=None"):
            dm.setup()

    def test_prediction_batches_stay_exempt(self):
        data = Rows(token_row, bad=range(16), key="labels", value=None)
        dm = UniversalDataModule(predict_data=data, task_spec=REGRESSION, batch_size=4)
        assert all("labels" not in batch for batch in dm.predict_dataloader())


def filled(row):
    return {**row, "labels": 0.0 if row["labels"] is None else row["labels"]}


class TestNonFiniteTargetsAtSetup:
    @pytest.mark.parametrize("value", [float("nan"), float("inf")])
    def test_a_column_of_targets_is_checked_at_setup(self, value):
        labels = torch.arange(12, dtype=torch.float32)
        labels[7] = value
        rows = {"input_ids": [torch.arange(5, 9)] * 12, "labels": labels}
        dm = UniversalDataModule(rows, task_spec=REGRESSION, batch_size=4)
        with pytest.raises(ValueError, match=rf"train row 7: 'labels' should be a finite number, but got "
                                             rf"labels={value}; .*"):
            dm.setup()

    def test_an_arrow_column_of_targets_is_checked_at_setup(self):
        data = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 6, "labels": [1.0, 2.0, 3.0, -np.inf, 5.0, 6.0]})
        dm = UniversalDataModule(data, task_spec=REGRESSION, batch_size=2, val_data=data)
        with pytest.raises(ValueError, match=r"train row 3: 'labels' should be a finite number, but got labels=-inf"):
            dm.setup()


@pytest.mark.parametrize("workers", [0, 2])
class TestNonFiniteValuesInBatches:
    @pytest.mark.parametrize("value", [float("nan"), float("inf")])
    def test_text_regression_targets(self, workers, value):
        data = Rows(token_row, bad=[6], key="labels", value=value)
        dm = UniversalDataModule(data, task_spec=REGRESSION, batch_size=4, shuffle=False, num_workers=workers)
        with pytest.raises(ValueError, match=rf"train row 6: 'labels' should be a finite number, but got "
                                             rf"labels={value}"):
            list(dm.train_dataloader())

    def test_vision_regression_targets(self, workers):
        data = Rows(image_row, bad=[2], key="labels", value=float("nan"))
        dm = UniversalDataModule(data, task_spec=VISION_REGRESSION, batch_size=4, shuffle=False, num_workers=workers)
        with pytest.raises(ValueError, match=r"train row 2: 'labels' should be a finite number, but got labels=nan"):
            first_batch_of(dm)

    def test_nan_audio_samples(self, workers):
        wave = torch.zeros(300)
        wave[123] = float("nan")
        data = Rows(wave_row, bad=[5], key="input_values", value=wave)
        dm = UniversalDataModule(data, task_spec=TaskSpec.audio_tiny(), batch_size=4, shuffle=False,
                                 num_workers=workers)
        with pytest.raises(ValueError, match=r"train row 5: 'input_values' should hold finite samples, but got "
                                             r"input_values=nan at sample 123"):
            list(dm.train_dataloader())

    def test_float_audio_at_int16_scale(self, workers):
        data = Rows(wave_row, bad=[3], key="input_values", value=torch.sin(torch.arange(500) / 7.0) * 30000.0)
        dm = UniversalDataModule(data, task_spec=TaskSpec.audio_tiny(), batch_size=4, shuffle=False,
                                 num_workers=workers)
        with pytest.raises(ValueError, match=r"train row 3: float 'input_values' should hold samples in \[-1, 1\] "
                                             r".*, but got input_values with max abs=3e\+04; .*divide it by 32768"):
            first_batch_of(dm)


def test_collator_kwargs_cannot_turn_the_requirement_off():
    rows = {"pixel_values": [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 4, "labels": [1] * 4}
    with pytest.raises(ValueError, match=r"collator_kwargs\['require_targets'\]=False contradicts "
                                         r"spec.is_supervised=True"):
        UniversalDataModule(rows, task_spec=TaskSpec.vision_tiny(), collator_kwargs={"require_targets": False})
