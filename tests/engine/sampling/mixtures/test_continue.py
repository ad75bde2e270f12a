"""``Mixture(on_change='continue')``: a checkpoint of another mixture goes on in its epoch. No row served in the
epoch is served again, the rest follows the new weights, a new source joins with all its rows, a removed one
stops, and a state saved after the change resumes exactly, on any number of ranks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Mixture
from engine.sampling.mixtures.order import MixtureOrder
from engine.sampling.mixtures.plan import Draws
from engine.sampling.seeded import SeededBatchSampler

SEED, BATCH = 5, 8
"""The seed, and the global batch: one step of every rank together, one block of the mixture."""


class Ranks(list):
    """The samplers of every rank, each with its live pass (a new pass starts once the last one ended)."""

    iterators: list | None = None


def lengths_of(name: str, size: int) -> np.ndarray:
    """Token lengths of a source's rows: 1 to 9, seeded by the source's name."""
    return np.random.default_rng(sum(map(ord, name))).integers(1, 10, size)


def samplers(mixture: Mixture, sizes: dict[str, int], replicas: int = 1) -> Ranks:
    """One plain sampler per rank over sources of ``sizes`` (in the order of the mixture's names)."""
    made = Ranks()
    for rank in range(replicas):
        order = MixtureOrder(mixture, [sizes[name] for name in mixture.names], block=BATCH, seed=SEED,
                             served_prefix=True, lengths=[lengths_of(name, sizes[name]) for name in mixture.names])
        made.append(SeededBatchSampler(order.size, BATCH // replicas, order=order, num_replicas=replicas, rank=rank,
                                       seed=SEED))
    return made


def named(sampler: SeededBatchSampler, rows: list[int]) -> list[tuple[str, int]]:
    """Rows of the mixed source as (source name, row of the source): comparable across mixtures."""
    order = sampler.mixture
    which = order.source_of(np.asarray(rows, dtype=np.int64))
    return [(order.mixture.names[s], int(row - order.offsets[s])) for s, row in zip(which.tolist(), rows)]


def take(ranks: Ranks, steps: int | None) -> list[list[tuple[str, int]]]:
    """``steps`` steps (None: the rest of the pass) of every rank, each step as all ranks' rows by name."""
    if ranks.iterators is None:
        ranks.iterators = [iter(one) for one in ranks]
    served = []
    while steps is None or len(served) < steps:
        batches = [next(iterator, None) for iterator in ranks.iterators]
        if all(batch is None for batch in batches):
            ranks.iterators = None
            break
        served.append([row for one, batch in zip(ranks, batches) if batch is not None for row in named(one, batch)])
    return served


def loaded(mixture: Mixture, sizes: dict[str, int], state: dict, replicas: int = 1) -> Ranks:
    ranks = samplers(mixture, sizes, replicas)
    for one in ranks:
        one.load_state_dict(state)
    return ranks


@settings(max_examples=40, deadline=None)
@given(old=st.lists(st.integers(1, 9), min_size=2, max_size=3), new=st.lists(st.integers(0, 9), min_size=2,
                                                                             max_size=3),
       before=st.integers(0, 12), replicas=st.sampled_from([1, 2]), later=st.sampled_from([1, 2]),
       blocks=st.integers(3, 11))
def test_the_rest_of_the_epoch_serves_unserved_rows_at_the_new_weights(old, new, before, replicas, later, blocks):
    """Sources s0.. of the saved mixture, t-named sources of the new one beside the kept s-names: kept sources go
    on with their own draws, a new one joins, a removed one stops; every source is large enough never to wrap."""
    spe = blocks * BATCH  # whole steps: no rank's last batch is padded with a row of another
    if sum(new) == 0:
        new = [1] + new[1:]
    old_mix = Mixture({f"s{i}": w for i, w in enumerate(old)}, samples_per_epoch=spe)
    kept = [f"s{i}" for i in range(min(len(old), len(new)) - 1)]  # the last old source is left out
    new_names = kept + [f"t{i}" for i in range(len(new) - len(kept))]
    new_mix = Mixture(dict(zip(new_names, new)), samples_per_epoch=spe, on_change="continue")
    sizes = dict.fromkeys(list(old_mix.names) + new_names, 100)
    before = min(before, (spe - 1) // (BATCH))  # the saved epoch not over yet
    first = samplers(old_mix, sizes, replicas)
    served = take(first, before)
    state = first[0].state_dict()
    ranks = loaded(new_mix, sizes, state, later)
    assert len(ranks[0]) == len(served) + len(ranks[0]._batches(0, ()))  # the epoch's steps, those served too
    rest = take(ranks, None)
    epoch = [row for step in served + rest for row in step]
    assert len(epoch) == len(set(epoch)) == spe  # no row twice, none lost: the epoch's rows
    for name in set(old_mix.names) | set(new_names):  # each source's rows: its seeded draws, in turn
        rows = [row for source, row in epoch if source == name]
        assert sorted(rows) == sorted(Draws(SEED, name, 100, 0, None, None).rows(len(rows)).tolist())
    removed = set(old_mix.names) - set(new_names)
    assert not [row for step in rest for row in step if row[0] in removed]
    weights = np.array([new_mix.weights[name] for name in new_names])
    counts = np.array([[sum(row[0] == name for row in step) for name in new_names] for step in rest])
    counts = counts[:sum(len(step) == BATCH for step in rest)]  # the short last step takes what is left
    running = np.cumsum(counts, axis=0)
    targets = np.arange(1, len(counts) + 1)[:, None] * BATCH * weights[None, :]
    assert len(counts) == 0 or np.abs(running - targets).max() < 1  # within a row of the new shares, every step
    assert sum(len(step) for step in take(ranks, None)) == spe  # the next epoch: the new mixture's, whole


def test_served_counts_carry_on_and_a_state_saved_after_the_change_resumes_exactly():
    sizes = {"a": 60, "b": 60, "c": 60}
    old = Mixture({"a": 0.5, "b": 0.5})
    new = Mixture({"a": 0.2, "b": 0.3, "c": 0.5}, on_change="continue")
    first = samplers(old, sizes)
    before = take(first, 5)
    changed = loaded(new, sizes, first[0].state_dict())
    after = take(changed, 3)
    state = changed[0].state_dict()
    rows = [name for step in before + after for name, _ in step]
    tokens = {name: sum(int(lengths_of(name, 60)[row]) for step in before + after for source, row in step
                        if source == name) for name in sizes}
    assert state["mixture"]["served"] == {name: [rows.count(name), tokens[name]] for name in sizes}
    assert [rows.count(name) for name in sizes] == [20 + 5, 20 + 7, 12]  # 5 steps at 1:1, 3 at 2:3:5
    assert state["mixture"]["history"] == [[5, old.describe()]]
    expected = take(changed, None) + take(changed, 2)  # the rest of the epoch, and the next one's first steps
    resumed = loaded(new, sizes, state)
    assert take(resumed, None) + take(resumed, 2) == expected
    assert resumed[0].state_dict()["mixture"]["history"] == [[5, old.describe()]]


def test_two_changes_in_one_epoch_each_go_on_from_the_draws_served():
    """'b' is left out at the first change and comes back at the second: it goes on after its draws served."""
    sizes = {"a": 200, "b": 200, "c": 200}
    mixes = [Mixture({"a": 1, "b": 1}, samples_per_epoch=160),
             Mixture({"a": 1, "c": 3}, samples_per_epoch=160, on_change="continue"),
             Mixture({"a": 1, "b": 1, "c": 1}, samples_per_epoch=160, on_change="continue")]
    ranks, served, states = samplers(mixes[0], sizes, 2), [], []
    for mix in mixes:
        if states:
            ranks = loaded(mix, sizes, states[-1], 1 + len(states) % 2)  # on 2 ranks, then 1, then 2
        served += take(ranks, 4 if mix is not mixes[-1] else None)
        states.append(ranks[0].state_dict())
    epoch = [row for step in served for row in step]
    assert len(epoch) == len(set(epoch)) == 160
    assert [step for step, _ in states[1]["mixture"]["history"]] == [4]
    assert [step for step, _ in states[2]["mixture"]["history"]] == [4, 8]
    assert [[sum(name == "c" for name, _ in step) for step in served[4:8]]] == [[6, 6, 6, 6]]  # 3/4 of each step


def test_a_change_after_an_elastic_resume_counts_the_steps_served_on_other_ranks():
    sizes = {"a": 200, "b": 200}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=120)
    first = samplers(old, sizes, 2)
    served = take(first, 3)
    elastic = loaded(old, sizes, first[0].state_dict(), 1)
    served += take(elastic, 2)
    state = elastic[0].state_dict()
    assert state["served"] == [[2, 3]] and state["mixture"]["taken"]["steps"] == 5
    served += take(loaded(Mixture({"a": 0.25, "b": 0.75}, samples_per_epoch=120, on_change="continue"), sizes,
                          state, 2), None)
    epoch = [row for step in served for row in step]
    assert len(epoch) == len(set(epoch)) == 120


def test_a_state_saved_after_the_change_on_two_ranks_resumes_on_one():
    sizes = {"a": 200, "b": 200}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=120)
    new = Mixture({"a": 0.25, "b": 0.75}, samples_per_epoch=120, on_change="continue")
    first = samplers(old, sizes, 2)
    before = take(first, 3)
    changed = loaded(new, sizes, first[0].state_dict(), 2)
    after = take(changed, 4)
    state = changed[0].state_dict()
    uninterrupted = take(changed, None)
    elastic = loaded(new, sizes, state, 1)
    rest = [row for step in take(elastic, None) for row in step]
    assert sorted(rest) == sorted(row for step in uninterrupted for row in step)  # the same rows, each once
    epoch = [row for step in before + after for row in step] + rest
    assert len(epoch) == len(set(epoch)) == 120


