"""engine/sampling/position.py: the sampler's resume state as one value; each transition changes what its row of
the table says, and saving and loading at any point of a run continues with the uninterrupted run's batches."""

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.length import TokenBudgetBatchSampler
from engine.sampling.position import PassState
from engine.sampling.seeded import SeededBatchSampler
from tests.engine.sampling.saved_states import LENGTHS


class TestTransitions:
    def test_a_pin_of_another_epoch_moves_there_and_forgets_what_was_served_elsewhere(self):
        state = PassState.at(2, 3, served=((2, 1),)).pinned(4)
        assert state == PassState(epoch=4, position=3, resume=0, pinned_epoch=4)  # position: until a pass starts

    def test_a_pin_of_the_same_epoch_keeps_a_loaded_start_and_ends_a_begun_pass(self):
        assert PassState.at(2, 3).pinned(2).resume == 3
        assert PassState.at(2, 3).started().pinned(2) == PassState(epoch=2, position=3, resume=0, pinned_epoch=2)

    def test_a_pin_past_a_pass_loaded_part_way_only_shifts_the_callers_numbering(self):
        loaded = PassState().loaded(PassState.at(1, 2), count=5)
        assert loaded.loaded_epoch == 1
        assert loaded.pinned(2) == PassState(epoch=1, position=2, resume=2, offset=1, pinned_epoch=2)
        assert loaded.pinned(2).pinned(3).epoch == 2  # the caller's next epoch is the data's next

    def test_a_pin_below_the_offset_restarts_the_callers_numbering(self):
        assert PassState(epoch=3, offset=2).pinned(1) == PassState(epoch=1, resume=0, pinned_epoch=1)

    def test_a_pass_starts_where_resume_says_or_at_the_following_epoch(self):
        assert PassState.at(1, 2).started() == PassState(epoch=1, position=2, resume=None)
        assert PassState(epoch=1, position=4, resume=None, served=((2, 1),)).started() == PassState(
            epoch=2, resume=None)

    def test_starting_keeps_the_loaded_epoch_only_for_the_loaded_pass(self):
        loaded = PassState().loaded(PassState.at(1, 2), count=5)
        assert loaded.started().loaded_epoch == 1
        assert loaded.started().finished(1).loaded_epoch == 1  # a prefetch may end it before the caller pins
        assert loaded.started().started().loaded_epoch is None

    def test_advancing_and_finishing(self):
        running = PassState().started().advanced(3)
        assert running.position == 3 and running.as_state() == {"epoch": 0, "position": 3, "epoch_offset": 0}
        assert running.finished(0) == PassState(epoch=1, position=0, resume=0)

    @pytest.mark.parametrize(("pinned", "saved", "expected"), [
        (None, PassState.at(1, 2), replace(PassState.at(1, 2), loaded_epoch=1)),  # part-way, nothing pinned
        (None, PassState.at(1, 5), PassState.at(2, 0)),  # the last batch was handed out: the next epoch
        (1, PassState.at(1, 5), replace(PassState.at(1, 5), pinned_epoch=1)),  # that epoch pinned: the empty rest
        (2, PassState.at(1, 2), replace(PassState.at(1, 2, offset=1), pinned_epoch=2)),  # counted done: goes on
        (3, PassState.at(1, 0), replace(PassState.at(3, 0), pinned_epoch=3)),  # a later epoch pinned at a boundary
        (0, PassState.at(1, 2), replace(PassState.at(1, 2), pinned_epoch=0)),  # an earlier pin: the saved pass
    ])
    def test_a_loaded_state_is_read_against_the_pinned_epoch(self, pinned, saved, expected):
        before = PassState() if pinned is None else PassState().pinned(pinned)
        assert before.loaded(saved, count=5) == expected

    def test_the_saved_part_round_trips_and_is_checked(self):
        state = PassState.at(3, 2, offset=1)
        assert PassState.from_state(state.as_state()) == state
        assert PassState.from_state({"epoch": 3, "position": 2}) == PassState.at(3, 2)
        with pytest.raises(ValueError, match="sampler state's epoch_offset should be a non-negative integer"):
            PassState.from_state({"epoch": 3, "position": 2, "epoch_offset": -1})


SAMPLERS = {
    "plain": lambda: SeededBatchSampler(8, 3, shuffle=True, seed=1),
    "token_budget": lambda: TokenBudgetBatchSampler(LENGTHS[:12], 90, seed=1, mega_batch_factor=2),
}
RESUME_ORDERS = ("load, pin, iter", "pin, load at iter", "load at iter, pin")
"""How a resumed loop meets the state: loaded at once; applied at ``iter()`` after the pin (torchdata); applied at
an ``iter()`` made before the pin, the pass already drawing batches for a prefetch (Lightning's first epoch)."""


