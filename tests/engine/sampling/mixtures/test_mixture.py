"""A mixture's order: exact counts per block, schedules from their step, passes per exhaustion policy, token
shares, determinism, and the declaration's refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Mixture
from engine.sampling.mixtures.order import MixtureOrder


def served_by_block(order: MixtureOrder, epoch: int = 0) -> np.ndarray:
    """``[blocks, sources]`` rows of each source in each block, counted from the epoch's order itself."""
    rows = order.order(epoch)
    which = order.source_of(rows)
    sizes = order.plan(epoch).counts.sum(axis=1)
    block_of = np.repeat(np.arange(len(sizes)), sizes)
    counted = np.zeros((len(sizes), len(order.sizes)), dtype=np.int64)
    np.add.at(counted, (block_of, which), 1)
    return counted


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.floats(0.001, 1.0), min_size=2, max_size=5), block=st.integers(1, 48),
       seed=st.integers(0, 2**31 - 1), blocks=st.integers(1, 60))
def test_every_source_stays_within_one_row_of_its_share_at_every_block(weights, block, seed, blocks):
    names = [f"s{i}" for i in range(len(weights))]
    mixture = Mixture(dict(zip(names, weights)), samples_per_epoch=block * blocks)
    order = MixtureOrder(mixture, [7] * len(names), block=block, seed=seed)
    counted = served_by_block(order)
    assert (counted.sum(axis=1) == block).all()  # every block full
    served = np.cumsum(counted, axis=0)
    targets = np.cumsum(np.full(len(counted), block))[:, None] * np.array(list(mixture.weights.values()))
    assert np.abs(served - targets).max() < 1  # within one row of the share, at every block boundary


def test_a_switch_serves_the_new_weights_from_exactly_its_step():
    mixture = Mixture({"a": 0.7, "b": 0.3}, schedule=[(5, {"a": 0.2, "b": 0.8})], samples_per_epoch=100)
    counted = served_by_block(MixtureOrder(mixture, [50, 50], block=10, seed=3))
    assert counted[:5].tolist() == [[7, 3]] * 5
    assert counted[5:].tolist() == [[2, 8]] * 5


def test_a_linear_ramp_moves_the_counts_step_by_step():
    mixture = Mixture({"a": 1, "b": 0}, schedule=[(10, {"a": 0, "b": 1}, "linear")], samples_per_epoch=200)
    counted = served_by_block(MixtureOrder(mixture, [100, 100], block=10, seed=0))
    assert counted[:11, 1].tolist() == list(range(11))  # b: 0, 1, ... 10 of each 10 rows
    assert counted[10:, 1].tolist() == [10] * 10


def test_the_weights_of_a_step():
    mixture = Mixture({"a": 3, "b": 1}, schedule=[(4, {"a": 1, "b": 1}), (8, {"a": 0, "b": 1}, "linear")])
    assert mixture.weights_at(3).tolist() == [0.75, 0.25]
    assert mixture.weights_at(4).tolist() == [0.5, 0.5]
    assert mixture.weights_at(6).tolist() == [0.25, 0.75]
    assert mixture.weights_at(100).tolist() == [0.0, 1.0]
    assert mixture.change_steps() == (4,)


def test_a_source_that_stops_is_served_once_and_ends_the_epoch():
    mixture = Mixture({"big": 0.7, "small": 0.3}, exhaust={"small": "stop"})
    order = MixtureOrder(mixture, [1000, 90], block=16, seed=1)
    for epoch in (0, 1):
        rows = order.order(epoch)
        small = rows[rows >= 1000] - 1000
        assert sorted(small.tolist()) == list(range(90))  # every row once, none twice
        assert (rows[-16:] >= 1000).any() and len(rows) < 90 / 0.3 + 16  # its last rows are in the last block
    assert not np.array_equal(order.order(0)[order.order(0) >= 1000], order.order(1)[order.order(1) >= 1000])


def test_a_cycling_source_serves_each_row_once_per_pass_across_epochs():
    mixture = Mixture({"a": 0.5, "b": 0.5}, exhaust={"a": "stop", "b": "cycle"})
    order = MixtureOrder(mixture, [40, 30], block=8, seed=2)
    draws = np.concatenate([rows[rows >= 40] - 40 for rows in (order.order(e) for e in range(4))])
    whole = len(draws) // 30 * 30
    for start in range(0, whole, 30):  # passes over b in order: each a permutation
        assert sorted(draws[start:start + 30].tolist()) == list(range(30))


