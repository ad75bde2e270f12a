"""TextCollator: differential tests against transformers, then our own behaviour where it deliberately differs."""

from __future__ import annotations

import copy
import logging
import pickle
import re

import numpy as np
import pytest
import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

from collators.packed import PackedCollator
from collators.text import TextCollator, create_text_collator
from task_spec import TaskSpec
from tests.collators.conftest import build_tokenizer
from tests.collators.test_targets import Batch

SOURCES = ["the cat sat on the mat", "a dog", "birds sing at dawn and dusk tonight", "", "rain"]
TARGETS = ["the mat", "a dog ran in the park", "", "we read", "old ships"]


def assert_same(ours: dict, theirs, keys=None) -> None:
    keys = keys or sorted(theirs.keys())
    assert sorted(ours) == sorted(keys), (sorted(ours), keys)
    for key in keys:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), (key, ours[key], theirs[key])


def encoded_rows(tokenizer, texts=SOURCES) -> list[dict]:
    return [{key: list(value) for key, value in tokenizer(text).items()} for text in texts]


class TestAgainstTransformers:
    @pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
    @pytest.mark.parametrize("side", ["right", "left"])
    def test_with_padding_and_classification_labels(self, tokenizer, side, pad_to_multiple_of):
        tokenizer.padding_side = side
        rows = [{**row, "labels": index % 2} for index, row in enumerate(encoded_rows(tokenizer))]
        theirs = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)(copy.deepcopy(rows))
        ours = TextCollator(tokenizer=tokenizer, task_type="classification", pad_to_multiple_of=pad_to_multiple_of)
        assert_same(ours(rows), theirs)

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_causal_lm(self, tokenizer, side):
        # transformers sets every position holding pad_token_id to -100, we set the padded positions: the two
        # agree because no real token of these rows is [PAD] (pad id 0, eos id 5); TestCausalLM pins the rest.
        tokenizer.padding_side = side
        rows = encoded_rows(tokenizer)
        theirs = DataCollatorForLanguageModeling(tokenizer, mlm=False)(copy.deepcopy(rows))
        assert_same(TextCollator(tokenizer=tokenizer)(rows), theirs)

    @pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
    @pytest.mark.parametrize("side", ["right", "left"])
    def test_seq2seq_labels_padded_separately(self, tokenizer, side, pad_to_multiple_of):
        tokenizer.padding_side = side
        rows = [{**source, "labels": target["input_ids"]}
                for source, target in zip(encoded_rows(tokenizer), encoded_rows(tokenizer, TARGETS))]
        theirs = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=pad_to_multiple_of)
        ours = TextCollator(tokenizer=tokenizer, task_type="seq2seq", pad_to_multiple_of=pad_to_multiple_of)
        batch = ours(rows)
        assert batch["labels"].shape[1] != batch["input_ids"].shape[1] or pad_to_multiple_of
        assert_same(batch, theirs(copy.deepcopy(rows)))

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_token_classification(self, tokenizer, side):
        tokenizer.padding_side = side
        rows = [{**row, "labels": [index % 3 for index in range(len(row["input_ids"]))]}
                for row in encoded_rows(tokenizer)]
        theirs = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8)(copy.deepcopy(rows))
        ours = TextCollator(tokenizer=tokenizer, task_type="token_classification", pad_to_multiple_of=8)
        assert_same(ours(rows), theirs)


