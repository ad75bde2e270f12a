"""Column-wise fetch from Hugging Face datasets: the same rows and batches as the row path, whatever the layout.

HFSource, handing columns, answers ``__getitems__`` with a ColumnBatch. Its columns must equal
``dataset[positions]`` for every table layout (one or many record batches, ``select`` views, shuffled or in
order), collators that read rows must see the same row dicts as before, and an epoch through UniversalDataModule
must give the batches the row path gives.
"""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from collators import DefaultCollator, TextCollator
from collators.columns import ColumnBatch, RaggedColumn, RowBatch, SpanColumn
from engine.datamodule.universal import UniversalDataModule
from engine.sampling.base import BatchIndices
from engine.sources.wrappers import HFSource
from task_spec import TaskSpec


def make_dataset(rows: int = 300, chunk: int | None = 64, seed: int = 0, min_length: int = 0) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, 12, rows)
    data = {
        "input_ids": [rng.integers(5, 500, n).tolist() for n in lengths],
        "attention_mask": [[1] * int(n) for n in lengths],
        "flags": [[bool(x) for x in rng.integers(0, 2, n)] for n in lengths],
        "label": rng.integers(0, 3, rows).tolist(),
        "score": rng.random(rows).tolist(),
        "name": [f"row{i}" for i in range(rows)],
        "nested": [[[i], [i, i]] for i in range(rows)],
    }
    dataset = datasets.Dataset.from_dict(data)
    if chunk is not None:  # a batched map writes one Arrow record batch per ``chunk`` rows, like tokenization
        dataset = dataset.map(lambda batch: batch, batched=True, batch_size=chunk)
    return dataset


def as_rows(columns: dict) -> list[dict]:
    values = {key: value.rows() if isinstance(value, (RaggedColumn, SpanColumn)) else value
              for key, value in columns.items()}
    return [dict(zip(values, row)) for row in zip(*values.values())]


@pytest.fixture(scope="module")
def chunked():
    datasets.disable_progress_bars()
    return make_dataset()


