"""``Mixture(on_change='continue')``: a checkpoint of another mixture goes on in its epoch, under every batching
mode. No row served in the epoch is served again, the rest follows the new weights, a new source joins with all
its rows, a removed one stops, and a state saved after the change resumes exactly, on any number of ranks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Mixture
from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.mixtures.order import MixtureOrder
from engine.sampling.mixtures.plan import Draws
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler

SEED, BATCH, TOKENS, DOCUMENTS = 5, 8, 48, 8
"""The seed; the global batch (plain and grouped: one step of every rank together, one block of the mixture); the
global token budget (token_budget and packed) and their block of documents."""
MODES = ("plain", "grouped", "token_budget", "packed")
REPEATS_WHOLE_BATCHES = ("token_budget", "packed")
"""Modes that even out the ranks' batch counts by repeating whole batches (bins): the checks count each once."""


class Ranks(list):
    """The samplers of every rank, each with its live pass (a new pass starts once the last one ended), and the
    batches the pass served (under :data:`REPEATS_WHOLE_BATCHES`, a batch served again is a rank's padding)."""

    iterators: list | None = None
    seen: set | None = None
    mode = "plain"


def lengths_of(name: str, size: int) -> np.ndarray:
    """Token lengths of a source's rows: 1 to 9, seeded by the source's name."""
    return np.random.default_rng(sum(map(ord, name))).integers(1, 10, size)