class TestCausalLM:
    def test_no_spec_is_causal_lm(self, tokenizer):
        batch = TextCollator(tokenizer=tokenizer)([{"input_ids": [2, 7, 3]}, {"input_ids": [2, 3]}])
        assert list(batch) == ["input_ids", "attention_mask", "labels"]
        assert batch["labels"].tolist() == [[2, 7, 3], [2, 3, -100]]

    def test_pad_equal_to_eos_keeps_real_eos_labels(self, gpt_tokenizer):
        assert gpt_tokenizer.pad_token_id == gpt_tokenizer.eos_token_id == 5
        rows = [{"input_ids": [7, 5, 8, 5]}, {"input_ids": [9, 5]}]
        batch = TextCollator(tokenizer=gpt_tokenizer)(rows)
        assert batch["input_ids"].tolist() == [[7, 5, 8, 5], [9, 5, 5, 5]]
        assert batch["labels"].tolist() == [[7, 5, 8, 5], [9, 5, -100, -100]]
        assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_a_tokenizer_without_pad_token_pads_with_its_eos(self, side, caplog):
        tokenizer = build_tokenizer(pad_token=None, post_processor=False)
        tokenizer.padding_side = side
        rows = [{"input_ids": [7, 8, 5]}, {"input_ids": [9, 5]}, {"input_ids": [10, 11, 12, 5]}]
        with caplog.at_level(logging.INFO, logger="collators"):
            collate = TextCollator(tokenizer=tokenizer)
        assert (collate.pad_token_id, collate.pad_source) == (5, "eos")
        assert [record.getMessage() for record in caplog.records] == [
            "the tokenizer has no pad token, so causal_lm rows are padded with its eos token (id 5); padded "
            "positions get label -100 by position, so a real eos keeps its label; pass pad_token_id=... to choose "
            "another id"]
        batch = collate(rows)
        assert tokenizer.pad_token is None and tokenizer.pad_token_id is None  # the tokenizer is not changed
        # transformers needs the pad token set (on a copy here), then masks every eos, the real ones too
        padded = copy.deepcopy(tokenizer)
        padded.pad_token = padded.eos_token
        theirs = DataCollatorForLanguageModeling(padded, mlm=False)(copy.deepcopy(rows))
        assert torch.equal(batch["input_ids"], theirs["input_ids"])
        assert torch.equal(batch["attention_mask"], theirs["attention_mask"])
        real_eos = (batch["input_ids"] == 5) & (batch["attention_mask"] == 1)
        assert torch.equal(batch["labels"][~real_eos], theirs["labels"][~real_eos])
        assert batch["labels"][real_eos].tolist() == [5, 5, 5]  # transformers: -100, the model never learns to stop
        assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()

    def test_eos_padding_is_for_causal_lm_only(self):
        tokenizer = build_tokenizer(pad_token=None)
        with pytest.raises(ValueError, match=r"pad_token_id is needed to pad rows, but tokenizer \w+ "
                                             "has no pad_token_id"):
            TextCollator(tokenizer=tokenizer, task_type="classification")
        assert TextCollator(tokenizer=build_tokenizer()).pad_source == "tokenizer"
        assert TextCollator(tokenizer=tokenizer, pad_token_id=0).pad_source == "given"

    def test_pad_equal_to_eos_from_lm_tiny_spec(self):
        eos = TaskSpec.lm_tiny().special_tokens["eos_token_id"]
        batch = create_text_collator(TaskSpec.lm_tiny(), padding_side="left")([[eos], [11, 12, eos]])
        assert batch["labels"].tolist() == [[-100, -100, eos], [11, 12, eos]]

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_given_labels_are_kept_and_padded(self, side):
        rows = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}, {"input_ids": [5, 6], "labels": [-100, 6]}]
        batch = TextCollator(pad_token_id=0, padding_side=side)(rows)
        expected = [[-100, -100, 3, 4], [-100, 6, -100, -100]] if side == "right" else \
            [[-100, -100, 3, 4], [-100, -100, -100, 6]]
        assert batch["labels"].tolist() == expected

    def test_given_labels_of_wrong_length_raise(self):
        rows = [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [1, 2], "labels": [1]}]
        with pytest.raises(ValueError, match=r"row 1: 'labels' has 1 entries but 'input_ids' has 2"):
            TextCollator(pad_token_id=0)(rows)

    def test_row_attention_mask_is_padded_with_zero(self):
        rows = [{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 0]}, {"input_ids": [4], "attention_mask": [1]}]
        batch = TextCollator(pad_token_id=0)(rows)
        assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]