class TestFetchColumns:
    @pytest.mark.parametrize("chunk", [None, 64, 7])
    @pytest.mark.parametrize("order", ["shuffled", "sequential", "across_boundary", "single", "repeated"])
    def test_equals_datasets_rows(self, chunk, order):
        dataset = make_dataset(chunk=chunk)
        positions = {"shuffled": np.random.default_rng(1).permutation(300)[:64].tolist(),
                     "sequential": list(range(100, 164)), "across_boundary": list(range(60, 70)), "single": [299],
                     "repeated": [5, 5, 0, 5]}[order]
        source = HFSource(dataset)
        columns = source.fetch_columns(positions)
        assert list(columns) == dataset.column_names
        assert isinstance(columns["input_ids"], SpanColumn) and isinstance(columns["flags"], SpanColumn)
        assert isinstance(columns["nested"], list) and isinstance(columns["name"], list)
        assert as_rows(columns) == HFSource(dataset).__getitems__(positions)

    @pytest.mark.parametrize("layout", ["memory_mapped", "memory_mapped_slice", "in_memory_map", "concatenated",
                                        "concatenated_past_the_copy_limit"])
    def test_spans_read_every_table_layout_exactly(self, tmp_path, monkeypatch, layout):
        # A batch of a column in several chunks finds its rows' chunks and spans; nothing is kept per row.
        import engine.sources._arrow_buffers as arrow_buffers

        dataset = make_dataset(chunk=None).remove_columns(["nested"])
        if layout.startswith("memory_mapped"):
            dataset.save_to_disk(str(tmp_path / "saved"))
            dataset = datasets.load_from_disk(str(tmp_path / "saved")).map(
                lambda batch: batch, batched=True, batch_size=23, cache_file_name=str(tmp_path / "mapped.arrow"))
            assert isinstance(dataset.data, datasets.table.MemoryMappedTable)
            if layout == "memory_mapped_slice":
                dataset = dataset.select(range(31, 250))  # contiguous: a slice of the table, chunks cut mid-way
        elif layout == "in_memory_map":
            dataset = dataset.map(lambda batch: batch, batched=True, batch_size=23)
        else:  # chunks in separate allocations
            datasets.disable_progress_bars()
            pieces = [dataset.select(range(start, min(start + 23, 300))) for start in range(0, 300, 23)]
            dataset = datasets.concatenate_datasets([piece.flatten_indices() for piece in pieces])
        assert dataset.data.table.column("input_ids").num_chunks > 5
        if layout == "concatenated_past_the_copy_limit":
            monkeypatch.setattr(arrow_buffers, "COMBINE_LIMIT", 0)
        source = HFSource(dataset)
        positions = np.random.default_rng(4).permutation(len(dataset))[:64].tolist() + [0, len(dataset) - 1]
        columns = source.fetch_columns(positions)
        assert as_rows(columns) == source.__getitems__(positions)
        expected_kind = RaggedColumn if layout == "concatenated_past_the_copy_limit" else SpanColumn
        assert isinstance(columns["input_ids"], expected_kind) and isinstance(columns["flags"], expected_kind)
        index = source._fetcher.ragged["input_ids"]
        per_row = [name for name, value in vars(index).items() if isinstance(value, np.ndarray)
                   and len(value) >= len(dataset) and name not in ("values", "offsets")]
        assert per_row == []  # the fetcher's own arrays are per chunk, not per row (values and offsets are views)
        if layout.startswith("memory_mapped"):  # one view of the file's mapping: the values were not copied
            assert not index.values.flags.owndata and index.values.base is not None
        elif layout == "concatenated":  # chunks held apart are copied once into one buffer
            assert index.values.flags.owndata

    @pytest.mark.parametrize("layout", ["one_chunk", "chunks", "memory_mapped", "past_the_scan_limit"])
    def test_a_one_byte_column_of_one_value_is_handed_over_without_its_values(self, tmp_path, monkeypatch, layout):
        # A tokenizer's int8 attention mask is all ones: its spans come as spans of a zero-stride array of 1 (the
        # collator never reads the column). A one-byte column with two values, or one past the scan limit, keeps
        # its buffer. Rows and collated batches equal the row path's either way.
        import engine.sources._arrow_buffers as arrow_buffers

        rng = np.random.default_rng(3)
        lengths = rng.integers(0, 12, 300).tolist()
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                      "attention_mask": datasets.Sequence(datasets.Value("int8")),
                                      "token_type_ids": datasets.Sequence(datasets.Value("int8"))})
        dataset = datasets.Dataset.from_dict({
            "input_ids": [rng.integers(5, 500, n).tolist() for n in lengths],
            "attention_mask": [[1] * n for n in lengths],
            "token_type_ids": [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]}, features=features)
        if layout != "one_chunk":
            dataset = dataset.map(lambda batch: batch, batched=True, batch_size=37, features=features)
        if layout == "memory_mapped":
            dataset.save_to_disk(str(tmp_path / "saved"))
            dataset = datasets.load_from_disk(str(tmp_path / "saved"))
            assert isinstance(dataset.data, datasets.table.MemoryMappedTable)
        if layout == "past_the_scan_limit":
            monkeypatch.setattr(arrow_buffers, "UNIFORM_SCAN_LIMIT", 0)
        source = HFSource(dataset)
        positions = np.random.default_rng(4).permutation(300)[:64].tolist() + [0, 299]
        columns = source.fetch_columns(positions)
        assert as_rows(columns) == source.__getitems__(positions)
        assert (columns["attention_mask"].values.strides == (0,)) == (layout != "past_the_scan_limit")
        assert columns["token_type_ids"].values.strides == (1,)
        collate = TextCollator(pad_token_id=0, max_length=8, vocab_size=500)
        batch = collate.collate_columns(columns)
        reference = collate(source.__getitems__(positions))
        assert batch.keys() == reference.keys()
        assert all(torch.equal(batch[key], reference[key]) for key in reference)

    def test_select_views_and_negative_indices(self, chunked):
        view = HFSource(chunked).view(np.random.default_rng(2).permutation(300)[:120]).view(np.arange(119, -1, -2))
        positions = [0, 59, 1, 30]
        assert as_rows(view.fetch_columns(positions)) == view.__getitems__(positions)
        assert as_rows(view.fetch_columns([-1, -60])) == view.__getitems__([59, 0])  # datasets' own path refuses these
        with pytest.raises(IndexError, match="out of bounds for size 60"):
            view.fetch_columns([60])

    def test_a_select_view_is_mapped_in_one_numpy_take(self, chunked, monkeypatch):
        # datasets maps each index through the indices table one row at a time; the fetcher must not.
        import datasets.formatting.formatting as formatting

        def per_row(*args, **kwargs):
            raise AssertionError("per-row indices mapping used")

        monkeypatch.setattr(formatting, "_query_table_with_indices_mapping", per_row)
        view = HFSource(chunked).view(np.arange(299, -1, -1))
        columns = view.fetch_columns([0, 1, 150])
        assert columns["label"] == [chunked[299]["label"], chunked[298]["label"], chunked[149]["label"]]

    def test_nulls_fall_back_to_formatted_values(self):
        dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2], None, [3]], "x": [1, None, 3]})
        columns = HFSource(dataset).fetch_columns([0, 1, 2])
        assert columns == {"input_ids": [[1, 2], None, [3]], "x": [1, None, 3]}


