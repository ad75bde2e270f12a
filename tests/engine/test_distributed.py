from types import SimpleNamespace

import lightning
import pytest

from engine.core.distributed import check_trainer_keeps_our_samplers, resolve_world


def connector(use_distributed_sampler):
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False,
                                use_distributed_sampler=use_distributed_sampler)
    return trainer._accelerator_connector  # the attribute the check reads, from a real Trainer


class TestTrainerCheck:
    def test_ddp_trainer_that_would_replace_our_samplers_is_refused_with_the_fix(self):
        trainer = SimpleNamespace(world_size=2, _accelerator_connector=connector(True))
        with pytest.raises(ValueError, match=r"lightning.Trainer\(..., use_distributed_sampler=False\)"):
            check_trainer_keeps_our_samplers(trainer)

    def test_allowed_cases(self):
        check_trainer_keeps_our_samplers(SimpleNamespace(world_size=2, _accelerator_connector=connector(False)))
        check_trainer_keeps_our_samplers(SimpleNamespace(world_size=1, _accelerator_connector=connector(True)))
        check_trainer_keeps_our_samplers(None)


def test_resolve_world():
    assert resolve_world() == (0, 1)
    assert resolve_world(SimpleNamespace(global_rank=1, world_size=2)) == (1, 2)
