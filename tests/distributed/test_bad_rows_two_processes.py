"""Two real processes (gloo on CPU): rows left out on one rank only (on_error='skip') leave both ranks with
equal batch counts, so a step's collective never waits for a missing batch; the run ends within its timeout."""

from tests.distributed._data import ROWS
from tests.distributed.test_two_processes import torchrun

TRAIN_ROWS = ROWS - 8


def test_a_bad_row_on_one_rank_only_keeps_batch_counts_equal_and_never_hangs(tmp_path):
    ranks = torchrun("_torchrun_bad_rows.py", tmp_path)  # fails on a timeout (180 s) if a rank waits forever
    assert ranks[1]["skipped"] == [[], []]
    for epoch in range(2):
        assert ranks[0]["batches"][epoch] == ranks[1]["batches"][epoch] == -(-(TRAIN_ROWS // 2) // 4)
        skipped, seen = ranks[0]["skipped"][epoch], ranks[0]["train"][epoch]
        assert skipped and all(index % 5 == 1 for index in skipped) and not set(skipped) & set(seen)
        assert len(seen) + len(skipped) == len(ranks[1]["train"][epoch]) == TRAIN_ROWS // 2  # 'drop': equal shares
        assert not (set(seen) | set(skipped)) & set(ranks[1]["train"][epoch])
    assert ranks[0]["val_batches"] == ranks[1]["val_batches"]
