"""Keys a collator does not interpret reach the batch unchanged in every built-in collator (never dropped)."""

import pytest
import torch

from collators import AudioCollator, TextCollator, VisionCollator


def rows_with_extras(make_input):
    return [{**make_input(i), "labels": i % 2, "row_id": i, "source": f"file{i}.bin"} for i in range(3)]


@pytest.mark.parametrize(
    ("collator", "make_input"),
    [
        (VisionCollator(normalize=False), lambda i: {"pixel_values": torch.zeros(3, 4, 4, dtype=torch.uint8)}),
        (AudioCollator(), lambda i: {"input_values": torch.zeros(10 + i)}),
        (TextCollator(task_type="classification", pad_token_id=0), lambda i: {"input_ids": [1] * (2 + i)}),
    ],
    ids=["vision", "audio", "text"],
)
def test_extra_keys_pass_through(collator, make_input):
    batch = collator(rows_with_extras(make_input))
    assert batch["row_id"].tolist() == [0, 1, 2]
    assert batch["source"] == ["file0.bin", "file1.bin", "file2.bin"]
    assert batch["labels"].tolist() == [0, 1, 0]


def test_a_key_missing_from_a_later_row_is_an_error():
    rows = [{"pixel_values": torch.zeros(3, 2, 2), "row_id": 0}, {"pixel_values": torch.zeros(3, 2, 2)}]
    with pytest.raises(ValueError, match="row 1 has no 'row_id', which row 0 has"):
        VisionCollator(normalize=False)(rows)