class TestPaddingAndInputs:
    def test_lists_tensors_numpy_and_bare_rows_agree(self):
        ids = [[3, 4, 5], [6], [], [7, 8]]
        collate = TextCollator(pad_token_id=0)
        expected = collate([{"input_ids": row} for row in ids])
        variants = [
            [{"input_ids": torch.tensor(row, dtype=torch.int32)} for row in ids],
            [{"input_ids": np.array(row, dtype=np.int16)} for row in ids],
            [tuple(row) for row in ids],
            [torch.tensor(row, dtype=torch.long) for row in ids],
            [np.array(row, dtype=np.uint8) for row in ids],
            [ids[0], torch.tensor(ids[1]), np.array(ids[2], dtype=np.int64), tuple(ids[3])],
        ]
        for rows in variants:
            assert_same(collate(rows), expected, keys=list(expected))
        assert expected["input_ids"].dtype == torch.long

    def test_empty_and_length_one_rows(self):
        batch = TextCollator(pad_token_id=9)([[], [4]])
        assert batch["input_ids"].tolist() == [[9], [4]]
        assert batch["labels"].tolist() == [[-100], [4]]

    @pytest.mark.parametrize("multiple", [None, 8])
    def test_all_empty_batch(self, multiple):
        batch = TextCollator(pad_token_id=0, pad_to_multiple_of=multiple)([[], []])
        assert {key: tuple(value.shape) for key, value in batch.items()} == {
            "input_ids": (2, 0), "attention_mask": (2, 0), "labels": (2, 0)}

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_max_length_keeps_the_start(self, side):
        rows = [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, 4, 5]}, {"input_ids": [6]}]
        rows[1]["labels"] = [6]
        batch = TextCollator(pad_token_id=0, max_length=3, padding_side=side)(rows)
        short = [6, 0, 0] if side == "right" else [0, 0, 6]
        assert batch["input_ids"].tolist() == [[1, 2, 3], short]
        assert batch["labels"][0].tolist() == [-100, 2, 3]

    def test_pad_to_multiple_of(self):
        batch = TextCollator(pad_token_id=0, pad_to_multiple_of=4)([[1, 2, 3, 4, 5], [6]])
        assert batch["input_ids"].shape == (2, 8)
        assert batch["attention_mask"].sum(1).tolist() == [5, 1]

    def test_left_padding(self):
        batch = TextCollator(pad_token_id=0, padding_side="left")([[1, 2, 3], [4]])
        assert batch["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
        assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
        assert batch["labels"].tolist() == [[1, 2, 3], [-100, -100, 4]]

    def test_padding_side_defaults_to_tokenizer(self, tokenizer):
        tokenizer.padding_side = "left"
        assert TextCollator(tokenizer=tokenizer).padding_side == "left"
        assert TextCollator(tokenizer=tokenizer, padding_side="right").padding_side == "right"

    def test_extra_keys_pass_through(self):
        rows = [{"input_ids": [1, 2], "id": "a", "score": 0.5, "pair": [1, 2], "ragged": [1], "vec": torch.ones(2)},
                {"input_ids": [3], "id": "b", "score": 1.5, "pair": [3, 4], "ragged": [1, 2], "vec": torch.zeros(2)}]
        batch = TextCollator(pad_token_id=0)(rows)
        assert batch["id"] == ["a", "b"]
        assert batch["score"].tolist() == [0.5, 1.5]
        assert batch["pair"].tolist() == [[1, 2], [3, 4]]
        assert batch["ragged"] == [[1], [1, 2]]
        assert batch["vec"].tolist() == [[1.0, 1.0], [0.0, 0.0]]

    def test_rows_are_not_mutated_and_outputs_do_not_alias_them(self):
        rows = [{"input_ids": torch.tensor([1, 2, 3]), "attention_mask": np.array([1, 1, 1]),
                 "labels": [-100, 2, 3], "vec": torch.ones(2), "ragged": [1]},
                {"input_ids": torch.tensor([4]), "attention_mask": np.array([1]), "labels": [4],
                 "vec": torch.ones(2), "ragged": [1, 2]}]
        snapshot = copy.deepcopy(rows)
        batch = TextCollator(pad_token_id=0)(rows)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.add_(100)
            else:
                value[0].append(7)
        for row, saved in zip(rows, snapshot):
            assert row.keys() == saved.keys()
            for key in row:
                assert np.array_equal(np.asarray(row[key]), np.asarray(saved[key])), key

    def test_rows_are_not_mutated_by_masking(self):
        rows = [{"input_ids": torch.arange(10, 60)} for _ in range(4)]
        snapshot = copy.deepcopy(rows)
        batch = create_text_collator(TaskSpec.mlm_tiny(), mlm_probability=1.0)(rows)
        assert (batch["labels"] != -100).all()
        assert all(torch.equal(row["input_ids"], saved["input_ids"]) for row, saved in zip(rows, snapshot))


class TestRawText:
    def test_tokenizes_then_collates(self, tokenizer):
        rows = [{"text": text, "id": index} for index, text in enumerate(SOURCES)]
        batch = TextCollator(tokenizer=tokenizer)(rows)
        expected = TextCollator(tokenizer=tokenizer)([{"input_ids": tokenizer(text)["input_ids"]} for text in SOURCES])
        assert_same({key: batch[key] for key in expected}, expected)
        assert "text" not in batch and batch["id"].tolist() == [0, 1, 2, 3, 4]
        assert batch["input_ids"][3, :2].tolist() == [2, 3]  # "" -> [CLS] [SEP]

    def test_all_empty_text_without_special_tokens(self, gpt_tokenizer):
        batch = TextCollator(tokenizer=gpt_tokenizer)([{"text": ""}, {"text": ""}])
        assert batch["input_ids"].shape == (2, 0)

    def test_truncation_by_the_tokenizer_keeps_special_tokens(self, tokenizer):
        batch = TextCollator(tokenizer=tokenizer, max_length=4)([{"text": SOURCES[0]}])
        assert batch["input_ids"].tolist() == [[2, *tokenizer(SOURCES[0])["input_ids"][1:3], 3]]

    def test_without_tokenizer_raises(self):
        with pytest.raises(ValueError, match=r"raw text under 'text' but no tokenizer was given; pass tokenizer="):
            TextCollator(pad_token_id=0)([{"text": "hello"}])

    def test_text_field_from_spec_and_seq2seq_targets(self, tokenizer):
        spec = TaskSpec.seq2seq_tiny()
        rows = [{"source": source, "target": target} for source, target in zip(SOURCES, TARGETS)]
        batch = create_text_collator(spec, tokenizer=tokenizer, max_target_length=3)(rows)
        assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
        assert batch["labels"].shape == (5, 3)
        assert batch["labels"][0].tolist() == tokenizer(TARGETS[0])["input_ids"][:2] + [3]

    def test_neither_ids_nor_text_raises(self, tokenizer):
        with pytest.raises(ValueError, match=r"row 0 has neither 'input_ids' nor raw text under 'text' "
                                             r"\(keys: \['x'\]"):
            TextCollator(tokenizer=tokenizer)([{"x": 1}])

    @pytest.mark.parametrize(("make", "key"), [
        (lambda tokenizer: TextCollator(tokenizer=tokenizer), "text"),
        (lambda tokenizer: PackedCollator(tokenizer=tokenizer), "text"),
        (lambda tokenizer: create_text_collator(TaskSpec.seq2seq_tiny(), tokenizer=tokenizer), "source"),
    ])
    @pytest.mark.parametrize("role", ["train", "val", "predict"])
    def test_a_text_of_none_is_refused_naming_its_split_row_and_the_fix(self, tokenizer, make, key, role):
        rows = [{"text": "the cat", "source": "a dog", "target": "the mat"} for _ in range(3)]
        rows[1] = {**rows[1], key: None}
        with pytest.raises(ValueError, match=rf"^{role} row 7: {key!r} should hold a str of raw text, but got None "
                                             r"\(a NaN in a pandas or Arrow column is read as None\); filter the "
                                             r"rows without text out of the data, or fill them$"):
            make(tokenizer)(Batch(rows, role=role, indices=[4, 7, 1]))

    def test_outside_the_engine_a_text_of_none_is_named_by_its_place(self, tokenizer):
        with pytest.raises(ValueError, match=r"^row 1: 'text' should hold a str of raw text, but got None"):
            TextCollator(tokenizer=tokenizer)([{"text": "the cat"}, {"text": None}])


class TestTargets:
    def test_classification_label_forms(self):
        forms = [[1, 0], [torch.tensor(1), torch.tensor(0)], [np.int64(1), np.int32(0)], [1.0, 0.0]]
        for labels in forms:
            rows = [{"input_ids": [1, 2], "labels": label} for label in labels]
            batch = TextCollator(pad_token_id=0, task_type="classification")(rows)
            assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]

    def test_multilabel_and_regression(self):
        rows = [{"input_ids": [1], "labels": [1, 0, 1]}, {"input_ids": [2], "labels": [0, 1, 1]}]
        assert TextCollator(pad_token_id=0, task_type="classification")(rows)["labels"].shape == (2, 3)
        rows = [{"input_ids": [1], "y": 0.25}, {"input_ids": [2], "y": torch.tensor(2.5)}]
        batch = create_text_collator(TaskSpec.cls_tiny(), task_type="regression", target_field="y")(rows)
        assert batch["y"].dtype == torch.float32 and batch["y"].tolist() == [0.25, 2.5]

    def test_rows_without_the_target_key_are_a_prediction_batch(self):
        # No row has 'labels': a batch for prediction; the other key passes through (a misnamed target shows up
        # there, and the engine's validate=True reports the missing 'labels' key when training).
        rows = [{"input_ids": [1], "label": 1}]
        batch = create_text_collator(TaskSpec.cls_tiny())(rows)
        assert sorted(batch) == ["attention_mask", "input_ids", "label"]
        assert create_text_collator(TaskSpec.cls_tiny(), target_field="label")(rows)["label"].tolist() == [1]

    def test_bad_labels_name_the_row(self):
        rows = [{"input_ids": [1], "labels": 1}, {"input_ids": [1], "labels": 0.5}]
        with pytest.raises(ValueError, match=r"row 1: classification labels under 'labels' should be integer"):
            TextCollator(pad_token_id=0, task_type="classification")(rows)
        rows = [{"input_ids": [1], "labels": [1, 0]}, {"input_ids": [1], "labels": [1]}]
        with pytest.raises(ValueError, match=r"row 1: 'labels' should be a number .* but got shape \(1,\)"):
            TextCollator(pad_token_id=0, task_type="classification")(rows)

    def test_seq2seq_truncates_targets_and_pads_decoder_inputs(self):
        rows = [{"input_ids": [1, 2], "labels": [5, 6, 7, 8], "decoder_input_ids": [0, 5, 6, 7]},
                {"input_ids": [3], "labels": [9], "decoder_input_ids": [0]}]
        batch = create_text_collator(TaskSpec.seq2seq_tiny(), pad_token_id=4, max_target_length=3)(rows)
        assert batch["labels"].tolist() == [[5, 6, 7], [9, -100, -100]]
        assert batch["decoder_input_ids"].tolist() == [[0, 5, 6], [0, 4, 4]]
        assert batch["input_ids"].tolist() == [[1, 2], [3, 4]]

    def test_token_classification_without_labels_is_a_prediction_batch(self):
        batch = TextCollator(pad_token_id=0, task_type="token_classification")([[1, 2], [3]])
        assert sorted(batch) == ["attention_mask", "input_ids"] and batch["input_ids"].tolist() == [[1, 2], [3, 0]]


