"""States the samplers and the module save in the situations a resume must handle, and the batches each state
serves next, kept in ``saved_states.json``: every later engine must load each state and serve those batches.

Each case runs ``before`` on fresh samplers (or a module), saves rank 0's state, then runs ``after`` on new ones
that load it. Events: ``take N`` (N more batches of the live pass, starting one if there is none; the pass may
end first), ``end`` (the rest of the live pass), ``pin E`` (``set_epoch(E)``), ``load`` (the saved state, where
it is loaded; at the start when absent), and in ``before`` only, ``resume CASE`` (load that case's saved state).

Write the file again only when the saved format changes on purpose (with ``STATE_VERSION``):
``python -m tests.engine.sampling.saved_states``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine import UniversalDataModule
from engine.sampling.eval import ShardedEvalBatchSampler
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler
from task_spec import TaskSpec

FIXTURE = Path(__file__).with_suffix(".json")
ROWS, GLOBAL, GLOBAL_TOKENS = 37, 8, 240
LENGTHS = np.random.default_rng(7).integers(1, 40, ROWS)

SAMPLERS = {
    "plain": lambda ranks, rank: SeededBatchSampler(ROWS, GLOBAL // ranks, shuffle=True, seed=5, num_replicas=ranks,
                                                    rank=rank),
    "grouped": lambda ranks, rank: LengthGroupedBatchSampler(LENGTHS, GLOBAL // ranks, seed=5, mega_batch_factor=2,
                                                             num_replicas=ranks, rank=rank),
    "token_budget": lambda ranks, rank: TokenBudgetBatchSampler(LENGTHS, GLOBAL_TOKENS // ranks, seed=5,
                                                                mega_batch_factor=2, num_replicas=ranks, rank=rank),
    "packed": lambda ranks, rank: PackedBatchSampler(LENGTHS, GLOBAL_TOKENS // ranks, seed=5, mega_batch_factor=2,
                                                     num_replicas=ranks, rank=rank),
    "eval": lambda ranks, rank: ShardedEvalBatchSampler(ROWS, GLOBAL // ranks, seed=5, num_replicas=ranks, rank=rank),
}

SAMPLER_CASES: dict[str, dict[str, Any]] = {
    "fresh": dict(sampler="plain", before=[], after=["take 7"]),
    "mid_epoch": dict(sampler="plain", before=["take 3"], after=["take 7"]),
    "mid_second_epoch": dict(sampler="plain", before=["end", "take 2"], after=["take 7"]),
    "after_the_loop_ended": dict(sampler="plain", before=["end"], after=["take 7"]),
    "last_batch_handed_out": dict(sampler="plain", before=["take 5"], after=["take 7"]),
    "last_batch_handed_out_then_the_same_epoch_pinned": dict(
        sampler="plain", before=["take 5"], after=["pin 0", "load", "end", "pin 1", "take 3"]),
    "last_batch_handed_out_then_the_next_epoch_pinned": dict(
        sampler="plain", before=["take 5"], after=["pin 1", "load", "take 3"]),
    "after_set_epoch": dict(sampler="plain", before=["pin 2"], after=["take 3"]),
    "after_set_epoch_pinned_again": dict(sampler="plain", before=["pin 2"], after=["pin 2", "load", "take 3"]),
    "after_set_epoch_on_an_abandoned_pass": dict(sampler="plain", before=["take 2", "pin 1"], after=["take 3"]),
    "mid_epoch_then_a_checkpoint_resume": dict(
        sampler="plain", before=["take 3"], after=["pin 0", "load", "end", "pin 1", "take 2"]),
    "mid_epoch_then_max_steps_pins_loaded_first": dict(
        sampler="plain", before=["take 3"], after=["load", "pin 1", "end", "pin 2", "take 2"]),
    "mid_epoch_then_max_steps_pins_first": dict(
        sampler="plain", before=["take 3"], after=["pin 1", "load", "end", "pin 2", "take 2"]),
    "after_a_max_steps_resume": dict(
        sampler="plain", before=["resume mid_epoch", "pin 1", "take 1"], after=["load", "pin 2", "end", "pin 3",
                                                                               "take 2"]),
    "after_a_max_steps_resume_pinned_back": dict(
        sampler="plain", before=["resume mid_epoch", "pin 1", "take 1"], after=["pin 0", "load", "take 3"]),
    "elastic_two_ranks": dict(sampler="plain", ranks=2, before=["take 2"], after_ranks=1, after=["end", "take 2"]),
    "elastic_two_ranks_on_four": dict(sampler="plain", ranks=2, before=["take 2"], after_ranks=4,
                                      after=["end", "take 2"]),
    "elastic_two_ranks_on_two": dict(sampler="plain", ranks=2, before=["take 2"], after_ranks=2, after=["take 4"]),
    "elastic_chained": dict(sampler="plain", ranks=1, before=["resume elastic_two_ranks", "take 1"], after_ranks=4,
                            after=["end", "take 1"]),
    "elastic_last_batch_handed_out": dict(sampler="plain", ranks=2, before=["take 3"], after_ranks=1,
                                          after=["take 3"]),
    "grouped_mid_epoch": dict(sampler="grouped", before=["take 2"], after=["take 7"]),
    "grouped_elastic": dict(sampler="grouped", ranks=2, before=["take 1"], after_ranks=4, after=["end", "take 1"]),
    "token_budget_mid_epoch": dict(sampler="token_budget", before=["take 2"], after=["take 7"]),
    "token_budget_elastic": dict(sampler="token_budget", ranks=4, before=["take 1"], after_ranks=2,
                                 after=["end", "take 1"]),
    "packed_mid_epoch": dict(sampler="packed", before=["take 2"], after=["take 7"]),
    "eval_mid_pass": dict(sampler="eval", before=["take 2"], after=["take 7"]),
}

SPEC = TaskSpec.lm_tiny()
MODULE_CASES: dict[str, dict[str, Any]] = {
    "fresh": dict(options={}, before=[], after=["take 3"]),
    "mid_epoch": dict(options={}, before=["take 2"], after=["take 7"]),
    "after_the_loop_ended": dict(options={}, before=["end"], after=["take 6"]),
    "mid_second_epoch": dict(options={}, before=["end", "take 1"], after=["take 6"]),
    "workers_mid_epoch": dict(options={"num_workers": 2}, before=["take 2"], after=["take 7"]),
    "workers_mid_epoch_on_no_workers": dict(options={"num_workers": 2}, before=["take 2"],
                                            after_options={"num_workers": 0}, after=["take 7"]),
    "threads_mid_epoch": dict(options={"num_threads": 1}, before=["take 2"], after=["take 7"]),
    "token_budget_mid_epoch": dict(options={"batching": "token_budget", "max_tokens": 64}, before=["take 2"],
                                   after=["take 7"]),
    "after_a_max_steps_resume": dict(options={}, before=["resume mid_epoch", "pin 1", "take 1"],
                                     after=["pin 2", "end", "pin 3", "take 2"]),
}


def module_rows() -> list[torch.Tensor]:
    """45 rows whose every token is 2 + the row's index, so a causal LM batch names its rows."""
    lengths = np.random.default_rng(3).integers(3, 20, 45)
    return [torch.full((int(n),), 2 + i) for i, n in enumerate(lengths)]


