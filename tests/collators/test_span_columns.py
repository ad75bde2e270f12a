"""SpanColumn: rows that are spans of one larger buffer, padded straight from it.

The engine hands the text collator token rows as spans of the source's buffer (a flat token buffer, an Arrow
column), so a batch is written with one gather and tokens cut by truncation are never read. These tests pin that
path to the row path: the same batches for every padding option and task, the same errors for bad values where
they reach the model, and refusals of spans that do not fit their buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collators.text import SpanColumn, TextCollator

JUNK = 10**6


def spans_of(rows: list[list[int]], dtype=np.int64, junk: int = JUNK) -> SpanColumn:
    """The rows in reverse order in one buffer, ``junk`` around each (reads outside a row would show)."""
    buffer, starts = [junk], [0] * len(rows)
    for index in reversed(range(len(rows))):
        starts[index] = len(buffer)
        buffer += rows[index] + [junk]
    return SpanColumn(np.array(buffer, dtype=dtype), np.array(starts), np.array([len(row) for row in rows]))


ROWS = [[5, 6, 7, 8, 9, 10], [11], [], [12, 13, 14]]


def assert_batches_equal(ours: dict, reference: dict) -> None:
    assert list(ours) == list(reference)
    for key, value in reference.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), (key, ours[key], value)


OPTIONS = [{}, {"max_length": 4}, {"max_length": 1}, {"pad_to_multiple_of": 8, "max_length": 4},
           {"padding": "max_length", "max_length": 8}, {"padding": "max_length", "max_length": 2},
           {"pad_to_buckets": (3, 8)}, {"pad_to_buckets": (2, 4), "max_length": 4},
           {"task_type": "masked_lm", "mask_token_id": 1, "mlm_probability": 0.5},
           {"task_type": "masked_lm", "mask_token_id": 1, "mlm_probability": 0.5, "max_length": 3}]


@pytest.mark.parametrize("with_mask", [True, False], ids=["mask given", "mask derived"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("options", OPTIONS)
def test_spans_give_the_row_paths_batch(side, options, with_mask):
    """Without a mask column, the ids' compiled pass also writes the mask and the causal-LM labels."""
    collate = TextCollator(pad_token_id=0, padding_side=side, vocab_size=40, **options)
    rows = [{"input_ids": row, "attention_mask": [1] * len(row)} if with_mask else {"input_ids": row} for row in ROWS]
    columns = {"input_ids": spans_of(ROWS)}
    if with_mask:
        columns["attention_mask"] = spans_of([[1] * len(row) for row in ROWS])
    ours = collate.collate_columns(columns, generator=torch.Generator().manual_seed(3))
    reference = collate(rows, generator=torch.Generator().manual_seed(3))
    assert_batches_equal(ours, reference)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64, np.uint64])
def test_any_integer_buffer_gives_int64_batches(dtype):
    collate = TextCollator(pad_token_id=0, vocab_size=100)
    ours = collate.collate_columns({"input_ids": spans_of(ROWS, dtype=dtype, junk=99)})
    assert_batches_equal(ours, collate([{"input_ids": row} for row in ROWS]))


def test_given_labels_and_masks_with_zeros_are_padded_from_their_spans():
    labels = [[-100, 6, 7, 8, 9, 10], [11], [], [-100, -100, 14]]
    masks = [[1, 1, 1, 1, 0, 0], [1], [], [0, 1, 1]]
    collate = TextCollator(pad_token_id=0, vocab_size=40, max_length=5, padding_side="left")
    columns = {"input_ids": spans_of(ROWS), "attention_mask": spans_of(masks, dtype=np.bool_, junk=1),
               "labels": spans_of(labels, junk=-7)}
    rows = [{"input_ids": r, "attention_mask": m, "labels": lab} for r, m, lab in zip(ROWS, masks, labels)]
    assert_batches_equal(collate.collate_columns(columns), collate(rows))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("fill", [1, True, 0, 7])
