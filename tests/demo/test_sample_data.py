"""Tests for demo.sample_data: deterministic, offline, of the promised shapes and classes."""

from __future__ import annotations

import pickle
import re
from collections import Counter

import datasets
import pytest
import torch

from demo import sample_data


class TestLoadCorpus:
    def test_size_and_content(self):
        lines = sample_data.load_corpus()
        assert 300 <= len(lines) <= 1000
        assert 20_000 <= sample_data.CORPUS_PATH.stat().st_size <= 80_000
        assert all(line.strip() and line.isascii() for line in lines)

    def test_every_line_belongs_to_exactly_one_theme(self):
        for line in sample_data.load_corpus():
            words = set(re.findall(r"[a-z]+", line.lower()))
            assert bool(words & sample_data.TOPIC_WORDS[0]) != bool(words & sample_data.TOPIC_WORDS[1]), line


class TestBuildTokenizer:
    def test_special_tokens(self):
        tok = sample_data.build_tokenizer()
        for name, token in sample_data.SPECIAL_TOKENS.items():
            assert getattr(tok, name) == token
            assert getattr(tok, f"{name}_id") is not None
        assert tok.pad_token_id == 0
        assert len(set(tok.all_special_ids)) == len(sample_data.SPECIAL_TOKENS)

    def test_round_trip_and_bos_eos(self):
        tok = sample_data.build_tokenizer()
        for text in [*sample_data.load_corpus()[:50], "Unseen words: zebra, 42 & café!"]:
            ids = tok(text)["input_ids"]
            assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
            assert tok.decode(ids, skip_special_tokens=True) == text

    def test_corpus_words_are_single_tokens(self):
        tok = sample_data.build_tokenizer()
        assert len(tok("The fox watches the quiet lake.", add_special_tokens=False)["input_ids"]) == 7

    def test_cached_and_deterministic(self):
        tok = sample_data.build_tokenizer()
        assert sample_data.build_tokenizer() is tok
        # Retraining uses fresh hash-map seeds in the Rust trainer, so equal output means deterministic training.
        again = sample_data.build_tokenizer.__wrapped__()
        assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()

    def test_too_small_vocab_raises(self):
        with pytest.raises(ValueError, match=r"vocab_size should be an int >= 263"):
            sample_data.build_tokenizer(vocab_size=100)


class TestTextDatasets:
    def test_text_dataset(self):
        ds = sample_data.text_dataset()
        assert isinstance(ds, datasets.Dataset)
        assert ds.column_names == ["text"]
        assert ds["text"] == sample_data.load_corpus()
        assert sample_data.text_dataset(10)["text"] == ds["text"][:10]

    def test_bad_n_raises(self):
        with pytest.raises(ValueError, match=r"text_dataset\(n=...\) should be an int in \[1, \d+\] or None"):
            sample_data.text_dataset(0)

    def test_classification_dataset_balanced(self):
        ds = sample_data.classification_dataset()
        assert ds.column_names == ["text", "labels"]
        counts = Counter(ds["labels"])
        assert set(counts) == {0, 1}
        assert abs(counts[0] - counts[1]) <= len(ds) // 10

    def test_seq2seq_dataset_is_word_reversal(self):
        ds = sample_data.seq2seq_dataset()
        assert ds.column_names == ["source", "target"]
        assert len(ds) > 500
        for row in ds.select(range(20)):
            assert row["target"].split() == row["source"].split()[::-1]
        assert sample_data.seq2seq_dataset()["target"] == ds["target"]


class TestSyntheticImages:
    def test_rows(self):
        ds = sample_data.image_dataset(n=32)
        assert len(ds) == 32
        row = ds[5]
        assert row["pixel_values"].dtype == torch.uint8
        assert row["pixel_values"].shape == (3, 32, 32)
        assert {ds[i]["labels"] for i in range(len(ds))} == {0, 1, 2, 3}

    def test_deterministic_and_seeded(self):
        a, b = sample_data.image_dataset(n=8), sample_data.image_dataset(n=8)
        assert torch.equal(a[3]["pixel_values"], b[3]["pixel_values"])
        assert torch.equal(a[-1]["pixel_values"], a[7]["pixel_values"])
        assert not torch.equal(a[3]["pixel_values"], sample_data.image_dataset(n=8, seed=1)[3]["pixel_values"])

    def test_picklable_and_bounds(self):
        ds = pickle.loads(pickle.dumps(sample_data.image_dataset(n=8)))
        assert torch.equal(ds[2]["pixel_values"], sample_data.image_dataset(n=8)[2]["pixel_values"])
        with pytest.raises(IndexError, match=r"index should be in \[-8, 8\), but got index=8"):
            ds[8]
        with pytest.raises(ValueError, match=r"image_dataset\(n=...\) should be a positive int, but got n=0"):
            sample_data.image_dataset(n=0)


class TestSyntheticAudio:
    def test_rows(self):
        ds = sample_data.audio_dataset(n=16)
        lengths = set()
        for i in range(len(ds)):
            row = ds[i]
            wave = row["input_values"]
            assert wave.dtype == torch.float32 and wave.dim() == 1
            assert 4000 <= wave.numel() <= 16000
            assert row["labels"] == i % 4
            lengths.add(wave.numel())
        assert len(lengths) > 1

    def test_dominant_frequency_follows_label(self):
        ds = sample_data.audio_dataset(n=8)
        for i in range(len(ds)):
            wave = ds[i]["input_values"]
            peak = torch.fft.rfft(wave).abs().argmax().item() * 16000 / wave.numel()
            expected = sample_data.SyntheticAudio.FREQUENCIES[ds[i]["labels"]]
            assert abs(peak - expected) < 0.1 * expected

    def test_deterministic(self):
        a = pickle.loads(pickle.dumps(sample_data.audio_dataset(n=4)))
        assert torch.equal(a[1]["input_values"], sample_data.audio_dataset(n=4)[1]["input_values"])


class TestSyntheticCaptions:
    def test_rows_are_jpegs_with_the_caption_of_their_pattern(self):
        import io

        from PIL import Image

        data = sample_data.caption_dataset(8, seed=3)
        for index in range(8):
            row = data[index]
            image = Image.open(io.BytesIO(row["image"]))
            assert image.format == "JPEG" and all(24 <= side <= 48 for side in image.size)
            words = [sample_data.CAPTION_VOCAB[token] for token in row["input_ids"]]
            assert " ".join(words) == sample_data.CAPTIONS[index % 4] + " <eos>"

    def test_deterministic_and_seeded(self):
        first, again, other = (sample_data.caption_dataset(4, seed=seed)[1] for seed in (0, 0, 1))
        assert first["image"] == again["image"] and first["image"] != other["image"]
