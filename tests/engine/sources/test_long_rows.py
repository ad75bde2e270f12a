"""Long rows: 'truncate', 'split' (windows equal to transformers' overflow windows) and 'drop', applied per split
after the split is cut, counted, logged once and shown in repr(dm)."""

import datasets
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.sample_data import build_tokenizer
from engine import UniversalDataModule
from engine.sources.long_rows import LongRows, TokenWindows, apply_long_rows, special_frame, windows
from engine.sources.wrappers import HFSource, TensorListSource
from task_spec import REMOVE, TaskSpec

SPEC = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 16})
TEXTS = [" ".join(f"word{i}x{j}" for j in range(i % 9 + 1)) for i in range(40)]  # 1..9 words, some long


def documents(count=40):
    return [torch.arange(1000 * i, 1000 * i + 3 + (7 * i) % 41) for i in range(count)]  # 3..43 tokens


def rows_of(source):
    return [row if isinstance(row, list) else row.tolist() for row in (source[i] for i in range(len(source)))]


class TestWindows:
    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(0, 60), min_size=1, max_size=20), st.integers(1, 20), st.data())
    def test_windows_cover_every_token_overlap_by_stride_and_fit(self, lengths, max_length, data):
        stride = data.draw(st.integers(0, max_length - 1))
        rows, starts, ends = windows(np.array(lengths), LongRows("split", max_length, stride))
        for row, length in enumerate(lengths):
            mine = [(s, e) for r, s, e in zip(rows, starts, ends) if r == row]
            assert mine[0][0] == 0 and mine[-1][1] == length  # the start and the end of the document
            assert all(e - s <= max_length for s, e in mine)
            covered = set().union(*(range(s, e) for s, e in mine))
            assert covered == set(range(length))  # every token appears in some window
            for (s0, e0), (s1, _) in zip(mine, mine[1:]):
                assert e0 - s1 == stride and e0 - s0 == max_length  # full windows, overlapping by stride
        assert list(rows) == sorted(rows)  # a document's windows are consecutive, documents in order

    @pytest.mark.parametrize(("max_length", "stride"), [(8, 0), (8, 2), (5, 0), (12, 3), (16, 7)])
    def test_split_equals_transformers_overflowing_windows_on_the_same_text(self, max_length, stride):
        tokenizer = build_tokenizer()
        reference = tokenizer(TEXTS, truncation=True, max_length=max_length, stride=stride,
                              return_overflowing_tokens=True)
        whole = tokenizer(TEXTS)
        data = datasets.Dataset.from_dict({**whole, "doc": list(range(len(TEXTS)))})
        out, report = apply_long_rows(HFSource(data), "input_ids", LongRows("split", max_length, stride),
                                      special_frame(tokenizer), materialize=True)
        assert out.dataset["input_ids"] == reference["input_ids"]
        assert out.dataset["attention_mask"] == reference["attention_mask"]
        assert out.dataset["doc"] == reference["overflow_to_sample_mapping"]  # per-row columns copied
        long = sum(len(ids) > max_length for ids in whole["input_ids"])
        assert (report["long_rows"], report["out_rows"], report["cut_tokens"]) == (long, len(reference["input_ids"]), 0)

    def test_truncating_raw_text_equals_the_tokenizers_truncation_and_is_counted(self):
        tokenizer = build_tokenizer()
        whole = tokenizer(TEXTS)["input_ids"]
        data = datasets.Dataset.from_dict({"input_ids": whole})
        out, report = apply_long_rows(HFSource(data), "input_ids", LongRows("truncate", 8), special_frame(tokenizer),
                                      materialize=True)
        assert out.dataset["input_ids"] == tokenizer(TEXTS, truncation=True, max_length=8)["input_ids"]
        assert all(ids[-1] == tokenizer.eos_token_id for ids in out.dataset["input_ids"])  # EOS kept
        assert report["cut_tokens"] == sum(max(len(ids) - 8, 0) for ids in whole)


