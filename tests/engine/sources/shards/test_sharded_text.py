"""Raw text in shards: the collator tokenizes each batch's text, and the length-aware modes count every row's
tokens once (the text column alone, kept beside the cache), so every batching mode serves every row once."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Shards, UniversalDataModule
from engine.sources.lengths import lengths_of
from task_spec import TaskSpec

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]
MODES = {"plain": {}, "grouped": {"batching": "grouped"},
         "token_budget": {"batching": "token_budget", "max_tokens": 256},
         "packed": {"batching": "packed", "max_tokens": 256}}


@pytest.fixture()
def text_corpus(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    texts = [" ".join(WORDS[: 1 + row % 5] * (1 + row % 3)) for row in range(80)]
    for number in range(2):
        pq.write_table(pa.table({"text": texts[number * 40:(number + 1) * 40]}), folder / f"part-{number}.parquet",
                       row_group_size=10)
    return folder, texts


def module(folder, tmp_path, tokenizer, spec=None, **options):
    return UniversalDataModule(Shards(str(folder), cache_dir=str(tmp_path / "cache"), shuffle_window=16),
                               task_spec=spec or TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=4,
                               val_split=0, seed=1, **options)


@pytest.mark.parametrize("mode", list(MODES))
def test_raw_text_shards_serve_every_row_once_in_every_batching_mode(text_corpus, tmp_path, tokenizer, mode):
    folder, texts = text_corpus
    dm = module(folder, tmp_path, tokenizer, **MODES[mode])
    dm.setup("fit")
    counts = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    rows = tokens = 0
    for batch in dm.train_dataloader():
        if mode == "packed":
            rows += len(batch["cu_seq_lens_q"]) - 1
            tokens += int(batch["input_ids"].shape[1])
        else:
            rows += int(batch["input_ids"].shape[0])
            tokens += int(batch["attention_mask"].sum())
    assert rows == len(texts) and tokens == sum(counts)
    if mode != "plain":
        assert lengths_of(dm.datasets["train"], "input_ids").tolist() == counts
        assert list((tmp_path / "cache").glob("lengths-*-text-tokens-*.npy"))  # counted once, kept


def test_raw_text_shards_refuse_split_long_rows_naming_the_fix(text_corpus, tmp_path, tokenizer):
    folder, _ = text_corpus
    short = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 8})
    dm = module(folder, tmp_path, tokenizer, short, long_rows="split", batching="grouped")
    with pytest.raises(ValueError, match=r"long_rows='split' cuts token ids.*raw text in 'text'.*tokenize_on_ray"):
        dm.setup("fit")


def test_raw_text_shards_drop_long_rows_by_their_token_counts(text_corpus, tmp_path, tokenizer):
    folder, texts = text_corpus
    counts = np.array([len(ids) for ids in tokenizer(texts)["input_ids"]])
    limit = int(np.median(counts))
    short = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": limit})
    dm = module(folder, tmp_path, tokenizer, short, long_rows="drop", batching="grouped")
    dm.setup("fit")
    assert len(dm.datasets["train"]) == int((counts <= limit).sum())
