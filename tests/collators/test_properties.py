"""Property tests: TextCollator against transformers' collators on generated batches (1,000 in all).

Each test draws a batch (1 to 8 rows, mostly short, empty and length-1 rows included, some of 100 to 300 ids; ids
over the whole vocabulary of the test tokenizers, so the pad and eos ids occur as real tokens), a padding side,
``pad_to_multiple_of``, and the form our collator receives the rows in (lists, tensors, numpy arrays, or columns
through ``collate_columns``, as flat values + offsets or as spans of a larger buffer with junk between the rows);
transformers always gets lists. Where our documented behaviour differs (causal-LM
labels mask padding by position, not by id: see test_text.py and docs/collators.md), the test compares the
positions where both agree and pins ours on the rest. Runs are derandomized: the same batches every run, and
nothing is written to a ``.hypothesis`` database. No timing here.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

from collators.text import RaggedColumn, SpanColumn, TextCollator

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hypothesis-collators")  # not .hypothesis/ in the checkout
EXAMPLES = 250
"""Batches per test; four tests, so 1,000 batches in all."""
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

IDS = st.integers(0, 32)  # every id of the test tokenizers (len 33): pad 0, eos 5 and the other specials too
SEEDS = st.integers(0, 2**32 - 1)


def random_values(length: int, seed: int, low: int = 0, high: int = 33) -> list[int]:
    """``length`` values in ``[low, high)``, -1 read as -100; drawn by numpy (one hypothesis draw per long row)."""
    values = np.random.default_rng(seed).integers(low, high, length)
    return np.where(values == -1, -100, values).tolist()


SHORT = st.lists(IDS, max_size=12)
LONG = st.builds(random_values, st.integers(100, 300), SEEDS)
ROWS = st.lists(st.one_of(SHORT, SHORT, SHORT, LONG), min_size=1, max_size=8)
SIDES = st.sampled_from(["right", "left"])
MULTIPLES = st.sampled_from([None, 1, 3, 8, 16])
FORMS = st.sampled_from(["list", "tensor", "numpy", "columns", "spans"])
CLASS_LABELS = st.one_of(st.integers(0, 4), st.just(-100))
PER_TOKEN_KEYS = ("input_ids", "attention_mask", "labels")


def ragged(values: list[list[int]]) -> RaggedColumn:
    flat = np.array([x for value in values for x in value], dtype=np.int64)
    return RaggedColumn(flat, np.concatenate([[0], np.cumsum([len(value) for value in values])]).astype(np.int64))


JUNK = 10**6
"""Fills the gaps between spans: an id no vocabulary here holds, so a read outside a row shows in the output."""


def spans(values: list[list[int]]) -> SpanColumn:
    """The rows laid out in reverse order in one buffer, a junk value before and after each: spans, not offsets."""
    buffer: list[int] = [JUNK]
    starts = [0] * len(values)
    for index in reversed(range(len(values))):
        starts[index] = len(buffer)
        buffer += values[index] + [JUNK]
    return SpanColumn(np.array(buffer, dtype=np.int64), np.array(starts), np.array([len(v) for v in values]))


def collate(collator: TextCollator, rows: list[dict], form: str) -> dict:
    """``collator`` on ``rows`` handed over in ``form``; checks that the caller's rows are left as they were."""
    snapshot = copy.deepcopy(rows)
    if form in ("columns", "spans"):
        columns = {}
        for key in rows[0]:
            values = [row[key] for row in rows]
            ragged_key = isinstance(values[0], list)
            flat = spans if form == "spans" else ragged
            columns[key] = flat(values) if ragged_key and (key != "labels" or form == "spans") else (
                pa.array(values, type=pa.list_(pa.int64())) if ragged_key else values)
        batch = collator.collate_columns(columns)
    else:
        convert = {"list": list, "tensor": lambda v: torch.tensor(v, dtype=torch.long),
                   "numpy": lambda v: np.array(v, dtype=np.int64)}[form]
        batch = collator([{key: convert(value) if key in PER_TOKEN_KEYS and isinstance(value, list) else value
                           for key, value in row.items()} for row in rows])
    assert rows == snapshot
    return batch


def assert_same(ours: dict, theirs, keys) -> None:
    """Same keys in both batches; equal int64 tensors under ``keys``."""
    assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
    for key in keys:
        assert ours[key].dtype == theirs[key].dtype == torch.long, key
        assert torch.equal(ours[key], theirs[key]), (key, ours[key], theirs[key])