def test_a_capped_source_cycles_at_most_its_passes_then_ends_the_epoch():
    mixture = Mixture({"a": 0.5, "b": 0.5}, exhaust={"a": "cycle", "b": 2})
    order = MixtureOrder(mixture, [500, 30], block=10, seed=4)
    rows = order.order(0)
    b = rows[rows >= 500] - 500
    assert len(b) == 60 and sorted(b[:30].tolist()) == sorted(b[30:].tolist()) == list(range(30))


def test_without_a_stopping_source_an_epoch_is_every_source_s_rows_or_samples_per_epoch():
    assert MixtureOrder(Mixture({"a": 1, "b": 1}), [30, 50], block=8, seed=0).size == 80
    assert MixtureOrder(Mixture({"a": 1, "b": 1}, samples_per_epoch=36), [30, 50], block=8, seed=0).size == 36


def test_token_weights_hold_the_token_shares_within_a_row_or_two():
    rng = np.random.default_rng(0)
    lengths = [rng.integers(1, 20, 400), rng.integers(50, 200, 400)]  # short rows against long ones
    mixture = Mixture({"short": 0.5, "long": 0.5}, by="tokens", samples_per_epoch=800)
    order = MixtureOrder(mixture, [400, 400], block=16, seed=0, lengths=lengths)
    plan = order.plan(0)
    tokens = np.cumsum(plan.tokens, axis=0)
    shares = tokens / tokens.sum(axis=1, keepdims=True)
    assert abs(shares[-1, 0] - 0.5) < 200 / tokens[-1].sum() * 2
    assert np.abs(tokens[:, 0] - tokens[:, 1]).max() <= 2 * 200  # within about a long row at every block
    rows = order.order(0)
    assert int(np.concatenate(lengths)[rows].sum()) == int(tokens[-1].sum())  # the plan counts the rows served


def test_the_order_is_a_function_of_seed_and_epoch():
    mixture = Mixture({"a": 0.6, "b": 0.4})

    def make(seed):
        return MixtureOrder(mixture, [60, 40], block=10, seed=seed)

    assert np.array_equal(make(1).order(2), make(1).order(2))
    assert not np.array_equal(make(1).order(0), make(1).order(1))
    assert not np.array_equal(make(1).order(0), make(2).order(0))
    later = make(1)
    later.order(3)  # computed out of turn: the same epochs
    assert np.array_equal(later.order(1), make(1).order(1))


@pytest.mark.parametrize(("arguments", "error", "match"), [
    ({"weights": {}}, TypeError, "non-empty dict"),
    ({"weights": {"a": -1, "b": 1}}, ValueError, r"weights\['a'\] should be a finite number >= 0"),
    ({"weights": {"a": 0, "b": 0}}, ValueError, "positive sum"),
    ({"weights": {"a": 1, "b": float("nan")}}, ValueError, "finite"),
    ({"weights": {"a": 1}, "by": "bytes"}, ValueError, "by should be one of 'rows', 'tokens'"),
    ({"weights": {"a": 1, "b": 1}, "schedule": [(5, {"a": 1})]}, KeyError, r"missing \['b'\]"),
    ({"weights": {"a": 1}, "schedule": [(5, {"a": 1}), (5, {"a": 1})]}, ValueError, "should increase"),
    ({"weights": {"a": 1}, "schedule": [(0, {"a": 1})]}, ValueError, "positive integer"),
    ({"weights": {"a": 1}, "schedule": [(3, {"a": 1}, "cubic")]}, ValueError, "'step', 'linear'"),
    ({"weights": {"a": 1}, "exhaust": {"b": "stop"}}, KeyError, "not sources of the mixture"),
    ({"weights": {"a": 1}, "exhaust": "forever"}, ValueError, "'cycle', 'stop' or a positive int"),
    ({"weights": {"a": 1}, "samples_per_epoch": 0}, ValueError, "samples_per_epoch should be a positive integer"),
    ({"weights": {"a": 1}, "on_change": "ignore"}, ValueError, "'refuse', 'new_epoch'"),
])
def test_a_bad_declaration_is_refused_naming_it(arguments, error, match):
    with pytest.raises(error, match=match):
        Mixture(**arguments)


def test_an_epoch_that_would_never_end_is_refused():
    mixture = Mixture({"a": 1, "b": 0}, exhaust={"b": "stop"})
    with pytest.raises(ValueError, match="would never end"):
        MixtureOrder(mixture, [10, 10], block=4, seed=0).plan(0)


def test_mixing_by_tokens_needs_lengths():
    with pytest.raises(ValueError, match="by='tokens'.*mix by='rows'"):
        MixtureOrder(Mixture({"a": 1}, by="tokens"), [10], block=4, seed=0)


