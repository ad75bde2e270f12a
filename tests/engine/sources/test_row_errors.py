"""A row that cannot be read or collated is named: its dataset index and split, with the cause, with 0 and 2
workers (where torch re-raises the worker's exception by type and message)."""

import pytest
import torch

from engine import UniversalDataModule
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
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return {"input_ids": torch.arange(5, 9) if index != 5 else torch.tensor([1.5, 2.5])}


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
    with pytest.raises(TypeError, match=r"collating the batch of rows \[4, 5, 6, 7\] of the train data failed "
                                        r"\(TypeError: row 1: 'input_ids' should be a 1-D sequence of int"):
        drain(floats)


def test_an_exception_that_needs_more_arguments_becomes_a_data_row_error():
    error = named_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "reading row 3 failed")
    assert isinstance(error, DataRowError) and str(error).startswith("reading row 3 failed (UnicodeDecodeError:")


def test_the_happy_path_is_unchanged():
    dm = UniversalDataModule(FloatRow(), task_spec=TaskSpec.lm_tiny(), batch_size=4, shuffle=False)
    assert len(next(iter(dm.train_dataloader()))["input_ids"]) == 4
