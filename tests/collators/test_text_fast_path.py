"""The fast paths of text collation give exactly what the reference paths give.

Differential tests: TextCollator against transformers on edge cases; the columnar entry point against the row
path (every column form, every task); the ``bytes`` mask conversion, the range test for special ids and the
in-place masking against the straightforward implementations they replace. No timing here (see benchmarks/).
"""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

from collators._padding import PaddingLayout
from collators._text_inputs import flatten_ids
from collators.masking import build_special_tokens_mask, mask_tokens
from collators.text import RaggedColumn, TextCollator

TEXTS = ["the cat sat on the mat", "", "a", "birds sing at dawn and dusk tonight", "rain falls on quiet streets"]


def assert_same(ours: dict, theirs, keys=None) -> None:
    keys = list(keys or theirs.keys())
    for key in keys:
        a, b = ours[key], theirs[key]
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), (key, a, b)
        else:
            assert a == b, (key, a, b)


def as_columns(rows: list[dict], form: str) -> dict:
    """The rows as columns: ragged keys as RaggedColumn / pyarrow arrays of several layouts, others as lists."""
    out = {}
    for key in rows[0]:
        values = [row[key] for row in rows]
        if not isinstance(values[0], list):
            out[key] = values
        elif form == "ragged":
            lengths = [len(value) for value in values]
            flat = np.array([x for value in values for x in value], dtype=np.int64).reshape(-1)
            out[key] = RaggedColumn(flat, np.concatenate([[0], np.cumsum(lengths)]))
        elif form == "arrow_int32":
            out[key] = pa.array(values, type=pa.list_(pa.int32()))
        elif form == "arrow_large":
            out[key] = pa.array(values, type=pa.large_list(pa.int64()))
        elif form == "arrow_chunked":  # several chunks, one of them a slice with a non-zero offset
            padded = pa.array([[9, 9], *values], type=pa.list_(pa.int16()))
            out[key] = pa.chunked_array([padded.slice(1, 2), padded.slice(3, len(values) - 2)])
        else:
            raise ValueError(form)
    return out


FORMS = ["ragged", "arrow_int32", "arrow_large", "arrow_chunked"]


def encoded(tokenizer, texts=TEXTS) -> list[dict]:
    return [{key: list(value) for key, value in tokenizer(text).items()} for text in texts]


class TestAgainstTransformers:
    @pytest.mark.parametrize("multiple", [None, 8])
    @pytest.mark.parametrize("side", ["right", "left"])
    @pytest.mark.parametrize("form", ["rows", *FORMS])
    def test_padding_edge_cases(self, gpt_tokenizer, side, multiple, form):
        # Without special tokens "" is an empty row and "a" a single token: both edge cases in one batch.
        gpt_tokenizer.padding_side = side
        rows = encoded(gpt_tokenizer)
        assert [len(row["input_ids"]) for row in rows][1:3] == [0, 1]
        theirs = DataCollatorWithPadding(gpt_tokenizer, pad_to_multiple_of=multiple)(copy.deepcopy(rows))
        collate = TextCollator(tokenizer=gpt_tokenizer, pad_to_multiple_of=multiple)
        ours = collate(rows) if form == "rows" else collate.collate_columns(as_columns(rows, form))
        assert_same(ours, theirs, ["input_ids", "attention_mask"])
        expected = theirs["input_ids"].masked_fill(theirs["attention_mask"] == 0, -100)
        assert torch.equal(ours["labels"], expected)

    @pytest.mark.parametrize("side", ["right", "left"])
    @pytest.mark.parametrize("form", ["rows", *FORMS])
    def test_max_length_truncation_equals_truncated_rows(self, tokenizer, side, form):
        tokenizer.padding_side = side
        rows = encoded(tokenizer)
        truncated = [{key: value[:4] for key, value in row.items()} for row in rows]
        theirs = DataCollatorWithPadding(tokenizer)(copy.deepcopy(truncated))
        collate = TextCollator(tokenizer=tokenizer, max_length=4)
        ours = collate(rows) if form == "rows" else collate.collate_columns(as_columns(rows, form))
        assert_same(ours, theirs, ["input_ids", "attention_mask"])

    def test_numpy_and_int32_inputs(self, tokenizer):
        rows = encoded(tokenizer)
        theirs = DataCollatorWithPadding(tokenizer)(copy.deepcopy(rows))
        collate = TextCollator(tokenizer=tokenizer)
        for convert in (lambda v: np.array(v, dtype=np.int32), lambda v: torch.tensor(v, dtype=torch.int32),
                        lambda v: np.array(v, dtype=np.uint16)):
            assert_same(collate([{k: convert(v) for k, v in row.items()} for row in rows]), theirs,
                        ["input_ids", "attention_mask"])

    def test_masked_lm_deterministic_parts(self, tokenizer):
        rows = encoded(tokenizer) * 20
        theirs = DataCollatorForLanguageModeling(tokenizer, mlm=True, seed=0)(copy.deepcopy(rows))
        ours = TextCollator(tokenizer=tokenizer, task_type="masked_lm").collate_columns(as_columns(rows, "ragged"))
        assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
        padded = DataCollatorWithPadding(tokenizer)(copy.deepcopy(rows))["input_ids"]
        selected = ours["labels"] != -100
        assert torch.equal(ours["labels"][selected], padded[selected])
        assert torch.equal(ours["input_ids"][~selected], padded[~selected])


