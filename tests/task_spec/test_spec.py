"""Tests for task_spec/spec.py (and the freezing in task_spec/_freeze.py): validation, defaults, immutability."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import pytest

from task_spec import LOSS_TYPES, MODALITIES, SUPERVISED_TASK_TYPES, TASK_TYPES, TaskSpec

READ_ONLY = re.escape("TaskSpec mappings are read-only; derive a new spec with spec.replace(field={...}) instead")


def _allowed(values: tuple[str, ...]) -> str:
    return ", ".join(repr(value) for value in values)


class TestEnumeratedFields:
    @pytest.mark.parametrize(
        ("field_name", "allowed"),
        [("modality", MODALITIES), ("task_type", TASK_TYPES), ("loss_type", LOSS_TYPES)],
    )
    def test_bad_value_names_field_value_and_allowed_values(self, field_name, allowed):
        kwargs = {"name": "t", "task_type": "causal_lm", field_name: "bogus"}
        expected = f"TaskSpec.{field_name} should be one of {_allowed(allowed)}, but got {field_name}='bogus'"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(**kwargs)

    @pytest.mark.parametrize("modality", MODALITIES)
    def test_every_modality_is_accepted(self, modality):
        assert TaskSpec(name="t", task_type="classification", modality=modality).modality == modality

    @pytest.mark.parametrize("task_type", TASK_TYPES)
    def test_every_task_type_is_accepted(self, task_type):
        loss_type = "mse" if task_type == "regression" else "cross_entropy"
        assert TaskSpec(name="t", task_type=task_type, loss_type=loss_type).task_type == task_type

    @pytest.mark.parametrize("loss_type", LOSS_TYPES)
    def test_every_loss_type_is_accepted(self, loss_type):
        assert TaskSpec(name="t", task_type="causal_lm", loss_type=loss_type).loss_type == loss_type

    def test_modality_is_checked_before_task_type(self):
        with pytest.raises(ValueError, match=r"^TaskSpec\.modality should be one of"):
            TaskSpec(name="t", task_type="bogus", modality="bogus")


class TestName:
    @pytest.mark.parametrize("name", ["", "   "])
    def test_empty_name_raises(self, name):
        expected = f"TaskSpec.name should be a non-empty string, but got name={name!r}"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name=name, task_type="causal_lm")

    def test_non_string_name_raises(self):
        with pytest.raises(ValueError, match=re.escape("TaskSpec.name should be a non-empty string, but got name=3")):
            TaskSpec(name=3, task_type="causal_lm")

    def test_name_is_checked_first(self):
        with pytest.raises(ValueError, match=r"^TaskSpec\.name "):
            TaskSpec(name="", task_type="bogus", modality="bogus", loss_type="bogus")


class TestModelFamily:
    def test_empty_model_family_raises(self):
        expected = "TaskSpec.model_family should be a non-empty string, but got model_family=''"
        with pytest.raises(ValueError, match=re.escape(expected)):
            TaskSpec(name="t", task_type="causal_lm", model_family="")


class TestInputFields:
    def test_bare_string_raises_type_error_with_the_fix(self):
        expected = (
            "TaskSpec.input_fields should be a sequence of field names, but got the string 'input_ids'; "
            "write input_fields=('input_ids',)"
        )
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", input_fields="input_ids")

    @pytest.mark.parametrize("fields", [("input_ids", ""), ("input_ids", 3)])
    def test_non_string_or_empty_entries_raise(self, fields):
        expected = f"TaskSpec.input_fields should hold non-empty strings, but got {fields!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            TaskSpec(name="t", task_type="causal_lm", input_fields=fields)

    def test_list_becomes_tuple(self):
        spec = TaskSpec(name="t", task_type="causal_lm", input_fields=["input_ids", "attention_mask"])
        assert spec.input_fields == ("input_ids", "attention_mask")
        assert isinstance(spec.input_fields, tuple)


class TestTargetField:
    @pytest.mark.parametrize("task_type", SUPERVISED_TASK_TYPES)
    def test_supervised_task_without_target_raises_with_the_fix(self, task_type):
        expected = (
            f"TaskSpec.target_field is None, but task_type={task_type!r} needs a target; "
            "set target_field='labels' (or the key your rows use)"
        ) + (", or loss_type='contrastive' for pairs whose pairing is the target" if task_type == "classification"
             else "")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type=task_type, target_field=None)

    def test_contrastive_pairs_need_no_target(self):
        spec = TaskSpec(name="pairs", task_type="classification", modality="multimodal", loss_type="contrastive",
                        target_field=None)
        assert spec.target_field is None

    @pytest.mark.parametrize("task_type", ["causal_lm", "masked_lm"])
    def test_language_modelling_allows_no_target(self, task_type):
        assert TaskSpec(name="t", task_type=task_type, target_field=None).target_field is None

    def test_empty_target_raises(self):
        expected = "TaskSpec.target_field should be a non-empty string or None, but got ''"
        with pytest.raises(ValueError, match=re.escape(expected)):
            TaskSpec(name="t", task_type="classification", target_field="")


class TestMappingFields:
    @pytest.mark.parametrize(
        "field_name", ["special_tokens", "additional_config", "input_schema", "output_schema", "preprocessing_config"]
    )
    def test_non_mapping_raises_type_error(self, field_name):
        value = [("pad_token_id", 0)]
        expected = f"TaskSpec.{field_name} should be a mapping, but got list: {value!r}"
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", **{field_name: value})


class TestSpecialTokens:
    def test_negative_id_raises_value_error(self):
        expected = "TaskSpec.special_tokens['pad_token_id'] should be a non-negative int token id, but got -1"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", special_tokens={"pad_token_id": -1})

    @pytest.mark.parametrize("token_id", ["0", 1.0, True, None])
    def test_non_int_id_raises_type_error(self, token_id):
        expected = (
            f"TaskSpec.special_tokens['pad_token_id'] should be a non-negative int token id, but got "
            f"{type(token_id).__name__}: {token_id!r}"
        )
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", special_tokens={"pad_token_id": token_id})

    def test_zero_is_a_valid_id(self):
        spec = TaskSpec(name="t", task_type="causal_lm", special_tokens={"pad_token_id": 0})
        assert spec.special_tokens == {"pad_token_id": 0}


class TestAdditionalConfig:
    @pytest.mark.parametrize("value", [0, -1])
    def test_max_seq_len_not_positive_raises_value_error(self, value):
        expected = f"TaskSpec.additional_config['max_seq_len'] should be a positive int, but got {value!r}"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", additional_config={"max_seq_len": value})

    @pytest.mark.parametrize("value", ["x", 1.5, True])
    def test_max_seq_len_not_an_int_raises_type_error(self, value):
        expected = (
            f"TaskSpec.additional_config['max_seq_len'] should be a positive int, but got "
            f"{type(value).__name__}: {value!r}"
        )
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", additional_config={"max_seq_len": value})

    @pytest.mark.parametrize("key", ["vocab_size", "num_classes", "sample_rate", "max_target_len", "max_length"])
    def test_other_sizes_are_checked_too(self, key):
        expected = f"TaskSpec.additional_config[{key!r}] should be a positive int, but got 0"
        with pytest.raises(ValueError, match=re.escape(expected)):
            TaskSpec(name="t", task_type="causal_lm", additional_config={key: 0})

    def test_unchecked_keys_pass_through(self):
        spec = TaskSpec(name="t", task_type="causal_lm", additional_config={"image_size": [3, 8, 8], "note": "x"})
        assert spec.additional_config == {"image_size": (3, 8, 8), "note": "x"}


class TestDefaults:
    def test_documented_audio_call(self):
        spec = TaskSpec(name="speech", modality="audio", task_type="classification")
        assert spec.input_fields == ("input_values",)
        assert spec.target_field == "labels"
        assert spec.loss_type == "cross_entropy"
        assert spec.model_family == "generic"

    @pytest.mark.parametrize(
        ("modality", "fields"),
        [
            ("text", ("input_ids",)),
            ("vision", ("pixel_values",)),
            ("audio", ("input_values",)),
            ("multimodal", ("pixel_values", "input_ids")),
            ("tabular", ("features",)),
        ],
    )
    def test_per_modality_default_input_fields(self, modality, fields):
        assert TaskSpec(name="t", task_type="classification", modality=modality).input_fields == fields

    def test_explicit_input_fields_win_over_the_default(self):
        spec = TaskSpec(name="t", task_type="classification", modality="audio", input_fields=("waveform",))
        assert spec.input_fields == ("waveform",)

    def test_mappings_default_to_empty_and_are_not_shared(self):
        first = TaskSpec(name="a", task_type="causal_lm")
        second = TaskSpec(name="b", task_type="causal_lm")
        assert first.special_tokens == {} and first.additional_config == {}
        assert first.metrics == ()
        assert first.special_tokens is not second.special_tokens


class TestImmutability:
    def test_assigning_a_field_raises_frozen_instance_error(self):
        spec = TaskSpec.lm_tiny()
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.name = "other"
        assert spec.name == "lm_tiny"

    @pytest.mark.parametrize(
        "mutate",
        [
            lambda s: s.special_tokens.__setitem__("pad_token_id", 1),
            lambda s: s.special_tokens.__delitem__("pad_token_id"),
            lambda s: s.special_tokens.update(pad_token_id=1),
            lambda s: s.special_tokens.pop("pad_token_id"),
            lambda s: s.special_tokens.popitem(),
            lambda s: s.special_tokens.clear(),
            lambda s: s.special_tokens.setdefault("unk_token_id", 1),
            lambda s: s.additional_config.__setitem__("max_seq_len", 1),
            lambda s: s.additional_config.__ior__({"max_seq_len": 1}),
            lambda s: s.input_schema["input_ids"].__setitem__("dtype", "int32"),
        ],
    )
    def test_mutating_mappings_raises_type_error_suggesting_replace(self, mutate):
        spec = TaskSpec.lm_tiny()
        with pytest.raises(TypeError, match=f"^{READ_ONLY}$"):
            mutate(spec)
        assert spec == TaskSpec.lm_tiny()

    def test_in_place_or_operator_raises(self):
        spec = TaskSpec.lm_tiny()
        tokens = spec.special_tokens
        with pytest.raises(TypeError, match=READ_ONLY):
            tokens |= {"pad_token_id": 1}
        assert spec.special_tokens["pad_token_id"] == 50256

    def test_nested_lists_become_tuples(self):
        spec = TaskSpec(
            name="t",
            task_type="classification",
            modality="vision",
            metrics=["accuracy"],
            additional_config={"image_size": [3, 32, 32], "crops": [[1, 2], {"size": [4]}]},
        )
        assert spec.metrics == ("accuracy",)
        assert spec.additional_config["image_size"] == (3, 32, 32)
        assert spec.additional_config["crops"] == ((1, 2), {"size": (4,)})
        with pytest.raises(TypeError):
            spec.additional_config["image_size"][0] = 1
        with pytest.raises(TypeError, match=READ_ONLY):
            spec.additional_config["crops"][1]["size"] = (5,)

    def test_sets_become_sorted_tuples(self):
        spec = TaskSpec(name="t", task_type="causal_lm", preprocessing_config={"drop": {"b", "a"}})
        assert spec.preprocessing_config["drop"] == ("a", "b")

    def test_callers_mapping_is_not_aliased(self):
        config = {"max_seq_len": 64}
        spec = TaskSpec(name="t", task_type="causal_lm", additional_config=config)
        config["max_seq_len"] = 1
        assert spec.max_seq_len == 64

    def test_equal_field_values_compare_and_hash_equal(self):
        first = TaskSpec(name="t", task_type="causal_lm", additional_config={"max_seq_len": 8, "vocab_size": 9})
        second = TaskSpec(name="t", task_type="causal_lm", additional_config={"vocab_size": 9, "max_seq_len": 8})
        assert first == second
        assert hash(first) == hash(second)


class TestReplace:
    def test_returns_new_spec_and_leaves_original_unchanged(self):
        original = TaskSpec.cls_tiny()
        changed = original.replace(additional_config={**original.additional_config, "num_classes": 5})
        assert changed is not original
        assert changed.num_classes == 5
        assert original.num_classes == 2
        assert original == TaskSpec.cls_tiny()
        assert changed.name == original.name and changed.special_tokens == original.special_tokens

    def test_result_is_frozen_and_validated(self):
        changed = TaskSpec.lm_tiny().replace(metrics=["loss"], special_tokens={"pad_token_id": 0})
        assert changed.metrics == ("loss",)
        with pytest.raises(TypeError, match=READ_ONLY):
            changed.special_tokens["pad_token_id"] = 1

    @pytest.mark.parametrize("replace", [TaskSpec.replace, dataclasses.replace], ids=["method", "dataclasses"])
    def test_invalid_replace_raises_and_leaves_original(self, replace):
        original = TaskSpec.cls_tiny()
        with pytest.raises(ValueError, match=re.escape("but task_type='classification' needs a target")):
            replace(original, target_field=None)
        with pytest.raises(ValueError, match=re.escape("but got modality='smell'")):
            replace(original, modality="smell")
        with pytest.raises(ValueError, match=re.escape("TaskSpec.additional_config['max_seq_len'] should be")):
            replace(original, additional_config={"max_seq_len": 0})
        assert original == TaskSpec.cls_tiny()

    def test_dataclasses_replace_matches_the_method(self):
        original = TaskSpec.lm_tiny()
        assert dataclasses.replace(original, name="other") == original.replace(name="other")
        assert dataclasses.replace(original, name="other").name == "other"

    def test_replacing_modality_brings_that_modality_default_input_fields(self):
        base = TaskSpec(name="t", task_type="classification")
        assert base.input_fields == ("input_ids",)
        audio = base.replace(modality="audio")
        assert audio.input_fields == ("input_values",)
        assert audio == TaskSpec(name="t", task_type="classification", modality="audio")
        assert dataclasses.replace(base, modality="vision").input_fields == ("pixel_values",)

    @pytest.mark.parametrize("round_trip", [lambda s: pickle.loads(pickle.dumps(s)), copy.deepcopy, copy.copy])
    def test_modality_default_survives_copies(self, round_trip):
        copied = round_trip(TaskSpec(name="t", task_type="classification"))
        assert copied.replace(modality="audio").input_fields == ("input_values",)

    def test_replacing_modality_keeps_explicit_input_fields(self):
        base = TaskSpec(name="t", task_type="classification", input_fields=("input_ids",))
        assert base.replace(modality="audio").input_fields == ("input_ids",)


class TestProperties:
    @pytest.mark.parametrize("task_type", TASK_TYPES)
    def test_is_supervised(self, task_type):
        loss_type = "mse" if task_type == "regression" else "cross_entropy"
        spec = TaskSpec(name="t", task_type=task_type, loss_type=loss_type)
        assert spec.is_supervised is (task_type in SUPERVISED_TASK_TYPES)

    def test_language_modelling_is_not_supervised(self):
        assert TaskSpec(name="t", task_type="causal_lm").is_supervised is False
        assert TaskSpec(name="t", task_type="masked_lm").is_supervised is False
        assert TaskSpec(name="t", task_type="regression", loss_type="mse").is_supervised is True

    def test_sizes_read_additional_config(self):
        config = {"max_seq_len": 7, "vocab_size": 11, "num_classes": 3}
        spec = TaskSpec(name="t", task_type="classification", additional_config=config)
        assert (spec.max_seq_len, spec.vocab_size, spec.num_classes) == (7, 11, 3)

    def test_sizes_are_none_when_absent(self):
        spec = TaskSpec(name="t", task_type="classification")
        assert (spec.max_seq_len, spec.vocab_size, spec.num_classes) == (None, None, None)
