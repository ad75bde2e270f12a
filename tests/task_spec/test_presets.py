"""Tests for task_spec/presets.py: every preset constructs, carries its key values and is a fresh, equal value."""

from __future__ import annotations

import copy
import pickle

import pytest

from task_spec import TaskSpec

PRESETS = ["lm_tiny", "mlm_tiny", "cls_tiny", "seq2seq_tiny", "vision_tiny", "audio_tiny"]


def _preset(name: str) -> TaskSpec:
    return getattr(TaskSpec, name)()


class TestEveryPreset:
    @pytest.mark.parametrize("name", PRESETS)
    def test_constructs_a_task_spec_named_after_the_preset(self, name):
        spec = _preset(name)
        assert isinstance(spec, TaskSpec)
        assert spec.name == name

    @pytest.mark.parametrize("name", PRESETS)
    def test_returns_fresh_but_equal_values(self, name):
        first, second = _preset(name), _preset(name)
        assert first is not second
        assert first == second
        assert hash(first) == hash(second)

    @pytest.mark.parametrize("name", PRESETS)
    def test_pickle_round_trip_is_equal(self, name):
        spec = _preset(name)
        restored = pickle.loads(pickle.dumps(spec))
        assert restored == spec
        assert hash(restored) == hash(spec)
        # The restored mappings stay read-only, so a spec sent to a worker is still immutable there.
        with pytest.raises(TypeError, match=r"spec\.replace"):
            restored.additional_config["max_seq_len"] = 1

    @pytest.mark.parametrize("name", PRESETS)
    def test_deepcopy_is_equal(self, name):
        spec = _preset(name)
        copied = copy.deepcopy(spec)
        assert copied == spec
        assert hash(copied) == hash(spec)

    @pytest.mark.parametrize("name", PRESETS)
    def test_is_hashable_and_usable_as_a_dict_key(self, name):
        lookup = {_preset(name): name}
        assert lookup[_preset(name)] == name

    def test_presets_differ_from_each_other(self):
        specs = [_preset(name) for name in PRESETS]
        assert len(set(specs)) == len(PRESETS)


class TestLmTiny:
    def test_key_values(self):
        spec = TaskSpec.lm_tiny()
        assert spec.task_type == "causal_lm"
        assert spec.modality == "text"
        assert spec.max_seq_len == 128
        assert spec.vocab_size == 50257
        assert spec.input_fields == ("input_ids",)
        assert spec.is_supervised is False

    def test_pad_shares_the_gpt2_eos_id(self):
        spec = TaskSpec.lm_tiny()
        assert spec.special_tokens["pad_token_id"] == spec.special_tokens["eos_token_id"] == 50256
        assert spec.special_tokens["eos_token_id"] == spec.vocab_size - 1


class TestMlmTiny:
    def test_key_values(self):
        spec = TaskSpec.mlm_tiny()
        assert spec.task_type == "masked_lm"
        assert spec.max_seq_len == 128
        assert spec.vocab_size == 30522
        assert spec.special_tokens["mask_token_id"] == 103
        assert spec.special_tokens["pad_token_id"] == 0
        assert spec.preprocessing_config["mlm_probability"] == 0.15


class TestClsTiny:
    def test_key_values(self):
        spec = TaskSpec.cls_tiny()
        assert spec.task_type == "classification"
        assert spec.modality == "text"
        assert spec.num_classes == 2
        assert spec.target_field == "labels"
        assert spec.is_supervised is True


class TestSeq2SeqTiny:
    def test_key_values(self):
        spec = TaskSpec.seq2seq_tiny()
        assert spec.task_type == "seq2seq"
        assert spec.max_seq_len == 128
        assert spec.additional_config["max_target_len"] == 64
        assert spec.vocab_size == 32128
        assert spec.preprocessing_config["text_field"] == "source"
        assert spec.preprocessing_config["target_text_field"] == "target"


class TestVisionTiny:
    def test_key_values(self):
        spec = TaskSpec.vision_tiny()
        assert spec.modality == "vision"
        assert spec.task_type == "classification"
        assert spec.input_fields == ("pixel_values",)
        assert spec.additional_config["image_size"] == (3, 32, 32)
        assert spec.num_classes == 4
        assert spec.input_schema["pixel_values"]["shape"] == (3, 32, 32)


class TestAudioTiny:
    def test_key_values(self):
        spec = TaskSpec.audio_tiny()
        assert spec.modality == "audio"
        assert spec.task_type == "classification"
        assert spec.input_fields == ("input_values",)
        assert spec.additional_config["sample_rate"] == 16000
        assert spec.num_classes == 4
        assert spec.preprocessing_config["n_mels"] == 40
