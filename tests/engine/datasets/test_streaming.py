from __future__ import annotations

import pickle
from collections import Counter

import pytest
import torch
from torch.utils.data import IterableDataset

from collators import TextCollator, VisionCollator
from demo.sample_data import build_tokenizer
from engine.core import distributed
from engine.datasets import (
    FileDataset,
    HDF5Dataset,
    ImageFolderDataset,
    LoadingMode,
    StreamingHDF5Dataset,
    TextFileDataset,
    shard_blocks,
)

ROWS = 37


def row_ids(batches, key="y2"):
    return torch.cat([batch[key] for batch in batches]).tolist()


@pytest.fixture
def h5_ids(h5_path):
    """The HDF5 file with a dataset holding each row's index, so rows are easy to count."""
    import h5py

    with h5py.File(h5_path, "a") as file:
        file["y2"] = torch.arange(ROWS).numpy()
    return h5_path


class TestShardBlocks:
    def test_blocks_are_dealt_round_robin(self):
        assert list(shard_blocks(10, 3, 0, 2)) == [(0, 3), (6, 9)]
        assert list(shard_blocks(10, 3, 1, 2)) == [(3, 6), (9, 10)]
        assert list(shard_blocks(2, 3, 1, 2)) == []

    @pytest.mark.parametrize(("rows", "block", "shards"), [(37, 4, 3), (5, 8, 4), (64, 1, 6), (0, 2, 2)])
    def test_every_row_is_in_exactly_one_shard(self, rows, block, shards):
        seen = [i for shard in range(shards) for start, stop in shard_blocks(rows, block, shard, shards)
                for i in range(start, stop)]
        assert sorted(seen) == list(range(rows))

    def test_bad_shard(self):
        with pytest.raises(ValueError, match="shard should be in \\[0, 2\\), but got shard=2"):
            list(shard_blocks(4, 1, 2, 2))


class TestStreamingDataset:
    def test_is_an_iterable_dataset_in_file_order(self, h5_ids):
        ds = HDF5Dataset(h5_ids, mode="streaming", block_rows=5)
        assert isinstance(ds, IterableDataset) and ds.mode is LoadingMode.STREAMING and len(ds) == ROWS
        assert [row["y2"].item() for row in ds] == list(range(ROWS))

    def test_rows_match_the_map_style_rows(self, h5_ids, rows_equal):
        rows_equal(list(HDF5Dataset(h5_ids, mode="streaming")), HDF5Dataset(h5_ids).__getitems__(range(ROWS)))

    @pytest.mark.parametrize("batch_size", [4, 5, 16])
    def test_two_workers_yield_every_row_exactly_once(self, h5_ids, load, batch_size):
        ds = HDF5Dataset(h5_ids, mode="streaming", block_rows=5)
        ids = row_ids(load(ds, workers=2, context="fork", batch_size=batch_size))
        assert Counter(ids) == Counter(range(ROWS))
        if batch_size == ds.block_rows:  # a batch per block, taken from the workers in turn: file order
            assert ids == list(range(ROWS))

    def test_each_epoch_streams_again(self, h5_ids):
        from engine import DataLoaderConfig, DataLoaderFactory

        loader = DataLoaderFactory().create_dataloader(
            HDF5Dataset(h5_ids, mode="streaming", block_rows=8), DataLoaderConfig(batch_size=8, num_workers=2))
        assert row_ids(loader) == row_ids(loader) == list(range(ROWS))

    def test_images_and_text_stream_with_their_collators(self, image_root, tmp_path, load):
        images = ImageFolderDataset(image_root[0], mode="streaming", block_rows=2)
        batches = load(images, workers=2, context="fork", batch_size=2, collate_fn=VisionCollator(keep_uint8=True))
        assert row_ids(batches, "labels") == images.targets.tolist()
        (tmp_path / "t.txt").write_text("".join(f"line {i}\n" for i in range(23)))
        text = TextFileDataset(tmp_path / "t.txt", mode="streaming", block_rows=3)
        tokenizer = build_tokenizer()
        batches = load(text, workers=2, context="fork", batch_size=3, collate_fn=TextCollator(tokenizer=tokenizer))
        decoded = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
                   for batch in batches for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        assert decoded == [f"line {i}" for i in range(23)]

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_resumed_loader_continues_without_rereading(self, h5_ids, workers, monkeypatch):
        from engine import DataLoaderConfig, DataLoaderFactory

        context = "fork" if workers else None
        config = DataLoaderConfig(batch_size=4, num_workers=workers, multiprocessing_context=context)
        loader = DataLoaderFactory().create_dataloader(HDF5Dataset(h5_ids, mode="streaming", block_rows=4), config)
        batches = iter(loader)
        seen = [next(batches)["y2"] for _ in range(3)]
        state = loader.state_dict()
        reads = []
        original = HDF5Dataset._read_range
        monkeypatch.setattr(HDF5Dataset, "_read_range", lambda self, a, b: reads.append((a, b)) or original(self, a, b))
        resumed = DataLoaderFactory().create_dataloader(HDF5Dataset(h5_ids, mode="streaming", block_rows=4), config)
        resumed.load_state_dict(state)
        rest = [batch["y2"] for batch in resumed]
        assert torch.cat(seen + rest).tolist() == list(range(ROWS))
        if workers == 0:  # reads are counted in this process only
            assert reads[0] == (12, 16)

    def test_shuffle_is_refused_by_the_factory(self, h5_ids):
        from engine import DataLoaderConfig, DataLoaderFactory

        with pytest.raises(ValueError, match="shuffle=True cannot reorder an IterableDataset"):
            DataLoaderFactory().create_dataloader(HDF5Dataset(h5_ids, mode="streaming"),
                                                  DataLoaderConfig(shuffle=True))

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_loader_resumed_mid_block_reads_the_rest_of_that_block_only(self, h5_ids, workers, monkeypatch):
        from engine import DataLoaderConfig, DataLoaderFactory

        context = "fork" if workers else None
        config = DataLoaderConfig(batch_size=4, num_workers=workers, multiprocessing_context=context)
        loader = DataLoaderFactory().create_dataloader(HDF5Dataset(h5_ids, mode="streaming", block_rows=8), config)
        batches = iter(loader)
        seen = [next(batches)["y2"] for _ in range(3)]  # 12 rows: inside a block of 8 in either case
        state = loader.state_dict()
        reads = []
        original = HDF5Dataset._read_range
        monkeypatch.setattr(HDF5Dataset, "_read_range", lambda self, a, b: reads.append((a, b)) or original(self, a, b))
        resumed = DataLoaderFactory().create_dataloader(HDF5Dataset(h5_ids, mode="streaming", block_rows=8), config)
        resumed.load_state_dict(state)
        ids = torch.cat(seen + [batch["y2"] for batch in resumed]).tolist()
        assert sorted(ids) == list(range(ROWS))  # each row once: none lost, none repeated
        if workers == 0:
            assert ids == list(range(ROWS)) and reads == [(12, 16), (16, 24), (24, 32), (32, 37)]

    def test_stream_batch_seeds_follow_the_rows_whatever_the_workers(self, h5_ids):
        """The factory seeds each stream batch from its rows (engine.core.rng.content_seed, hashed column by column):
        the generators are those of the rows, the same with 0 or 2 workers."""
        from engine import DataLoaderConfig, DataLoaderFactory
        from engine.core.rng import content_seed, generator_from

        draws = {}
        for workers in (0, 2):
            config = DataLoaderConfig(batch_size=8, num_workers=workers, seed=5, collate_fn=DrawingCollate(),
                                      multiprocessing_context="fork" if workers else None)
            stream = HDF5Dataset(h5_ids, mode="streaming", block_rows=8)
            draws[workers] = [(batch["y2"].tolist(), int(batch["draw"]))
                              for batch in DataLoaderFactory().create_dataloader(stream, config)]
        assert draws[0] == draws[2]
        rows = HDF5Dataset(h5_ids)
        for ids, draw in draws[0]:
            seed = content_seed(5, rows.__getitems__(ids))
            assert draw == int(torch.randint(0, 2**62, (1,), generator=generator_from(seed)))


