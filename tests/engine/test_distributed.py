from types import SimpleNamespace

import lightning
import torch
from lightning.pytorch.trainer.states import RunningStage

from engine import UniversalDataModule
from engine.core.compat import replaces_samplers
from engine.core.distributed import keep_our_samplers, resolve_world, restore_samplers
from task_spec import TaskSpec


def connector(use_distributed_sampler):
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False,
                                use_distributed_sampler=use_distributed_sampler)
    return trainer._accelerator_connector  # the attribute the switch lives in, from a real Trainer


class TestTrainerSwitch:
    def test_a_ddp_trainer_that_would_replace_our_samplers_is_told_not_to_until_restored(self):
        trainer = SimpleNamespace(world_size=2, _accelerator_connector=connector(True))
        assert keep_our_samplers(trainer) and not replaces_samplers(trainer)
        restore_samplers(trainer)
        assert replaces_samplers(trainer)

    def test_cases_left_alone(self):
        kept = SimpleNamespace(world_size=2, _accelerator_connector=connector(False))
        single = SimpleNamespace(world_size=1, _accelerator_connector=connector(True))
        assert not keep_our_samplers(kept) and not replaces_samplers(kept)
        assert not keep_our_samplers(single) and replaces_samplers(single)
        assert not keep_our_samplers(None)

    def test_lightning_ddp_keeps_the_modules_loaders_without_use_distributed_sampler_false(self):
        """The trainer's default (use_distributed_sampler=True) needs no change: setup turns it off for the module's
        loaders, which Lightning then leaves as they are, and teardown turns it on again for other loaders."""
        trainer = lightning.Trainer(strategy="ddp", devices=2, accelerator="cpu", logger=False)  # nothing starts
        rows = [torch.arange(3, 9 + n % 5) for n in range(40)]
        dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, seed=0)
        dm.trainer = trainer  # what Trainer.fit(model, datamodule=dm) does before it calls dm.setup("fit")
        dm.setup("fit")
        loader = dm.train_dataloader()
        assert trainer._data_connector._prepare_dataloader(loader, shuffle=True, mode=RunningStage.TRAINING) is loader
        assert dm.world_size == 2
        dm.teardown("fit")
        assert replaces_samplers(trainer)


def test_resolve_world():
    assert resolve_world() == (0, 1)
    assert resolve_world(SimpleNamespace(global_rank=1, world_size=2)) == (1, 2)
