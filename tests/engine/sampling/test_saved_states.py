"""States saved by earlier engines still load and serve exactly the batches they served then, and the engine still
saves them the same way (``saved_states.json``, written by ``tests/engine/sampling/saved_states.py``)."""

import json

import pytest

from engine.loading.state import STATE_VERSION, sampler_state_of
from tests.engine.sampling.saved_states import (
    FIXTURE,
    MODULE_CASES,
    SAMPLER_CASES,
    module_serves_next,
    saved_module_state,
    saved_sampler_state,
    serves_next,
)

SAVED = json.loads(FIXTURE.read_text())


def comparable(state):
    """A module state as JSON, with the loader's part reduced to the sampler's: torchdata's part also holds the
    seed it drew for its worker processes, which differs every run."""
    state = json.loads(json.dumps(state))
    return {**state, "train_loader": state["train_loader"] and sampler_state_of(state["train_loader"])}


def test_every_case_is_recorded_at_this_version():
    assert sorted(SAVED["samplers"]) == sorted(SAMPLER_CASES)
    assert sorted(SAVED["modules"]) == sorted(MODULE_CASES)
    assert {saved["state"]["version"] for saved in SAVED["modules"].values()} == {STATE_VERSION}


@pytest.mark.parametrize("name", list(SAMPLER_CASES))
def test_a_saved_sampler_state_serves_the_same_batches_and_is_saved_the_same(name):
    case, saved = SAMPLER_CASES[name], SAVED["samplers"][name]
    assert serves_next(case, saved["state"]) == saved["next"]
    assert saved_sampler_state(case, SAVED["samplers"]) == saved["state"]


@pytest.mark.parametrize("name", list(MODULE_CASES))
def test_a_saved_module_state_serves_the_same_batches_and_is_saved_the_same(name):
    case, saved = MODULE_CASES[name], SAVED["modules"][name]
    assert module_serves_next(case, saved["state"]) == saved["next"]
    assert comparable(saved_module_state(case, SAVED["modules"])) == comparable(saved["state"])
