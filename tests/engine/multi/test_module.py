"""Several named datasets through one module: each keeps its spec and collator; one resumable schedule."""

import itertools
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import lightning
import pytest
import torch

from engine import MultiDataModule, UniversalDataModule
from engine.multi import module as multi_module
from engine.multi.config import MultiDataLoaderConfig
from task_spec import TaskSpec
from tests.engine.concurrency import first_loaders_from_threads
from tests.engine.test_module_options import SMALL_IMAGES, Images
from tests.engine.test_resume import fingerprint

LM = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 100})


def tokens(count=40):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 100, (int(n),), generator=generator)
            for n in torch.randint(3, 30, (count,), generator=generator)]


def module(**kwargs):
    options = dict(task_spec={"lm": LM, "img": SMALL_IMAGES}, batch_size=4, val_split=0.25, seed=7)
    options.update(kwargs)
    return MultiDataModule({"lm": tokens(), "img": Images(16)}, **options)


def take(dm, count):
    out = []
    for name, batch in itertools.islice(itertools.chain.from_iterable(itertools.repeat(dm.train_dataloader())),
                                        count):
        out.append((name, fingerprint(batch)))
    return out


class TestShape:
    def test_a_dict_of_datasets_builds_named_children_with_their_own_collators(self):
        dm = module()
        assert type(dm) is MultiDataModule and list(dm.children) == ["lm", "img"]
        assert all(type(child) is UniversalDataModule for child in dm.children.values())
        assert dm.split_sizes["lm"]["train"] == 30 and dm.split_sizes["img"]["train"] == 12
        batches = list(dm.train_dataloader())
        assert len(batches) == len(dm.train_dataloader()) == 8 + 3
        assert {name for name, _ in batches} == {"lm", "img"}
        for name, batch in batches:
            assert set(batch) == ({"input_ids", "attention_mask", "labels"} if name == "lm"
                                  else {"pixel_values", "labels"})
        assert set(dm.val_dataloader()) == {"lm", "img"}

    def test_weighted_schedule_from_multi_config(self):
        config = MultiDataLoaderConfig(sampling_strategy="weighted", dataloader_weights=[3, 1],
                                       epoch_length_policy="fixed_num_steps", steps_per_epoch=40)
        names = [name for name, _ in module(multi_config=config).train_dataloader()]
        assert names.count("lm") == 30 and names.count("img") == 10

    def test_names_must_match(self):
        with pytest.raises(ValueError, match=r"task_spec names \['lm'\] do not match the train datasets"):
            MultiDataModule({"lm": tokens(), "img": Images(16)}, task_spec={"lm": LM})


class TestResume:
    @pytest.mark.parametrize("stop", [1, 6, 11, 14])
    def test_resume_continues_the_schedule_and_every_child(self, stop):
        reference = take(module(), 20)
        first = module()
        assert take(first, stop) == reference[:stop]
        resumed = module()
        resumed.load_state_dict(first.data_state())
        assert take(resumed, 20 - stop) == reference[stop:]

    @pytest.mark.parametrize("steps", [6, 16])
    def test_a_new_trainer_extends_a_run_stopped_at_max_steps(self, tmp_path, steps):
        class Recorder(lightning.LightningModule):
            def __init__(self):
                super().__init__()
                self.weight, self.seen = torch.nn.Parameter(torch.zeros(1)), []

            def training_step(self, named, batch_index):
                name, batch = named
                self.seen.append((name, fingerprint(batch)))
                return (self.weight ** 2).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        def trainer(max_steps):
            return lightning.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=max_steps,
                                     enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=False)

        full = Recorder()
        trainer(16).fit(full, datamodule=module())  # 11 steps per epoch: 16 crosses into the second
        stopped = trainer(3)
        stopped.fit(Recorder(), datamodule=module())
        stopped.save_checkpoint(tmp_path / "three.ckpt")
        extended = Recorder()
        trainer(steps).fit(extended, datamodule=module(), ckpt_path=tmp_path / "three.ckpt")
        assert extended.seen == full.seen[3:steps]

    def test_state_of_other_datasets_is_refused(self):
        state = module().data_state()
        with pytest.raises(ValueError, match="does not match this data module"):
            MultiDataModule({"lm": tokens(41), "img": Images(16)}, task_spec={"lm": LM, "img": SMALL_IMAGES},
                            batch_size=4, val_split=0.25, seed=7).load_state_dict(state)