class TestTokenData:
    def test_split_of_a_tensor_list_is_new_offsets_into_the_same_buffer(self):
        source = TensorListSource(documents())
        out, report = apply_long_rows(source, None, LongRows("split", 10, 3))
        assert isinstance(out, TokenWindows) and out.buffer.data_ptr() == source.buffer.data_ptr()
        expected = [doc[s:s + 10].tolist() for doc in documents() for s in range(0, max(len(doc) - 3, 1), 7)]
        assert rows_of(out) == expected
        picked = np.array([5, 0, len(expected) - 1, 7])  # the columns the collator reads equal the rows
        column = out.view(np.arange(len(expected))[::-1]).fetch_columns(len(expected) - 1 - picked)["input_ids"]
        assert column.rows() == [expected[i] for i in picked]
        assert np.shares_memory(column.values, source.buffer.numpy())  # spans of the one buffer, nothing copied
        assert report == {"policy": "split", "max_length": 10, "stride": 3, "rows": 40,
                          "long_rows": sum(len(d) > 10 for d in documents()),
                          "tokens": sum(len(d) for d in documents()), "cut_tokens": 0, "out_rows": len(expected)}

    def test_drop_leaves_long_rows_out_as_a_view(self):
        source = TensorListSource(documents())
        out, report = apply_long_rows(source.view(np.arange(20, 40)), None, LongRows("drop", 10))
        kept = [d.tolist() for d in documents()[20:] if len(d) <= 10]
        assert rows_of(out) == kept and out.buffer is source.buffer
        assert report["cut_tokens"] == sum(len(d) for d in documents()[20:] if len(d) > 10)
        assert report["out_rows"] == len(kept) == report["rows"] - report["long_rows"]

    def test_hf_token_columns_labels_split_alike_and_row_columns_copied(self):
        ids = [list(range(100 * i, 100 * i + n)) for i, n in enumerate([3, 12, 25])]
        data = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-x for x in row] for row in ids],
                                           "doc": [0, 1, 2], "tags": [[7, 7]] * 3})
        out, _ = apply_long_rows(HFSource(data), "input_ids", LongRows("split", 10, 2))
        rows = out.dataset.to_list()
        assert [row["doc"] for row in rows] == [0, 1, 1, 2, 2, 2]
        assert all(row["labels"] == [-x for x in row["input_ids"]] for row in rows)
        assert all(row["tags"] == [7, 7] for row in rows)  # a list column of other lengths is per row
        assert rows[2]["input_ids"] == list(range(108, 112))  # the tail window of document 1


    def test_a_seq2seq_target_is_copied_whole_even_when_as_long_as_the_inputs(self):
        ids = [list(range(n)) for n in (4, 12)]
        data = datasets.Dataset.from_dict({"input_ids": ids, "labels": [[9] * len(row) for row in ids]})
        out, _ = apply_long_rows(HFSource(data), "input_ids", LongRows("split", 8), whole=("labels",))
        assert list(out.dataset["labels"]) == [[9] * 4, [9] * 12, [9] * 12]
        assert list(out.dataset["input_ids"]) == [ids[0], ids[1][:8], ids[1][8:]]


class TestModule:
    def test_val_split_keeps_every_documents_windows_in_one_split(self):
        spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 10})
        rows = {"input_ids": [d.tolist() for d in documents()], "doc": list(range(40))}
        dm = UniversalDataModule(datasets.Dataset.from_dict(rows), task_spec=spec, val_split=0.25,
                                 test_split=4, long_rows="split", stride=2, batch_size=4)
        dm.setup()
        docs = {role: set(dm.datasets[role].dataset["doc"]) for role in ("train", "val", "test")}
        assert not docs["train"] & docs["val"] and not docs["train"] & docs["test"] and not docs["val"] & docs["test"]
        assert set().union(*docs.values()) == set(range(40))
        assert len(docs["val"]) == 10 and len(docs["test"]) == 4  # the split counts documents
        assert dm.long_rows_report["val"]["rows"] == 10 and dm.long_rows_report["val"]["out_rows"] > 10

    def test_raw_text_split_counts_logs_once_and_shows_in_repr(self, caplog, tmp_path):
        tokenizer = build_tokenizer()
        with caplog.at_level("WARNING", logger="engine"):
            dm = UniversalDataModule(datasets.Dataset.from_dict({"text": TEXTS}), task_spec=SPEC, tokenizer=tokenizer,
                                     long_rows="split", stride=4, cache_dir=tmp_path, batch_size=4)
            dm.setup()
            dm.setup("fit")
        reference = tokenizer(TEXTS, truncation=True, max_length=16, stride=4, return_overflowing_tokens=True)
        assert dm.datasets["train"].dataset["input_ids"] == reference["input_ids"]
        report = dm.long_rows_report["train"]
        assert report["out_rows"] == len(reference["input_ids"]) and report["long_rows"] > 0
        messages = [r.message for r in caplog.records if "long_rows='split' cut them" in r.message]
        assert len(messages) == 1 and f"{report['long_rows']} of 40 train rows are longer" in messages[0]
        assert f"long rows: {report['long_rows']} of 40 train rows" in repr(dm)
        batch = next(iter(dm.train_dataloader()))
        assert batch["input_ids"].shape[1] <= 16

    def test_drop_from_the_spec_and_a_new_fingerprint(self):
        spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 10},
                                          preprocessing_config={"long_rows": "drop"})
        dm = UniversalDataModule(documents(), task_spec=spec, batch_size=4)
        truncating = UniversalDataModule(documents(), task_spec=spec.replace(preprocessing_config=REMOVE),
                                         batch_size=4)
        assert dm.long_rows == LongRows("drop", 10, 0)
        with pytest.raises(ValueError, match=r"long_rows='truncate' contradicts spec.preprocessing_config"
                                             r"\['long_rows'\]='drop'; set it in one place"):
            UniversalDataModule(documents(), task_spec=spec, long_rows="truncate", batch_size=4)
        dm.setup()
        assert len(dm.datasets["train"]) == sum(len(d) <= 10 for d in documents())
        assert "long_rows='drop' left them out" in repr(dm)
        assert dm.identity()["data_fingerprint"] != truncating.identity()["data_fingerprint"]

    def test_split_rows_reach_workers_in_the_same_batches(self):
        spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 10})
        batches = []
        for workers in (0, 2):
            dm = UniversalDataModule(documents(), task_spec=spec, long_rows="split", batch_size=8, seed=3,
                                     num_workers=workers)
            batches.append([b["input_ids"] for b in dm.train_dataloader()])
        assert len(batches[0]) == len(batches[1]) and all(torch.equal(a, b) for a, b in zip(*batches))