def make_module(options: dict[str, Any]) -> UniversalDataModule:
    return UniversalDataModule(module_rows(), task_spec=SPEC, batch_size=8, val_split=5, seed=11, **options)


class Player:
    """Runs events on one rank's sampler (or a module's train loader), recording what it serves."""

    def __init__(self, target: Any, *, module: bool) -> None:
        self.target, self.module, self.live, self.served = target, module, None, []

    @property
    def loader(self) -> Any:
        return self.target.train_dataloader() if self.module else self.target

    def draw(self, count: int | None) -> None:
        if self.live is None:
            self.live = iter(self.loader)
        while count is None or count > 0:
            batch = next(self.live, None)
            if batch is None:
                self.live = None
                self.served.append("end")
                return
            self.served.append(self.record(batch))
            count = None if count is None else count - 1

    def record(self, batch: Any) -> Any:
        if self.module:
            return (batch["input_ids"][:, 0] - 2).tolist()
        return [list(batch), batch.epoch, batch.rng_seed]

    def pin(self, epoch: int) -> None:
        (self.loader.batch_sampler if self.module else self.target).set_epoch(epoch)

    def load(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(json.loads(json.dumps(state)))


def play(players: list[Player], events: list[str], state: dict[str, Any] | None, saved: dict[str, Any]) -> None:
    """Run ``events`` on every rank in lockstep; ``state`` is loaded at ``load`` (first, if absent)."""
    if state is not None and "load" not in events:
        events = ["load", *events]
    for event in events:
        name, _, argument = event.partition(" ")
        for player in players:
            if name == "take":
                player.draw(int(argument))
            elif name == "end":
                player.draw(None)
            elif name == "pin":
                player.pin(int(argument))
            elif name == "load":
                player.load(state)
            elif name == "resume":
                player.load(saved[argument]["state"])
            else:
                raise ValueError(f"event should be take, end, pin, load or resume, but got {event!r}")


def saved_sampler_state(case: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The state rank 0 saves after ``case``'s ``before`` (``saved``: earlier cases, for ``resume``)."""
    make, ranks = SAMPLERS[case["sampler"]], case.get("ranks", 1)
    players = [Player(make(ranks, rank), module=False) for rank in range(ranks)]
    play(players, case["before"], None, saved)
    states = [player.target.state_dict() for player in players]
    assert all(state == states[0] for state in states), "every rank saves the same state"
    return states[0]


def serves_next(case: dict[str, Any], state: dict[str, Any]) -> list[Any]:
    """Each rank's batches after loading ``state`` on ``after_ranks`` new samplers and running ``after``."""
    make, ranks = SAMPLERS[case["sampler"]], case.get("after_ranks", case.get("ranks", 1))
    players = [Player(make(ranks, rank), module=False) for rank in range(ranks)]
    play(players, case["after"], state, {})
    return [player.served for player in players]


def saved_module_state(case: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The state a module saves after ``case``'s ``before``."""
    player = Player(make_module(case["options"]), module=True)
    play([player], case["before"], None, saved)
    return player.target.data_state()


def module_serves_next(case: dict[str, Any], state: dict[str, Any]) -> list[Any]:
    """The rows of each batch a new module serves after loading ``state`` and running ``after``."""
    player = Player(make_module(case.get("after_options", case["options"])), module=True)
    play([player], case["after"], state, {})
    return player.served


def record() -> dict[str, Any]:
    """Every case's saved state and the batches it served next, with this engine."""
    samplers: dict[str, Any] = {}
    for name, case in SAMPLER_CASES.items():
        state = saved_sampler_state(case, samplers)
        samplers[name] = {"state": state, "next": serves_next(case, state)}
    modules: dict[str, Any] = {}
    for name, case in MODULE_CASES.items():
        state = saved_module_state(case, modules)
        modules[name] = {"state": state, "next": module_serves_next(case, state)}
    return {"samplers": samplers, "modules": modules}


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {FIXTURE}")