class TestThreads:
    """The first train loader is built once whichever threads ask, and a state loaded meanwhile is not lost."""

    def test_the_first_train_dataloader_from_eight_threads_builds_one_loader(self, monkeypatch):
        built, build = [], multi_module.build_multi_loader

        def slow(*args, **kwargs):
            built.append(1)
            time.sleep(0.05)  # the window in which a check-then-act race would let another thread in
            return build(*args, **kwargs)

        monkeypatch.setattr(multi_module, "build_multi_loader", slow)
        dm = module()
        loaders = first_loaders_from_threads(dm)
        assert len(built) == 1
        assert all(loader is loaders[0] for loader in loaders) and dm.train_dataloader() is loaders[0]
        assert take(dm, 20) == take(module(), 20)

    def test_a_state_loaded_while_another_thread_builds_the_loader_is_where_training_continues(self, monkeypatch):
        reference, first = take(module(), 20), module()
        take(first, 6)
        state = first.data_state()
        building, loaded, build = threading.Event(), threading.Event(), multi_module.build_multi_loader

        def held(*args, **kwargs):
            building.set()
            loaded.wait(timeout=0.5)  # without the lock the load runs inside this window
            return build(*args, **kwargs)

        monkeypatch.setattr(multi_module, "build_multi_loader", held)
        resumed = module()
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(resumed.train_dataloader)
            assert building.wait(timeout=60)
            resumed.load_state_dict(state)
            loaded.set()
            started.result()
        assert take(resumed, 14) == reference[6:]

    def test_the_module_still_pickles(self):
        dm = module()
        assert take(pickle.loads(pickle.dumps(dm)), 5) == take(dm, 5)


def test_lightning_fit_receives_named_batches():
    seen, validated = [], set()

    class TwoHeads(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.text, self.image = torch.nn.Embedding(100, 4), torch.nn.Linear(3 * 8 * 8, 4)

        def training_step(self, named, batch_index):
            name, batch = named
            seen.append(name)
            if name == "lm":
                return self.text(batch["input_ids"]).mean()
            return torch.nn.functional.cross_entropy(self.image(batch["pixel_values"].flatten(1)), batch["labels"])

        def validation_step(self, batch, batch_index, dataloader_idx=0):
            validated.add(dataloader_idx)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    lightning.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0).fit(TwoHeads(), datamodule=module())
    expected = [name for name, _ in module().train_dataloader()]  # round robin, the short loader cycles
    assert seen == expected and expected.count("img") == 5 and validated == {0, 1}


class TestComposition:
    """MultiDataModule is a composite of UniversalDataModules: every public method and utility works on it."""

    def test_each_module_takes_its_own_kind_of_data(self):
        with pytest.raises(TypeError, match=r"MultiDataModule takes train_data=\{name: data\}, but got list"):
            MultiDataModule(tokens(), task_spec=LM)
        with pytest.raises(TypeError, match=r"train_data=\{name: data\} holds several named datasets \['img', 'lm'\]; "
                                            r"pass mix=.* use MultiDataModule\(train_data, \.\.\.\)"):
            UniversalDataModule({"lm": tokens(), "img": Images(16)}, task_spec=LM)
        assert not hasattr(UniversalDataModule(tokens(), task_spec=LM), "children")

    def test_children_are_built_with_the_modules_options_and_seeds_derived_from_their_names(self):
        from engine import derive_seed

        dm = module(num_workers=0, eval_batch_size=3)
        assert {name: child.seed for name, child in dm.children.items()} == {
            name: derive_seed(7, name) % 2**31 for name in ("lm", "img")}
        assert all(child.eval_config.batch_size == 3 for child in dm.children.values())
        assert dm.split_sizes == {name: child.split_sizes for name, child in dm.children.items()}

    def test_identity_state_and_repr(self):
        dm = module()
        identity = dm.identity()
        assert identity["version"] == dm.data_state()["version"] and sorted(identity["children"]) == ["img", "lm"]
        assert identity["children"]["lm"] == dm.children["lm"].identity()
        text = repr(dm)
        assert "schedule=round_robin" in text and "lm:" in text and "img:" in text

    def test_validate_first_batch_checks_every_child(self):
        from engine import validate_first_batch

        report = validate_first_batch(module())
        assert report.passed
        assert {name.split("/")[0] for name in (check.name for check in report.checks)} == {"lm", "img"}

    def test_recommend_num_workers_measures_the_children(self):
        from engine import recommend_num_workers

        result = recommend_num_workers(module(), candidates=(0,), max_batches=1, warmup_batches=0)
        assert result.num_workers == 0 and "lm" in result.reason and "img" in result.reason

    def test_multi_config_is_not_an_option_of_a_single_dataset(self):
        with pytest.raises(TypeError, match="multi_config"):
            UniversalDataModule(tokens(), task_spec=LM, multi_config=MultiDataLoaderConfig())

    def test_report_per_child(self):
        dm = module()
        assert dm.report("lm").numbers["split_sizes"] == dm.children["lm"].report().numbers["split_sizes"]
        with pytest.raises(ValueError, match=r"report\(\) describes one dataset: pass name= one of \['img', 'lm'\]"):
            dm.report()