def samplers(mixture: Mixture, sizes: dict[str, int], replicas: int = 1, mode: str = "plain") -> Ranks:
    """One sampler of batching ``mode`` per rank over sources of ``sizes`` (in the order of the mixture's names)."""
    made = Ranks()
    made.mode = mode
    lengths = [lengths_of(name, sizes[name]) for name in mixture.names]
    for rank in range(replicas):
        order = MixtureOrder(mixture, [sizes[name] for name in mixture.names], seed=SEED, lengths=lengths,
                             block=BATCH if mode in ("plain", "grouped") else DOCUMENTS)
        common = {"order": order, "num_replicas": replicas, "rank": rank, "seed": SEED}
        if mode == "plain":
            made.append(SeededBatchSampler(order.size, BATCH // replicas, **common))
        elif mode == "grouped":
            made.append(LengthGroupedBatchSampler(np.concatenate(lengths), BATCH // replicas, mega_batch_factor=2,
                                                  **common))
        else:
            kind = TokenBudgetBatchSampler if mode == "token_budget" else PackedBatchSampler
            made.append(kind(np.concatenate(lengths), TOKENS // replicas, mega_batch_factor=2, **common))
    return made


def named(sampler: SeededBatchSampler, rows: list[int]) -> list[tuple[str, int]]:
    """Rows of the mixed source as (source name, row of the source): comparable across mixtures."""
    order = sampler.mixture
    which = order.source_of(np.asarray(rows, dtype=np.int64))
    return [(order.mixture.names[s], int(row - order.offsets[s])) for s, row in zip(which.tolist(), rows)]


def take(ranks: Ranks, steps: int | None) -> list[list[tuple[str, int]]]:
    """``steps`` steps (None: the rest of the pass) of every rank, each step as all ranks' rows by name."""
    if ranks.iterators is None:
        ranks.iterators, ranks.seen = [iter(one) for one in ranks], set()
    served = []
    while steps is None or len(served) < steps:
        batches = [next(iterator, None) for iterator in ranks.iterators]
        if all(batch is None for batch in batches):
            ranks.iterators = None
            break
        step = []
        for one, batch in zip(ranks, batches):
            rows = named(one, batch) if batch is not None else []
            if ranks.mode in REPEATS_WHOLE_BATCHES and len(ranks) > 1 and tuple(rows) in ranks.seen:
                continue  # a rank's padding: a batch of this pass again (one rank has none; a cycling source's
                # row drawn twice in a pass may make two one-row batches alike)
            ranks.seen.add(tuple(rows))
            step += rows
        served.append(step)
    return served


def loaded(mixture: Mixture, sizes: dict[str, int], state: dict, replicas: int = 1, mode: str = "plain") -> Ranks:
    ranks = samplers(mixture, sizes, replicas, mode)
    for one in ranks:
        one.load_state_dict(state)
    return ranks


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=25, deadline=None)
@given(old=st.lists(st.integers(1, 9), min_size=2, max_size=3), new=st.lists(st.integers(0, 9), min_size=2,
                                                                             max_size=3),
       before=st.integers(0, 12), replicas=st.sampled_from([1, 2]), later=st.sampled_from([1, 2]),
       blocks=st.integers(3, 11))
def test_the_rest_of_the_epoch_serves_unserved_rows_at_the_new_weights(mode, old, new, before, replicas, later,
                                                                       blocks):
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
    first = samplers(old_mix, sizes, replicas, mode)
    before = min(before, len(first[0]) - 1)  # the saved epoch not over yet
    served = take(first, before)
    state = first[0].state_dict()
    ranks = loaded(new_mix, sizes, state, later, mode)
    assert len(ranks[0]) == len(served) + len(ranks[0]._batches(0, ()))  # the epoch's steps, those served too
    rest = take(ranks, None)
    epoch = [row for step in served + rest for row in step]
    assert len(epoch) == len(set(epoch)) == spe  # no row twice, none lost: the epoch's rows
    removed = set(old_mix.names) - set(new_names)
    assert not [row for step in rest for row in step if row[0] in removed]
    weights = np.array([new_mix.weights[name] for name in new_names])
    if mode == "plain":  # each source's rows: its seeded draws, in turn; each step at the new shares
        for name in set(old_mix.names) | set(new_names):
            rows = [row for source, row in epoch if source == name]
            assert sorted(rows) == sorted(Draws(SEED, name, 100, 0, None, None).rows(len(rows)).tolist())
        counts = np.array([[sum(row[0] == name for row in step) for name in new_names] for step in rest])
        counts = counts[:sum(len(step) == BATCH for step in rest)]  # the short last step takes what is left
        running = np.cumsum(counts, axis=0)
        targets = np.arange(1, len(counts) + 1)[:, None] * BATCH * weights[None, :]
        assert len(counts) == 0 or np.abs(running - targets).max() < 1  # within a row of the new shares
    else:  # the steps serve their windows' rows in another order: the rest as a whole is at the new shares
        counts = np.array([sum(row[0] == name for step in rest for row in step) for name in new_names])
        assert np.abs(counts - counts.sum() * weights).max() < 1
    assert sum(len(step) for step in take(ranks, None)) == spe  # the next epoch: the new mixture's, whole


@pytest.mark.parametrize("mode", MODES)
def test_served_counts_carry_on_and_a_state_saved_after_the_change_resumes_exactly(mode):
    sizes = {"a": 60, "b": 60, "c": 60}
    old = Mixture({"a": 0.5, "b": 0.5})
    new = Mixture({"a": 0.2, "b": 0.3, "c": 0.5}, on_change="continue")
    first = samplers(old, sizes, mode=mode)
    before = take(first, 5)
    changed = loaded(new, sizes, first[0].state_dict(), mode=mode)
    after = take(changed, 3)
    state = changed[0].state_dict()
    rows = [name for step in before + after for name, _ in step]
    tokens = {name: sum(int(lengths_of(name, 60)[row]) for step in before + after for source, row in step
                        if source == name) for name in sizes}
    assert state["mixture"]["served"] == {name: [rows.count(name), tokens[name]] for name in sizes}
    if mode == "plain":
        assert [rows.count(name) for name in sizes] == [20 + 5, 20 + 7, 12]  # 5 steps at 1:1, 3 at 2:3:5
    assert state["mixture"]["history"] == [[5, old.describe()]]
    expected = take(changed, None) + take(changed, 2)  # the rest of the epoch, and the next one's first steps
    resumed = loaded(new, sizes, state, mode=mode)  # N steps == k + save/load + N - k
    assert take(resumed, None) + take(resumed, 2) == expected
    assert resumed[0].state_dict()["mixture"]["history"] == [[5, old.describe()]]


@pytest.mark.parametrize("mode", MODES)
def test_two_changes_in_one_epoch_each_go_on_from_the_draws_served(mode):
    """'b' is left out at the first change and comes back at the second: it goes on after its draws served (under
    windows, passing over those served ahead of its first unserved one)."""
    sizes = {"a": 200, "b": 200, "c": 200}
    mixes = [Mixture({"a": 1, "b": 1}, samples_per_epoch=160),
             Mixture({"a": 1, "c": 3}, samples_per_epoch=160, on_change="continue"),
             Mixture({"a": 1, "b": 1, "c": 1}, samples_per_epoch=160, on_change="continue")]
    ranks, served, states = samplers(mixes[0], sizes, 2, mode), [], []
    for mix in mixes:
        if states:
            ranks = loaded(mix, sizes, states[-1], 1 + len(states) % 2, mode)  # on 2 ranks, then 1, then 2
        served += take(ranks, 4 if mix is not mixes[-1] else None)
        states.append(ranks[0].state_dict())
    epoch = [row for step in served for row in step]
    assert len(epoch) == len(set(epoch)) == 160
    assert [step for step, _ in states[1]["mixture"]["history"]] == [4]
    assert [step for step, _ in states[2]["mixture"]["history"]] == [4, 8]
    if mode == "plain":
        assert [[sum(name == "c" for name, _ in step) for step in served[4:8]]] == [[6, 6, 6, 6]]  # 3/4 a step


@pytest.mark.parametrize("mode", MODES)
def test_a_change_after_an_elastic_resume_counts_the_steps_served_on_other_ranks(mode):
    sizes = {"a": 200, "b": 200}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=120)
    first = samplers(old, sizes, 2, mode)
    served = take(first, 3)
    elastic = loaded(old, sizes, first[0].state_dict(), 1, mode)
    served += take(elastic, 2)
    state = elastic[0].state_dict()
    assert state["served"] == [[2, 3]] and state["mixture"]["taken"]["steps"] == 5
    served += take(loaded(Mixture({"a": 0.25, "b": 0.75}, samples_per_epoch=120, on_change="continue"), sizes,
                          state, 2, mode), None)
    epoch = [row for step in served for row in step]
    assert len(epoch) == len(set(epoch)) == 120


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_a_state_saved_after_the_change_resumes_on_another_number_of_ranks(mode, saved_on, resumed_on):
    sizes = {"a": 200, "b": 200}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=120)
    new = Mixture({"a": 0.25, "b": 0.75}, samples_per_epoch=120, on_change="continue")
    first = samplers(old, sizes, saved_on, mode)
    before = take(first, 3)
    changed = loaded(new, sizes, first[0].state_dict(), saved_on, mode)
    after = take(changed, 4)
    state = changed[0].state_dict()
    uninterrupted = take(changed, None)
    elastic = loaded(new, sizes, state, resumed_on, mode)
    rest = [row for step in take(elastic, None) for row in step]
    assert sorted(rest) == sorted(row for step in uninterrupted for row in step)  # the same rows, each once
    epoch = [row for step in before + after for row in step] + rest
    assert len(epoch) == len(set(epoch)) == 120


@pytest.mark.parametrize("mode", MODES)
def test_going_on_by_tokens_holds_the_new_token_shares(mode):
    sizes = {"a": 400, "b": 400}
    old = Mixture({"a": 0.5, "b": 0.5}, samples_per_epoch=320)
    new = Mixture({"a": 0.2, "b": 0.8}, by="tokens", samples_per_epoch=320, on_change="continue")
    first = samplers(old, sizes, mode=mode)
    before = take(first, 10)
    rest = take(loaded(new, sizes, first[0].state_dict(), mode=mode), None)
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


@pytest.mark.parametrize("mode", MODES)
def test_a_source_that_stops_ends_the_epoch_once_its_rows_are_served(mode):
    sizes = {"a": 12, "b": 100}
    old = Mixture({"a": 0.5, "b": 0.5}, exhaust={"a": "stop"})
    new = Mixture({"a": 0.75, "b": 0.25}, exhaust={"a": "stop"}, on_change="continue")
    first = samplers(old, sizes, mode=mode)
    before = take(first, 1)
    rest = take(loaded(new, sizes, first[0].state_dict(), mode=mode), None)
    served_a = [row for step in before + rest for name, row in step if name == "a"]
    assert sorted(served_a) == list(range(12))  # each row of 'a' once, then the epoch ends
    if mode == "plain":
        assert len(rest) == 2 and ("a", served_a[-1]) in rest[-1]  # 4 of 'a' before, the 8 left at 6 a step


@pytest.mark.parametrize("mode", MODES)
def test_a_state_saved_at_the_end_of_its_epoch_goes_on_from_the_next(mode):
    sizes = {"a": 8, "b": 8}
    old = Mixture({"a": 0.5, "b": 0.5})
    new = Mixture({"a": 0.25, "b": 0.75}, on_change="continue")
    first = samplers(old, sizes, mode=mode)
    take(first, len(first[0]))  # the whole epoch, its pass not finished
    state = first[0].state_dict()
    assert state["mixture"]["taken"]["ended"]
    changed = loaded(new, sizes, state, mode=mode)
    assert changed[0].state_dict()["epoch"] == 1


@pytest.mark.parametrize("mode", ["grouped", "token_budget", "packed"])
def test_under_windows_a_state_names_the_draws_served_ahead_and_the_rest_passes_over_them(mode):
    """A window sorted by length (packed) serves rows from anywhere in it: the state names each source's draws
    served past its first unserved one, and the rest of the epoch draws neither them nor the ones before."""
    sizes = {"a": 100, "b": 100}
    first = samplers(Mixture({"a": 1, "b": 1}, samples_per_epoch=80), sizes, 2, mode)
    before = take(first, 3)
    taken = first[0].state_dict()["mixture"]["taken"]
    assert taken["skipped"]  # with these lengths, every mode serves some draws ahead
    served = {name: {row for step in before for source, row in step if source == name} for name in sizes}
    for count, name in zip(taken["rows"], sizes):
        draws = Draws(SEED, name, 100, 0, None, None).rows(100).tolist()
        assert served[name] == {*draws[:count], *(draws[one] for one in taken["skipped"].get(name, []))}
    rest = take(loaded(Mixture({"a": 1, "b": 3}, samples_per_epoch=80, on_change="continue"), sizes,
                       first[0].state_dict(), 1, mode), None)
    assert not {row for step in rest for row in step} & {row for step in before for row in step}


def test_a_cycling_source_s_draws_passed_over_stay_passed_over_in_its_next_epoch():
    """Draws of 'a' served ahead under the old mixture, beyond those the rest of the epoch reaches: the next epoch
    goes on in the same pass of 'a' and passes over them too, so the pass serves each row of 'a' once."""
    sizes = {"a": 60, "b": 400}
    first = samplers(Mixture({"a": 1, "b": 1}, samples_per_epoch=32), sizes, 1, "grouped")
    before = take(first, 3)
    state = first[0].state_dict()
    assert state["mixture"]["taken"]["skipped"]["a"]
    new = Mixture({"a": 1, "b": 15}, samples_per_epoch=32, on_change="continue")
    ranks = loaded(new, sizes, state, 1, "grouped")
    rest, following = take(ranks, None), take(ranks, 1)
    assert ranks[0].state_dict()["mixture"]["epoch_start"]["skipped"]["a"]  # the next epoch still passes over some
    following += take(ranks, None)
    rows = [row for step in before + rest + following for name, row in step if name == "a"]
    assert len(rows) == len(set(rows)) < 60  # one pass of 'a' so far: no row twice


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
    (lambda mix: mix["taken"].update(skipped={"a": [9, 9]}), "should have 'names', 'taken'"),
    (lambda mix: mix["taken"].update(skipped={"a": [1]}), "should have 'names', 'taken'"),
    (lambda mix: mix["taken"].update(skipped={"z": [30]}), "should have 'names', 'taken'"),
    (lambda mix: mix["epoch_start"].update(skipped={"a": []}), "should have 'names', 'taken'"),
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


def test_a_loaded_epoch_start_s_draws_passed_over_are_validated_on_an_exact_resume():
    sizes = {"a": 100, "b": 100}
    first = samplers(Mixture({"a": 1, "b": 1}, samples_per_epoch=80), sizes, 1, "grouped")
    take(first, 3)
    new = Mixture({"a": 1, "b": 3}, samples_per_epoch=80, on_change="continue")
    changed = loaded(new, sizes, first[0].state_dict(), 1, "grouped")
    take(changed, 1)
    state = changed[0].state_dict()
    start = state["mixture"]["epoch_start"]
    assert start["skipped"]  # the rest passes over draws served ahead before the change
    expected = take(changed, None)
    assert take(loaded(new, sizes, state, 1, "grouped"), None) == expected
    name = next(iter(start["skipped"]))
    start["skipped"][name] = [start["starts"][list(sizes).index(name)]]  # its first draw: not served ahead
    with pytest.raises(ValueError, match="epoch_start skipped should name draws after each source's first"):
        loaded(new, sizes, state, 1, "grouped")
