"""Rules every batch is held to, in every collator and on both text entry points (rows and columns).

Bool token ids are refused whatever the rest of the batch holds; a batch without targets is a prediction batch,
targets in some rows only are an error that names the row; ids, class labels and float pixels are checked per
batch on the host, so what would become a CUDA device-side assert is an error that names key, value, row and limit.
"""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchvision.transforms import v2

from collators import AudioCollator, VisionCollator, create_audio_collator, create_vision_collator
from collators.text import RaggedColumn, TextCollator, create_text_collator
from task_spec import TaskSpec

BOOL_ERROR = r"should be a 1-D sequence of int token ids .* bools are not token ids: .*\.long\(\)"


def ragged(rows: list[list[int]]) -> RaggedColumn:
    return RaggedColumn(np.array([x for row in rows for x in row], dtype=np.int64),
                        np.concatenate([[0], np.cumsum([len(row) for row in rows])]))


class TestBoolTokenIds:
    @pytest.mark.parametrize(("rows", "row"), [
        ([[True, False], [5, 6]], 0),  # was accepted: numpy promoted the batch to int64
        ([[5, 6], [7, True, 8]], 1),  # was accepted
        ([[np.True_, 5]], 0),  # was accepted
        ([[True, False]], 0),
        ([[5], torch.tensor([True, False])], 1),
        ([np.array([5]), np.array([True])], 1),
    ])
    def test_refused_whatever_the_rest_of_the_batch(self, rows, row):
        with pytest.raises(TypeError, match=rf"row {row}: 'input_ids' {BOOL_ERROR}"):
            TextCollator(pad_token_id=0)(rows)

    @pytest.mark.parametrize("column", [
        RaggedColumn(np.array([True, False, True]), np.array([0, 2, 3])),
        pa.array([[True, False], [True]]),
        np.array([[True, False], [True, True]]),
        [[5, 6], [True, 7]],
        [[5, 6], torch.tensor([True, False])],
    ], ids=["ragged", "arrow", "numpy_2d", "list_mixed", "list_tensor"])
    def test_refused_on_the_columnar_path(self, column):
        with pytest.raises(TypeError, match=BOOL_ERROR):
            TextCollator(pad_token_id=0).collate_columns({"input_ids": column})

    def test_refused_in_seq2seq_labels_and_decoder_inputs(self):
        collate = create_text_collator(TaskSpec.seq2seq_tiny())
        with pytest.raises(TypeError, match=rf"row 1: 'labels' {BOOL_ERROR}"):
            collate([{"input_ids": [1], "labels": [5]}, {"input_ids": [2], "labels": [6, False]}])
        with pytest.raises(TypeError, match=rf"row 0: 'decoder_input_ids' {BOOL_ERROR}"):
            collate([{"input_ids": [1], "labels": [5], "decoder_input_ids": [True]}])

    def test_zero_one_ids_and_bool_masks_are_still_fine(self):
        batch = TextCollator(pad_token_id=0)([{"input_ids": [0, 1, 1], "attention_mask": [True, True, False]},
                                              {"input_ids": [1], "attention_mask": [np.True_]}])
        assert batch["input_ids"].tolist() == [[0, 1, 1], [1, 0, 0]]
        assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]


INPUTS = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}]
TARGETS = {"classification": [1, 0], "regression": [0.5, 1.5], "token_classification": [[1, 0, 1], [0]],
           "seq2seq": [[9, 10], [11]]}