class Caller:
    """A training loop over a sampler: a plain loop (iterating again starts the next epoch) or one that pins its
    own epoch count before every pass, as Lightning does. It records the batches it is served."""

    def __init__(self, make, pins):
        self.make, self.pins, self.sampler, self.epoch = make, pins, make(), 0
        self.batches, self.prefetched, self.seen = None, [], []
        self.pending, self.order, self.prefetch = None, RESUME_ORDERS[0], 0
        self.resumed = self.cut_short = False

    def start(self):
        """A new pass: pin the caller's epoch and iterate, meeting a state not applied yet as ``order`` says."""
        state, self.pending, self.cut_short = self.pending, None, False
        if state is not None and self.order == "load at iter, pin":
            self.sampler.load_state_dict(state)
            self.batches = iter(self.sampler)
            drawn = (next(self.batches, None) for _ in range(self.prefetch))
            self.prefetched = [batch for batch in drawn if batch is not None]
            self.sampler.set_epoch(self.epoch)
            return
        if self.pins:
            self.sampler.set_epoch(self.epoch)
        if state is not None:
            self.sampler.load_state_dict(state)
        self.batches = iter(self.sampler)

    def step(self):
        """Take the next batch of the pass, if one is under way."""
        self.resumed = False
        if self.batches is None:
            return
        batch = self.prefetched.pop(0) if self.prefetched else next(self.batches, None)
        if batch is None:
            self.batches, self.epoch = None, self.epoch + 1
        else:
            self.seen.append((list(batch), batch.epoch, batch.rng_seed))

    def cut(self):
        """End the epoch early and count it done (a pinning caller's ``limit_train_batches``)."""
        if self.batches is not None:
            self.batches, self.prefetched, self.epoch, self.cut_short = None, [], self.epoch + 1, True

    def save_and_resume(self, order, prefetch, max_steps):
        """Save, then go on in a new process: a new sampler meets the state as ``order`` says, and a pass in
        progress continues. ``max_steps``: the run stopped part-way through a pass, which a pinning caller counts
        as finished, so from now on it pins one epoch further than the uninterrupted run."""
        state = self.pending or json.loads(json.dumps(self.sampler.state_dict()))  # a loader saves what it holds
        count, live = len(self.sampler), self.batches is not None
        self.sampler, self.batches, self.order, self.prefetch = self.make(), None, order, prefetch
        if self.pins and order != "load, pin, iter":
            self.pending = state
        else:
            self.sampler.load_state_dict(state)
        if live:
            self.epoch += int(self.pins and max_steps and 0 < state["position"] < count)
            self.start()
        self.resumed = live


def play(make, pins, events):
    """The batches of ``events`` run uninterrupted, and run with each ``save`` event saving and resuming."""
    reference, resumed = Caller(make, pins), Caller(make, pins)
    for event, *options in events:
        if event == "save":
            # A pass cut short and saved reads as a run stopped at max_steps; a loader with batches drawn ahead
            # saves the position of those it delivered, which the sampler alone does not know.
            if resumed.cut_short or resumed.prefetched:
                continue
            if resumed.batches is not None and resumed.sampler.state_dict()["position"] == len(resumed.sampler):
                reference.step()  # the last batch was served: the loop's pass ends with no other
                resumed.batches, resumed.epoch = None, resumed.epoch + 1
            resumed.save_and_resume(*options)
            continue
        if event in ("pass", "cut") and resumed.resumed:  # a resumed loop goes on with its pass first
            reference.step()
            resumed.step()
        for caller in (reference, resumed):
            if event == "pass":
                if pins:
                    caller.cut()
                caller.start()
                caller.step()
            elif event == "next":
                for _ in range(*options):
                    caller.step()
            elif event == "cut" and pins:
                caller.cut()
    return reference.seen, resumed.seen


RESUMES = [(order, prefetch, max_steps) for order in RESUME_ORDERS for prefetch in (0, 2) for max_steps in (False, True)
           if prefetch == 0 or order == "load at iter, pin"]
EVENTS = st.lists(st.one_of(st.just(("pass",)), st.just(("cut",)), st.tuples(st.just("next"), st.integers(1, 3)),
                            st.sampled_from(RESUMES).map(lambda resume: ("save", *resume))), max_size=12)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(sampler=st.sampled_from(sorted(SAMPLERS)), pins=st.booleans(), events=EVENTS)
def test_saving_and_resuming_anywhere_continues_with_the_uninterrupted_batches(sampler, pins, events):
    for point in range(len(events) + 1):
        for resume in RESUMES if pins else RESUMES[:1]:  # a plain loop meets a state one way
            reference, resumed = play(SAMPLERS[sampler], pins, [*events[:point], ("save", *resume), *events[point:]])
            assert resumed == reference, (point, resume)
