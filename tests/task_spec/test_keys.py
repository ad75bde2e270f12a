"""Tests for task_spec/_keys.py and choices.KNOWN_KEYS: near misses of the keys the data path reads are refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from task_spec import TaskSpec
from task_spec.choices import KNOWN_KEYS

ROOT = Path(__file__).resolve().parents[2]


def _spec(**mappings) -> TaskSpec:
    return TaskSpec(name="t", task_type="classification", **mappings)


class TestNearMisses:
    @pytest.mark.parametrize(
        ("field_name", "key", "meant"),
        [
            ("additional_config", "max_seq_length", "max_seq_len"),
            ("additional_config", "Max_Seq_Len", "max_seq_len"),
            ("additional_config", "maxseqlen", "max_seq_len"),
            ("additional_config", "num_class", "num_classes"),
            ("additional_config", "num_labels", "num_classes"),
            ("additional_config", "sampling_rate", "sample_rate"),
            ("additional_config", "vocab", "vocab_size"),
            ("additional_config", "max_target_length", "max_target_len"),
            ("preprocessing_config", "mlm_probabilty", "mlm_probability"),
            ("preprocessing_config", "mlm_prob", "mlm_probability"),
            ("preprocessing_config", "padding-side", "padding_side"),
            ("preprocessing_config", "n_mel", "n_mels"),
            ("preprocessing_config", "text_column", "text_field"),
            ("special_tokens", "pad_id", "pad_token_id"),
            ("special_tokens", "mask_token", "mask_token_id"),
            ("special_tokens", "eos_token_ids", "eos_token_id"),
        ],
    )
    def test_near_miss_raises_naming_the_known_key(self, field_name, key, meant):
        expected = (
            f"TaskSpec.{field_name} keys should be ones the data path reads or names clearly distinct from them, "
            f"but got {key!r}, a near miss of {meant!r}"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}.*rename it to {re.escape(repr(meant))}"):
            _spec(**{field_name: {key: 1}})

    def test_other_close_keys_are_listed_too(self):
        close = "a near miss of 'max_length' (or 'max_seq_len', 'max_tiles'), which"
        with pytest.raises(ValueError, match=re.escape(close)):
            _spec(additional_config={"max_len": 8})
        with pytest.raises(ValueError, match=re.escape("a near miss of 'sep_token_id', which nothing reads")):
            _spec(special_tokens={"sep2_token_id": 8})

    @pytest.mark.parametrize(
        ("field_name", "keys"),
        [
            ("additional_config", ["min_seq_len", "note", "crops", "hidden_size", "dropout", "image_shape"]),
            ("preprocessing_config", ["drop", "augment", "crop", "tokenizer_name", "normalize"]),
            ("special_tokens", ["video_token_id", "audio_token_id", "user_token_id"]),
        ],
    )
    def test_keys_far_from_every_known_one_stay_allowed(self, field_name, keys):
        spec = _spec(**{field_name: {key: 7 for key in keys}})
        assert set(getattr(spec, field_name)) == set(keys)

    def test_schemas_are_free_form(self):
        spec = _spec(input_schema={"max_seq_length": 1}, output_schema={"num_class": 2})
        assert spec.input_schema == {"max_seq_length": 1}

    def test_non_string_keys_are_not_checked(self):
        assert _spec(additional_config={3: "x"}).additional_config == {3: "x"}


class TestKeysInTheWrongMapping:
    @pytest.mark.parametrize(
        ("field_name", "key", "home"),
        [
            ("additional_config", "mlm_probability", "preprocessing_config"),
            ("preprocessing_config", "max_seq_len", "additional_config"),
            ("additional_config", "pad_token_id", "special_tokens"),
        ],
    )
    def test_known_key_of_another_mapping_says_where_it_belongs(self, field_name, key, home):
        expected = (
            f"TaskSpec.{field_name} should not hold {key!r}, which is read from {home}, but got "
            f"{field_name}={{{key!r}: 1, ...}}; move it: {home}={{{key!r}: 1}}"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            _spec(**{field_name: {key: 1}})


class TestKnownKeysCoverWhatIsRead:
    READS = re.compile(
        r"(?:(additional_config|preprocessing_config|special_tokens)(?:\.get\(|\[)"
        r"|preprocessing\(spec, |resolve_token_id\(|resolve_probability\()\"([a-z_]+)\""
    )

    def test_every_key_read_by_collators_or_engine_is_known(self):
        found: set[tuple[str, str]] = set()
        for path in [*ROOT.glob("collators/**/*.py"), *ROOT.glob("engine/**/*.py")]:
            for match in self.READS.finditer(path.read_text(encoding="utf-8")):
                field_name = match.group(1) or (
                    "special_tokens" if match.group(2).endswith("_token_id") else "preprocessing_config")
                found.add((field_name, match.group(2)))
        assert found, "the pattern finds no reads: update it to the code"
        unknown = sorted((field_name, key) for field_name, key in found if key not in KNOWN_KEYS[field_name])
        assert unknown == [], "add these to task_spec.choices.KNOWN_KEYS"
