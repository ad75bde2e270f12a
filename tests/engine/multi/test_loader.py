import itertools
import math
import pickle
from collections import Counter

import lightning
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from engine import DataLoaderConfig, DataLoaderFactory
from engine.multi.config import EpochLengthPolicy, MultiDataLoaderConfig, SamplingStrategy
from engine.multi.loader import MultiDataLoader, build_multi_loader


def child(rows, batch_size=2, seed=0, offset=0):
    """A shuffled StatefulDataLoader from the engine's factory over ``rows`` ints starting at ``offset``."""
    dataset = TensorDataset(torch.arange(offset, offset + rows))
    return DataLoaderFactory().create_dataloader(dataset, DataLoaderConfig(batch_size=batch_size, shuffle=True,
                                                                           seed=seed))


def children(rows=(8, 4, 6), batch_size=2):
    """Named factory loaders with disjoint rows: loader i holds ints from 100 * i."""
    return {name: child(n, batch_size, seed=i, offset=100 * i) for i, (name, n) in enumerate(zip("abc", rows))}


def flat(multi, epochs):
    """(name, rows) of every step over ``epochs`` epochs; each epoch iterates the multi-loader again."""
    return ((name, batch[0].tolist()) for _ in range(epochs) for name, batch in multi)


def config(**kwargs):
    return MultiDataLoaderConfig(**kwargs)