class TestErrors:
    def test_missing_pad_token_id(self):
        with pytest.raises(ValueError, match=r"pad_token_id is needed to pad rows, but no tokenizer was given.*"
                                             r"pass pad_token_id=\.\.\., a tokenizer=.*"
                                             r"special_tokens=\{'pad_token_id'"):
            TextCollator()

    def test_a_spec_pad_id_outside_the_tokenizer_vocabulary_is_refused(self):
        tokenizer = build_tokenizer(pad_token=None, eos_token=None)
        spec = TaskSpec.cls_tiny().replace(special_tokens={"pad_token_id": 50})
        expected = ("pad_token_id should be an id of the vocabulary (0..32, len(tokenizer)=33), but got "
                    "pad_token_id=50 from spec.special_tokens['pad_token_id']: the tokenizer has no pad token, so the "
                    "id came from the TaskSpec, whose vocabulary is not the tokenizer's; pass pad_token_id=... (an "
                    "id of the tokenizer), or spec.replace(special_tokens={'pad_token_id': ...}) with one")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            create_text_collator(spec, tokenizer=tokenizer)

    def test_a_preset_mask_id_outside_the_tokenizer_vocabulary_is_refused(self):
        tokenizer = build_tokenizer(mask_token=None)
        with pytest.raises(ValueError, match=re.escape("but got mask_token_id=103 from "
                                                       "spec.special_tokens['mask_token_id']: the tokenizer has no "
                                                       "mask token")):
            create_text_collator(TaskSpec.mlm_tiny(), tokenizer=tokenizer)

    def test_bad_ids_name_the_row(self):
        with pytest.raises(TypeError, match=r"row 2: 'input_ids' should be a 1-D sequence .* item 1 is float"):
            TextCollator(pad_token_id=0)([[1], [2], [3, 4.5]])
        with pytest.raises(TypeError, match=r"row 1: 'input_ids' should be .* but got a 2-D tensor"):
            TextCollator(pad_token_id=0)([[1], torch.ones(2, 2, dtype=torch.long)])
        with pytest.raises(TypeError, match=r"row 0: 'input_ids' should be .* numpy array of dtype float32"):
            TextCollator(pad_token_id=0)([np.ones(2, dtype=np.float32)])

    def test_rows_with_different_keys(self):
        with pytest.raises(ValueError, match=r"row 1 has keys \['input_ids'\] but row 0 has \['id', 'input_ids'\]"):
            TextCollator(pad_token_id=0)([{"input_ids": [1], "id": 0}, {"input_ids": [2]}])

    def test_rows_container(self):
        with pytest.raises(TypeError, match=r"rows should be a list of rows"):
            TextCollator(pad_token_id=0)({"input_ids": [[1]]})
        with pytest.raises(ValueError, match=r"rows should hold at least one row"):
            TextCollator(pad_token_id=0)([])

    def test_bad_options(self):
        with pytest.raises(ValueError, match=r"padding_side should be 'right' or 'left', but got padding_side='up'"):
            TextCollator(pad_token_id=0, padding_side="up")
        with pytest.raises(ValueError, match=r"task_type should be one of .* but got task_type='lm'"):
            TextCollator(pad_token_id=0, task_type="lm")
        with pytest.raises(ValueError, match=r"pad_to_multiple_of should be an int >= 1 or None"):
            TextCollator(pad_token_id=0, pad_to_multiple_of=0)