class DrawingCollate:
    """Stacks ``y2`` and draws one number from the batch's generator (to see which seed the batch got)."""

    def __call__(self, rows, generator=None):
        return {"y2": torch.stack([row["y2"] for row in rows]),
                "draw": torch.randint(0, 2**62, (1,), generator=generator)}


class TestRanks:
    def test_ranks_split_the_rows_and_workers_split_each_rank(self, h5_ids, monkeypatch, load):
        ds = HDF5Dataset(h5_ids, mode="streaming", block_rows=3)
        per_rank = []
        for rank in range(2):
            monkeypatch.setattr(distributed, "rank_and_world", lambda rank=rank: (rank, 2))
            ids = row_ids(load(ds, workers=2, context="fork", batch_size=3))
            assert len(ds) == len(ids) and ids == sorted(ids)  # a rank's rows in file order
            per_rank.append(ids)
        assert sorted(per_rank[0] + per_rank[1]) == list(range(ROWS))
        assert per_rank[0][:6] == [0, 1, 2, 6, 7, 8]

    def test_rank_seen_when_pickled_travels_to_spawned_workers(self, h5_ids, monkeypatch):
        ds = HDF5Dataset(h5_ids, mode="streaming", block_rows=3)
        monkeypatch.setattr(distributed, "rank_and_world", lambda: (1, 2))
        state = pickle.dumps(ds)
        monkeypatch.setattr(distributed, "rank_and_world", lambda: None)  # as in a spawned worker
        clone = pickle.loads(state)
        assert [row["y2"].item() for row in clone][:4] == [3, 4, 5, 9] and len(clone) == 18


class TestConstruction:
    def test_the_streaming_class_always_streams(self, h5_ids):
        assert StreamingHDF5Dataset(h5_ids).mode is LoadingMode.STREAMING

    def test_map_style_modes_are_not_iterable_datasets(self, h5_ids):
        assert not isinstance(HDF5Dataset(h5_ids, mode="cached"), IterableDataset)

    def test_a_subclass_without_a_streaming_class_is_refused(self, h5_ids):
        class Custom(HDF5Dataset):
            pass

        with pytest.raises(TypeError, match="Custom has no streaming class of its own"):
            Custom(h5_ids, mode="streaming")
        assert isinstance(Custom(h5_ids), FileDataset)

    def test_bad_block_rows(self, h5_ids):
        with pytest.raises(ValueError, match="block_rows should be a positive integer, but got block_rows=0"):
            HDF5Dataset(h5_ids, mode="streaming", block_rows=0)
