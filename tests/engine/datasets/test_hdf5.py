from __future__ import annotations

import pickle

import h5py
import numpy as np
import pytest
import torch

from engine.datasets import HDF5Dataset, LoadingMode, StreamingHDF5Dataset

MAP_MODES = [LoadingMode.LAZY, LoadingMode.EAGER, LoadingMode.CACHED]
ROWS = 37


class TestRows:
    def test_rows_are_dicts_of_tensors_from_every_chosen_dataset(self, h5_path):
        ds = HDF5Dataset(h5_path, keys=["x", "y"])
        row = ds[2]
        assert set(row) == {"x", "y"} and len(ds) == ROWS
        assert torch.equal(row["x"], torch.arange(24, 36, dtype=torch.float32).reshape(3, 4))
        assert row["y"].dtype == torch.int64 and row["y"].item() == 2

    def test_mapping_renames_datasets_and_reads_nested_paths(self, h5_path):
        ds = HDF5Dataset(h5_path, keys={"x": "pixel_values", "group/z": "labels"})
        row = ds[3]
        assert set(row) == {"pixel_values", "labels"} and row["labels"].item() == -3

    def test_no_keys_takes_every_top_level_dataset_sorted(self, h5_path):
        assert HDF5Dataset(h5_path).columns == {"x": "x", "y": "y"}

    def test_batched_fetch_keeps_order_repeats_and_negative_indices(self, h5_path):
        ds = HDF5Dataset(h5_path)
        rows = ds.__getitems__([5, 1, 5, -1])
        assert [row["x"][0, 0].item() for row in rows] == [60.0, 12.0, 60.0, 36 * 12.0]
        for indices in ([9, 2, 30], [2, 9, 30], [4, 5, 6]):  # unsorted, sorted with gaps, a run
            assert [row["y"].item() for row in ds.__getitems__(indices)] == [i % 5 for i in indices]

    def test_index_out_of_range_raises(self, h5_path):
        with pytest.raises(IndexError, match="index 37 is out of range for HDF5Dataset of 37 rows"):
            HDF5Dataset(h5_path)[37]

    @pytest.mark.parametrize("mode", MAP_MODES[1:])
    def test_every_map_style_mode_gives_the_rows_of_lazy(self, h5_path, mode, rows_equal):
        indices = [3, 0, 36, 3, 17, 18, 19]
        lazy = HDF5Dataset(h5_path, mode="lazy").__getitems__(indices)
        other = HDF5Dataset(h5_path, mode=mode)
        rows_equal(other.__getitems__(indices), lazy)
        rows_equal(other.__getitems__(indices), lazy)  # CACHED: the second read comes from the cache

    def test_eager_reads_nothing_after_construction(self, h5_path, rows_equal):
        lazy_rows = HDF5Dataset(h5_path).__getitems__(range(ROWS))
        eager = HDF5Dataset(h5_path, mode=LoadingMode.EAGER)
        h5_path.unlink()
        rows_equal(eager.__getitems__(range(ROWS)), lazy_rows)

    def test_cached_rows_own_their_memory_and_count_against_the_budget(self, h5_path):
        ds = HDF5Dataset(h5_path, mode="cached", cache_bytes=10 * (48 + 8))
        ds.__getitems__(range(20))
        stats = ds.cache.stats()
        assert stats["items"] == 10 and stats["nbytes"] == 560 and stats["evictions"] == 10
        assert all(row["x"].untyped_storage().nbytes() == 48 for row in ds.__getitems__(range(10, 20)))

    def test_caller_changes_do_not_reach_the_cache(self, h5_path):
        ds = HDF5Dataset(h5_path, mode="cached")
        ds[0]["x"] = "replaced"
        assert isinstance(ds[0]["x"], torch.Tensor)


