import re

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from engine.tools.split_files import available_splits, create_loader, load_split_indices, split_path


class Rows(Dataset):
    def __init__(self, size=20):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return {"row": torch.tensor(index)}


class NotATensor:
    pass


@pytest.fixture
def split_dir(tmp_path):
    torch.save(torch.arange(0, 12), tmp_path / "train_idx.pt")
    torch.save(torch.tensor([12, 13, 14, 15]), tmp_path / "val_idx.pt")
    torch.save(torch.tensor([19, 18, 17, 16]), tmp_path / "test_idx.pt")
    return tmp_path


def rows_of(loader):
    return [batch["row"].tolist() for batch in loader]


class TestLoadSplitIndices:
    def test_reads_indices_in_file_order(self, split_dir):
        indices = load_split_indices(split_dir, "test", dataset_size=20)
        assert isinstance(indices, np.ndarray) and indices.dtype == np.int64
        assert indices.tolist() == [19, 18, 17, 16]
        assert available_splits(split_dir) == ["test", "train", "val"]
        assert split_path(split_dir, "val") == split_dir / "val_idx.pt"

    def test_missing_split_names_the_path_and_the_splits_present(self, split_dir):
        (split_dir / "test_idx.pt").unlink()
        with pytest.raises(ValueError, match=r"split file not found: .*test_idx\.pt; the valid splits in .* are "
                                             r"\['train', 'val'\]"):
            load_split_indices(split_dir, "test")

    @pytest.mark.parametrize("split", ["../train", "sub/train", "..\\train"])
    def test_a_split_named_with_a_path_separator_is_refused_naming_the_file_it_would_read(self, tmp_path, split):
        (tmp_path / "splits").mkdir()
        torch.save(torch.tensor([0, 1]), tmp_path / "train_idx.pt")  # outside the split folder
        with pytest.raises(ValueError, match=r"split should be the name of a split file in dataset_dir \(the file "
                                             r"\{split\}_idx\.pt\), without a path separator, but got "
                                             rf"split={re.escape(repr(split))}, which would read .*train_idx\.pt "
                                             r"outside .*splits; pass the folder that holds the file as dataset_dir"):
            load_split_indices(tmp_path / "splits", split)

    def test_an_empty_split_file_is_refused_naming_it(self, split_dir):
        torch.save(torch.tensor([], dtype=torch.long), split_dir / "val_idx.pt")
        with pytest.raises(ValueError, match=r"split file .*val_idx\.pt should hold at least one row index, but got "
                                             r"an empty tensor: a loader over split 'val' would give 0 batches; "
                                             r"rebuild the file .* or delete it"):
            create_loader(split_dir, "val", dataset=Rows(), batch_size=2)
        assert load_split_indices(split_dir, "train").size  # an empty val file shares no row with train

    def test_missing_directory_says_no_splits(self, tmp_path):
        with pytest.raises(ValueError, match="are none"):
            load_split_indices(tmp_path / "absent", "train")

    @pytest.mark.parametrize("bad", [20, 25, -1])
    def test_index_out_of_range_names_the_index_and_the_size(self, tmp_path, bad):
        torch.save(torch.tensor([0, 1, bad]), tmp_path / "train_idx.pt")
        with pytest.raises(ValueError, match=rf"split 'train' .* holds index {bad}, but the dataset has 20 rows "
                                             r"\(valid indices 0\.\.19\)"):
            load_split_indices(tmp_path, "train", dataset_size=20)
        assert load_split_indices(tmp_path, "train").tolist() == [0, 1, bad]  # no size, no range check

    def test_two_dimensional_indices_are_rejected(self, tmp_path):
        torch.save(torch.zeros(2, 3, dtype=torch.long), tmp_path / "train_idx.pt")
        with pytest.raises(ValueError, match=r"should hold a 1-D tensor of row indices, but its tensor has shape "
                                             r"\[2, 3\]"):
            load_split_indices(tmp_path, "train")

    @pytest.mark.parametrize("value", [torch.tensor([0.0, 1.0]), torch.tensor([True, False])])
    def test_non_integer_indices_are_rejected(self, tmp_path, value):
        torch.save(value, tmp_path / "train_idx.pt")
        expected = rf"should hold integer row indices, but its tensor has dtype {value.dtype};"
        with pytest.raises(TypeError, match=expected):
            load_split_indices(tmp_path, "train")

    def test_non_tensor_contents_are_rejected(self, tmp_path):
        torch.save({"indices": [1, 2]}, tmp_path / "train_idx.pt")
        with pytest.raises(TypeError, match="should hold a 1-D integer tensor of row indices, but holds a dict"):
            load_split_indices(tmp_path, "train")

    def test_a_list_of_ints_is_accepted(self, tmp_path):
        torch.save([3, 1, 2], tmp_path / "train_idx.pt")
        assert load_split_indices(tmp_path, "train", dataset_size=4).tolist() == [3, 1, 2]

    def test_arbitrary_pickles_are_refused(self, tmp_path):
        torch.save(NotATensor(), tmp_path / "train_idx.pt")
        with pytest.raises(ValueError, match=r"could not read split file .* with torch.load\(weights_only=True\)"):
            load_split_indices(tmp_path, "train")

    def test_duplicates_within_a_split(self, tmp_path):
        torch.save(torch.tensor([4, 2, 4, 7, 2]), tmp_path / "train_idx.pt")
        with pytest.raises(ValueError, match=r"split 'train' .* repeats 2 index\(es\), e.g. \[2, 4\]"):
            load_split_indices(tmp_path, "train")

    def test_overlap_between_standard_splits(self, split_dir):
        torch.save(torch.tensor([11, 12, 13]), split_dir / "val_idx.pt")
        for split in ("train", "val"):
            with pytest.raises(ValueError, match=r"splits '(train|val)' and '(train|val)' share 1 row\(s\), e.g. "
                                                 r"\[11\]"):
                load_split_indices(split_dir, split)
        assert load_split_indices(split_dir, "val", check_overlap=False).tolist() == [11, 12, 13]
        assert load_split_indices(split_dir, "test").tolist() == [19, 18, 17, 16]  # test shares nothing