class TestColumnBatch:
    def test_is_a_sequence_of_the_row_dicts_with_the_seed(self, chunked):
        indices = BatchIndices([3, 1, 4])
        indices.rng_seed = 99
        batch = HFSource(chunked).handing_columns().__getitems__(indices)
        assert isinstance(batch, ColumnBatch) and batch.rng_seed == 99 and len(batch) == 3
        expected = [chunked[i] for i in (3, 1, 4)]
        assert batch == expected and list(batch) == expected and batch[1] == expected[1] and batch[-1] == expected[2]
        restored = pickle.loads(pickle.dumps(batch))
        assert isinstance(restored, ColumnBatch) and restored == expected and restored.rng_seed == 99
        assert all(isinstance(column, list) for column in restored.columns.values())  # the buffers stay behind
        assert "ColumnBatch(rows=3" in repr(batch)

    def test_formatted_datasets_keep_the_row_path(self, chunked):
        for dataset in (chunked.with_format("torch"), chunked.select_columns(["label"]).with_format("numpy"),
                        chunked.with_format(None, columns=["label"])):
            batch = HFSource(dataset).handing_columns().__getitems__([0, 1])
            assert isinstance(batch, RowBatch) and [list(row) for row in batch] == [list(dataset[0])] * 2
            assert all(str(batch[i][key]) == str(dataset[i][key]) for i in (0, 1) for key in batch[0])

    def test_source_pickles_without_its_fetcher(self, chunked):
        source = HFSource(chunked)
        source.fetch_columns([0])
        clone = pickle.loads(pickle.dumps(source))
        assert clone._fetcher is None and as_rows(clone.fetch_columns([2])) == [chunked[2]]

    def test_default_collator_sees_the_rows(self, chunked):
        batch = HFSource(chunked.select_columns(["label", "score", "name"])).handing_columns().__getitems__([7, 8])
        rows = RowBatch(batch.rows())
        ours, reference = DefaultCollator()(batch), DefaultCollator()(rows)
        assert torch.equal(ours["label"], reference["label"]) and ours["name"] == reference["name"]

    @pytest.mark.parametrize("options", [{"task_type": "causal_lm"}, {"task_type": "masked_lm", "mask_token_id": 4,
                                         "vocab_size": 500}, {"task_type": "classification", "target_field": "label",
                                                              "padding_side": "left", "max_length": 5}])
    def test_text_collator_reads_columns_with_the_same_result(self, chunked, options):
        collate = TextCollator(pad_token_id=0, **options)
        positions = np.random.default_rng(3).permutation(300)[:32].tolist()
        batch = HFSource(chunked.remove_columns(["nested"])).handing_columns().__getitems__(positions)
        ours = collate(batch, generator=torch.Generator().manual_seed(0))
        reference = collate(RowBatch(batch.rows()), generator=torch.Generator().manual_seed(0))
        assert list(ours) == list(reference)
        for key, value in reference.items():
            assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, key


class RowsDataset(Dataset):
    """The same rows as a plain torch Dataset: the row path, for comparison."""

    def __init__(self, dataset: datasets.Dataset) -> None:
        self.rows = [dataset[i] for i in range(len(dataset))]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


def epoch(data, **kwargs) -> list[dict]:
    spec = TaskSpec(name="lm", task_type="causal_lm", modality="text", special_tokens={"pad_token_id": 0})
    module = UniversalDataModule(data, task_spec=spec, batch_size=16, seed=5, val_split=0.2, **kwargs)
    return list(module.train_dataloader()) + list(module.val_dataloader())


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_through_the_data_module_equals_the_row_path(workers):
    # rows of at least one token: the module refuses empty token rows at setup
    data = make_dataset(min_length=1).select_columns(["input_ids", "attention_mask", "label", "name"])
    ours, reference = epoch(data, num_workers=workers), epoch(RowsDataset(data))
    assert len(ours) == len(reference) > 15
    for got, expected in zip(ours, reference):
        assert list(got) == list(expected)
        for key, value in expected.items():
            assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value, key


def test_loaders_that_hand_columns_share_one_fetcher_per_process(chunked):
    source = HFSource(chunked)
    first, second = source.handing_columns(), source.handing_columns()
    first.__getitems__([0, 1])
    assert second._fetcher is first._fetcher is source._fetcher is not None  # built once, not per loader