def test_going_on_by_tokens_holds_the_new_token_shares():
    sizes = {"a": 400, "b": 400}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=320)
    new = Mixture({"a": 0.2, "b": 0.8}, by="tokens", samples_per_epoch=320, on_change="continue")
    first = samplers(old, sizes)
    before = take(first, 10)
    rest = take(loaded(new, sizes, first[0].state_dict()), None)
    epoch = [row for step in before + rest for row in step]
    assert len(epoch) == len(set(epoch)) == 320
    tokens = {name: sum(int(lengths_of(name, 400)[row]) for step in rest for source, row in step if source == name)
              for name in sizes}
    share = tokens["a"] / (tokens["a"] + tokens["b"])
    assert abs(share - 0.2) * (tokens["a"] + tokens["b"]) <= 2 * 9  # within two of the longest rows


def test_a_schedule_of_the_new_mixture_switches_at_its_step_of_the_run():
    sizes = {"a": 200, "b": 200}
    old = Mixture({"a": 0.5, "b": 0.5})
    new = Mixture({"a": 1, "b": 0}, schedule=[(6, {"a": 0, "b": 1})], on_change="continue")
    first = samplers(old, sizes)
    take(first, 3)
    rest = take(loaded(new, sizes, first[0].state_dict()), 6)
    assert [sorted({name for name, _ in step}) for step in rest] == [["a"]] * 3 + [["b"]] * 3  # steps 3-5, 6-8


