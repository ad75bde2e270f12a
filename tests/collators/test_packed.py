"""PackedCollator: field for field equal to transformers' DataCollatorWithFlattening, plus its own guarantees
(columns equal rows, masked LM, value checks, errors naming the row, rows never modified)."""

from __future__ import annotations

import copy
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from transformers import DataCollatorWithFlattening

from collators import CollatorRegistry, PackedCollator, create_packed_collator
from collators.packed import PACKED_FIELDS
from collators.text import RaggedColumn
from task_spec import TaskSpec

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "hypothesis-collators")  # not .hypothesis/ in the checkout
PROPERTY = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DOCUMENTS = st.lists(st.lists(st.integers(0, 999), min_size=1, max_size=60), min_size=1, max_size=12)
FORMS = st.sampled_from(["lists", "tensors", "numpy", "ragged", "arrow"])


def reference():
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)


def ours(documents, form, collate, labels=None):
    """Our collator on ``documents`` in one of the forms the engine hands it."""
    if form in ("ragged", "arrow"):
        columns = {"input_ids": _column(documents, form)}
        if labels is not None:
            columns["labels"] = _column(labels, form)
        return collate.collate_columns(columns)
    convert = {"lists": list, "tensors": torch.tensor, "numpy": np.array}[form]
    rows = [{"input_ids": convert(doc)} for doc in documents]
    if labels is not None:
        for row, label in zip(rows, labels):
            row["labels"] = convert(label)
    return collate(rows)


def _column(rows, form):
    if form == "arrow":
        return pa.array(rows, type=pa.list_(pa.int64()))
    return RaggedColumn(np.array([x for row in rows for x in row], dtype=np.int64),
                        np.cumsum([0, *map(len, rows)]))


def assert_same_fields(mine, theirs):
    assert set(mine) == set(theirs) == set(PACKED_FIELDS)
    for key in PACKED_FIELDS:
        if isinstance(theirs[key], int):
            assert type(mine[key]) is int and mine[key] == theirs[key], key
        else:
            assert mine[key].dtype == theirs[key].dtype, key
            assert mine[key].shape == theirs[key].shape, key
            assert torch.equal(mine[key], theirs[key]), key


class TestAgainstDataCollatorWithFlattening:
    @PROPERTY
    @given(documents=DOCUMENTS, form=FORMS)
    def test_every_field_equals_transformers_on_random_documents(self, documents, form):
        expected = reference()([{"input_ids": doc} for doc in documents])
        assert_same_fields(ours(documents, form, PackedCollator()), expected)

    @PROPERTY
    @given(documents=DOCUMENTS, form=FORMS, seed=st.integers(0, 2**32 - 1))
    def test_labels_the_rows_carry_are_used_as_transformers_uses_them(self, documents, form, seed):
        rng = np.random.default_rng(seed)
        labels = [rng.choice([-100, 3, 7, 500], size=len(doc)).tolist() for doc in documents]
        expected = reference()([{"input_ids": doc, "labels": lab} for doc, lab in zip(documents, labels)])
        assert_same_fields(ours(documents, form, PackedCollator(), labels), expected)


