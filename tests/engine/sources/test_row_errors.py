"""A row that cannot be read or collated is named: its dataset index and split, with the cause, with 0 and 2
workers (where torch re-raises the worker's exception by type and message)."""

import pytest
import torch

from engine import UniversalDataModule
from engine.collation.seeded_collate import collate_failure
from engine.sources.bad_rows import DataRowError, named_error
from task_spec import TaskSpec


class Unreadable(torch.utils.data.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, index):
        if index == 13:
            raise OSError("truncated file img_13.png")
        return {"input_ids": torch.arange(5, 10 + index % 4)}


class FloatRow(torch.utils.data.Dataset):
    """``size`` rows of token ids, except row ``bad``, which holds floats (it fails to collate)."""

    def __init__(self, size=8, bad=5):
        self.size, self.bad = size, bad

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return {"input_ids": torch.arange(5, 9) if index != self.bad else torch.tensor([1.5, 2.5])}


def drain(dm):
    for loader in (dm.train_dataloader(), dm.val_dataloader() or []):
        for _ in loader:
            pass


@pytest.mark.parametrize("workers", [0, 2])
def test_reading_and_collation_errors_name_the_rows(workers):
    unreadable = UniversalDataModule(Unreadable(), task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2,
                                     seed=1, num_workers=workers)
    unreadable.setup()
    split = "train" if 13 in unreadable.split_plan.train else "val"
    with pytest.raises(OSError, match=rf"reading row 13 of the {split} data failed; fix or remove that row \(or its "
                                      r"file\), or pass on_error='skip' .* \(OSError: truncated file img_13.png\)") \
            as caught:
        drain(unreadable)
    if workers == 0:
        assert isinstance(caught.value.__cause__, OSError)
    floats = UniversalDataModule(FloatRow(), task_spec=TaskSpec.lm_tiny(), batch_size=4, shuffle=False,
                                 num_workers=workers)
    with pytest.raises(TypeError, match=r"collating the batch of rows \[4, 5, 6, 7\] of the train data failed at "
                                        r"row 5 of the train data \(the batch's row 1\) \(TypeError: row 1: "
                                        r"'input_ids' should be a 1-D sequence of int"):
        drain(floats)


def test_an_exception_that_needs_more_arguments_becomes_a_data_row_error():
    error = named_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "reading row 3 failed")
    assert isinstance(error, DataRowError) and str(error).startswith("reading row 3 failed (UnicodeDecodeError:")


def test_the_happy_path_is_unchanged():
    dm = UniversalDataModule(FloatRow(), task_spec=TaskSpec.lm_tiny(), batch_size=4, shuffle=False)
    assert len(next(iter(dm.train_dataloader()))["input_ids"]) == 4


def rows_pattern(rows):
    return r"\[" + ", ".join(map(str, rows)) + r"\]"


class TestRowsAreTheUsersOwn:
    """A batch that fails to collate is named by the rows' indices in the data the user gave, not by positions in
    a split or places in the batch, with the row the collator named among them."""

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_val_split_batch_names_dataset_indices(self, workers):
        dm = UniversalDataModule(FloatRow(20, bad=13), task_spec=TaskSpec.lm_tiny(), batch_size=3, val_split=8, seed=4,
                                 num_workers=workers)
        dm.setup()
        assert 13 in dm.split_plan.val
        batches = [list(dm.split_plan.val[start:start + 3]) for start in range(0, 8, 3)]
        batch = next(rows for rows in batches if 13 in rows)
        with pytest.raises(TypeError, match=rf"collating the batch of rows {rows_pattern(batch)} of the val data "
                                            rf"failed at row 13 of the val data \(the batch's row "
                                            rf"{batch.index(13)}\)"):
            list(dm.val_dataloader())

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_shuffled_train_split_names_the_row_not_its_place(self, workers):
        dm = UniversalDataModule(FloatRow(20, bad=13), task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=4, seed=2,
                                 num_workers=workers)
        dm.setup()
        assert 13 in dm.split_plan.train
        with pytest.raises(TypeError, match=r"of the train data failed at row 13 of the train data"):
            list(dm.train_dataloader())


class Texts(torch.utils.data.Dataset):
    """Raw text in a map-style torch dataset, tokenized by the collator at batch time; row 5 has no text."""

    def __len__(self):
        return 12

    def __getitem__(self, index):
        return {"text": None if index == 5 else f"row {index} says hello"}


class TestTextOfNone:
    @pytest.mark.parametrize(("val_split", "split"), [(0.0, "train"), (6, "val")])
    def test_a_row_without_text_is_named_with_its_split_and_the_fix(self, tokenizer, val_split, split):
        dm = UniversalDataModule(Texts(), task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=4,
                                 val_split=val_split, seed=4)
        dm.setup()
        assert 5 in getattr(dm.split_plan, split)
        with pytest.raises(ValueError, match=rf"of the {split} data failed \(ValueError: {split} row 5: 'text' "
                                             r"should hold a str of raw text, but got None \(a NaN in a pandas or "
                                             r"Arrow column is read as None\); filter the rows without text out of "
                                             r"the data, or fill them\)$"):
            drain(dm)


def test_a_row_the_collator_named_by_its_own_index_is_not_read_as_a_place_in_the_batch():
    error = ValueError("train row 2: 'labels' should be the row's target")
    assert collate_failure(error, [3, 0, 1, 2], "train") == (
        "collating the batch of rows [3, 0, 1, 2] of the train data failed")
    assert collate_failure(ValueError("row 2: bad"), [3, 0, 1, 2], "train") == (
        "collating the batch of rows [3, 0, 1, 2] of the train data failed at row 1 of the train data (the "
        "batch's row 2)")