class TestArguments:
    @pytest.mark.parametrize(("options", "error", "match"), [
        ({"long_rows": "chop"}, ValueError,
         r"long_rows should be one of 'truncate', 'split', 'drop', but got long_rows='chop'"),
        ({"stride": 2}, ValueError, r"stride=2 is the overlap of the windows of long_rows='split'"),
        ({"long_rows": "split", "stride": -1}, ValueError, r"stride should be a non-negative integer, but got"),
        ({"long_rows": "split", "stride": 16}, ValueError, r"stride should be smaller than max_length=16"),
        ({"long_rows": "split", "task_spec": TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": REMOVE})},
         ValueError, r"but max_length is None"),
        ({"num_proc": 0}, ValueError, r"num_proc should be a positive integer, but got num_proc=0"),
        ({"cache_dir": 3}, TypeError, r"cache_dir should be a folder path"),
    ])
    def test_bad_arguments_are_refused_at_construction(self, options, error, match):
        with pytest.raises(error, match=match):
            UniversalDataModule(documents(), **{"task_spec": SPEC, **options})

    def test_split_needs_columns_not_a_torch_dataset_or_a_stream(self):
        with pytest.raises(TypeError, match=r"long_rows='split' needs token data in columns .* but train_data is a "
                                            r"TorchSource"):
            UniversalDataModule(_DictRows(), task_spec=SPEC, long_rows="split")
        stream = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 4}).to_iterable_dataset()
        with pytest.raises(ValueError, match=r"long_rows='drop' needs every row's length up front"):
            UniversalDataModule(stream, task_spec=SPEC, long_rows="drop")


class _DictRows(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return {"input_ids": torch.arange(3)}


class TestDropEmptiesASplit:
    """long_rows='drop' that leaves a split with no row is refused at setup, naming the count, the limit and the
    fix (not only a log line, and an empty loader later)."""

    def test_dropping_every_train_row_is_refused_with_the_fix(self):
        spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 4})
        dm = UniversalDataModule([torch.arange(2, 12)] * 6, task_spec=spec, long_rows="drop", batch_size=2)
        with pytest.raises(ValueError, match=r"long_rows='drop' should leave rows in the train split, but it dropped "
                                             r"all 6 of its rows: each is longer than max_length=4 tokens; raise "
                                             r"max_length .* or pass long_rows='split' .* or long_rows='truncate'"):
            dm.setup()

    def test_dropping_every_val_row_names_the_val_split(self):
        spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 8})
        dm = UniversalDataModule([torch.arange(2, 6)] * 6, val_data=[torch.arange(2, 20)] * 3, task_spec=spec,
                                 long_rows="drop", batch_size=2)
        with pytest.raises(ValueError, match=r"should leave rows in the val split, but it dropped all 3 of its rows"):
            dm.setup()


class TestErrorsInWindowsNameTheUsersRow:
    """A row cut into windows by long_rows='split' is named by its own index in errors, not by a window's place."""

    SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0},
                                      additional_config={"vocab_size": 64, "max_seq_len": 10})

    @staticmethod
    def rows():
        rows = [torch.arange(5, 9 + i % 5) for i in range(12)]
        rows[7] = torch.full((30,), 7)
        rows[7][25] = 99  # an id past the vocabulary, in row 7's third window
        return rows

    @pytest.mark.parametrize("workers", [0, 2])
    @pytest.mark.parametrize("kind", ["tensors", "arrow"])
    def test_a_bad_id_in_a_window_names_row_7(self, kind, workers):
        rows = self.rows()
        data = rows if kind == "tensors" else datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in rows]})
        dm = UniversalDataModule(data, task_spec=self.SPEC, batch_size=4, long_rows="split", shuffle=False,
                                 num_workers=workers)
        with pytest.raises(ValueError, match=r"collating the batch of rows \[7, 8, 9\] of the train data failed at "
                                             r"row 7 of the train data \(the batch's row 1\)"):
            list(dm.train_dataloader())

    def test_each_window_maps_to_the_row_it_was_cut_from(self):
        dm = UniversalDataModule(self.rows(), task_spec=self.SPEC, batch_size=4, long_rows="split", shuffle=False)
        dm.setup()
        source = dm.datasets["train"]
        assert source.user_indices(list(range(len(source)))) == [0, 1, 2, 3, 4, 5, 6, 7, 7, 7, 8, 9, 10, 11]
