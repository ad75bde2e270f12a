"""Resume where users actually checkpoint: after a loop that finished its epoch, after Lightning stops at
``max_steps`` and a new Trainer extends the run, and with a changed setting (refused, naming it)."""

import logging
import pickle
import warnings

import lightning
import pytest
import torch

from engine import UniversalDataModule
from tests.engine.test_resume import SPEC, fingerprint, module, rows
from tests.engine.test_resume_lightning import Recorder

BATCHINGS = [dict(batching="plain"), dict(batching="grouped"), dict(batching="token_budget", max_tokens=120)]


def epochs(dm, count):
    """``count`` whole passes over the train loader, each run to its end as a plain ``for`` loop does."""
    loader = dm.train_dataloader()
    return [[fingerprint(batch) for batch in loader] for _ in range(count)]


class TestAfterACompletedEpoch:
    @pytest.mark.parametrize("options", BATCHINGS, ids=lambda o: o["batching"])
    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_state_saved_after_the_loop_ends_resumes_at_the_next_epoch(self, workers, options):
        reference = epochs(module(workers, **options), 3)
        first = module(workers, **options)
        assert epochs(first, 1) == reference[:1]
        state = pickle.loads(pickle.dumps(first.data_state()))
        assert state["epoch"] == 1
        resumed = module(workers, **options)
        resumed.load_state_dict(state)
        assert epochs(resumed, 2) == reference[1:]

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_state_saved_mid_way_through_the_second_epoch(self, workers):
        reference = [batch for epoch in epochs(module(workers), 3) for batch in epoch]
        first = module(workers)
        loader = first.train_dataloader()
        seen = [fingerprint(batch) for batch in loader]  # epoch 0, to its end
        for batch in loader:  # epoch 1, three batches in: not the first batch of anything
            seen.append(fingerprint(batch))
            if len(seen) == 8:
                break
        resumed = module(workers)
        resumed.load_state_dict(first.data_state())
        rest = [fingerprint(batch) for batch in resumed.train_dataloader()]
        rest += [fingerprint(batch) for batch in resumed.train_dataloader()]
        assert seen + rest == reference


def trainer(**kwargs):
    return lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=False, **kwargs)


@pytest.fixture
def quiet_lightning():
    logging.getLogger("lightning").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.usefixtures("quiet_lightning")
class TestLightningExtendsARun:
    """Lightning's ``test_fit_loop_save_and_restore_dataloaders`` pattern: fit to max_steps, save, extend."""

    @pytest.mark.parametrize("workers", [0, 2])
    def test_a_new_trainer_with_more_steps_sees_the_next_batches(self, tmp_path, workers):
        full = Recorder()
        trainer(max_steps=9).fit(full, datamodule=module(workers))  # 5 batches per epoch: crosses into epoch 1
        first, dm = Recorder(), module(workers)
        stopped = trainer(max_steps=2)
        stopped.fit(first, datamodule=dm)
        assert first.seen == full.seen[:2]
        assert dm.data_state()["train_loader"] is not None
        stopped.save_checkpoint(tmp_path / "two.ckpt")
        for steps in (4, 9):  # inside the saved epoch, and on into the next one
            extended = Recorder()
            trainer(max_steps=steps).fit(extended, datamodule=module(workers), ckpt_path=tmp_path / "two.ckpt")
            assert extended.seen == full.seen[2:steps], steps

    def test_a_resumed_run_can_be_saved_and_resumed_again(self, tmp_path):
        full = Recorder()
        trainer(max_steps=12).fit(full, datamodule=module())
        first = trainer(max_steps=3)
        first.fit(Recorder(), datamodule=module())
        first.save_checkpoint(tmp_path / "three.ckpt")
        second, middle = trainer(max_steps=7), Recorder()
        second.fit(middle, datamodule=module(), ckpt_path=tmp_path / "three.ckpt")
        second.save_checkpoint(tmp_path / "seven.ckpt")
        last = Recorder()
        trainer(max_steps=12).fit(last, datamodule=module(), ckpt_path=tmp_path / "seven.ckpt")
        assert middle.seen + last.seen == full.seen[3:]

    def test_the_same_module_keeps_its_position_after_fit_ends(self):
        dm = module(2)
        trainer(max_steps=2).fit(Recorder(), datamodule=dm)
        state = dm.data_state()  # Lightning dropped the loader's iterator at the end of fit
        resumed = module(2)
        resumed.load_state_dict(state)
        full = Recorder()
        trainer(max_steps=5).fit(full, datamodule=module(2))
        assert [fingerprint(batch) for batch in resumed.train_dataloader()] == full.seen[2:5]