class TestColumnsEqualRows:
    def rows(self) -> list[dict]:
        return [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 0], "token_type_ids": [0, 0, 1], "id": "a",
                 "score": 0.5, "pair": [1, 2]},
                {"input_ids": [], "attention_mask": [], "token_type_ids": [], "id": "b", "score": 1.5, "pair": [3, 4]},
                {"input_ids": [8], "attention_mask": [1], "token_type_ids": [0], "id": "c", "score": 2.0,
                 "pair": [5, 6]}]

    @pytest.mark.parametrize("form", FORMS)
    @pytest.mark.parametrize("options", [{}, {"padding_side": "left", "pad_to_multiple_of": 4}, {"max_length": 2}])
    def test_causal_lm_with_every_per_token_key_and_extras(self, form, options):
        collate = TextCollator(pad_token_id=0, **options)
        rows = self.rows()
        ours, reference = collate.collate_columns(as_columns(rows, form)), collate(rows)
        assert list(ours) == list(reference)
        assert_same(ours, reference)

    @pytest.mark.parametrize("form", FORMS)
    def test_masked_lm_same_generator_same_batch(self, form):
        rows = [{"input_ids": list(range(10, 10 + n)), "special_tokens_mask": [1] + [0] * (n - 1)}
                for n in (5, 30, 1, 17)]
        collate = TextCollator(pad_token_id=0, task_type="masked_lm", mask_token_id=4, vocab_size=100,
                               mlm_probability=0.5)
        ours = collate.collate_columns(as_columns(rows, form), generator=torch.Generator().manual_seed(3))
        reference = collate(rows, generator=torch.Generator().manual_seed(3))
        assert list(ours) == list(reference) == ["input_ids", "attention_mask", "labels"]
        assert_same(ours, reference)

    @pytest.mark.parametrize("task", ["token_classification", "seq2seq", "classification", "regression"])
    def test_targets_of_every_task(self, task):
        base = [[5, 6, 7], [8], [9, 10]]
        targets = {"token_classification": [[1, 2, 3], [4], [5, 6]], "seq2seq": [[1], [2, 3, 4, 5], []],
                   "classification": [1, 0, 2], "regression": [0.5, 1.5, -2.0]}[task]
        rows = [{"input_ids": ids, "labels": target} for ids, target in zip(base, targets)]
        if task == "seq2seq":
            for row, dec in zip(rows, [[0, 1], [0], [0, 2, 3]]):
                row.update(decoder_input_ids=dec, decoder_attention_mask=[1] * len(dec))
        collate = TextCollator(pad_token_id=0, task_type=task, pad_to_multiple_of=2)
        for form in FORMS:
            assert_same(collate.collate_columns(as_columns(rows, form)), collate(rows))

    def test_raw_text_column_is_tokenized(self, tokenizer):
        rows = [{"text": text, "n": index} for index, text in enumerate(TEXTS)]
        collate = TextCollator(tokenizer=tokenizer)
        assert_same(collate.collate_columns({"text": pa.array(TEXTS), "n": np.arange(5)}), collate(rows))

    def test_bool_masks_and_numpy_columns(self):
        rows = [{"input_ids": [1, 2], "attention_mask": [True, False]}, {"input_ids": [3], "attention_mask": [True]}]
        columns = {"input_ids": pa.array([[1, 2], [3]]), "attention_mask": pa.array([[True, False], [True]])}
        collate = TextCollator(pad_token_id=0)
        assert_same(collate.collate_columns(columns), collate(rows))

    def test_unusual_columns_take_the_row_path_and_its_errors(self):
        collate = TextCollator(pad_token_id=0)
        with pytest.raises(TypeError, match=r"row 1: 'input_ids' should be .* but got NoneType None"):
            collate.collate_columns({"input_ids": pa.array([[1], None])})
        with pytest.raises(TypeError, match=r"row 0: 'input_ids' should be .* item 0 is float"):
            collate.collate_columns({"input_ids": pa.array([[1.5], [2.0]])})
        with pytest.raises(TypeError, match=r"row 0: 'input_ids' should be .* item 0 is bool"):
            collate.collate_columns({"input_ids": pa.array([[True], [False]])})
        with pytest.raises(ValueError, match=r"row 1: 'attention_mask' has 2 entries but 'input_ids' has 1"):
            collate.collate_columns({"input_ids": pa.array([[1], [2]]), "attention_mask": pa.array([[1], [1, 1]])})

    def test_bad_column_containers(self):
        collate = TextCollator(pad_token_id=0)
        with pytest.raises(ValueError, match=r"column 'labels' has 1 rows but column 'input_ids' has 2"):
            collate.collate_columns({"input_ids": [[1], [2]], "labels": [1]})
        with pytest.raises(ValueError, match=r"rows should hold at least one row"):
            collate.collate_columns({"input_ids": []})
        with pytest.raises(TypeError, match=r"column 'input_ids' should be a list of per-row values"):
            collate.collate_columns({"input_ids": 3})
        with pytest.raises(TypeError, match=r"columns should be a mapping"):
            collate.collate_columns([[1, 2]])

    def test_column_inputs_are_not_modified_or_aliased(self):
        values = np.array([5, 6, 7, 8])
        batch = TextCollator(pad_token_id=0).collate_columns({"input_ids": RaggedColumn(values, np.array([0, 3, 4]))})
        for tensor in batch.values():
            tensor.add_(100)
        assert values.tolist() == [5, 6, 7, 8]

    def test_objects_with_to_columns_are_collated_from_columns(self):
        class Batch(list):
            def to_columns(self):
                return {"input_ids": RaggedColumn(np.array([1, 2, 3]), np.array([0, 1, 3]))}

        batch = TextCollator(pad_token_id=0)(Batch([{"input_ids": "ignored"}]))
        assert batch["input_ids"].tolist() == [[1, 0], [2, 3]]


