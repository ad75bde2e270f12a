"""``long_rows='split'`` on sharded data: the windows, batches and counts of the same rows given as a
``datasets.Dataset`` (the differential reference), at any number of workers, with exact resume, and per-window
state of a few bytes held in numpy arrays."""

import pickle

import datasets
import numpy as np
import pytest
import torch

from engine import Shards, UniversalDataModule
from engine.sources.shards.source import ShardedSource
from tests.engine.sources.shards.shard_corpus import SPEC, write_corpus

SHORT = SPEC.replace(additional_config={"max_seq_len": 16})


@pytest.fixture()
def corpus(tmp_path):
    rows = write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus", rows


def sharded(folder, tmp_path):
    return Shards(str(folder), cache_dir=str(tmp_path / "cache"), shuffle_window=64)


def in_memory(rows):
    return datasets.Dataset.from_dict({"input_ids": rows, "doc": list(range(len(rows)))})


def module(data, workers=0, **options):
    settings = dict(task_spec=SHORT, batch_size=8, val_split=0, seed=3, num_workers=workers, long_rows="split",
                    stride=4)
    settings.update(options)
    return UniversalDataModule(data, **settings)


def windows(batches):
    """Each served window as ``(doc, tokens)``, in order."""
    served = []
    for batch in batches:
        for doc, ids, mask in zip(batch["doc"].tolist(), batch["input_ids"], batch["attention_mask"]):
            served.append((doc, tuple(ids[mask.bool()].tolist())))
    return served


def test_split_shards_serve_the_windows_and_batches_of_the_same_rows_in_a_dataset(corpus, tmp_path):
    folder, rows = corpus
    reference = module(in_memory(rows), shuffle=False, val_split=100)
    expected = windows(reference.train_dataloader())
    for workers in (0, 2):
        dm = module(sharded(folder, tmp_path), workers=workers, shuffle=False, val_split=100)
        assert windows(dm.train_dataloader()) == expected
        assert windows(dm.val_dataloader()) == windows(reference.val_dataloader())
        assert dm.long_rows_report == reference.long_rows_report
    assert dm.long_rows_report["train"]["long_rows"] > 100
    assert len(expected) == dm.long_rows_report["train"]["out_rows"] > dm.long_rows_report["train"]["rows"]
    assert max(len(tokens) for _, tokens in expected) == 16
    by_doc = {}
    for doc, tokens in expected:  # consecutive windows share stride=4 tokens and cover the row
        by_doc.setdefault(doc, []).append(tokens)
    for doc, cuts in by_doc.items():
        assert all(a[-4:] == b[:4] for a, b in zip(cuts, cuts[1:]))
        assert list(cuts[0]) + [t for cut in cuts[1:] for t in cut[4:]] == rows[doc]


def test_a_shuffled_epoch_serves_every_window_once_the_same_at_any_number_of_workers(corpus, tmp_path):
    folder, rows = corpus
    expected = sorted(windows(module(in_memory(rows)).train_dataloader()))
    first = windows(module(sharded(folder, tmp_path)).train_dataloader())
    assert sorted(first) == expected and first != sorted(first)
    assert windows(module(sharded(folder, tmp_path), workers=2).train_dataloader()) == first


def test_rows_and_columns_of_a_window_source_agree(corpus, tmp_path):
    folder, rows = corpus
    dm = module(sharded(folder, tmp_path))
    dm.setup()
    source = dm.datasets["train"]
    assert isinstance(source, ShardedSource) and source.windows is not None
    picked = list(range(0, len(source), 37))
    read = source.for_role("train", None).__getitems__(picked)  # the row path
    columns = source.fetch_columns(picked)
    assert [row["input_ids"] for row in read] == columns["input_ids"].rows()
    assert [row["doc"] for row in read] == columns["doc"] == source.user_indices(picked)
    assert all(row["input_ids"] == rows[row["doc"]][start:end]
               for row, start, end in zip(read, *source._spans(picked)))


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_resume_mid_epoch_continues_exactly(corpus, tmp_path, before, after):
    folder, _ = corpus
    full = windows(module(sharded(folder, tmp_path)).train_dataloader())
    first = module(sharded(folder, tmp_path), workers=before)
    iterator = iter(first.train_dataloader())
    served = windows(next(iterator) for _ in range(40))
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = module(sharded(folder, tmp_path), workers=after)
    resumed.load_state_dict(state)
    assert served + windows(resumed.train_dataloader()) == full


