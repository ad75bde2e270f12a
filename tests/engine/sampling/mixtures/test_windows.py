"""A mixture under token budgets and packing: each window of rows sorted by length is a whole number of the
mixture's 64-document blocks and is served before the next, so every window holds each source at its share."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Mixture
from engine.sampling.length import TokenBudgetBatchSampler
from engine.sampling.mixtures.order import MixtureOrder
from engine.sampling.packed import PackedBatchSampler

BLOCK = 64


def served_sources(sampler, order: MixtureOrder) -> np.ndarray:
    """The source of every document, in the order the sampler serves them."""
    return order.source_of(np.asarray([row for batch in sampler for row in batch], dtype=np.int64))


def whole_blocks(rows: int) -> int:
    """A sampler's window of about ``rows`` rows, as a mixture's: a whole number of blocks."""
    return -(-rows // BLOCK) * BLOCK


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.integers(1, 10), min_size=2, max_size=4), longest=st.lists(st.integers(2, 400),
       min_size=4, max_size=4), budget=st.integers(400, 4000), packed=st.booleans(), factor=st.integers(1, 8),
       seed=st.integers(0, 2**31 - 1))
def test_every_window_of_a_token_budget_or_packed_epoch_holds_each_source_within_a_row(weights, longest, budget,
                                                                                       packed, factor, seed):
    rng = np.random.default_rng(seed)
    names = [f"s{i}" for i in range(len(weights))]
    lengths = [rng.integers(1, top + 1, 300) for top in longest[:len(names)]]
    mixture = Mixture(dict(zip(names, weights)))
    order = MixtureOrder(mixture, [300] * len(names), block=BLOCK, seed=seed, lengths=lengths)
    kind = PackedBatchSampler if packed else TokenBudgetBatchSampler
    sampler = kind(np.concatenate(lengths), budget, seed=seed, mega_batch_factor=factor, order=order)
    served = served_sources(sampler, order)
    assert len(served) == order.size
    window = whole_blocks(factor * max(1, int(budget // float(np.concatenate(lengths).mean()))) if packed
                          else sampler._mega_batch_rows(budget))
    ends = np.r_[np.arange(window, len(served), window), len(served)]
    running = np.cumsum(served[:, None] == np.arange(len(names))[None, :], axis=0)[ends - 1]
    share = np.asarray(list(mixture.weights.values()))
    assert np.abs(running - ends[:, None] * share[None, :]).max() < 1  # at every window's end: within a row


def test_a_window_of_a_mixture_is_served_before_the_next_one():
    rng = np.random.default_rng(0)
    lengths = [rng.integers(4, 60, 3000), rng.integers(40, 128, 3000)]
    order = MixtureOrder(Mixture({"web": 0.7, "code": 0.3}), [3000, 3000], block=BLOCK, seed=0, lengths=lengths)
    sampler = TokenBudgetBatchSampler(np.concatenate(lengths), 1024, seed=0, order=order)
    served = served_sources(sampler, order)
    window = whole_blocks(sampler._mega_batch_rows(1024))
    code = np.cumsum(served == 1)[np.arange(window, len(served) + 1, window) - 1]
    assert np.abs(code - 0.3 * np.arange(window, len(served) + 1, window)).max() < 1  # was up to 112 rows off