class TestPredictionBatches:
    @pytest.mark.parametrize("task", list(TARGETS))
    @pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
    def test_rows_without_targets_pad_inputs_and_give_no_labels(self, task, columns):
        spec = TaskSpec.cls_tiny().replace(task_type=task, loss_type="mse" if task == "regression" else "cross_entropy")
        collate = create_text_collator(spec)
        rows = copy.deepcopy(INPUTS)
        batch = collate.collate_columns({"input_ids": ragged([r["input_ids"] for r in rows])}) if columns \
            else collate(rows)
        assert sorted(batch) == ["attention_mask", "input_ids"]
        trained = collate([{**row, "labels": target} for row, target in zip(INPUTS, TARGETS[task])])
        assert torch.equal(batch["input_ids"], trained["input_ids"]) and "labels" in trained
        assert rows == INPUTS

    @pytest.mark.parametrize("task", list(TARGETS))
    def test_targets_in_some_rows_only_name_the_row(self, task):
        collate = create_text_collator(TaskSpec.cls_tiny(), task_type=task)
        target = TARGETS[task][0]
        with pytest.raises(ValueError, match=r"row 1 has no target under 'labels' but row 0 has one; give every row "
                                             r".* or none \(prediction: the batch then has no 'labels'\)"):
            collate([{**INPUTS[0], "labels": target}, INPUTS[1]])
        with pytest.raises(ValueError, match=r"row 0 has no target under 'labels' but row 1 has one"):
            collate([INPUTS[0], {**INPUTS[1], "labels": target}])
        with pytest.raises(ValueError, match=r"row 2 has no target under 'labels' but row 0 has one"):
            collate([{**INPUTS[0], "labels": target}, {**INPUTS[1], "labels": target}, {**INPUTS[1], "labels": None}])

    def test_none_targets_count_as_absent_in_rows_and_arrow_columns(self):
        collate = create_text_collator(TaskSpec.cls_tiny())
        batch = collate([{**row, "labels": None} for row in INPUTS])
        assert sorted(batch) == ["attention_mask", "input_ids"]
        ids = pa.array([row["input_ids"] for row in INPUTS])
        assert "labels" not in collate.collate_columns({"input_ids": ids, "labels": pa.array([None, None])})
        with pytest.raises(ValueError, match=r"row 1 has no target under 'labels' but row 0 has one"):
            collate.collate_columns({"input_ids": ids, "labels": pa.array([1, None])})

    def test_seq2seq_target_text_in_some_rows_only(self, tokenizer):
        collate = create_text_collator(TaskSpec.seq2seq_tiny(), tokenizer=tokenizer)
        with pytest.raises(ValueError, match=r"row 1 has no target under 'target' but row 0 has one"):
            collate([{"source": "a dog", "target": "the cat"}, {"source": "a cat"}])
        rows = [{"source": "a dog", "decoder_input_ids": [0, 7]}, {"source": "a cat", "decoder_input_ids": [0]}]
        batch = collate(rows)
        assert sorted(batch) == ["attention_mask", "decoder_input_ids", "input_ids"]

    def test_language_modelling_still_derives_labels(self):
        assert "labels" in create_text_collator(TaskSpec.lm_tiny())(copy.deepcopy(INPUTS))

    @pytest.mark.parametrize("make", [lambda: VisionCollator(), lambda: AudioCollator()], ids=["vision", "audio"])
    def test_vision_and_audio(self, make):
        key = "pixel_values" if isinstance(make(), VisionCollator) else "input_values"
        value = torch.zeros(3, 4, 4, dtype=torch.uint8) if key == "pixel_values" else torch.zeros(8)
        assert "labels" not in make()([{key: value}, {key: value}])
        assert "labels" not in make()([{key: value, "labels": None}, {key: value, "labels": None}])
        with pytest.raises(ValueError, match=r"row 1 has no 'labels' but row 0 has one; give every row a label, or "
                                             r"none \(prediction"):
            make()([{key: value, "labels": 1}, {key: value, "labels": None}])


class TestTokenIdRange:
    def test_ids_past_the_tokenizer(self, tokenizer):
        rows = [{"input_ids": [2, 7, 3]}, {"input_ids": [2, 7, 40, 3]}]
        with pytest.raises(ValueError, match=r"row 1, position 2: 'input_ids' should hold values in \[0, 33\) "
                                             r"\(len\(tokenizer\)=33\), but got input_ids=40 .*vocab_size="):
            TextCollator(tokenizer=tokenizer)(rows)

    @pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
    def test_ids_past_the_spec_vocabulary_and_negative_ids(self, columns):
        collate = create_text_collator(TaskSpec.cls_tiny())

        def call(ids):
            if columns:
                return collate.collate_columns({"input_ids": ragged(ids), "labels": [0] * len(ids)})
            return collate([{"input_ids": row, "labels": 0} for row in ids])

        with pytest.raises(ValueError, match=r"row 2, position 0: 'input_ids' should hold values in \[0, 30522\) "
                                             r"\(TaskSpec.additional_config\['vocab_size'\]=30522\), but got "
                                             r"input_ids=30522"):
            call([[1], [2, 3], [30522]])
        with pytest.raises(ValueError, match=r"row 0, position 1: 'input_ids' .* but got input_ids=-100"):
            call([[1, -100], [2]])
        assert call([[1, 30521], [0]])["input_ids"].tolist() == [[1, 30521], [0, 0]]

    def test_without_a_vocabulary_only_negative_ids_are_refused(self):
        assert TextCollator(pad_token_id=0)([[10**9]])["input_ids"].tolist() == [[10**9]]
        with pytest.raises(ValueError, match=r"'input_ids' should hold values >= 0, but got input_ids=-1"):
            TextCollator(pad_token_id=0)([[-1]])

    def test_labels_and_decoder_inputs_of_token_tasks(self):
        with pytest.raises(ValueError, match=r"row 0, position 1: 'labels' should hold values in \[0, 16\) or -100 "
                                             r"\(ignored\) \(vocab_size=16\), but got labels=16"):
            TextCollator(pad_token_id=0, vocab_size=16)([{"input_ids": [1, 2], "labels": [-100, 16]}])
        s2s = create_text_collator(TaskSpec.seq2seq_tiny(), vocab_size=16)
        with pytest.raises(ValueError, match=r"row 1, position 0: 'labels' .* but got labels=20"):
            s2s([{"input_ids": [1], "labels": [3]}, {"input_ids": [1], "labels": [20]}])
        with pytest.raises(ValueError, match=r"row 0, position 1: 'decoder_input_ids' .* got decoder_input_ids=-3"):
            s2s([{"input_ids": [1], "labels": [3], "decoder_input_ids": [0, -3]}])

    def test_masked_lm_checks_ids_before_masking(self):
        with pytest.raises(ValueError, match=r"'input_ids' should hold values in \[0, 30522\)"):
            create_text_collator(TaskSpec.mlm_tiny())([[101, 40000, 102]])

    def test_check_values_false_skips_the_checks(self):
        batch = create_text_collator(TaskSpec.cls_tiny(), check_values=False)([{"input_ids": [-5], "labels": 9}])
        assert batch["input_ids"].tolist() == [[-5]] and batch["labels"].tolist() == [9]


