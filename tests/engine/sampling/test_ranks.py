"""engine/sampling/ranks.py: the one rule that shares an epoch's rows among ranks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.ranks import deal_to_ranks, equalize_batch_counts, rows_per_rank


@settings(max_examples=200, deadline=None, derandomize=True)
@given(rows=st.integers(0, 60), world=st.integers(1, 5), uneven=st.sampled_from(["pad", "drop"]))
def test_every_rank_gets_the_same_count_and_rows_are_covered_or_dropped_as_promised(rows, world, uneven):
    order = np.random.default_rng(rows).permutation(rows)
    shares = [deal_to_ranks(order, world, rank, uneven) for rank in range(world)]
    assert {len(share) for share in shares} == {rows_per_rank(rows, world, uneven)}
    dealt = np.concatenate(shares) if shares else np.array([])
    if uneven == "pad":
        assert set(dealt.tolist()) == set(order.tolist())  # every row, a few twice
        assert len(dealt) - rows < world
    else:
        assert len(set(dealt.tolist())) == len(dealt)  # disjoint
        assert rows - len(dealt) < world


@pytest.mark.parametrize(("uneven", "expected"), [("pad", [[1], [2], [1]]), ("drop", [[1], [2]])])
def test_equalize_batch_counts(uneven, expected):
    per_rank = [[[1], [2]], [[3], [4], [5]]]  # pad up to the largest count, drop down to the smallest
    assert equalize_batch_counts(per_rank[0], per_rank, uneven) == expected
    assert len(equalize_batch_counts(per_rank[1], per_rank, uneven)) == len(expected)


def test_a_rank_without_rows_borrows_whole_batches():
    assert equalize_batch_counts([], [[], [[7, 8]]], "pad") == [[7, 8]]