def test_an_order_keeps_two_epochs_plans_and_the_summary_still_counts_every_epoch():
    mixture = Mixture({"a": 0.7, "b": 0.3}, schedule=[(12, {"a": 0.2, "b": 0.8})], exhaust={"a": "cycle", "b": "cycle"})
    order = MixtureOrder(mixture, [40, 30], block=10, seed=2)
    for epoch in range(6):
        order.order(epoch)
        assert len(order._plans) <= 2  # the parent's memory does not grow with the epochs
    fresh = MixtureOrder(mixture, [40, 30], block=10, seed=2)
    asked = sum(((plan.weights * plan.counts.sum(axis=1, keepdims=True)).sum(axis=0)
                 for plan in (fresh.plan(epoch) for epoch in range(5))), np.zeros(2))
    partial = fresh.plan(5)
    asked = asked + (partial.weights[:3] * partial.counts[:3].sum(axis=1, keepdims=True)).sum(axis=0)
    np.testing.assert_allclose(order._expected_rows(5, 3), asked)
    assert order.plan(1).counts.tolist() == MixtureOrder(mixture, [40, 30], block=10, seed=2).plan(1).counts.tolist()


def token_drift(order: MixtureOrder, epoch: int = 0) -> np.ndarray:
    """``[blocks, sources]``: each source's tokens served minus its target at every block boundary, where the
    target sums each block's tokens times the weights of that block's own step."""
    plan = order.plan(epoch)
    target = np.cumsum(plan.weights * plan.tokens.sum(axis=1, keepdims=True), axis=0)
    return np.cumsum(plan.tokens, axis=0) - target


def test_by_tokens_a_switch_serves_every_source_at_the_new_weights_from_its_step():
    rng = np.random.default_rng(0)
    lengths = [rng.integers(4, 9, 5000), rng.integers(10, 17, 5000)]
    mixture = Mixture({"web": 0.8, "code": 0.2}, by="tokens", schedule=[(20, {"web": 0.2, "code": 0.8})],
                      samples_per_epoch=600)
    plan = MixtureOrder(mixture, [5000, 5000], block=10, seed=0, lengths=lengths).plan(0)
    web_share = plan.tokens[20:40, 0].sum() / plan.tokens[20:40].sum()
    assert abs(web_share - 0.2) < 0.02  # was 0.0: web was starved until its share of the whole run fell to 20%
    assert (plan.counts[20:, 0] > 0).all()  # every block after the switch holds web rows
    assert np.abs(token_drift(MixtureOrder(mixture, [5000, 5000], block=10, seed=0, lengths=lengths))).max() <= 16


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(0, 20), min_size=2, max_size=4), later=st.lists(st.integers(0, 20), min_size=4,
       max_size=4), step=st.integers(1, 30), ramp=st.sampled_from(["step", "linear", None]),
       block=st.integers(1, 48), longest=st.lists(st.integers(1, 300), min_size=4, max_size=4),
       seed=st.integers(0, 2**31 - 1))
def test_by_tokens_every_block_is_drawn_at_its_own_weights_within_the_longest_row(weights, later, step, ramp, block,
                                                                                   longest, seed):
    names = [f"s{i}" for i in range(len(weights))]
    weights = [weight if any(weights) else 1 for weight in weights]
    later = [weight if any(later[:len(names)]) else 1 for weight in later[:len(names)]]
    schedule = [] if ramp is None else [(step, dict(zip(names, later)), ramp)]
    rng = np.random.default_rng(seed)
    lengths = [rng.integers(1, top + 1, 200) for top in longest[:len(names)]]
    mixture = Mixture(dict(zip(names, weights)), by="tokens", schedule=schedule, samples_per_epoch=block * 40)
    order = MixtureOrder(mixture, [200] * len(names), block=block, seed=seed, lengths=lengths)
    assert (order.plan(0).counts.sum(axis=1) == block).all()
    assert np.abs(token_drift(order)).max() <= max(longest[:len(names)])  # the documented bound


def test_a_by_tokens_schedule_checkpoint_of_the_earlier_rule_is_refused():
    mixture = Mixture({"a": 1, "b": 1}, by="tokens", schedule=[(4, {"a": 1, "b": 3})])
    order = MixtureOrder(mixture, [50, 50], block=4, seed=0, lengths=[np.ones(50), np.ones(50)])
    earlier = {key: value for key, value in mixture.describe().items() if key != "blocks"}
    with pytest.raises(ValueError, match=r"blocks: saved None, now \"each at its step's weights\""):
        order.check_saved({"declared": earlier, "names": ["a", "b"], "served": {"a": [0, 0], "b": [0, 0]}})
    assert "blocks" not in Mixture({"a": 1, "b": 1}, by="tokens").describe()  # constant weights: the same rule
