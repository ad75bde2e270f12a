"""Tests for collators.targets and ``require_targets``: a train, val or test batch of a supervised task must carry
its targets, float targets must be finite, and errors name a row by its split and index when the batch says them."""

from __future__ import annotations

import pytest
import torch

from collators import (
    AudioCollator,
    CollatorRegistry,
    DefaultCollator,
    TextCollator,
    VisionCollator,
    create_default_collator,
)
from collators.audio import SAMPLE_LIMIT
from collators.default import collate_labels
from collators.targets import row_name
from task_spec import TaskSpec


class Batch(list):
    """Rows as the engine hands them: with their split and their indices in the data the user gave."""

    def __init__(self, rows, role="train", indices=None):
        super().__init__(rows)
        self.role, self.indices = role, indices if indices is not None else [10 + i for i in range(len(rows))]


def images(count, **extra):
    return [{"pixel_values": torch.zeros(3, 4, 4, dtype=torch.uint8), **extra} for _ in range(count)]


class TestRowName:
    def test_a_plain_list_names_the_position_and_an_engine_batch_the_split_and_index(self):
        assert row_name([1, 2, 3], 2) == "row 2"
        assert row_name(Batch([1, 2, 3], role="val", indices=[7, 3, 9]), 2) == "val row 9"


class TestRequireTargets:
    def test_without_a_split_or_in_predict_a_batch_may_lack_labels(self):
        collate = VisionCollator(require_targets=True)
        assert "labels" not in collate(images(2))
        assert "labels" not in collate(Batch(images(2), role="predict"))

    @pytest.mark.parametrize("role", ["train", "val", "test"])
    def test_train_val_and_test_batches_must_carry_them(self, role):
        with pytest.raises(ValueError, match=rf"^{role} row 10: 'labels' should be the row's target \(every train, "
                                             r"val and test row of a supervised task needs one\), but got no "
                                             r"'labels' \(the row's keys: \['pixel_values'\]\); a train_transform"):
            VisionCollator(require_targets=True)(Batch(images(2), role=role))
        with pytest.raises(ValueError, match=rf"^{role} row 11: 'labels' should be .*, but got labels=None \(a NaN "
                                             r"in a pandas or Arrow column is read as None\); fill or drop"):
            VisionCollator(require_targets=True)(Batch([*images(1, labels=1), *images(1, labels=None)], role=role))

    def test_without_the_option_a_training_batch_may_still_lack_them(self):
        assert "labels" not in VisionCollator()(Batch(images(2)))

    def test_it_needs_a_target_field(self):
        for make in (VisionCollator, AudioCollator, DefaultCollator):
            with pytest.raises(ValueError, match=r"require_targets=True needs the key of the .*, but got "
                                                 r"target_field=None"):
                make(target_field=None, require_targets=True)

    def test_the_factories_set_it_from_the_spec(self):
        registry = CollatorRegistry.get_instance()
        assert registry.get_collator(TaskSpec.vision_tiny()).require_targets
        assert registry.get_collator(TaskSpec.audio_tiny()).require_targets
        tabular = TaskSpec(name="prices", task_type="regression", loss_type="mse", modality="tabular")
        default = create_default_collator(tabular)
        assert (default.target_field, default.require_targets) == ("labels", True)
        assert create_default_collator(TaskSpec.lm_tiny()).require_targets is False

    def test_text_reads_it_from_the_task_type(self):
        rows = [{"input_ids": [5, 6]}, {"input_ids": [7]}]
        collate = TextCollator(task_type="classification", pad_token_id=0)
        assert "labels" not in collate(rows) and "labels" not in collate(Batch(rows, role="predict"))
        with pytest.raises(ValueError, match=r"^train row 10: 'labels' should be the row's target .* but got no "
                                             r"'labels' \(the row's keys: \['input_ids'\]\)"):
            collate(Batch(rows))
        with pytest.raises(ValueError, match=r"^test row 10: 'labels' should be the row's target"):
            collate(Batch(rows, role="test"))
        assert "labels" in TextCollator(task_type="causal_lm", pad_token_id=0)(Batch(rows))  # derived from inputs

    def test_the_default_collator_checks_dict_rows(self):
        collate = DefaultCollator(target_field="y", require_targets=True)
        rows = [{"x": torch.ones(2), "y": 1.0}, {"x": torch.ones(2), "y": None}]
        with pytest.raises(ValueError, match=r"^train row 11: 'y' should be the row's target .*y=None"):
            collate(Batch(rows))
        with pytest.raises(ValueError, match=r"^val row 10: 'y' should be the row's target .*but got no 'y'"):
            collate(Batch([{"x": torch.ones(2)}] * 2, role="val"))
        with pytest.raises(ValueError, match=r"^test row 11: 'y' should be the row's target .*y=None"):
            collate(Batch(rows, role="test"))
        assert "y" not in collate(Batch([{"x": torch.ones(2)}] * 2, role="predict"))