class TestCreateLoader:
    def test_train_shuffles_and_drops_the_last_partial_batch(self, split_dir):
        loader = create_loader(split_dir, "train", dataset=Rows(), batch_size=5, seed=1)
        batches = rows_of(loader)
        assert [len(batch) for batch in batches] == [5, 5]
        seen = [row for batch in batches for row in batch]
        assert set(seen) < set(range(12)) and len(set(seen)) == 10
        assert seen != sorted(seen)
        assert rows_of(loader) != batches  # a new order next epoch

    def test_eval_splits_keep_file_order_and_every_row(self, split_dir):
        loader = create_loader(split_dir, "test", dataset=Rows(), batch_size=3)
        assert rows_of(loader) == [[19, 18, 17], [16]]

    def test_explicit_options_override_the_split_defaults(self, split_dir):
        loader = create_loader(split_dir, "train", dataset=Rows(), batch_size=5, shuffle=False, drop_last=False)
        assert rows_of(loader) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]

    def test_epoch_and_rank_reach_the_sampler(self, split_dir):
        loader = create_loader(split_dir, "train", dataset=Rows(), batch_size=2, epoch=3, rank=1, num_replicas=2)
        assert loader.batch_sampler.epoch == 3
        expected = create_loader(split_dir, "train", dataset=Rows(), batch_size=2, rank=1, num_replicas=2)
        expected.batch_sampler.set_epoch(3)
        assert rows_of(loader) == rows_of(expected)
        assert sum(len(batch) for batch in rows_of(loader)) == 6

    def test_indices_are_checked_against_the_dataset_at_load_time(self, split_dir):
        with pytest.raises(ValueError, match="holds index 12, but the dataset has 12 rows"):
            create_loader(split_dir, "val", dataset=Rows(12), batch_size=2)
