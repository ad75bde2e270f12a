"""A sampler state is checked number by number before any of it is used: a crafted or corrupted state (more ranks
than rows in a step, a position past its epoch, absurd sizes) is refused with a ValueError or TypeError naming the
key, the value and the allowed range, from the sampler, the loader and the module alike; never a MemoryError or an
error from deep in numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import UniversalDataModule
from engine.core.compat import sampler_state_of
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler
from task_spec import TaskSpec

ROWS = 40
LENGTHS = np.random.default_rng(1).integers(1, 30, ROWS)
MAKERS = {
    "plain": lambda ranks: SeededBatchSampler(ROWS, 8 // ranks, shuffle=True, seed=5, num_replicas=ranks),
    "grouped": lambda ranks: LengthGroupedBatchSampler(LENGTHS, 8 // ranks, seed=5, mega_batch_factor=2,
                                                       num_replicas=ranks),
    "token_budget": lambda ranks: TokenBudgetBatchSampler(LENGTHS, 120 // ranks, seed=5, mega_batch_factor=2,
                                                          num_replicas=ranks),
    "packed": lambda ranks: PackedBatchSampler(LENGTHS, 120 // ranks, seed=5, mega_batch_factor=2,
                                               num_replicas=ranks),
}


def saved_state(kind, ranks=2, steps=2, resumed_from=None):
    """The state of ``kind``'s rank-0 sampler on ``ranks`` ranks after ``steps`` batches (of a pass resumed from a
    state saved on ``resumed_from`` ranks, so that it holds served parts)."""
    sampler = MAKERS[kind](ranks)
    if resumed_from is not None:
        sampler.load_state_dict(saved_state(kind, resumed_from, 1))
    list(itertools.islice(iter(sampler), steps))
    return sampler.state_dict()


class TestNumbersOutOfRange:
    @pytest.mark.parametrize("replicas", [3, 9, 1000, 10**12])
    def test_more_ranks_than_the_global_batch_holds_or_a_count_that_does_not_divide_it(self, replicas):
        state = {**saved_state("plain"), "num_replicas": replicas}
        with pytest.raises(ValueError, match=rf"sampler state's num_replicas should divide its global_batch=8 "
                                             rf"\(every rank serves a whole share of each step\), but got "
                                             rf"num_replicas={replicas}"):
            MAKERS["plain"](2).load_state_dict(state)

    @pytest.mark.parametrize(("key", "value", "allowed"), [
        ("epoch", 2**63, r"a non-negative integer \(below 2\*\*63\)"),
        ("epoch_offset", -1, r"a non-negative integer \(below 2\*\*63\)"),
        ("position", 10**9, r"at most the 5 batches of epoch 0"),
        ("global_batch", 0, r"a positive integer"),
    ])
    def test_each_number_names_its_key_value_and_range(self, key, value, allowed):
        state = {**saved_state("plain"), key: value}
        with pytest.raises(ValueError, match=rf"sampler state's {key} should be {allowed}.*, but got {key}={value}"):
            MAKERS["plain"](2).load_state_dict(state)

    def test_a_served_part_past_the_batches_it_had(self):
        state = saved_state("plain", resumed_from=4)
        assert state["served"] == [[4, 1]]
        state["served"] = [[4, 10**6]]
        with pytest.raises(ValueError, match=r"sampler state's served position should be at most the 5 batches each "
                                             r"of 4 ranks had in epoch 0, but got served position=1000000"):
            MAKERS["plain"](2).load_state_dict(state)

    @pytest.mark.parametrize("value", [1.5, "3", None, True])
    def test_a_number_of_another_type_is_a_type_error(self, value):
        with pytest.raises(TypeError, match=r"sampler state's num_replicas should be a positive integer"):
            MAKERS["plain"](2).load_state_dict({**saved_state("plain"), "num_replicas": value})

    @pytest.mark.parametrize("workers", [0, 2])
    def test_the_loader_and_the_module_refuse_it_when_it_is_loaded(self, workers):
        dm = UniversalDataModule([torch.arange(3, 4 + n % 7) for n in range(ROWS)], task_spec=TaskSpec.lm_tiny(),
                                 batch_size=4, num_workers=workers)
        loader = dm.train_dataloader()
        next(iter(loader))
        state = dm.data_state()
        sampler_state_of(state["train_loader"])["num_replicas"] = 10**12
        refused = r"sampler state's num_replicas should divide its global_batch=4 .*, but got num_replicas=10{12}"
        with pytest.raises(ValueError, match=refused):
            loader.load_state_dict(state["train_loader"])
        with pytest.raises(ValueError, match=refused):
            dm.load_state_dict(state)


def test_the_modules_own_numbers_are_checked_too():
    dm = UniversalDataModule([torch.arange(3, 4 + n % 7) for n in range(ROWS)], task_spec=TaskSpec.lm_tiny(),
                             batch_size=4)
    state = {**dm.data_state(), "world_size": -1, "batch_size": -4}  # the same product as 1 x 4
    with pytest.raises(ValueError, match=r"the checkpoint's data state's world_size should be a positive integer "
                                         r"\(below 2\*\*63\), but got world_size=-1"):
        dm.load_state_dict(state)


NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=20),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64 + 1, 10**12]),
    st.integers(min_value=-5, max_value=2**40).map(np.int64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([None, True, False, "2", [], [1]]),
)


REFUSALS = ("sampler state", "row ")
"""How the engine's refusals of a loaded state begin: a number of the state, or (packing on more ranks, each with a
smaller budget) a row longer than the per-rank budget."""


def numeric_paths(state):
    """Where a number sits in ``state``: a top-level key, or (``served``, part, field)."""
    paths = [(key,) for key, value in state.items() if isinstance(value, int)]
    return paths + [("served", i, j) for i, part in enumerate(state.get("served", ())) for j in range(2)]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(MAKERS)), resumed_from=st.sampled_from([None, 1, 4]), steps=st.integers(0, 4),
       data=st.data())
def test_a_mutated_number_loads_and_resumes_or_is_refused(kind, resumed_from, steps, data):
    state = saved_state(kind, steps=steps, resumed_from=resumed_from)
    path = data.draw(st.sampled_from(numeric_paths(state)), label="path")
    value = data.draw(NUMBERS, label="value")
    mutated = {**state, "served": [list(part) for part in state.get("served", ())]}
    if len(path) == 1:
        mutated[path[0]] = value
    else:
        mutated["served"][path[1]][path[2]] = value
    sampler = MAKERS[kind](2)
    try:
        sampler.load_state_dict(mutated)
        assert len(sampler) >= 0
        batches = [list(batch) for batch in itertools.islice(iter(sampler), 200)]
    except (ValueError, TypeError) as error:  # the engine's own refusals, not an error from deep in numpy
        assert str(error).startswith(REFUSALS), error
        return
    assert all(batch and all(0 <= row < ROWS for row in batch) for batch in batches)
    if path in (("epoch",), ("position",), ("epoch_offset",)) and not mutated.get("served"):
        reference = MAKERS[kind](2)  # the batches the loaded epoch and position name, read from a fresh sampler
        epoch, position = int(mutated["epoch"]), int(mutated["position"])
        epoch_batches = reference.epoch_batches(epoch)
        expected = epoch_batches[position:] if position < len(epoch_batches) else reference.epoch_batches(epoch + 1)
        assert batches == [list(batch) for batch in expected]
