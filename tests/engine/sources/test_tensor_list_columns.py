"""Token rows in a flat buffer reach the text collator as columns: the same batches as from the rows, bit for bit."""

import pytest
import torch

from collators.columns import ColumnBatch, RowBatch
from collators.text import TextCollator
from engine.collation.seeded_collate import SeededCollate
from engine.sources.wrappers import TensorListSource
from task_spec import TaskSpec

MLM = TaskSpec.mlm_tiny().replace(special_tokens={"pad_token_id": 0, "mask_token_id": 1},
                                  additional_config={"vocab_size": 600})


def token_rows(dtype, count=40):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(2, 600, (int(n),), generator=generator).to(dtype)
            for n in torch.randint(1, 30, (count,), generator=generator)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("spec", [TaskSpec.lm_tiny(), MLM], ids=["causal", "masked"])
@pytest.mark.parametrize("key", [None, "input_ids"])
def test_columns_collate_to_the_batch_of_the_rows(dtype, spec, key):
    rows = token_rows(dtype) if dtype != torch.uint8 else [row.clamp(max=255) for row in token_rows(torch.int64)]
    rows = [row.to(dtype) for row in rows]
    source = TensorListSource(rows, key=key).view(torch.arange(39, 3, -1).numpy())  # a split view, reversed
    collator = TextCollator(task_spec=spec)
    positions = [5, 0, 17, 33, 2, 9, 9]
    batch = source.handing_columns().__getitems__(positions)
    assert isinstance(batch, ColumnBatch)
    as_rows = source.__getitems__(positions)  # the row path
    assert isinstance(as_rows, RowBatch) and len(as_rows) == len(positions)
    expected = [rows[39 - p] for p in positions]
    assert all(torch.equal(row if key is None else row[key], want) for row, want in zip(as_rows, expected))
    from_columns = collator(batch, generator=torch.Generator().manual_seed(7))
    from_rows = collator(list(as_rows), generator=torch.Generator().manual_seed(7))
    assert from_columns.keys() == from_rows.keys()
    for name in from_rows:
        assert from_columns[name].dtype == from_rows[name].dtype and torch.equal(from_columns[name], from_rows[name])


def test_collators_of_rows_get_a_list_and_other_rows_keep_the_row_path():
    seen = []

    def stack(rows):
        seen.append(type(rows))
        return torch.stack(rows)

    source = TensorListSource([torch.arange(3) + i for i in range(6)])
    batch = source.__getitems__([4, 1])
    assert torch.equal(SeededCollate(stack)(batch), torch.tensor([[4, 5, 6], [1, 2, 3]]))
    assert seen == [RowBatch]
    floats = TensorListSource([torch.ones(3), torch.zeros(2)])
    assert isinstance(floats.__getitems__([0, 1]), RowBatch)  # not token ids: rows as before
    images = TensorListSource([torch.ones(2, 3, dtype=torch.long)] * 2)
    assert isinstance(images.__getitems__([0, 1]), RowBatch)  # not 1-D
