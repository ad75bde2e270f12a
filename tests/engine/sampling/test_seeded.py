"""engine/sampling/seeded.py: the plain sampler's batches, held as one array of rows (RowBatches)."""

import numpy as np
import pytest

from engine.sampling.seeded import SeededBatchSampler


class TestRowBatches:
    @pytest.mark.parametrize("drop_last", [False, True])
    def test_batches_equal_the_order_cut_every_batch_size_rows(self, drop_last):
        sampler = SeededBatchSampler(103, 10, shuffle=True, seed=4, drop_last=drop_last)
        order = sampler.epoch_order(0).tolist()
        expected = [order[start:start + 10] for start in range(0, 103, 10)]
        expected = expected[:-1] if drop_last else expected
        batches = sampler.epoch_batches(0)
        assert batches == expected and len(batches) == len(expected)
        assert batches[-1] == expected[-1] and batches[2:4] == expected[2:4]
        assert [list(batch) for batch in sampler] == expected  # what iterating the sampler yields
        with pytest.raises(IndexError):
            batches[len(expected)]

    def test_an_epoch_is_held_in_four_bytes_a_row(self):
        batches = SeededBatchSampler(100_000, 32, shuffle=True, seed=0).epoch_batches(0)
        assert batches.rows.dtype == np.int32 and batches.rows.nbytes == 400_000
