"""Tests for task_spec/_checks.py: contradictory fields are refused, numpy integers are accepted as ints."""

from __future__ import annotations

import re

import numpy as np
import pytest

from task_spec import TaskSpec


class TestContradictions:
    @pytest.mark.parametrize("modality", ["vision", "audio"])
    @pytest.mark.parametrize("task_type", ["causal_lm", "masked_lm"])
    def test_language_modelling_needs_token_ids(self, modality, task_type):
        expected = (
            f"TaskSpec.task_type should be a task that {modality} inputs can serve, but got task_type={task_type!r} "
            f"with modality={modality!r}: language modelling predicts token ids, which {modality} rows do not have; "
            f"use modality='text' (or 'multimodal' for images with text), or a task_type such as 'classification'"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type=task_type, modality=modality)

    @pytest.mark.parametrize("modality", ["text", "multimodal"])
    def test_language_modelling_on_token_ids_is_fine(self, modality):
        assert TaskSpec(name="t", task_type="causal_lm", modality=modality).modality == modality

    def test_regression_with_cross_entropy_is_refused(self):
        expected = (
            "TaskSpec.loss_type should be a regression loss ('mse' or 'l1') for task_type='regression', but got "
            "loss_type='cross_entropy' (the default, a classification loss); pass loss_type='mse'"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="regression")
        with pytest.raises(ValueError, match=re.escape("pass loss_type='mse'")):
            TaskSpec(name="t", task_type="regression", loss_type="mse").replace(loss_type="cross_entropy")

    @pytest.mark.parametrize("loss_type", ["mse", "l1"])
    def test_regression_losses_are_fine(self, loss_type):
        assert TaskSpec(name="t", task_type="regression", loss_type=loss_type).loss_type == loss_type

    def test_target_among_the_input_fields_is_refused(self):
        expected = (
            "TaskSpec.target_field should not be one of the input_fields, but got target_field='labels' with "
            "input_fields=('input_ids', 'labels'): the model would read its own target; name the target another "
            "key, or drop it from input_fields"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="classification", input_fields=("input_ids", "labels"))
        with pytest.raises(ValueError, match=re.escape("but got target_field='pixel_values'")):
            TaskSpec(name="t", task_type="classification", modality="vision", target_field="pixel_values")

    @pytest.mark.parametrize(
        ("name", "token_id"), [("pad_token_id", 100), ("pad_token_id", 250), ("mask_token_id", 100)]
    )
    def test_ids_written_into_inputs_must_be_inside_the_vocabulary(self, name, token_id):
        expected = (
            f"TaskSpec.special_tokens[{name!r}] should be below additional_config['vocab_size']=100, but got "
            f"{name}={token_id}: the id would index past the embedding table; raise vocab_size to at least "
            f"{token_id + 1}, or set {name} to an id inside the vocabulary"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="masked_lm", special_tokens={name: token_id},
                     additional_config={"vocab_size": 100})

    def test_pad_at_the_last_id_and_without_a_vocab_size_are_fine(self):
        spec = TaskSpec(name="t", task_type="causal_lm", special_tokens={"pad_token_id": 99},
                        additional_config={"vocab_size": 100})
        assert spec.special_tokens["pad_token_id"] == 99
        assert TaskSpec(name="t", task_type="causal_lm", special_tokens={"pad_token_id": 10**6}).vocab_size is None

    def test_replace_that_shrinks_the_vocabulary_below_the_pad_id_is_refused(self):
        with pytest.raises(ValueError, match=re.escape("but got pad_token_id=50256")):
            TaskSpec.lm_tiny().replace(additional_config={"vocab_size": 50})


class TestSizes:
    @pytest.mark.parametrize("key", ["n_mels", "n_fft", "hop_length", "max_tokens"])
    def test_preprocessing_sizes_must_be_positive(self, key):
        expected = f"TaskSpec.preprocessing_config[{key!r}] should be a positive int, but got 0"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="classification", preprocessing_config={key: 0})

    @pytest.mark.parametrize(("value", "error"), [(1.5, ValueError), (-0.1, ValueError), ("0.2", TypeError),
                                                  (True, TypeError)])
    def test_mlm_probability_must_be_a_probability(self, value, error):
        with pytest.raises(error, match=re.escape("TaskSpec.preprocessing_config['mlm_probability'] should be a "
                                                  "probability in [0, 1], but got")):
            TaskSpec(name="t", task_type="masked_lm", preprocessing_config={"mlm_probability": value})


class TestNumpyIntegers:
    @pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16])
    def test_numpy_ints_are_accepted_and_become_int(self, dtype):
        spec = TaskSpec(
            name="t", task_type="classification",
            special_tokens={"pad_token_id": dtype(0)},
            additional_config={"num_classes": dtype(3), "vocab_size": dtype(100), "max_seq_len": dtype(16),
                               "image_size": [dtype(3), dtype(8), dtype(8)]},
        )
        assert (spec.num_classes, spec.vocab_size, spec.max_seq_len) == (3, 100, 16)
        assert type(spec.num_classes) is int and type(spec.special_tokens["pad_token_id"]) is int
        assert spec.additional_config["image_size"] == (3, 8, 8)
        assert all(type(size) is int for size in spec.additional_config["image_size"])
        assert spec == TaskSpec(name="t", task_type="classification", special_tokens={"pad_token_id": 0},
                                additional_config={"num_classes": 3, "vocab_size": 100, "max_seq_len": 16,
                                                   "image_size": [3, 8, 8]})

    def test_numpy_ints_in_replace(self):
        assert TaskSpec.cls_tiny().replace(additional_config={"num_classes": np.int64(5)}).num_classes == 5

    @pytest.mark.parametrize("value", [np.bool_(True), True])
    def test_bools_are_refused(self, value):
        with pytest.raises(TypeError, match=re.escape("TaskSpec.additional_config['num_classes'] should be a "
                                                      "positive int, but got bool")):
            TaskSpec(name="t", task_type="classification", additional_config={"num_classes": value})

    def test_numpy_zero_is_still_refused(self):
        expected = "TaskSpec.additional_config['vocab_size'] should be a positive int, but got 0"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", additional_config={"vocab_size": np.int64(0)})
