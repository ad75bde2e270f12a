"""Static shapes: padding='max_length' equals transformers' on the same rows, and length buckets give a handful
of batch widths, so torch.compile, CUDA graphs and XLA see few shapes."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding

from collators import TextCollator
from task_spec import TaskSpec
from tests.collators.conftest import build_tokenizer

TOKENIZER = build_tokenizer()
ROW = st.lists(st.integers(6, len(TOKENIZER) - 1), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(rows=st.lists(ROW, min_size=1, max_size=6), max_length=st.sampled_from([24, 32]),
       side=st.sampled_from(["right", "left"]), multiple=st.sampled_from([None, 8]))
def test_max_length_padding_equals_transformers(rows, max_length, side, multiple):
    TOKENIZER.padding_side = side
    batch = [{"input_ids": ids} for ids in rows]
    theirs = DataCollatorWithPadding(TOKENIZER, padding="max_length", max_length=max_length,
                                     pad_to_multiple_of=multiple)(batch)
    ours = TextCollator(tokenizer=TOKENIZER, task_type="classification", padding="max_length",
                        max_length=max_length, pad_to_multiple_of=multiple)(batch)
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
    assert batch == [{"input_ids": ids} for ids in rows]  # rows untouched
    TOKENIZER.padding_side = "right"


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sources=st.lists(ROW, min_size=1, max_size=5), targets=st.lists(ROW, min_size=5, max_size=5),
       side=st.sampled_from(["right", "left"]), multiple=st.sampled_from([None, 8]))
def test_seq2seq_max_length_padding_equals_transformers(sources, targets, side, multiple):
    """Labels are max_length wide too (transformers 5 pads them to max_length), so every batch has one shape."""
    TOKENIZER.padding_side = side
    batch = [{"input_ids": ids, "labels": target} for ids, target in zip(sources, targets)]
    theirs = DataCollatorForSeq2Seq(TOKENIZER, padding="max_length", max_length=24, pad_to_multiple_of=multiple,
                                    label_pad_token_id=-100)(batch)
    ours = TextCollator(tokenizer=TOKENIZER, task_type="seq2seq", padding="max_length", max_length=24,
                        pad_to_multiple_of=multiple)(batch)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    assert batch == [{"input_ids": ids, "labels": target} for ids, target in zip(sources, targets)]  # rows untouched
    TOKENIZER.padding_side = "right"


class TestSeq2SeqMaxLength:
    ROWS = [{"input_ids": [1, 2], "labels": [5, 6, 7], "decoder_input_ids": [0, 5, 6],
             "decoder_attention_mask": [1, 1, 1]},
            {"input_ids": [3], "labels": [9], "decoder_input_ids": [0], "decoder_attention_mask": [1]}]

    def test_labels_and_decoder_inputs_are_max_target_length_wide(self):
        collate = TextCollator(pad_token_id=4, task_type="seq2seq", padding="max_length", max_length=6,
                               max_target_length=5)
        batch = collate(self.ROWS)
        assert batch["input_ids"].shape == (2, 6)
        assert batch["labels"].tolist() == [[5, 6, 7, -100, -100], [9, -100, -100, -100, -100]]
        assert batch["decoder_input_ids"].tolist() == [[0, 5, 6, 4, 4], [0, 4, 4, 4, 4]]
        assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]

    def test_without_max_target_length_labels_are_max_length_wide(self):
        batch = TextCollator(pad_token_id=4, task_type="seq2seq", padding="max_length", max_length=4)(self.ROWS)
        assert batch["labels"].shape == batch["decoder_input_ids"].shape == batch["input_ids"].shape == (2, 4)

    def test_a_label_longer_than_max_length_is_refused_not_cut(self):
        collate = TextCollator(pad_token_id=4, task_type="seq2seq", padding="max_length", max_length=2)
        expected = ("'labels' should have at most max_length=2 tokens with padding='max_length' and no "
                    "max_target_length, but got 3 tokens in row 0; set max_target_length=... to truncate the "
                    "targets, or raise max_length")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            collate(self.ROWS)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_buckets_pick_the_smallest_width_that_holds_the_batch(lengths):
    collate = TextCollator(pad_token_id=0, pad_to_buckets=(8, 16, 32), max_length=32)
    batch = collate([{"input_ids": list(range(1, n + 1))} for n in lengths])
    longest = min(max(lengths), 32)
    assert batch["input_ids"].shape[1] == min(width for width in (8, 16, 32) if width >= longest)
    assert batch["attention_mask"].sum(1).tolist() == [min(n, 32) for n in lengths]
    assert batch["labels"].shape == batch["input_ids"].shape


class TestOptions:
    def test_the_spec_can_ask_for_buckets_and_a_module_sees_few_shapes(self):
        from engine import UniversalDataModule

        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"pad_to_buckets": [64, 128]},
                                          special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 100})
        rows = [torch.randint(1, 100, (n,)) for n in torch.randint(2, 129, (200,)).tolist()]
        dm = UniversalDataModule(rows, task_spec=spec, batch_size=16)
        widths = {batch["input_ids"].shape[1] for _ in range(2) for batch in dm.train_dataloader()}
        assert widths <= {64, 128} and dm.collator.pad_to_buckets == (64, 128)

    @pytest.mark.parametrize(("options", "error", "message"), [
        (dict(padding="max_length", max_length=None), ValueError, "padding='max_length' pads every batch to "
                                                                  "max_length, but max_length is None"),
        (dict(padding="static"), ValueError, "padding should be 'longest' or 'max_length', but got "
                                             "padding='static'"),
        (dict(pad_to_buckets="128"), TypeError, "pad_to_buckets should be a sequence of widths"),
        (dict(pad_to_buckets=(0, 8)), ValueError, "pad_to_buckets item should be an int >= 1"),
        (dict(pad_to_buckets=(8,), padding="max_length", max_length=8), ValueError,
         "pad_to_buckets should be a non-empty sequence of widths used with padding='longest'"),
    ])
    def test_bad_options_are_refused(self, options, error, message):
        with pytest.raises(error, match=message):
            TextCollator(pad_token_id=0, **options)

    def test_a_row_longer_than_every_bucket_is_refused_not_truncated_silently(self):
        collate = TextCollator(pad_token_id=0, pad_to_buckets=(4, 8), max_length=None)
        with pytest.raises(ValueError, match=r"longest row has 9 tokens, but the largest of pad_to_buckets=\(4, 8\)"):
            collate([{"input_ids": list(range(1, 10))}])