def test_a_mask_of_one_repeated_value_gives_the_row_paths_batch(fill, side):
    """A uniform Arrow mask comes as spans of one repeated value; ones are written by the ids' pass."""
    repeated = np.broadcast_to(np.array([fill]), (100,))
    lengths = np.array([len(row) for row in ROWS])
    columns = {"input_ids": spans_of(ROWS), "attention_mask": SpanColumn(repeated, np.zeros(4, np.int64), lengths)}
    rows = [{"input_ids": row, "attention_mask": [fill] * len(row)} for row in ROWS]
    collate = TextCollator(pad_token_id=0, vocab_size=40, max_length=5, padding_side=side)
    assert_batches_equal(collate.collate_columns(columns), collate(rows))
    columns["attention_mask"] = SpanColumn(repeated, np.zeros(4, np.int64), lengths + np.array([0, 1, 0, 0]))
    with pytest.raises(ValueError, match=r"row 1: 'attention_mask' has 2 entries but 'input_ids' has 1"):
        collate.collate_columns(columns)


def test_the_buffer_is_only_read():
    column = spans_of(ROWS)
    before = column.values.copy()
    column.values.setflags(write=False)  # a read-only Arrow buffer
    batch = TextCollator(pad_token_id=0).collate_columns({"input_ids": column})
    assert np.array_equal(column.values, before) and not np.shares_memory(batch["input_ids"].numpy(), column.values)


class TestValueChecks:
    @pytest.mark.parametrize("side", ["right", "left"])
    def test_a_bad_id_names_its_row_and_position_in_the_row(self, side):
        rows = [[5, 6], [7, 8, 99, 9]]
        collate = TextCollator(pad_token_id=0, vocab_size=50, padding_side=side)
        for columns in ({"input_ids": spans_of(rows)}, None):
            with pytest.raises(ValueError, match=r"row 1, position 2: 'input_ids' should hold values in \[0, 50\) "
                                                 r".* but got input_ids=99"):
                collate.collate_columns(columns) if columns else collate([{"input_ids": row} for row in rows])

    def test_ids_cut_by_truncation_never_reach_the_model_and_are_not_checked(self):
        rows = [[5, 6, 99], [7]]  # 99 is past the vocabulary, but max_length=2 cuts it on both paths
        collate = TextCollator(pad_token_id=0, vocab_size=50, max_length=2)
        expected = torch.tensor([[5, 6], [7, 0]])
        assert torch.equal(collate.collate_columns({"input_ids": spans_of(rows)})["input_ids"], expected)
        assert torch.equal(collate([{"input_ids": row} for row in rows])["input_ids"], expected)

    def test_a_pad_id_outside_the_vocabulary_does_not_hide_or_raise(self):
        collate = TextCollator(pad_token_id=60, vocab_size=50)  # a pad id no real token may use
        batch = collate.collate_columns({"input_ids": spans_of([[1, 2, 3], [4]])})
        assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 60, 60]]
        with pytest.raises(ValueError, match=r"row 1, position 0: 'input_ids' .* but got input_ids=-3"):
            collate.collate_columns({"input_ids": spans_of([[1, 2, 3], [-3]])})

    def test_labels_out_of_range_are_named(self):
        collate = TextCollator(pad_token_id=0, vocab_size=50)
        columns = {"input_ids": spans_of([[1, 2], [3, 4]]), "labels": spans_of([[1, -100], [3, 77]])}
        with pytest.raises(ValueError, match=r"row 1, position 1: 'labels' should hold values in \[0, 50\) or -100"):
            collate.collate_columns(columns)


