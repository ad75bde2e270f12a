"""Tests for task_spec/_replace.py: ``spec.replace`` merges mappings, and REMOVE deletes a key or empties one."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import pytest

import task_spec
from task_spec import REMOVE, TaskSpec


class TestMerging:
    def test_a_changed_key_keeps_the_other_keys(self):
        spec = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 3})
        assert spec.additional_config == {"max_seq_len": 128, "vocab_size": 30522, "num_classes": 3}

    @pytest.mark.parametrize(
        ("field_name", "update", "kept"),
        [
            ("special_tokens", {"pad_token_id": 0}, ("eos_token_id", 50256)),
            ("additional_config", {"vocab_size": 60000}, ("max_seq_len", 128)),
            ("input_schema", {"attention_mask": {"dtype": "int64"}}, ("input_ids", {"dtype": "int64",
                                                                                    "shape": ("seq",)})),
            ("output_schema", {"loss": {"dtype": "float32"}}, ("logits", {"dtype": "float32",
                                                                          "shape": ("seq", "vocab")})),
            ("preprocessing_config", {"padding_side": "left"}, None),
        ],
    )
    def test_every_mapping_field_merges(self, field_name, update, kept):
        spec = TaskSpec.lm_tiny().replace(**{field_name: update})
        merged = getattr(spec, field_name)
        assert all(merged[key] == value for key, value in update.items())
        if kept is not None:
            assert merged[kept[0]] == kept[1]

    def test_merge_is_shallow(self):
        spec = TaskSpec.lm_tiny().replace(input_schema={"input_ids": {"dtype": "int32"}})
        assert spec.input_schema["input_ids"] == {"dtype": "int32"}

    def test_result_is_validated_after_merging(self):
        with pytest.raises(ValueError, match=re.escape("a near miss of 'max_seq_len'")):
            TaskSpec.lm_tiny().replace(additional_config={"max_seq_length": 512})

    def test_non_mapping_fields_are_replaced(self):
        spec = TaskSpec.lm_tiny().replace(metrics=("loss",), name="other")
        assert (spec.metrics, spec.name) == (("loss",), "other")

    def test_dataclasses_replace_still_replaces_whole_mappings(self):
        spec = dataclasses.replace(TaskSpec.cls_tiny(), additional_config={"num_classes": 3})
        assert spec.additional_config == {"num_classes": 3}

    def test_empty_mapping_is_refused_because_it_would_change_nothing(self):
        expected = (
            "TaskSpec.replace(preprocessing_config=...) should name the keys to change, but got "
            "preprocessing_config={}, which changes nothing because replace() merges mappings; to empty the mapping "
            "pass preprocessing_config=REMOVE, to delete one key pass preprocessing_config={key: REMOVE}"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec.audio_tiny().replace(preprocessing_config={})

    def test_non_mapping_value_still_raises_type_error(self):
        with pytest.raises(TypeError, match=re.escape("TaskSpec.additional_config should be a mapping, but got list")):
            TaskSpec.lm_tiny().replace(additional_config=[("max_seq_len", 4)])

    def test_unknown_field_names_the_closest(self):
        expected = "but got additonal_config={'num_classes': 3}; did you mean 'additional_config'?"
        with pytest.raises(TypeError, match=re.escape(expected)):
            TaskSpec.cls_tiny().replace(additonal_config={"num_classes": 3})


class TestRemove:
    def test_remove_deletes_one_key(self):
        spec = TaskSpec.cls_tiny().replace(additional_config={"max_seq_len": REMOVE, "num_classes": 3})
        assert spec.additional_config == {"vocab_size": 30522, "num_classes": 3}
        assert spec.max_seq_len is None

    def test_remove_as_the_whole_value_empties_the_mapping(self):
        spec = TaskSpec.audio_tiny().replace(preprocessing_config=REMOVE)
        assert spec.preprocessing_config == {}
        assert spec.additional_config == TaskSpec.audio_tiny().additional_config

    def test_remove_then_set_replaces_a_mapping_wholesale(self):
        spec = TaskSpec.cls_tiny().replace(additional_config=REMOVE).replace(additional_config={"num_classes": 3})
        assert spec.additional_config == {"num_classes": 3}

    def test_removing_a_missing_key_raises_listing_the_keys(self):
        expected = (
            "TaskSpec.replace(additional_config={'max_seq_length': REMOVE}) should delete a key the spec holds, but "
            "got 'max_seq_length', which additional_config does not hold; its keys are 'max_seq_len', 'vocab_size', "
            "'num_classes'"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec.cls_tiny().replace(additional_config={"max_seq_length": REMOVE})

    def test_remove_for_a_non_mapping_field_raises(self):
        expected = (
            "TaskSpec.target_field should be given a value in replace(); REMOVE only deletes mapping keys "
            "(special_tokens, additional_config, input_schema, output_schema, preprocessing_config), but got "
            "target_field=REMOVE"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec.lm_tiny().replace(target_field=REMOVE)

    def test_remove_in_a_constructor_raises(self):
        expected = (
            "TaskSpec.additional_config['max_seq_len'] should be a value, but got REMOVE, which only works in "
            "spec.replace(additional_config={'max_seq_len': REMOVE}) to delete a key the spec holds"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            TaskSpec(name="t", task_type="causal_lm", additional_config={"max_seq_len": REMOVE})

    def test_one_marker_everywhere(self):
        assert TaskSpec.REMOVE is REMOVE is task_spec.REMOVE
        assert "REMOVE" in task_spec.__all__
        assert pickle.loads(pickle.dumps(REMOVE)) is REMOVE
        assert copy.deepcopy(REMOVE) is REMOVE and copy.copy(REMOVE) is REMOVE
        assert repr(REMOVE) == "REMOVE"
        assert "REMOVE" not in {f.name for f in dataclasses.fields(TaskSpec)}
