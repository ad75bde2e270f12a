"""engine/sampling/elastic.py: a sampler state saved on W ranks resumes on W' ranks; the rest of the epoch serves
every remaining row once (pad repeats fewer than W' rows, as a fresh epoch does), later epochs are a fresh run's.

Ranks are simulated by one sampler per rank, stepped together as ranks in lockstep are."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler

ROWS = 53  # prime: no number of ranks divides it, so the uneven rules are exercised
LENGTHS = np.random.default_rng(0).integers(1, 40, ROWS)
GLOBAL = 12  # rows per step across ranks (tokens: GLOBAL_TOKENS)
GLOBAL_TOKENS = 480


def plain(ranks, rows=ROWS, global_batch=GLOBAL, **options):
    return [SeededBatchSampler(rows, global_batch // ranks, shuffle=True, seed=3, num_replicas=ranks, rank=r,
                               **options) for r in range(ranks)]


def grouped(ranks, **options):
    return [LengthGroupedBatchSampler(LENGTHS, GLOBAL // ranks, seed=3, mega_batch_factor=2, num_replicas=ranks,
                                      rank=r, **options) for r in range(ranks)]


def token_budget(ranks, **options):
    return [TokenBudgetBatchSampler(LENGTHS, GLOBAL_TOKENS // ranks, seed=3, mega_batch_factor=2,
                                    num_replicas=ranks, rank=r, **options) for r in range(ranks)]


def packed(ranks, **options):
    return [PackedBatchSampler(LENGTHS, GLOBAL_TOKENS // ranks, seed=3, mega_batch_factor=2, num_replicas=ranks,
                               rank=r, **options) for r in range(ranks)]


def steps(samplers, count):
    """Step every rank ``count`` times; returns the batches of each step (one per rank) and the iterators."""
    iterators, served = [iter(s) for s in samplers], []
    for _ in range(count):
        served.append([next(iterator) for iterator in iterators])
    return served, iterators


def save(samplers, count):
    """Rows the ranks served in ``count`` steps, and the state (the same on every rank, checked)."""
    served, _ = steps(samplers, count)
    states = [s.state_dict() for s in samplers]
    assert all(state == states[0] for state in states)  # rank 0's checkpoint is every rank's
    return [row for step in served for batch in step for row in batch], states[0]


def resume(samplers, state):
    """Each rank's batches of the resumed pass."""
    for sampler in samplers:
        sampler.load_state_dict(state)
    return [list(sampler) for sampler in samplers]


def check_rest_of_epoch(served, rest, ranks, rows=ROWS, uneven="pad", whole_batches=False):
    """The resumed pass serves the rows not served yet, each once (pad: fewer than ``ranks`` repeats; drop: fewer
    than ``ranks`` left out), with the same number of batches on every rank. ``whole_batches``: a token budget
    equalizes ranks by repeating whole batches, so each distinct batch is counted once."""
    assert len({len(batches) for batches in rest}) == 1, "ranks would wait for each other"
    batches = [tuple(batch) for per_rank in rest for batch in per_rank]
    later = [row for batch in (dict.fromkeys(batches) if whole_batches else batches) for row in batch]
    remaining = set(range(rows)) - set(served)
    assert not set(later) - remaining, "a row served before the save was served again"
    if uneven == "pad":
        assert set(later) == remaining and len(later) - len(set(later)) < ranks
    else:
        assert len(later) == len(set(later)) and len(remaining - set(later)) < ranks


TOPOLOGIES = [(2, 1), (1, 2), (2, 4), (4, 2), (4, 3), (3, 4), (1, 4)]