class TestClassLabelRange:
    def test_classification(self):
        collate = create_text_collator(TaskSpec.cls_tiny())
        with pytest.raises(ValueError, match=r"row 1: 'labels' should hold values in \[0, 2\) or -100 \(ignored\) "
                                             r"\(num_classes=2\), but got labels=2 .*num_classes="):
            collate([{"input_ids": [1], "labels": 1}, {"input_ids": [1], "labels": 2}])
        with pytest.raises(ValueError, match=r"row 0: 'labels' .* but got labels=-1 .*GLUE test splits"):
            collate([{"input_ids": [1], "labels": -1}])
        assert collate([{"input_ids": [1], "labels": -100}])["labels"].tolist() == [-100]

    def test_token_classification_rows_and_columns(self):
        collate = create_text_collator(TaskSpec.cls_tiny(), task_type="token_classification", num_classes=3)
        rows = [{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3, 4, 5], "labels": [0, 3, -100]}]
        message = r"row 1, position 1: 'labels' should hold values in \[0, 3\) or -100 .* but got labels=3"
        with pytest.raises(ValueError, match=message):
            collate(rows)
        with pytest.raises(ValueError, match=message):
            collate.collate_columns({"input_ids": ragged([r["input_ids"] for r in rows]),
                                     "labels": ragged([r["labels"] for r in rows])})

    def test_unchecked_without_a_cross_entropy_class_count(self):
        bce = TaskSpec.cls_tiny().replace(loss_type="bce", additional_config={"num_classes": 1})
        assert create_text_collator(bce)([{"input_ids": [1], "labels": 1}])["labels"].tolist() == [1]
        multi_label = create_text_collator(TaskSpec.cls_tiny())([{"input_ids": [1], "labels": [0, 5, 1]}])
        assert multi_label["labels"].shape == (1, 3)  # [B, C] targets are not class indices

    @pytest.mark.parametrize("kind", ["vision", "audio"])
    def test_vision_and_audio_take_num_classes_from_the_spec(self, kind):
        if kind == "vision":
            collate, key, value = create_vision_collator(TaskSpec.vision_tiny()), "pixel_values", torch.zeros(3, 2, 2)
        else:
            collate, key, value = create_audio_collator(TaskSpec.audio_tiny()), "input_values", torch.zeros(400)
        assert collate.num_classes == 4
        with pytest.raises(ValueError, match=r"row 1: 'labels' should be a class index in \[0, 4\) \(num_classes=4\) "
                                             r"or -100 \(ignored\), but got labels=4; map labels to 0..3"):
            collate([{key: value, "labels": 3}, {key: value, "labels": 4}])
        assert collate([{key: value, "labels": 3}, {key: value, "labels": -100}])["labels"].tolist() == [3, -100]
        assert collate([{key: value, "labels": 7.5}])["labels"].dtype == torch.float32  # float targets: not classes


class TestFloatImageRange:
    def test_0_255_floats_are_refused(self):
        rows = [{"pixel_values": torch.rand(3, 4, 4)}, {"pixel_values": torch.rand(3, 4, 4) * 255}]
        with pytest.raises(ValueError, match=r"row 1: float 'pixel_values' should hold values in \[0, 1\] .* but got "
                                             r"pixel_values with min=.*, max=.*; 0..255 values\? pass the uint8 "
                                             r"image .* or divide it by 255"):
            VisionCollator()(rows)
        with pytest.raises(ValueError, match=r"row 0: float 'pixel_values' .*divide it by 255"):
            VisionCollator(normalize=False)([np.full((4, 4, 3), 200.0, dtype=np.float32)])

    def test_normalized_and_nan_images_are_refused(self):
        normalized = v2.functional.normalize(torch.zeros(3, 4, 4), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        with pytest.raises(ValueError, match=r"min=-2.118.*normalized already\? pass images in \[0, 1\]"):
            VisionCollator()([normalized])
        with pytest.raises(ValueError, match=r"min=nan"):
            VisionCollator()([torch.full((3, 2, 2), float("nan"))])

    def test_resizing_overshoot_and_uint8_rows_are_accepted(self):
        sharp = (torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)) > 0.5).float()
        resized = v2.functional.resize(sharp, [40, 40], interpolation=v2.InterpolationMode.BICUBIC, antialias=True)[0]
        assert resized.min() < -0.05 and resized.max() > 1.05
        rows = [{"pixel_values": resized}, {"pixel_values": torch.full((3, 40, 40), 255, dtype=torch.uint8)}]
        batch = VisionCollator(normalize=False)(rows)
        assert torch.equal(batch["pixel_values"][0], resized) and bool((batch["pixel_values"][1] == 1).all())