class TestOneBuffer:
    def test_per_token_outputs_are_views_of_one_buffer_and_independent(self):
        batch = TextCollator(pad_token_id=0)([[1, 2, 3], [4]])
        pointers = {batch[key].untyped_storage().data_ptr() for key in ("input_ids", "attention_mask", "labels")}
        assert len(pointers) == 1 and all(batch[key].is_contiguous() for key in batch)
        batch["labels"].fill_(7)
        assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
        assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


class TestSmallIntMasks:
    @pytest.mark.parametrize("values", [
        [[1, 1, 0], [1]], [[True, False], [True]], [[np.int64(1), 0], []], [(1, 0), (1,)], [[1, 300], [2]],
        [[1, -1], [0]],
    ])
    def test_bytes_conversion_equals_numpy(self, values):
        flat, lengths = flatten_ids(values, "attention_mask", allow_bool=True)
        expected = np.concatenate([np.array(v, dtype=np.int64).reshape(-1) for v in values])
        assert flat.dtype == torch.long and flat.tolist() == expected.tolist()
        assert lengths.tolist() == [len(v) for v in values]

    def test_floats_still_raise(self):
        with pytest.raises(TypeError, match=r"row 0: 'attention_mask' should be .* item 0 is float"):
            flatten_ids([[1.0, 1], [1]], "attention_mask", allow_bool=True)