class TestPlain:
    @pytest.mark.parametrize(("before", "after"), TOPOLOGIES)
    @pytest.mark.parametrize("stop", [1, 2, 4])
    def test_the_rest_of_the_epoch_serves_each_remaining_row_once(self, before, after, stop):
        served, state = save(plain(before), stop)
        assert len(set(served)) == stop * GLOBAL  # a prefix of whole global batches
        check_rest_of_epoch(served, resume(plain(after), state), after)

    @pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (3, 2)])
    def test_the_rest_keeps_the_epochs_global_order(self, before, after):
        order = plain(1)[0].epoch_order(0).tolist()
        served, state = save(plain(before), 2)
        assert served and sorted(served) == sorted(order[: 2 * GLOBAL])
        rest = resume(plain(after), state)
        # ranks hold equal row counts, dealt round robin: step p's rows, interleaved, are the next of the order
        by_step = [batch[j] for step in zip(*rest) for j in range(len(step[0])) for batch in step]
        assert by_step[: ROWS - 2 * GLOBAL] == order[2 * GLOBAL :]  # then the pad rule's repeats

    @pytest.mark.parametrize("uneven", ["pad", "drop"])
    @pytest.mark.parametrize("drop_last", [False, True])
    def test_uneven_and_drop_last_rules_apply_to_the_rest(self, uneven, drop_last):
        served, state = save(plain(2, uneven=uneven, drop_last=drop_last), 1)
        rest = resume(plain(4, uneven=uneven, drop_last=drop_last), state)
        if drop_last:
            assert all(len(batch) == GLOBAL // 4 for batches in rest for batch in batches)
            later = {row for batches in rest for batch in batches for row in batch}
            assert not later & set(served) and len(set(range(ROWS)) - later - set(served)) < GLOBAL
        else:
            check_rest_of_epoch(served, rest, 4, uneven=uneven)

    @pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 4)])
    def test_later_epochs_are_a_fresh_run_on_the_new_ranks(self, before, after):
        _, state = save(plain(before), 2)
        resumed, fresh = plain(after), plain(after)
        resume(resumed, state)
        for sampler in fresh:
            sampler.set_epoch(1)
        assert [list(s) for s in resumed] == [list(s) for s in fresh]
        assert [list(s) for s in resumed] == [list(s) for s in fresh]  # and the epoch after

    @pytest.mark.parametrize("make", [plain, grouped, token_budget])
    def test_len_counts_the_steps_served_before_the_resume(self, make):
        _, state = save(make(2), 2)
        resumed = make(4)
        for sampler in resumed:
            sampler.load_state_dict(state)
        count = len(resumed[0])
        assert count == 2 + len(list(resumed[0]))  # Lightning restores 2 steps done, then counts up to len()

    def test_chained_resumes_2_to_1_to_4_still_serve_each_row_once(self):
        served, state = save(plain(2), 1)
        one = plain(1)
        for sampler in one:
            sampler.load_state_dict(state)
        more, state = save(one, 2)
        assert state["served"] == [[2, 1]] and state["position"] == 2
        assert not set(more) & set(served)
        check_rest_of_epoch(served + more, resume(plain(4), state), 4)

    def test_the_same_topology_resumes_exactly_as_before(self):
        reference = [list(s) for s in plain(2)]
        _, state = save(plain(2), 2)
        assert [batches for batches in resume(plain(2), state)] == [batches[2:] for batches in reference]

    def test_a_state_saved_at_the_end_of_the_epoch_goes_on_with_the_next(self):
        samplers = plain(2)
        count = len(samplers[0])
        _, state = save(samplers, count)
        fresh = plain(4)
        for sampler in fresh:
            sampler.set_epoch(1)
        assert resume(plain(4), state) == [list(s) for s in fresh]


class TestCallersEpochs:
    """Lightning stops at max_steps mid-epoch and counts the epoch as done: a new Trainer calls set_epoch(e + 1),
    before the loaded state is applied (torchdata applies it at iter()) or after (a state applied at once)."""

    @pytest.mark.parametrize("set_epoch_first", [True, False])
    def test_the_rest_of_the_saved_epoch_comes_first_then_the_callers_epochs_follow(self, set_epoch_first):
        served, state = save(plain(2), 2)
        resumed, fresh = plain(1), plain(1)
        for sampler in resumed:
            if set_epoch_first:
                sampler.set_epoch(1)
            sampler.load_state_dict(state)
            if not set_epoch_first:
                sampler.set_epoch(1)
        rest = [list(s) for s in resumed]
        check_rest_of_epoch(served, rest, 1)
        resumed[0].set_epoch(2)  # the caller's epoch 2 is the data's epoch 1
        fresh[0].set_epoch(1)
        assert list(resumed[0]) == list(fresh[0])