def test_a_source_that_stops_ends_the_epoch_once_its_rows_are_served():
    sizes = {"a": 12, "b": 100}
    old = Mixture({"a": 0.5, "b": 0.5}, exhaust={"a": "stop"})
    new = Mixture({"a": 0.75, "b": 0.25}, exhaust={"a": "stop"}, on_change="continue")
    first = samplers(old, sizes)
    before = take(first, 2)
    rest = take(loaded(new, sizes, first[0].state_dict()), None)
    served_a = [row for step in before + rest for name, row in step if name == "a"]
    assert sorted(served_a) == list(range(12))  # each row of 'a' once, then the epoch ends
    assert len(rest) == 1 and ("a", served_a[-1]) in rest[-1]  # 8 of 'a' before, the 4 left at 6 a step


def test_a_state_saved_at_the_end_of_its_epoch_goes_on_from_the_next():
    sizes = {"a": 8, "b": 8}
    old = Mixture({"a": 0.5, "b": 0.5})
    new = Mixture({"a": 0.25, "b": 0.75}, on_change="continue")
    first = samplers(old, sizes)
    take(first, 2)  # the whole epoch, its pass not finished
    state = first[0].state_dict()
    assert state["mixture"]["taken"]["ended"]
    changed = loaded(new, sizes, state)
    assert changed[0].state_dict()["epoch"] == 1