class TestChangedSettings:
    @pytest.mark.parametrize(("saved", "now", "field"), [
        (dict(batch_size=4), dict(batch_size=8), "batch_size"),
        (dict(shuffle=False), dict(shuffle=True), "shuffle"),
        (dict(batching="grouped"), dict(batching="plain"), "batching"),
        (dict(batching="token_budget", max_tokens=120), dict(batching="token_budget", max_tokens=200),
         "max_tokens"),
        (dict(drop_last=True), dict(drop_last=False), "drop_last"),
        (dict(uneven="drop"), dict(uneven="pad"), "uneven"),
    ])
    def test_a_state_from_other_batching_options_is_refused_naming_the_field(self, saved, now, field):
        first = module(**saved)
        next(iter(first.train_dataloader()))
        state = first.data_state()
        with pytest.raises(ValueError, match=f"{field} was .* when saved and is .* now .* Resume with {field}="):
            module(**now).load_state_dict(state)

    def test_eval_batch_size_and_collator_options_do_not_block_resume(self):
        first = module()
        next(iter(first.train_dataloader()))
        module(eval_batch_size=3).load_state_dict(first.data_state())


class TestLoadedStateIsChecked:
    def test_a_non_dict_is_refused(self):
        with pytest.raises(TypeError, match="state_dict should be a dict from dm.state_dict.*but got str"):
            module().load_state_dict("abc")

    def test_a_state_without_its_loader_part_is_refused(self):
        state = module().data_state()
        del state["train_loader"]
        with pytest.raises(ValueError, match=r"missing \['train_loader'\]"):
            module().load_state_dict(state)

    @pytest.mark.parametrize(("position", "error", "message"), [
        (-1, ValueError, r"position should be a non-negative integer \(below 2\*\*63\), but got position=-1"),
        (99, ValueError, "position should be at most the 5 batches of epoch 0, but got position=99"),
        ("2", TypeError, "position should be a non-negative integer"),
    ])
    def test_a_position_out_of_range_is_refused_at_load(self, position, error, message):
        dm = module()
        next(iter(dm.train_dataloader()))
        state = dm.data_state()
        state["train_loader"]["_index_sampler_state"]["position"] = position
        with pytest.raises(error, match=message):
            module().load_state_dict(state)

    def test_a_negative_epoch_is_refused(self):
        state = module().data_state()
        state["epoch"] = -1
        with pytest.raises(ValueError, match="non-negative integer epoch, but got epoch=-1"):
            module().load_state_dict(state)

    def test_a_loader_part_of_the_wrong_type_is_refused(self):
        state = module().data_state()
        state["train_loader"] = [1, 2]
        with pytest.raises(TypeError, match="train loader's state dict .* but got list"):
            module().load_state_dict(state)

    def test_a_state_saved_before_training_resumes_at_the_start(self):
        state = module().data_state()
        resumed = module()
        resumed.load_state_dict(state)
        assert epochs(resumed, 1) == epochs(module(), 1)
        assert state["epoch"] == 0


@pytest.mark.usefixtures("quiet_lightning")
class TestConfigurationInCheckpoints:
    def test_a_module_is_rebuilt_from_its_checkpoint_with_the_data_given_again(self, tmp_path):
        first = trainer(max_steps=2)
        first.fit(Recorder(), datamodule=module(batching="grouped", uneven="drop"))
        first.save_checkpoint(tmp_path / "two.ckpt")
        saved = torch.load(tmp_path / "two.ckpt", weights_only=True)["datamodule_hyper_parameters"]  # plain values
        assert len(pickle.dumps(saved)) < 64 * 1024
        assert not {"train_data", "val_data", "tokenizer", "collate_fn"} & set(saved)
        assert saved["not_checkpointed"] == []  # every other argument was stored
        rebuilt = UniversalDataModule.load_from_checkpoint(tmp_path / "two.ckpt", train_data=rows())
        assert (rebuilt.batching, rebuilt.uneven, rebuilt.seed, rebuilt.task_spec) == ("grouped", "drop", 11, SPEC)
        resumed = Recorder()
        trainer(max_steps=4).fit(resumed, datamodule=rebuilt, ckpt_path=tmp_path / "two.ckpt")
        full = Recorder()
        trainer(max_steps=4).fit(full, datamodule=module(batching="grouped", uneven="drop"))
        assert resumed.seen == full.seen[2:4]

    def test_an_argument_a_checkpoint_cannot_hold_must_be_given_again(self):
        from engine.datamodule.options import NOT_PLAIN, checkpoint_configuration, restore_configuration

        marker = object()
        saved = checkpoint_configuration({"batch_size": 4, "collator_kwargs": {"vocab": marker}, "self": None},
                                         ("self",))
        assert saved == {NOT_PLAIN: ["collator_kwargs"], "batch_size": 4}
        with pytest.raises(ValueError, match=r"built with \['collator_kwargs'\], .* pass collator_kwargs=\.\.\. to "
                                             r"load_from_checkpoint"):
            restore_configuration(saved, {"train_data": rows()})
        restored = restore_configuration(saved, {"train_data": [], "collator_kwargs": {"vocab": marker}})
        assert restored["collator_kwargs"]["vocab"] is marker and restored["batch_size"] == 4