class TestFiniteTargets:
    @pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
    def test_float_labels_must_be_finite(self, value):
        shown = {"nan": "nan", "inf": "inf", "-inf": "-inf"}[str(value)]
        with pytest.raises(ValueError, match=rf"^row 1: 'labels' should be a finite number, but got labels={shown}"):
            collate_labels([0.5, value], key="labels")
        with pytest.raises(ValueError, match=r"^train row 11: 'labels' should be a finite number"):
            collate_labels([torch.tensor(0.5), torch.tensor(value)], key="labels", rows=Batch([0, 1]))
        with pytest.raises(ValueError, match=rf"^train row 11: 'score' should be a finite number, but got "
                                             rf"score={shown}"):
            TextCollator(task_type="regression", pad_token_id=0, target_field="score")(
                Batch([{"input_ids": [5], "score": 1.0}, {"input_ids": [6], "score": value}]))
        with pytest.raises(ValueError, match=rf"^row 0: 'y' should be a finite number, but got y={shown}"):
            DefaultCollator(target_field="y")([{"y": value}, {"y": 1.0}])

    def test_nan_class_labels_are_named_as_nan_not_as_fractional(self):
        with pytest.raises(ValueError, match=r"^row 0: 'labels' should be a finite number, but got labels=nan"):
            TextCollator(task_type="classification", pad_token_id=0)([{"input_ids": [5], "labels": float("nan")}])


class TestAudioSamples:
    def test_a_nan_in_a_channel_is_named_with_its_sample_and_channel(self):
        wave = torch.zeros(2, 50)
        wave[1, 7] = float("inf")
        with pytest.raises(ValueError, match=r"^val row 11: 'input_values' should hold finite samples, but got "
                                             r"input_values=inf at sample 7 of channel 1"):
            AudioCollator()(Batch([{"input_values": torch.zeros(2, 60)}, {"input_values": wave}], role="val"))

    def test_the_limit_leaves_overshoot_and_padding_alone(self):
        quiet, loud = torch.full((10,), SAMPLE_LIMIT), torch.full((12,), SAMPLE_LIMIT * 1.01)
        AudioCollator()([{"input_values": quiet}])
        AudioCollator(pad_value=-100.0)([{"input_values": quiet}, {"input_values": quiet[:3]}])
        with pytest.raises(ValueError, match=r"^row 1: float 'input_values' should hold samples in \[-1, 1\]"):
            AudioCollator()([{"input_values": quiet}, {"input_values": loud}])

    @pytest.mark.parametrize("pad_value", [float("nan"), float("inf"), "0"])
    def test_a_pad_value_that_is_not_a_finite_number_is_refused(self, pad_value):
        with pytest.raises(ValueError, match=r"pad_value should be a finite number, but got pad_value="):
            AudioCollator(pad_value=pad_value)