class TestConfig:
    @pytest.mark.parametrize(("kwargs", "match"), [
        (dict(sampling_strategy="random"), r"sampling_strategy should be one of \['ROUND_ROBIN', 'WEIGHTED'"),
        (dict(dataloader_names=["a", "b", "a"]), r"dataloader_names should be unique, but \['a'\] appear"),
        (dict(dataloader_names=["a", ""]), "dataloader_names should be non-empty strings"),
        (dict(sampling_strategy="weighted"), "sampling_strategy=WEIGHTED needs dataloader_weights"),
        (dict(sampling_strategy="weighted", dataloader_weights=[1, 0]), r"finite numbers > 0.*\[1.0, 0.0\]"),
        (dict(dataloader_weights=[1, 2]), "dataloader_weights applies only to sampling_strategy=WEIGHTED"),
        (dict(sampling_strategy="alternating"), "sampling_strategy=ALTERNATING needs alternating_pattern"),
        (dict(sampling_strategy="alternating", alternating_pattern=[0, -1]), "non-empty list of loader indices"),
        (dict(epoch_length_policy="fixed_num_steps"), "FIXED_NUM_STEPS needs steps_per_epoch.*=None"),
        (dict(steps_per_epoch=5), "steps_per_epoch=5 applies only to epoch_length_policy=FIXED_NUM_STEPS"),
        (dict(burst_size=0), "burst_size should be a positive integer, but got burst_size=0"),
        (dict(choice_rng_seed=-1), "choice_rng_seed should be a non-negative integer"),
    ])
    def test_invalid_options(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            MultiDataLoaderConfig(**kwargs)

    def test_enum_values_are_accepted(self):
        made = config(sampling_strategy="sequential", epoch_length_policy="min_of_lengths")
        assert made.sampling_strategy is SamplingStrategy.SEQUENTIAL
        assert made.epoch_length_policy is EpochLengthPolicy.MIN_OF_LENGTHS

    @pytest.mark.parametrize(("kwargs", "match"), [
        (dict(dataloader_names=["x"]), r"one name per loader \(2\), but got 1"),
        (dict(sampling_strategy="weighted", dataloader_weights=[1.0]), r"one weight per loader \(2: \['dl0'"),
        (dict(sampling_strategy="alternating", alternating_pattern=[0, 2]), r"in \[0, 2\).*but got \[2\]"),
        (dict(sampling_strategy="alternating", alternating_pattern=[0, 0]), r"loaders \['dl1'\] never appear"),
    ])
    def test_per_loader_options_are_checked_against_the_loaders(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            MultiDataLoader([[1], [2]], config(**kwargs))

    def test_dict_keys_must_match_given_names(self):
        with pytest.raises(ValueError, match=r"dataloader_names=\['b', 'a'\] differs from the loaders' keys"):
            MultiDataLoader({"a": [1], "b": [2]}, config(dataloader_names=["b", "a"]))

    def test_list_loaders_get_default_or_given_names(self):
        assert MultiDataLoader([[1], [2]]).names == ["dl0", "dl1"]
        assert list(MultiDataLoader([[1], [2]], config(dataloader_names=["x", "y"]))) == [("x", 1), ("y", 2)]

    def test_empty_and_unsized_loaders_fail_at_construction(self):
        with pytest.raises(ValueError, match=r"loaders \['b'\] have no batches"):
            MultiDataLoader({"a": [1], "b": []})
        with pytest.raises(ValueError, match=r"SUM_OF_LENGTHS needs every loader's length, but \['b'\] have none"):
            MultiDataLoader({"a": [1], "b": DataLoader(Stream(), batch_size=None)})
        with pytest.raises(ValueError, match="a MultiDataLoader needs at least one loader"):
            MultiDataLoader([])

    def test_build_multi_loader(self):
        multi = build_multi_loader(children(), config(sampling_strategy="round_robin"))
        assert isinstance(multi, MultiDataLoader) and multi.names == ["a", "b", "c"]
        with pytest.raises(ValueError, match="named_loaders should be a non-empty dict"):
            build_multi_loader({})


class Stream(IterableDataset):
    """Unsized data that counts how it was told the epoch."""

    def __init__(self):
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter(range(3))


class TestSchedules:
    LENGTHS = {"a": 3, "b": 2, "c": 4}

    def multi(self, **kwargs):
        return MultiDataLoader({name: list(range(n)) for name, n in self.LENGTHS.items()}, config(**kwargs))

    def test_round_robin(self):
        assert self.multi().schedule() == list("abc" * 3)
        assert self.multi(burst_size=2).schedule() == list("aabbccaab")

    def test_sequential(self):
        assert self.multi(sampling_strategy="sequential").schedule() == list("aaabbcccc")
        # Other policies split the epoch's length equally, the first loaders taking the remainder.
        expected = list("aabc")
        assert self.multi(sampling_strategy="sequential", epoch_length_policy="max_of_lengths").schedule() == expected

    def test_alternating(self):
        multi = self.multi(sampling_strategy="alternating", alternating_pattern=[0, 0, 2, 1])
        assert multi.schedule() == list("aacbaac" "ba")
        assert [name for name, _ in multi] == multi.schedule()

    @pytest.mark.parametrize(("policy", "steps", "expected"), [
        ("sum_of_lengths", None, 9), ("max_of_lengths", None, 4), ("min_of_lengths", None, 2),
        ("fixed_num_steps", 7, 7),
    ])
    @pytest.mark.parametrize("strategy", ["round_robin", "sequential", "weighted"])
    def test_epoch_length_by_policy(self, policy, steps, expected, strategy):
        weights = [1.0, 2.0, 3.0] if strategy == "weighted" else None
        multi = self.multi(sampling_strategy=strategy, epoch_length_policy=policy, steps_per_epoch=steps,
                           dataloader_weights=weights)
        assert len(multi) == expected == len(list(multi)) == len(multi.schedule())

    def test_weighted_mix_matches_the_weights(self):
        weights, steps = [0.5, 0.3, 0.2], 4000
        multi = self.multi(sampling_strategy="weighted", dataloader_weights=weights,
                           epoch_length_policy="fixed_num_steps", steps_per_epoch=steps)
        counts = Counter(name for name, _ in multi)
        total = sum(weights)
        for name, weight in zip("abc", weights):
            p = weight / total
            assert abs(counts[name] - steps * p) <= 4 * math.sqrt(steps * p * (1 - p)), (name, counts)

    def test_weighted_schedule_is_a_function_of_seed_and_epoch(self):
        def weighted(seed):
            return self.multi(sampling_strategy="weighted", dataloader_weights=[1, 1, 2], choice_rng_seed=seed,
                              epoch_length_policy="fixed_num_steps", steps_per_epoch=40)

        first = weighted(3)
        assert first.schedule(0) == weighted(3).schedule(0)
        assert first.schedule(0) != first.schedule(1)
        assert first.schedule(0) != weighted(4).schedule(0)
        epochs = [[name for name, _ in first] for _ in range(2)]
        assert epochs == [first.schedule(0), first.schedule(1)]


class TestEpochsAndCycling:
    def test_short_loaders_restart_on_a_new_order(self):
        multi = MultiDataLoader(children(rows=(32, 8)))  # 16 + 4 batches; b serves 10 steps: 4 + 4 + 2
        steps = list(flat(multi, 1))
        b = [rows for name, rows in steps if name == "b"]
        first, second = b[:4], b[4:8]
        assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(100, 108))
        assert first != second
        assert len(steps) == 20

    def test_without_cycling_a_dropped_loaders_slots_go_to_the_others(self):
        multi = MultiDataLoader({"a": [1, 2, 3], "b": [10]}, config(cycle_short_loaders=False))
        assert multi.schedule() == list("abab") and list(multi) == [("a", 1), ("b", 10), ("a", 2), ("a", 3)]
        short = MultiDataLoader({"a": [1], "b": [10]}, config(cycle_short_loaders=False, epoch_length_policy=(
            "fixed_num_steps"), steps_per_epoch=5))
        assert list(short) == [("a", 1), ("b", 10)]  # the epoch ends when every loader is dropped

    def test_iterating_again_gives_the_next_epoch(self):
        loaders = children()
        multi = MultiDataLoader(loaders)
        first, second = list(flat(multi, 1)), list(flat(multi, 1))
        assert multi.epoch == 2 and first != second
        reference = child(8, seed=0, offset=0)
        reference.batch_sampler.set_epoch(1)
        assert [rows for name, rows in second if name == "a"] == [b[0].tolist() for b in reference][:3]

    def test_set_epoch_reaches_every_child(self):
        stream, loaders = Stream(), children(rows=(4, 4))
        multi = MultiDataLoader({**loaders, "s": DataLoader(stream, batch_size=None)},
                                config(epoch_length_policy="fixed_num_steps", steps_per_epoch=3))
        multi.set_epoch(5)
        assert multi.epoch == 5 and stream.epochs[-1] == 5
        assert all(loader.batch_sampler.epoch == 5 for loader in loaders.values())
        assert [name for name, _ in multi] == ["a", "b", "s"] and stream.epochs[-1] == 5
        with pytest.raises(ValueError, match="epoch should be a non-negative integer, but got epoch=-1"):
            multi.set_epoch(-1)


def resume_case(strategy):
    if strategy == "weighted":
        return config(sampling_strategy="weighted", dataloader_weights=[1, 1, 3], choice_rng_seed=7)
    if strategy == "alternating":
        return config(sampling_strategy="alternating", alternating_pattern=[2, 0, 1, 2], burst_size=2)
    return config(sampling_strategy=strategy)


class TestResume:
    EPOCHS = 2

    @pytest.mark.parametrize("strategy", ["round_robin", "weighted", "alternating", "sequential"])
    @pytest.mark.parametrize("stop", [1, 7, 9, 13, 18])  # 9 steps per epoch; 18: state taken at the very end
    def test_resumed_run_yields_the_same_batches(self, strategy, stop):
        uninterrupted = list(flat(MultiDataLoader(children(), resume_case(strategy)), self.EPOCHS))
        interrupted = MultiDataLoader(children(), resume_case(strategy))
        steps = flat(interrupted, self.EPOCHS)
        head = list(itertools.islice(steps, stop))
        state = pickle.loads(pickle.dumps(interrupted.data_state()))  # as a checkpoint would store it
        resumed = MultiDataLoader(children(), resume_case(strategy))  # fresh child loaders
        resumed.load_state_dict(state)
        rest = list(flat(resumed, self.EPOCHS - resumed.epoch))
        assert head + rest == uninterrupted

    def test_load_after_iter_still_resumes(self):
        original = MultiDataLoader(children())
        steps = flat(original, 1)
        head = [next(steps) for _ in range(5)]
        state = original.data_state()
        resumed = MultiDataLoader(children())
        iterator = iter(resumed)  # Lightning may create the iterator before it restores the state
        resumed.load_state_dict(state)
        assert head + [(name, batch[0].tolist()) for name, batch in iterator] == list(flat(MultiDataLoader(
            children()), 1))

    def test_loaders_without_state_are_replayed(self):
        def plain():
            return {"a": [1, 2, 3, 4, 5], "b": DataLoader(list(range(10, 16)), batch_size=2)}

        full = [(name, int(b) if name == "a" else b.tolist()) for name, b in MultiDataLoader(plain())]
        multi = MultiDataLoader(plain())
        iterator = iter(multi)
        [next(iterator) for _ in range(4)]
        resumed = MultiDataLoader(plain())
        resumed.load_state_dict(multi.data_state())
        assert [(n, int(b) if n == "a" else b.tolist()) for n, b in resumed] == full[4:]

    def test_state_from_other_loaders_or_seed_is_refused(self):
        state = MultiDataLoader(children(), config(choice_rng_seed=1)).data_state()
        with pytest.raises(KeyError, match=r"saved for loaders \['a', 'b', 'c'\], but this MultiDataLoader has"):
            MultiDataLoader({"a": [1]}).load_state_dict(state)
        with pytest.raises(ValueError, match="saved with choice_rng_seed=1, but this MultiDataLoader has "
                                             "choice_rng_seed=0"):
            MultiDataLoader(children()).load_state_dict(state)
        with pytest.raises(KeyError, match=r"state is missing \['cursor'"):
            MultiDataLoader(children()).load_state_dict({k: v for k, v in state.items() if k != "cursor"})


class NamedSteps(lightning.LightningModule):
    def __init__(self, multi):
        super().__init__()
        self.multi, self.layer, self.seen = multi, torch.nn.Linear(1, 1), []

    def train_dataloader(self):
        return self.multi

    def training_step(self, batch, batch_idx):
        name, (rows,) = batch
        self.seen.append((name, rows.tolist()))
        return self.layer(rows.float().unsqueeze(1)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_fit_over_a_multi_loader():
    multi = build_multi_loader(children(), config(sampling_strategy="weighted", dataloader_weights=[2, 1, 1]))
    expected = list(itertools.islice(flat(build_multi_loader(children(), multi.config), 3), 25))
    module = NamedSteps(multi)
    trainer = lightning.Trainer(max_steps=25, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    assert trainer.global_step == 25 and module.seen == expected  # 9 steps per epoch: into the third


def test_a_state_saved_before_the_children_resumed_round_trips():
    original = MultiDataLoader(children())
    steps = flat(original, 1)
    head = [next(steps) for _ in range(6)]
    once = MultiDataLoader(children())
    once.load_state_dict(original.data_state())
    twice = MultiDataLoader(children())
    twice.load_state_dict(once.data_state())  # once has not touched its children yet: their states carry over
    assert head + list(flat(twice, 1)) == list(flat(MultiDataLoader(children()), 1))


def test_a_loader_that_cannot_restart_is_an_error_when_cycling():
    one_shot = iter([10])  # a second pass of an iterator yields nothing
    multi = MultiDataLoader({"a": [1, 2, 3], "g": one_shot}, config(epoch_length_policy="fixed_num_steps",
                                                                    steps_per_epoch=4))
    with pytest.raises(RuntimeError, match="loader 'g' yielded no batch on a new pass, so it cannot be cycled"):
        list(multi)


class SaveAt(lightning.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize("step", [5, 9, 13])  # 9: at the end of the first epoch, where Lightning saves no loader state
def test_lightning_resume_continues_the_same_batches(step, tmp_path):
    def fit(multi, callbacks=(), ckpt_path=None):
        module = NamedSteps(multi)
        lightning.Trainer(max_steps=20, accelerator="cpu", logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          callbacks=list(callbacks)).fit(module, ckpt_path=ckpt_path)
        return module.seen

    cfg = config(sampling_strategy="weighted", dataloader_weights=[2, 1, 1])
    path = tmp_path / "step.ckpt"
    uninterrupted = fit(build_multi_loader(children(), cfg), [SaveAt(step, path)])
    assert fit(build_multi_loader(children(), cfg), ckpt_path=path) == uninterrupted[step:]
