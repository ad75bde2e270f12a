"""Several named datasets through one module: each keeps its spec and collator; one resumable schedule."""

import itertools

import lightning
import pytest
import torch

from engine import UniversalDataModule
from engine.datamodule.universal import MultiDataModule
from engine.multi.config import MultiDataLoaderConfig
from task_spec import TaskSpec
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
    return UniversalDataModule({"lm": tokens(), "img": Images(16)}, **options)


def take(dm, count):
    out = []
    for name, batch in itertools.islice(itertools.chain.from_iterable(itertools.repeat(dm.train_dataloader())),
                                        count):
        out.append((name, fingerprint(batch)))
    return out


class TestShape:
    def test_a_dict_of_datasets_builds_named_children_with_their_own_collators(self):
        dm = module()
        assert type(dm) is UniversalDataModule and list(dm.children) == ["lm", "img"]
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
            UniversalDataModule({"lm": tokens(), "img": Images(16)}, task_spec={"lm": LM})


class TestResume:
    @pytest.mark.parametrize("stop", [1, 6, 11, 14])
    def test_resume_continues_the_schedule_and_every_child(self, stop):
        reference = take(module(), 20)
        first = module()
        assert take(first, stop) == reference[:stop]
        resumed = module()
        resumed.load_state_dict(first.state_dict())
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
        state = module().state_dict()
        with pytest.raises(ValueError, match="does not match this data module"):
            UniversalDataModule({"lm": tokens(41), "img": Images(16)}, task_spec={"lm": LM, "img": SMALL_IMAGES},
                                batch_size=4, val_split=0.25, seed=7).load_state_dict(state)


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
    """Several named datasets are composed inside UniversalDataModule, so every public method and utility works."""

    def test_multidatamodule_is_the_same_module_and_refuses_a_single_dataset(self):
        options = dict(task_spec={"lm": LM, "img": SMALL_IMAGES}, batch_size=4, val_split=0.25, seed=7)
        named = MultiDataModule({"lm": tokens(), "img": Images(16)}, **options)
        assert isinstance(named, UniversalDataModule)
        assert take(named, 11) == take(module(), 11)
        with pytest.raises(TypeError, match=r"MultiDataModule takes train_data=\{name: data\}, but got list"):
            MultiDataModule(tokens(), task_spec=LM)

    def test_identity_state_and_repr(self):
        dm = module()
        identity = dm.identity()
        assert identity["version"] == dm.state_dict()["version"] and sorted(identity["children"]) == ["img", "lm"]
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

    def test_multi_config_is_refused_for_a_single_dataset(self):
        with pytest.raises(ValueError, match="multi_config applies to several named datasets"):
            UniversalDataModule(tokens(), task_spec=LM, multi_config=MultiDataLoaderConfig())
