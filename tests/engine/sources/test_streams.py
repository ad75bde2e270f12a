"""Streaming inputs (datasets.IterableDataset): sharded by rank and worker, epochs, exact resume, clear refusals."""

import datasets
import pytest
import torch

from engine import UniversalDataModule
from engine.sources.streams import EpochStream
from task_spec import TaskSpec
from tests.engine.test_resume import fingerprint, run

SPEC = TaskSpec.mlm_tiny().replace(special_tokens={"pad_token_id": 0, "mask_token_id": 1},
                                   additional_config={"vocab_size": 100})
ROWS = 40


def stream(shards=4):
    table = {"input_ids": [[2 + i % 90] * (1 + i % 6) for i in range(ROWS)], "row_id": list(range(ROWS))}
    return datasets.Dataset.from_dict(table).to_iterable_dataset(num_shards=shards)


def module(data=None, workers=0, **kwargs):
    return UniversalDataModule(data if data is not None else stream(), task_spec=SPEC, batch_size=4, seed=3,
                               num_workers=workers, **kwargs)


def row_ids(loader):
    return [int(i) for batch in loader for i in batch["row_id"]]


class TestSharding:
    @pytest.mark.parametrize(("workers", "persistent"), [(0, None), (2, None), (2, False)])
    def test_every_row_exactly_once_per_epoch_in_a_new_shard_order(self, workers, persistent):
        loader = module(workers=workers, persistent_workers=persistent).train_dataloader()
        epochs = [row_ids(loader) for _ in range(3)]
        assert all(sorted(ids) == list(range(ROWS)) for ids in epochs)
        assert loader.dataset.epoch == 2 and len({tuple(ids) for ids in epochs}) > 1  # shards reordered by epoch

    def test_ranks_read_disjoint_parts_that_cover_the_stream(self):
        parts = [[row["row_id"] for row in EpochStream(stream(), rank=r, world_size=2)] for r in range(2)]
        assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == list(range(ROWS))

    def test_a_shuffled_stream_gets_a_new_order_each_epoch(self):
        loader = module(stream().shuffle(seed=0, buffer_size=16)).train_dataloader()
        first, second = row_ids(loader), row_ids(loader)
        assert sorted(first) == sorted(second) == list(range(ROWS)) and first != second

    def test_masks_depend_on_the_rows_not_on_the_worker(self):
        batches = {fingerprint(b) for w in (0, 2) for b in module(workers=w).train_dataloader()}
        by_rows = {}
        for workers in (0, 2):
            for batch in module(workers=workers).train_dataloader():
                by_rows.setdefault(tuple(batch["row_id"].tolist()), set()).add(fingerprint(batch))
        assert all(len(hashes) == 1 for hashes in by_rows.values()) and batches


class TestResume:
    @pytest.mark.parametrize("workers", [0, 2])
    @pytest.mark.parametrize("stop", [1, 4, 12])
    def test_resume_continues_exactly(self, workers, stop):
        reference = run(module(workers=workers), 16)  # 10 batches per epoch: stops in epochs 0 and 1
        first = module(workers=workers)
        run(first, stop)
        resumed = module(workers=workers)
        resumed.load_state_dict(first.state_dict())
        assert run(resumed, 16 - stop) == reference[stop:]

    def test_resuming_a_shuffled_stream_is_refused(self):
        first = module(stream().shuffle(seed=0, buffer_size=8))
        next(iter(first.train_dataloader()))
        with pytest.raises(ValueError, match="whose buffer datasets does not save in its state"):
            module(stream().shuffle(seed=0, buffer_size=8)).load_state_dict(first.state_dict())

    def test_state_of_another_stream_is_refused(self):
        state = module().state_dict()
        with pytest.raises(ValueError, match="data_fingerprint was"):
            module(stream(shards=2)).load_state_dict(state)


class TestRefusals:
    @pytest.mark.parametrize(("kwargs", "match"), [
        ({"val_split": 0.1}, "cannot cut rows out of a stream"),
        ({"shuffle": True}, "shuffle=True cannot reorder a stream here"),
    ])
    def test_options_a_stream_cannot_honour(self, kwargs, match):
        options = {"num_workers": 0, **kwargs}
        with pytest.raises(ValueError, match=match):
            UniversalDataModule(stream(), task_spec=SPEC, **options)

    def test_raw_text_stream_without_tokenizer(self):
        text = datasets.Dataset.from_dict({"text": ["a b"] * 4}).to_iterable_dataset()
        with pytest.raises(ValueError, match="raw text in 'text' but no tokenizer was given"):
            UniversalDataModule(text, task_spec=SPEC)

    def test_split_sizes_report_an_unknown_length(self):
        assert module().split_sizes["train"] is None
        assert torch.is_tensor(next(iter(module().train_dataloader()))["input_ids"])


def test_a_none_text_cell_in_a_stream_names_the_column_and_the_fix():
    from demo.sample_data import build_tokenizer

    text = datasets.Dataset.from_dict({"text": ["a b", "c d", None, "e f"]}).to_iterable_dataset()
    dm = UniversalDataModule(text, task_spec=TaskSpec.lm_tiny(), tokenizer=build_tokenizer(), batch_size=2)
    with pytest.raises(ValueError, match=r"'text' should be a string in every row of the stream, but got text=None "
                                         r"in a row; .* filter those rows out"):
        list(dm.train_dataloader())