class TestRefused:
    def test_spans_past_the_buffer(self):
        column = SpanColumn(np.arange(10), np.array([0, 8]), np.array([3, 4]))
        with pytest.raises(ValueError, match=r"column 'input_ids': SpanColumn spans should lie inside values "
                                             r"\(length 10\), but got starts=\[0, 8\], lengths=\[3, 4\]"):
            TextCollator(pad_token_id=0).collate_columns({"input_ids": column})

    def test_negative_lengths_and_mismatched_shapes(self):
        with pytest.raises(ValueError, match="SpanColumn spans should lie inside values"):
            TextCollator(pad_token_id=0).collate_columns(
                {"input_ids": SpanColumn(np.arange(10), np.array([0, 5]), np.array([3, -1]))})
        with pytest.raises(TypeError, match="a SpanColumn needs 1-D values, starts and lengths of one size"):
            TextCollator(pad_token_id=0).collate_columns(
                {"input_ids": SpanColumn(np.arange(10), np.array([0, 5]), np.array([3]))})

    def test_a_mask_of_other_lengths_is_named(self):
        columns = {"input_ids": spans_of([[1, 2], [3]]), "attention_mask": spans_of([[1, 1], [1, 1]])}
        reference = [{"input_ids": [1, 2], "attention_mask": [1, 1]}, {"input_ids": [3], "attention_mask": [1, 1]}]
        with pytest.raises(ValueError) as ours:
            TextCollator(pad_token_id=0).collate_columns(columns)
        with pytest.raises(ValueError) as rows:
            TextCollator(pad_token_id=0)(reference)
        assert str(ours.value) == str(rows.value) and "attention_mask" in str(ours.value)

    def test_float_spans_take_the_row_paths_error(self):
        column = SpanColumn(np.array([1.5, 2.0]), np.array([0]), np.array([2]))
        with pytest.raises((TypeError, ValueError)) as ours:
            TextCollator(pad_token_id=0).collate_columns({"input_ids": column})
        with pytest.raises((TypeError, ValueError)) as rows:
            TextCollator(pad_token_id=0)([{"input_ids": [1.5, 2.0]}])
        assert str(ours.value) == str(rows.value)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("width", [None, 7, 40])
def test_rows_at_the_edges_of_the_buffer_and_strided_buffers(side, width):
    # Rows starting at 0 and ending at the buffer's end: their padded windows reach past the buffer, and are
    # copied row by row; a strided (non-contiguous) buffer is gathered by index. Both equal the row path.
    values = np.arange(100, 130)
    rows = [values[0:5].tolist(), values[10:12].tolist(), values[24:30].tolist(), values[5:5].tolist()]
    columns = [SpanColumn(values, np.array([0, 10, 24, 5]), np.array([5, 2, 6, 0])),
               SpanColumn(np.repeat(values, 2)[::2], np.array([0, 10, 24, 5]), np.array([5, 2, 6, 0]))]
    options = {"padding": "max_length", "max_length": width} if width else {}
    collate = TextCollator(pad_token_id=0, padding_side=side, **options)
    reference = collate([{"input_ids": row} for row in rows])
    for column in columns:
        assert_batches_equal(collate.collate_columns({"input_ids": column}), reference)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("value, dtype", [(1, np.int8), (0, np.int8), (True, np.bool_), (7, np.int64)])
def test_a_zero_stride_buffer_is_one_value_repeated(side, value, dtype):
    # What the engine hands over for an Arrow column of ones (a tokenizer's attention mask): spans of a zero-stride
    # array. The batch is written from the padding layout without reading it, and equals the row path's, with the
    # mask's padding and the labels' own pad value.
    lengths = [len(row) for row in ROWS]
    repeated = np.broadcast_to(np.array(value, dtype=dtype), (max(lengths),))
    assert repeated.strides == (0,)
    uniform = SpanColumn(repeated, np.zeros(len(ROWS), dtype=np.int64), np.array(lengths))
    collate = TextCollator(pad_token_id=0, padding_side=side, vocab_size=40, max_length=4,
                           task_type="token_classification", label_pad_token_id=-100)
    columns = {"input_ids": spans_of(ROWS), "attention_mask": uniform, "labels": uniform}
    rows = [{"input_ids": row, "attention_mask": [int(value)] * len(row), "labels": [int(value)] * len(row)}
            for row in ROWS]
    assert_batches_equal(collate.collate_columns(columns), collate(rows))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("width", [0, 1, 5, 1023, 1024, 1025, 1500])
def test_layout_masks_mark_the_kept_positions_at_every_width(side, width):
    # Masks up to 1024 wide are rows of a precomputed table, wider ones are computed: both mark exactly the kept
    # positions, at the row's start (right padding) or end (left padding).
    from collators._padding import PaddingLayout

    given = np.array([0, 1, width, width + 3, max(width - 2, 0), 700])
    layout = PaddingLayout(given, length=width, padding_side=side)
    kept = np.minimum(given, width)
    positions = np.arange(width)
    expected = positions < kept[:, None] if side == "right" else positions >= (width - kept)[:, None]
    assert layout.mask.shape == (len(given), width) and np.array_equal(layout.mask.numpy(), expected)
    assert np.array_equal(layout.padding, ~expected)