class TestMultiConfig:
    """The module's seed and names fill the schedule's config; a field that contradicts them is refused."""

    def test_unset_fields_are_filled_in(self):
        dm = module(multi_config=MultiDataLoaderConfig(sampling_strategy="weighted", dataloader_weights=[3, 1]))
        assert dm.multi_config.choice_rng_seed == 7 and dm.train_dataloader().names == ["lm", "img"]
        same = module(multi_config=MultiDataLoaderConfig(choice_rng_seed=7, dataloader_names=["lm", "img"]))
        assert take(same, 11) == take(module(), 11)

    @pytest.mark.parametrize(("config", "match"), [
        (MultiDataLoaderConfig(choice_rng_seed=123), r"multi_config.choice_rng_seed=123 contradicts seed=7"),
        (MultiDataLoaderConfig(dataloader_names=["img", "lm"]),
         r"multi_config.dataloader_names=\['img', 'lm'\] contradicts the names of train_data \['lm', 'img'\]"),
        (MultiDataLoaderConfig(dataloader_names=["a", "b"]), r"drop dataloader_names"),
    ])
    def test_contradicting_fields_are_refused(self, config, match):
        with pytest.raises(ValueError, match=match):
            module(multi_config=config)

    def test_a_bare_multi_loader_still_seeds_its_schedule_with_zero(self):
        from engine import MultiDataLoader

        assert MultiDataLoader({"a": [1], "b": [2]}).config.choice_rng_seed == 0


class TestCheckpointConfiguration:
    """Lightning checkpoints keep the module's configuration; both modules rebuild from theirs and from old ones."""

    def save(self, tmp_path, configuration):
        path = tmp_path / "module.ckpt"
        torch.save({"datamodule_hyper_parameters": configuration}, path)
        return path

    def test_a_multi_module_rebuilds_from_its_checkpoint(self, tmp_path):
        dm = module(multi_config=MultiDataLoaderConfig(sampling_strategy="weighted", dataloader_weights=[3, 1]))
        path = self.save(tmp_path, dict(dm.hparams_initial))
        restored = MultiDataModule.load_from_checkpoint(path, train_data={"lm": tokens(), "img": Images(16)})
        assert restored.multi_config == dm.multi_config and take(restored, 11) == take(dm, 11)

    def test_configurations_saved_before_the_composite_still_load(self, tmp_path):
        from engine.datamodule.options import checkpoint_configuration

        leave_out = ("train_data", "tokenizer")
        old_single = checkpoint_configuration({"task_spec": LM, "batch_size": 4, "multi_config": None}, leave_out)
        single = UniversalDataModule.load_from_checkpoint(self.save(tmp_path, old_single), train_data=tokens())
        assert single.train_config.batch_size == 4
        old_multi = checkpoint_configuration({"task_spec": {"lm": LM, "img": SMALL_IMAGES}, "batch_size": 4,
                                              "val_split": 0.25, "seed": 7,
                                              "multi_config": MultiDataLoaderConfig(choice_rng_seed=123)}, leave_out)
        path = self.save(tmp_path, old_multi)
        with pytest.raises(ValueError, match=r"holds a module over several named datasets; load it with "
                                             r"MultiDataModule.load_from_checkpoint"):
            UniversalDataModule.load_from_checkpoint(path, train_data=tokens())
        multi = MultiDataModule.load_from_checkpoint(path, train_data={"lm": tokens(), "img": Images(16)})
        assert take(multi, 11) == take(module(), 11)  # the schedule it ran on: the module's seed, not 123


def test_seed_none_draws_one_seed_recorded_for_the_schedule_the_state_and_the_checkpoint(monkeypatch):
    import secrets

    monkeypatch.setattr(secrets, "randbits", lambda bits: 4321)
    dm = MultiDataModule({"a": tokens(), "b": tokens(12)}, task_spec=LM, batch_size=4, seed=None)
    assert dm.seed == dm.hparams["seed"] == dm.multi_config.choice_rng_seed == 4321
    again = MultiDataModule({"a": tokens(), "b": tokens(12)}, task_spec=LM, batch_size=4, seed=4321)
    assert [name for name, _ in dm.train_dataloader()] == [name for name, _ in again.train_dataloader()]