class TestSpecialMaskAndMasking:
    @pytest.mark.parametrize("ids", [[], [0], [0, 1, 2, 3], [0, 100, 101, 102, 103], [1, 3, 5, 7, 9, 11],
                                     [-5, 2, 2, 3], [7]])
    def test_special_mask_equals_isin(self, ids):
        values = torch.randint(-6, 120, (9, 31), generator=torch.Generator().manual_seed(0))
        expected = torch.isin(values, torch.tensor(ids, dtype=torch.long)) if ids else torch.zeros_like(
            values, dtype=torch.bool)
        assert torch.equal(build_special_tokens_mask(values, ids), expected)

    @pytest.mark.parametrize("seed", range(6))
    def test_masking_draws_and_result_unchanged(self, seed):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 50, (7, 23), generator=gen)
        padding = torch.rand(7, 23, generator=gen) < 0.3
        options = dict(mask_token_id=4, vocab_size=50, special_ids=[0, 1, 2], padding_mask=padding,
                       mlm_probability=[0.15, 0.6, 1.0][seed % 3], mask_replace_prob=[0.8, 0.5, 0.0][seed % 3],
                       random_replace_prob=[0.1, 0.5, 0.3][seed % 3])
        ours = mask_tokens(ids, generator=torch.Generator().manual_seed(seed), **options)
        assert all(torch.equal(a, b) for a, b in zip(ours, reference_mask_tokens(ids, seed, **options)))


def reference_mask_tokens(ids, seed, *, mask_token_id, vocab_size, special_ids, padding_mask, mlm_probability,
                          mask_replace_prob, random_replace_prob):
    """The straightforward implementation (isin, fresh temporaries) that the in-place one must match exactly."""
    generator = torch.Generator().manual_seed(seed)
    protected = torch.isin(ids, torch.tensor(special_ids)) | padding_mask
    selected = (torch.rand(ids.shape, generator=generator) < mlm_probability) & ~protected
    labels = ids.masked_fill(~selected, -100)
    how = torch.rand(ids.shape, generator=generator)
    to_mask = selected & (how < mask_replace_prob)
    to_random = selected & (how >= mask_replace_prob) & (how < mask_replace_prob + random_replace_prob)
    masked = ids.masked_fill(to_mask, mask_token_id)
    count = int(to_random.sum())
    if count:
        masked[to_random] = torch.randint(vocab_size, (count,), generator=generator)
    return masked, labels


class TestPaddingLayoutFill:
    @pytest.mark.parametrize("side", ["right", "left"])
    def test_numpy_torch_and_out_agree(self, side):
        layout = PaddingLayout(torch.tensor([3, 0, 5]), length=4, padding_side=side)
        flat = np.arange(1, 9, dtype=np.int32)
        expected = layout.fill(torch.from_numpy(flat).long(), -1)
        assert torch.equal(layout.fill(flat, -1, torch.long), expected)
        out = torch.empty(3, 4, dtype=torch.long)
        assert layout.fill(flat, -1, out=out) is out and torch.equal(out, expected)
        read_only = flat.copy()
        read_only.setflags(write=False)
        assert torch.equal(layout.fill(read_only, -1, torch.long), expected)
        floats = layout.fill(torch.arange(8, dtype=torch.float16), 0.5)
        assert floats.dtype == torch.float16 and floats[~layout.mask].eq(0.5).all()