@PROPERTY
@given(ids=ROWS, side=SIDES, multiple=MULTIPLES, form=FORMS, with_mask=st.booleans(), data=st.data())
def test_classification_matches_data_collator_with_padding(tokenizers, ids, side, multiple, form, with_mask, data):
    tokenizer = tokenizers["bert", side]
    labels = data.draw(st.lists(CLASS_LABELS, min_size=len(ids), max_size=len(ids)))
    rows = [{"input_ids": row, **({"attention_mask": [1] * len(row)} if with_mask else {}), "labels": label}
            for row, label in zip(ids, labels)]
    theirs = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)(copy.deepcopy(rows))
    ours = collate(TextCollator(tokenizer=tokenizer, task_type="classification", pad_to_multiple_of=multiple,
                                num_classes=5), rows, form)
    assert_same(ours, theirs, ["input_ids", "attention_mask", "labels"])


@PROPERTY
@given(ids=ROWS, side=SIDES, multiple=MULTIPLES, form=FORMS, kind=st.sampled_from(["bert", "gpt"]))
def test_causal_lm_matches_language_modeling_collator_where_they_agree(tokenizers, ids, side, multiple, form, kind):
    tokenizer = tokenizers[kind, side]  # 'gpt': pad = eos, the case where the two differ on purpose
    rows = [{"input_ids": row} for row in ids]
    theirs = DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=multiple)(copy.deepcopy(rows))
    ours = collate(TextCollator(tokenizer=tokenizer, pad_to_multiple_of=multiple), rows, form)
    assert_same(ours, theirs, ["input_ids", "attention_mask"])
    # transformers labels every position holding the pad id -100, real tokens included; both agree elsewhere.
    not_pad_id = ours["input_ids"] != tokenizer.pad_token_id
    assert torch.equal(ours["labels"][not_pad_id], theirs["labels"][not_pad_id])
    assert bool((theirs["labels"][~not_pad_id] == -100).all())
    # Ours, pinned: the ids at real positions (a real eos equal to the pad id keeps its label), -100 at padding.
    real = ours["attention_mask"].bool()
    assert torch.equal(ours["labels"], torch.where(real, ours["input_ids"], -100))
    assert ours["attention_mask"].sum(1).tolist() == [len(row) for row in ids]


@PROPERTY
@given(ids=ROWS, side=SIDES, multiple=MULTIPLES, form=FORMS, data=st.data())
def test_seq2seq_matches_data_collator_for_seq2seq(tokenizers, ids, side, multiple, form, data):
    tokenizer = tokenizers["bert", side]
    targets = data.draw(st.lists(st.one_of(SHORT, SHORT, LONG), min_size=len(ids), max_size=len(ids)))
    rows = [{"input_ids": row, "labels": target} for row, target in zip(ids, targets)]
    theirs = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=multiple)(
        copy.deepcopy(rows))
    ours = collate(TextCollator(tokenizer=tokenizer, task_type="seq2seq", pad_to_multiple_of=multiple), rows, form)
    assert_same(ours, theirs, ["input_ids", "attention_mask", "labels"])


@PROPERTY
@given(ids=ROWS, side=SIDES, multiple=MULTIPLES, form=FORMS,
       task=st.sampled_from(["token_classification", "causal_lm"]), data=st.data())
def test_given_token_labels_match_data_collator_for_token_classification(tokenizers, ids, side, multiple, form,
                                                                         task, data):
    # Token classification, and causal LM with labels the rows already carry (kept and padded, not recomputed):
    # both pad the given per-token labels with -100 on the padding side, as DataCollatorForTokenClassification.
    tokenizer = tokenizers["bert", side]
    low, high = (-1, 5) if task == "token_classification" else (-1, 33)  # -1 stands for -100
    seed = data.draw(SEEDS)
    labels = [random_values(len(row), seed + index, low, high) for index, row in enumerate(ids)]
    rows = [{"input_ids": row, "labels": label} for row, label in zip(ids, labels)]
    theirs = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=multiple)(copy.deepcopy(rows))
    ours = collate(TextCollator(tokenizer=tokenizer, task_type=task, pad_to_multiple_of=multiple,
                                num_classes=5 if task == "token_classification" else None), rows, form)
    assert_same(ours, theirs, ["input_ids", "attention_mask", "labels"])