class TestRefusals:
    def test_another_global_batch_names_the_per_rank_batch_to_pass(self):
        _, state = save(plain(2), 1)  # 2 ranks x 6 rows
        with pytest.raises(ValueError, match=r"global batch of 12 \(2 ranks x batch_size=6\), but this sampler's "
                                             r"is 6 \(1 ranks x batch_size=6\).*batch_size=12"):
            SeededBatchSampler(ROWS, 6, shuffle=True, seed=3).load_state_dict(state)

    def test_a_global_batch_that_does_not_divide_among_the_ranks(self):
        _, state = save(plain(2), 1)
        with pytest.raises(ValueError, match="12 does not divide among 5 ranks"):
            SeededBatchSampler(ROWS, 2, shuffle=True, seed=3, num_replicas=5, rank=0).load_state_dict(state)

    def test_a_position_past_the_saved_epoch_is_refused(self):
        _, state = save(plain(2), 1)
        with pytest.raises(ValueError, match="position should be at most the 5 batches"):
            plain(1)[0].load_state_dict({**state, "position": 9})

    def test_malformed_served_segments_are_refused(self):
        _, state = save(plain(2), 1)
        with pytest.raises(TypeError, match="served should be a list of"):
            plain(1)[0].load_state_dict({**state, "served": 3})
        with pytest.raises(ValueError, match="does not divide its global batch"):
            plain(1)[0].load_state_dict({**state, "served": [[5, 1]]})


class TestLengthAware:
    @pytest.mark.parametrize("make", [grouped, token_budget, packed])
    @pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (4, 2), (2, 4)])
    def test_the_rest_of_the_epoch_serves_each_remaining_row_once(self, make, before, after):
        served, state = save(make(before), 2)
        assert len(set(served)) == len(served)
        check_rest_of_epoch(served, resume(make(after), state), after, whole_batches=make is not grouped)

    @pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1)])
    def test_packed_bins_keep_the_per_rank_budget_of_the_new_ranks(self, before, after):
        _, state = save(packed(before), 1)
        for batches in resume(packed(after), state):
            assert all(int(LENGTHS[b].sum()) <= GLOBAL_TOKENS // after for b in batches)

    @pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1)])
    def test_token_budget_keeps_the_global_budget(self, before, after):
        _, state = save(token_budget(before), 1)
        for batches in resume(token_budget(after), state):
            assert all(len(b) * int(LENGTHS[b].max()) <= GLOBAL_TOKENS // after for b in batches)

    def test_grouped_later_epochs_are_a_fresh_run_and_the_same_topology_is_exact(self):
        _, state = save(grouped(2), 1)
        resumed, fresh = grouped(4), grouped(4)
        resume(resumed, state)
        for sampler in fresh:
            sampler.set_epoch(1)
        assert [list(s) for s in resumed] == [list(s) for s in fresh]
        reference = [list(s) for s in grouped(2)]
        assert resume(grouped(2), state) == [batches[1:] for batches in reference]

    def test_another_global_token_budget_is_refused(self):
        _, state = save(token_budget(2), 1)
        with pytest.raises(ValueError, match="max_tokens=480"):
            TokenBudgetBatchSampler(LENGTHS, 240, seed=3, mega_batch_factor=2).load_state_dict(state)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 60), global_batch=st.sampled_from([4, 6, 12]), data=st.data())
def test_any_topology_change_serves_each_remaining_row_once(rows, global_batch, data):
    divisors = [w for w in (1, 2, 3, 4, 6) if global_batch % w == 0]
    before, after = data.draw(st.sampled_from(divisors)), data.draw(st.sampled_from(divisors))
    samplers = plain(before, rows=rows, global_batch=global_batch)
    stop = data.draw(st.integers(0, len(samplers[0])))
    served, state = save(samplers, stop)
    rest = resume(plain(after, rows=rows, global_batch=global_batch), state)
    if stop == len(samplers[0]):  # the epoch was over: the next one is whole
        assert {row for batches in rest for batch in batches for row in batch} == set(range(rows))
    elif before == after:  # the same ranks: exactly the uninterrupted run's rest, the original pad rule included
        assert rest == [list(s)[stop:] for s in plain(after, rows=rows, global_batch=global_batch)]
    else:
        check_rest_of_epoch(served, rest, after, rows=rows)