class TestFactoryAndPickling:
    def test_factory_reads_spec(self):
        lm = create_text_collator(TaskSpec.lm_tiny())
        assert (lm.task_type, lm.pad_token_id, lm.max_length) == ("causal_lm", 50256, 128)
        mlm = create_text_collator(TaskSpec.mlm_tiny())
        assert (mlm.task_type, mlm.mask_token_id, mlm.vocab_size) == ("masked_lm", 103, 30522)
        assert mlm.mlm_probability == 0.15 and mlm.max_length == 128
        assert mlm.special_token_ids == (0, 101, 102, 103)
        cls = create_text_collator(TaskSpec.cls_tiny())
        assert (cls.task_type, cls.pad_token_id, cls.target_field) == ("classification", 0, "labels")
        s2s = create_text_collator(TaskSpec.seq2seq_tiny())
        assert (s2s.text_field, s2s.target_text_field, s2s.max_target_length) == ("source", "target", 64)

    def test_kwargs_override_spec_and_tokenizer_overrides_spec(self, gpt_tokenizer):
        collate = create_text_collator(TaskSpec.lm_tiny(), pad_token_id=7, max_length=None, task_type="regression")
        assert (collate.pad_token_id, collate.max_length, collate.task_type) == (7, None, "regression")
        assert create_text_collator(TaskSpec.cls_tiny(), tokenizer=gpt_tokenizer).pad_token_id == 5
        assert create_text_collator(None, pad_token_id=3).task_type == "causal_lm"
        batch = create_text_collator(TaskSpec.lm_tiny(), max_length=None)([list(range(200))])
        assert batch["input_ids"].shape == (1, 200)

    def test_repr_shows_options(self, tokenizer):
        text = repr(create_text_collator(TaskSpec.mlm_tiny(), tokenizer=tokenizer))
        assert text.startswith("TextCollator(task_type='masked_lm', pad_token_id=0, label_pad_token_id=-100, ")
        assert "mask_token_id=4" in text and f"tokenizer={type(tokenizer).__name__}(len=33)" in text

    @pytest.mark.parametrize("spec", [TaskSpec.lm_tiny(), TaskSpec.mlm_tiny(), TaskSpec.seq2seq_tiny()])
    def test_pickle_round_trip(self, tokenizer, spec):
        collate = create_text_collator(spec, tokenizer=tokenizer)
        rows = [{"input_ids": list(range(6, 30)), "labels": [7, 8]}, {"input_ids": [9, 10], "labels": [7]}]
        if spec.task_type != "seq2seq":
            rows = [{"input_ids": row["input_ids"]} for row in rows]
        collate(rows)  # masked LM: advances the collator's own generator, whose state the clone carries
        clone = pickle.loads(pickle.dumps(collate))
        ours, theirs = collate(rows), clone(rows)
        assert_same(ours, theirs, keys=list(theirs))
        assert repr(clone) == repr(collate)