class TestFileHandle:
    def test_opened_on_first_access_not_at_construction(self, h5_path):
        ds = HDF5Dataset(h5_path)
        assert ds._file is None
        ds[0]
        assert ds._file is not None and ds._file.id.valid

    def test_pickles_after_access_without_the_handle(self, h5_path, rows_equal):
        ds = HDF5Dataset(h5_path)
        first = ds[4]
        clone = pickle.loads(pickle.dumps(ds))
        assert clone._file is None
        rows_equal([clone[4]], [first])

    def test_close_then_access_reopens(self, h5_path):
        ds = HDF5Dataset(h5_path)
        ds[0]
        ds.close()
        assert ds._file is None and ds[1]["y"].item() == 1

    @pytest.mark.parametrize("mode", MAP_MODES)
    def test_two_forked_workers_give_the_batches_of_the_main_process(self, h5_path, mode, load, batches_equal):
        ds = HDF5Dataset(h5_path, mode=mode)
        ds[0]  # a handle open in the parent must not be used by the forked workers
        batches_equal(load(ds, workers=2, context="fork"), load(ds))

    def test_two_spawned_workers_give_the_batches_of_the_main_process(self, h5_path, load, batches_equal):
        ds = HDF5Dataset(h5_path, keys={"x": "x", "group/z": "z"})
        ds[0]
        batches_equal(load(ds, workers=2, context="spawn", batch_size=8), load(ds, batch_size=8))


class TestErrors:
    def test_missing_file(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="HDF5 file not found: .*nope.h5"):
            HDF5Dataset(tmp_path / "nope.h5")

    def test_not_an_hdf5_file(self, tmp_path):
        (tmp_path / "fake.h5").write_text("hello")
        with pytest.raises(OSError, match="cannot open .*fake.h5.* as an HDF5 file"):
            HDF5Dataset(tmp_path / "fake.h5")

    def test_missing_dataset_lists_the_available_ones(self, h5_path):
        with pytest.raises(KeyError, match=r"has no dataset 'labels'; its datasets are \['x', 'y'\]"):
            HDF5Dataset(h5_path, keys=["x", "labels"])

    def test_length_mismatch(self, tmp_path):
        with h5py.File(tmp_path / "bad.h5", "w") as file:
            file["a"], file["b"] = np.zeros(10), np.zeros(9)
        with pytest.raises(ValueError, match="different lengths \\('a' has 10, 'b' has 9 rows\\)"):
            HDF5Dataset(tmp_path / "bad.h5")

    def test_scalar_and_text_datasets_are_refused(self, tmp_path):
        with h5py.File(tmp_path / "odd.h5", "w") as file:
            file["s"] = 3.0
            file["t"] = np.array([b"a", b"b"])
        with pytest.raises(ValueError, match="'s' is a scalar"):
            HDF5Dataset(tmp_path / "odd.h5", keys=["s"])
        with pytest.raises(ValueError, match="'t' has dtype \\|S1.*only numeric and bool"):
            HDF5Dataset(tmp_path / "odd.h5", keys=["t"])

    def test_bad_arguments(self, h5_path):
        with pytest.raises(TypeError, match="for one dataset pass keys=\\['x'\\]"):
            HDF5Dataset(h5_path, keys="x")
        with pytest.raises(ValueError, match="maps two datasets to one row key"):
            HDF5Dataset(h5_path, keys={"x": "a", "y": "a"})
        with pytest.raises(ValueError, match="mode should be one of LoadingMode.LAZY.*but got mode='fast'"):
            HDF5Dataset(h5_path, mode="fast")
        with pytest.raises(ValueError, match="cache_bytes should be a non-negative integer, but got cache_bytes=-1"):
            HDF5Dataset(h5_path, mode="cached", cache_bytes=-1)


def test_streaming_mode_constructs_the_streaming_class(h5_path):
    ds = HDF5Dataset(h5_path, mode=LoadingMode.STREAMING)
    assert type(ds) is StreamingHDF5Dataset and isinstance(ds, HDF5Dataset)
    assert [row["y"].item() for row in ds] == [i % 5 for i in range(ROWS)]