def test_a_state_saved_without_split_is_refused(corpus, tmp_path):
    folder, _ = corpus
    first = module(sharded(folder, tmp_path), long_rows="truncate", stride=None)
    next(iter(first.train_dataloader()))
    resumed = module(sharded(folder, tmp_path))
    with pytest.raises(ValueError, match="data_fingerprint was"):
        resumed.load_state_dict(first.state_dict())


def test_packing_counts_the_windows_tokens(corpus, tmp_path):
    folder, rows = corpus
    dm = module(sharded(folder, tmp_path), batching="packed", max_tokens=64)
    served = sum(int(batch["input_ids"].numel()) for batch in dm.train_dataloader())
    reference = module(in_memory(rows), batching="packed", max_tokens=64)
    assert served == sum(int(batch["input_ids"].numel()) for batch in reference.train_dataloader())
    assert served == sum(len(tokens) for _, tokens in windows(module(in_memory(rows)).train_dataloader()))


def test_the_windows_are_a_few_bytes_each_in_numpy_arrays(corpus, tmp_path):
    folder, _ = corpus
    dm = module(sharded(folder, tmp_path))
    dm.setup()
    source = dm.datasets["train"]
    held = source.windows
    assert all(isinstance(array, np.ndarray) and array.itemsize == 4 for array in held[:3])
    assert source.origins is held.rows  # the rows a window names in errors: the same array, not a copy
    shipped = len(pickle.dumps(source))  # what a spawned worker receives
    assert shipped < 12 * len(source) + 20_000
    assert torch.is_tensor(next(iter(dm.train_dataloader()))["input_ids"])


def test_a_state_saved_on_two_ranks_finishes_its_windows_on_one(corpus, tmp_path, monkeypatch):
    folder, _ = corpus
    served, states = [], []
    for rank in range(2):
        monkeypatch.setattr("engine.datamodule.universal.resolve_world", lambda trainer, rank=rank: (rank, 2))
        dm = module(sharded(folder, tmp_path), batch_size=4)
        iterator = iter(dm.train_dataloader())
        served += windows(next(iterator) for _ in range(10))
        states.append(dm.state_dict())
    monkeypatch.undo()
    resumed = module(sharded(folder, tmp_path))
    resumed.load_state_dict(states[0])
    rest = windows(resumed.train_dataloader())
    everything = windows(module(sharded(folder, tmp_path)).train_dataloader())
    assert len(served) == 80 and sorted(rest + served) == sorted(everything)


def test_every_per_token_column_is_cut_alike_as_in_a_dataset(tmp_path):
    """A mask of integers (read as flat buffers) and weights of floats (read as Python lists) as long as the
    tokens in every row are cut with them; a label list of another length and the doc are copied to each window."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    ids = [rng.integers(2, 500, size=int(rng.integers(3, 40))).tolist() for _ in range(120)]
    table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())),
                      "mask": pa.array([[i % 2 for i in range(len(row))] for row in ids], pa.list_(pa.int8())),
                      "weight": pa.array([[i / 7 for i in range(len(row))] for row in ids], pa.list_(pa.float32())),
                      "tags": pa.array([[len(row), 1] for row in ids], pa.list_(pa.int64())),
                      "doc": pa.array(range(120), pa.int64())})
    (tmp_path / "c").mkdir()
    for part in range(2):
        pq.write_table(table.slice(part * 60, 60), tmp_path / "c" / f"part-{part}.parquet", row_group_size=25)
    reference = module(datasets.Dataset(table), val_split=20)
    dm = module(sharded(tmp_path / "c", tmp_path), val_split=20)
    for dmodule in (reference, dm):
        dmodule.setup()
    for role in ("train", "val"):
        expected, source = reference.datasets[role], dm.datasets[role].for_role(role, None)
        assert len(source) == len(expected) > len(dm.split_plan.train if role == "train" else dm.split_plan.val)
        everything = list(range(len(source)))
        got = list(source.__getitems__(everything))
        want = list(expected.__getitems__(everything))
        assert got == want  # the same float32 values on both sides
        columns = source.fetch_columns(everything)
        assert columns["mask"].rows() == [row["mask"] for row in want]
        assert columns["weight"] == [row["weight"] for row in want]  # not integers: the Python-list path
        assert columns["tags"].rows() == [row["tags"] for row in want] and columns["doc"] == [r["doc"] for r in want]
