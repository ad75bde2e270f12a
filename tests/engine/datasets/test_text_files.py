from __future__ import annotations

import pickle

import pytest
import torch

from collators import TextCollator
from demo.sample_data import build_tokenizer
from engine import UniversalDataModule
from engine.datasets import LoadingMode, StreamingTextFileDataset, TextFileDataset, sizeof
from engine.datasets import text_files as text_files_module
from task_spec import TaskSpec

MAP_MODES = [LoadingMode.LAZY, LoadingMode.EAGER, LoadingMode.CACHED]
LINES = ["the first line", "", "   ", "zweite Zeile: ünïcödé ✓", "third\twith tab ", "last, no newline"]


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    (root / "nested").mkdir(parents=True)
    (root / "a.txt").write_bytes("\n".join(LINES[:3]).encode() + b"\r\n" + "\n".join(LINES[3:]).encode())
    (root / "nested" / "b.TXT").write_text("b one\nb two\n", encoding="utf-8")
    (root / "skip.md").write_text("not a .txt file\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "h.txt").write_text("hidden\n")
    return root


def texts(ds):
    return [row["text"] for row in ds.__getitems__(range(len(ds)))]


class TestLines:
    def test_blank_lines_are_skipped_by_default(self, corpus):
        assert texts(TextFileDataset(corpus)) == [
            "the first line", "zweite Zeile: ünïcödé ✓", "third\twith tab ", "last, no newline", "b one", "b two"]

    def test_blank_lines_are_kept_when_asked(self, corpus):
        assert texts(TextFileDataset(corpus / "a.txt", skip_blank=False)) == LINES

    def test_crlf_endings_are_left_out(self, tmp_path):
        (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\n\r\nthree\r")
        assert texts(TextFileDataset(tmp_path / "w.txt", skip_blank=False)) == ["one", "two", "", "three\r"]

    def test_lines_split_across_scan_chunks(self, tmp_path, monkeypatch):
        content = b"ab\r\n\ncd  \n \n\r\nefg\nh"
        (tmp_path / "c.txt").write_bytes(content)
        expected = [line.removesuffix("\r") for line in content.decode().split("\n")]
        for size in (1, 2, 3, 5, 64):
            monkeypatch.setattr(text_files_module, "_SCAN_BYTES", size)
            assert texts(TextFileDataset(tmp_path / "c.txt", skip_blank=False)) == expected
            assert texts(TextFileDataset(tmp_path / "c.txt")) == ["ab", "cd  ", "efg", "h"]

    def test_files_in_the_order_given(self, corpus):
        ds = TextFileDataset([corpus / "nested" / "b.TXT", corpus / "skip.md"])
        assert texts(ds) == ["b one", "b two", "not a .txt file"]

    @pytest.mark.parametrize("mode", MAP_MODES[1:])
    def test_every_map_style_mode_gives_the_rows_of_lazy(self, corpus, mode):
        indices = [5, 0, 3, 3, 1]
        lazy = TextFileDataset(corpus).__getitems__(indices)
        other = TextFileDataset(corpus, mode=mode)
        assert other.__getitems__(indices) == lazy and other.__getitems__(indices) == lazy

    def test_cached_rows_are_counted_by_encoded_bytes(self, corpus):
        ds = TextFileDataset(corpus, mode="cached")
        ds[1]
        assert ds.cache.nbytes == len("zweite Zeile: ünïcödé ✓".encode())

    @pytest.mark.parametrize(("encoding", "unit"), [("utf-8", "line"), ("utf-8", "file"), ("UTF8", "line"),
                                                    ("ascii", "line"), ("latin-1", "line")])
    def test_cached_sizes_are_the_encoded_bytes_in_every_encoding(self, tmp_path, encoding, unit):
        """UTF-8 and ASCII documents are sized by their byte spans, the others by sizeof: the same numbers."""
        second = {"utf": "grüße ✓", "lat": "grüße", "asc": "gruesse"}[encoding.lower()[:3]]
        data = "\n".join(["plain", second]).encode(encoding) + b"\r\ncrlf line\n" + b"x" * 40
        (tmp_path / "a.txt").write_bytes(data)
        ds = TextFileDataset(tmp_path / "a.txt", mode="cached", encoding=encoding, unit=unit)
        rows = ds.__getitems__([i for i in [2, 0, 3, 1] if i < len(ds)])
        assert ds.cache.nbytes == sum(sizeof(row) for row in rows) == sum(len(r["text"].encode()) for r in rows)


class TestFiles:
    def test_one_document_per_file(self, corpus):
        ds = TextFileDataset(corpus, unit="file")
        assert texts(ds) == [(corpus / "a.txt").read_bytes().decode(), "b one\nb two\n"]  # no newline translation

    def test_blank_files_are_skipped_by_default(self, tmp_path):
        (tmp_path / "a.txt").write_text(" \n\n")
        (tmp_path / "b.txt").write_text("")
        (tmp_path / "c.txt").write_text("text")
        assert texts(TextFileDataset(tmp_path, unit="file")) == ["text"]
        assert texts(TextFileDataset(tmp_path, unit="file", skip_blank=False)) == [" \n\n", "", "text"]

    @pytest.mark.parametrize("mode", MAP_MODES)
    def test_modes_agree(self, corpus, mode):
        assert texts(TextFileDataset(corpus, unit="file", mode=mode)) == texts(TextFileDataset(corpus, unit="file"))


class TestWithTextCollator:
    @pytest.mark.parametrize("mode", MAP_MODES)
    def test_two_workers_give_the_batches_of_the_main_process(self, corpus, mode, load, batches_equal):
        collate = TextCollator(tokenizer=build_tokenizer())
        ds = TextFileDataset(corpus, mode=mode)
        batches = load(ds, workers=2, context="fork", collate_fn=collate)
        batches_equal(batches, load(ds, collate_fn=collate))
        assert set(batches[0]) == {"input_ids", "attention_mask", "labels"}
        tokenizer = build_tokenizer()
        first = batches[0]["input_ids"][0][batches[0]["attention_mask"][0].bool()]
        assert tokenizer.decode(first, skip_special_tokens=True) == "the first line"

    def test_as_train_data_of_the_data_module(self, corpus):
        dm = UniversalDataModule(TextFileDataset(corpus, mode="eager"), task_spec=TaskSpec.lm_tiny(),
                                 tokenizer=build_tokenizer(), batch_size=3, shuffle=False)
        batch = next(iter(dm.train_dataloader()))
        assert batch["input_ids"].shape[0] == 3 and batch["labels"].dtype == torch.long

    def test_pickles(self, corpus):
        ds = TextFileDataset(corpus, mode="cached")
        ds[0]
        assert texts(pickle.loads(pickle.dumps(ds))) == texts(ds)


class TestErrors:
    def test_missing_file(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="text file not found: .*nope.txt"):
            TextFileDataset([tmp_path / "nope.txt"])

    def test_folder_without_text_files(self, tmp_path):
        (tmp_path / "a.md").write_text("x")
        with pytest.raises(ValueError, match="holds no files ending in \\('.txt',\\)"):
            TextFileDataset(tmp_path)

    def test_only_blank_documents(self, tmp_path):
        (tmp_path / "a.txt").write_text("\n  \n")
        with pytest.raises(ValueError, match="hold only blank documents, so the dataset would be empty"):
            TextFileDataset(tmp_path)

    def test_invalid_text_names_the_file_and_offset(self, tmp_path):
        (tmp_path / "a.txt").write_bytes(b"good\nbad \xff\xfe\n")
        ds = TextFileDataset(tmp_path)
        assert ds[0] == {"text": "good"}
        with pytest.raises(ValueError, match="a.txt': the document at byte 5 is not valid utf-8"):
            ds[1]
        assert TextFileDataset(tmp_path, encoding="latin-1")[1] == {"text": "bad ÿþ"}

    def test_bad_arguments(self, corpus):
        with pytest.raises(ValueError, match="unit should be 'line' .* or 'file'"):
            TextFileDataset(corpus, unit="word")
        with pytest.raises(ValueError, match="encoding='utf-16' does not write"):
            TextFileDataset(corpus, encoding="utf-16")
        with pytest.raises(LookupError, match="no-such-codec"):
            TextFileDataset(corpus, encoding="no-such-codec")
        with pytest.raises(ValueError, match="paths_or_dir is an empty sequence"):
            TextFileDataset([])


def test_streaming_mode_constructs_the_streaming_class(corpus):
    ds = TextFileDataset(corpus, mode=LoadingMode.STREAMING)
    assert type(ds) is StreamingTextFileDataset
    assert [row["text"] for row in ds] == texts(TextFileDataset(corpus))