class TestLayout:
    def test_fields_of_two_documents(self):
        batch = PackedCollator()([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
        assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
        assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
        assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
        assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 5]
        assert batch["max_length_q"] == batch["max_length_k"] == 3

    def test_rows_are_not_modified_and_outputs_do_not_share_their_memory(self):
        rows = [{"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([5, 6, 7])}]
        before = copy.deepcopy(rows)
        batch = PackedCollator()(rows)
        batch["input_ids"].add_(1)
        batch["labels"].add_(1)
        assert all(torch.equal(rows[0][key], before[0][key]) for key in rows[0])

    def test_token_type_ids_are_concatenated_and_other_keys_kept_per_document(self):
        rows = [{"input_ids": [5, 6], "token_type_ids": [0, 1], "attention_mask": [1, 1], "id": 4},
                {"input_ids": [7], "token_type_ids": [1], "attention_mask": [1], "id": 9}]
        batch = PackedCollator()(rows)
        assert batch["token_type_ids"].tolist() == [[0, 1, 1]]
        assert batch["id"].tolist() == [4, 9]
        assert "attention_mask" not in batch

    def test_raw_text_is_tokenized_once_per_batch(self, tokenizer):
        batch = PackedCollator(tokenizer=tokenizer)([{"text": "the cat sat"}, {"text": "a dog"}])
        expected = tokenizer(["the cat sat", "a dog"])["input_ids"]
        assert batch["input_ids"].tolist() == [expected[0] + expected[1]]
        assert batch["cu_seq_lens_q"].tolist() == [0, len(expected[0]), len(expected[0]) + len(expected[1])]


class TestTruncation:
    def test_a_document_past_max_length_keeps_its_start_as_transformers_would_on_cut_rows(self):
        rows = [{"input_ids": [5, 6, 7, 8], "labels": [1, 2, 3, 4], "token_type_ids": [0, 0, 1, 1]},
                {"input_ids": [9], "labels": [5], "token_type_ids": [1]}]
        batch = PackedCollator(max_length=3)(rows)
        cut = [{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": [9], "labels": [5]}]
        expected = reference()(cut)
        assert_same_fields({key: batch[key] for key in PACKED_FIELDS}, expected)
        assert batch["token_type_ids"].tolist() == [[0, 0, 1, 1]]

    def test_the_spec_s_max_seq_len_is_the_default(self):
        assert PackedCollator(task_spec=TaskSpec.lm_tiny()).max_length == TaskSpec.lm_tiny().max_seq_len
        assert PackedCollator().max_length is None


class TestMaskedLM:
    def collate(self):
        return PackedCollator(task_type="masked_lm", mask_token_id=4, vocab_size=1000, special_token_ids=[0, 2, 3],
                              mlm_probability=0.5)

    def test_labels_hold_the_original_ids_where_selected_and_specials_are_never_selected(self):
        documents = [[2, *range(10, 40), 3], [2, *range(50, 70), 3]]
        batch = self.collate()([{"input_ids": doc} for doc in documents], generator=torch.Generator().manual_seed(1))
        flat = torch.tensor([x for doc in documents for x in doc])
        labels, masked = batch["labels"][0], batch["input_ids"][0]
        selected = labels != -100
        assert 0 < int(selected.sum()) < len(flat)
        assert torch.equal(labels[selected], flat[selected])
        assert not selected[torch.isin(flat, torch.tensor([2, 3]))].any()
        assert torch.equal(masked[~selected], flat[~selected])
        assert batch["position_ids"].tolist() == [list(range(32)) + list(range(22))]

    def test_the_same_generator_seed_gives_the_same_masks(self):
        rows = [{"input_ids": list(range(10, 60))}, {"input_ids": list(range(5, 30))}]
        first = self.collate()(rows, generator=torch.Generator().manual_seed(7))
        again = self.collate()(rows, generator=torch.Generator().manual_seed(7))
        other = self.collate()(rows, generator=torch.Generator().manual_seed(8))
        assert torch.equal(first["labels"], again["labels"]) and torch.equal(first["input_ids"], again["input_ids"])
        assert not torch.equal(first["labels"], other["labels"])

    def test_a_pickled_collator_draws_on_from_its_own_generator(self):
        """Its generator crosses as its state's bytes (a spawned worker gets the state it had)."""
        rows = [{"input_ids": list(range(10, 60))}]
        collate = self.collate()
        collate(rows)
        clone = pickle.loads(pickle.dumps(collate))
        ours, theirs = collate(rows), clone(rows)
        assert torch.equal(ours["labels"], theirs["labels"]) and torch.equal(ours["input_ids"], theirs["input_ids"])


class TestChecks:
    def test_an_id_past_the_vocabulary_is_refused_naming_the_row_and_position(self):
        collate = PackedCollator(vocab_size=100)
        with pytest.raises(ValueError, match=r"row 1, position 2: 'input_ids' should hold values in \[0, 100\)"):
            collate([{"input_ids": [5, 6]}, {"input_ids": [7, 8, 100]}])

    def test_a_negative_id_is_refused_without_a_vocabulary(self):
        with pytest.raises(ValueError, match=r"row 0, position 1: 'input_ids' should hold values >= 0"):
            PackedCollator()([{"input_ids": [5, -100]}])

    def test_an_empty_document_is_refused_naming_it(self):
        with pytest.raises(ValueError, match="row 1 has no tokens"):
            PackedCollator()([{"input_ids": [5]}, {"input_ids": []}])

    def test_padding_inside_a_document_is_refused(self):
        with pytest.raises(ValueError, match="row 1: attention_mask has a 0"):
            PackedCollator()([{"input_ids": [5], "attention_mask": [1]},
                              {"input_ids": [5, 0], "attention_mask": [1, 0]}])

    def test_labels_of_another_length_are_refused(self):
        with pytest.raises(ValueError, match="row 0: 'labels' has 1 entries but 'input_ids' has 2"):
            PackedCollator()([{"input_ids": [5, 6], "labels": [5]}])

    @pytest.mark.parametrize("spec", [TaskSpec.seq2seq_tiny(), TaskSpec.cls_tiny()], ids=lambda s: s.task_type)
    def test_a_task_it_cannot_pack_is_refused_naming_the_modes_that_work(self, spec):
        with pytest.raises(ValueError, match=f"task_type='{spec.task_type}'; use batching='plain', 'grouped' or"):
            create_packed_collator(spec)

    def test_padding_options_are_refused(self):
        with pytest.raises(ValueError, match=r"adds no padding, but got \['pad_to_multiple_of'\]"):
            create_packed_collator(TaskSpec.lm_tiny(), pad_to_multiple_of=8)


def test_the_registry_chooses_it_by_name_only():
    registry = CollatorRegistry.get_instance()
    assert registry.resolve(TaskSpec.lm_tiny()).chosen.name == "text"
    assert isinstance(registry.get_collator(TaskSpec.lm_tiny(), "packed"), PackedCollator)