def test_going_on_needs_plain_batching():
    order = MixtureOrder(Mixture({"a": 1, "b": 1}), [20, 20], block=4, seed=0)  # not served_prefix: other batching
    sampler = SeededBatchSampler(order.size, 4, order=order, seed=0)
    next(iter(sampler))
    state = sampler.state_dict()
    assert "taken" not in state["mixture"]
    with pytest.raises(ValueError, match="not saved under batching='plain'"):
        loaded(Mixture({"a": 1, "b": 3}, on_change="continue"), {"a": 20, "b": 20}, state)


def test_a_source_switching_between_cycling_and_stopping_is_refused_naming_it():
    sizes = {"a": 20, "b": 20}
    first = samplers(Mixture({"a": 1, "b": 1}), sizes)
    take(first, 1)
    with pytest.raises(ValueError, match=r"exhaust switches between cycling and stopping for 'a': saved 'cycle', "
                                         r"now 'stop'"):
        loaded(Mixture({"a": 1, "b": 3}, exhaust={"a": "stop"}, on_change="continue"), sizes, first[0].state_dict())


@pytest.mark.parametrize(("change", "match"), [
    (lambda mix: mix.pop("taken"), "should have 'names', 'taken'"),
    (lambda mix: mix["taken"].update(rows=[1]), "should have 'names', 'taken'"),
    (lambda mix: mix["taken"].update(rows=[-1, 2]), "should have 'names', 'taken'"),
    (lambda mix: mix["taken"].update(ended="no"), "should have 'names', 'taken'"),
    (lambda mix: mix["epoch_start"].update(rows=-3), "should have 'names', 'taken'"),
    (lambda mix: mix["epoch_start"].update(left_out={"b": -1}), "should have 'names', 'taken'"),
    (lambda mix: mix.update(history=[[1, "web"]]), "history should be a list of"),
    (lambda mix: mix["taken"].update(steps=1), "taken should count the 2 steps its position served"),
    (lambda mix: mix["taken"].update(steps=3), "taken should count the 2 steps its position served"),
])
def test_a_crafted_state_is_refused_naming_what_is_wrong(change, match):
    sizes = {"a": 20, "b": 20}
    first = samplers(Mixture({"a": 1, "b": 1}), sizes)
    take(first, 2)
    state = first[0].state_dict()
    change(state["mixture"])
    with pytest.raises(ValueError, match=match):
        loaded(Mixture({"a": 1, "b": 3}, on_change="continue"), sizes, state)


def test_a_loaded_epoch_start_is_validated_on_an_exact_resume():
    sizes = {"a": 20, "b": 20}
    first = samplers(Mixture({"a": 1, "b": 1}), sizes)
    take(first, 2)
    state = first[0].state_dict()
    state["mixture"]["epoch_start"]["steps"] = "2"
    with pytest.raises(ValueError, match="epoch_start should be"):
        loaded(Mixture({"a": 1, "b": 1}), sizes, state)


def test_a_state_saved_before_taken_and_history_resumes_exactly_and_cannot_go_on():
    sizes = {"a": 30, "b": 30}
    mixture = Mixture({"a": 1, "b": 2})
    first = samplers(mixture, sizes)
    take(first, 2)
    state = first[0].state_dict()
    expected = take(first, None)
    older = {**state, "mixture": {key: value for key, value in state["mixture"].items()
                                  if key not in ("taken", "history")}}
    older["mixture"]["epoch_start"] = {key: value for key, value in state["mixture"]["epoch_start"].items()
                                       if key not in ("rows", "steps")}
    assert take(loaded(mixture, sizes, older), None) == expected
    with pytest.raises(ValueError, match="should have 'names', 'taken'"):
        loaded(Mixture({"a": 1, "b": 1}, on_change="continue"), sizes, older)
