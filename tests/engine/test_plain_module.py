"""DataModule, the data module without Lightning: the batches and states of UniversalDataModule (its Lightning
subclass) for the same arguments, its configuration, and its ranks from ``torch.distributed``."""

import pytest
import torch

from engine import DataModule, UniversalDataModule
from task_spec import TaskSpec

SPEC = TaskSpec.mlm_tiny().replace(special_tokens={"pad_token_id": 0, "mask_token_id": 1},
                                   additional_config={"vocab_size": 300})


def rows(count=50):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(2, 300, (int(n),), generator=generator) for n in torch.randint(3, 20, (count,),
                                                                                          generator=generator)]


def arguments(**kwargs):
    return {"task_spec": SPEC, "batch_size": 4, "val_split": 6, "test_split": 0.1, "seed": 9, **kwargs}


def tensors(batches):
    return [{key: value.tolist() for key, value in batch.items()} for batch in batches]


class TestSameAsUniversal:
    @pytest.mark.parametrize("options", [{}, {"batching": "grouped"}, {"batching": "token_budget", "max_tokens": 40,
                                                                       "batch_size": None, "eval_batch_size": 4}])
    def test_the_same_arguments_give_the_same_batches(self, options):
        plain = DataModule(rows(), **arguments(**options))
        lightning = UniversalDataModule(rows(), **arguments(**options))
        assert not isinstance(plain, type(lightning))
        for name in ("train_dataloader", "val_dataloader", "test_dataloader"):
            assert tensors(getattr(plain, name)()) == tensors(getattr(lightning, name)())
        assert tensors(plain.train_dataloader()) == tensors(lightning.train_dataloader())  # epoch 1 too
        assert plain.split_sizes == lightning.split_sizes and plain.configuration == dict(lightning.hparams)

    def test_the_summary_and_the_report_name_the_class_and_hold_the_same_lines(self):
        plain, lightning = DataModule(rows(), **arguments()), UniversalDataModule(rows(), **arguments())
        assert repr(plain).startswith("DataModule(\n") and repr(lightning).startswith("UniversalDataModule(\n")
        assert repr(plain).split("\n", 1)[1] == repr(lightning).split("\n", 1)[1]
        report = str(plain.report())
        assert report.startswith("DataModule report: mlm_tiny") and "splits: train=39, val=6, test=5" in report

    def test_a_mixture_gives_the_same_batches(self):
        data = {"a": rows(30), "b": rows(20)}
        options = {"task_spec": SPEC, "batch_size": 5, "seed": 2, "mix": {"a": 0.6, "b": 0.4}}
        assert tensors(DataModule(data, **options).train_dataloader()) == tensors(
            UniversalDataModule(data, **options).train_dataloader())

    def test_a_state_of_either_loads_into_the_other(self):
        lightning = UniversalDataModule(rows(), **arguments())
        batches = iter(lightning.train_dataloader())
        next(batches), next(batches)
        plain = DataModule(rows(), **arguments())
        plain.load_state_dict(lightning.state_dict())
        assert tensors(plain.train_dataloader()) == tensors(batches)


class TestState:
    def test_a_fresh_module_continues_with_the_next_batches(self):
        dm = DataModule(rows(), **arguments(num_workers=0))
        batches = iter(dm.train_dataloader())
        next(batches)
        state = dm.state_dict()
        fresh = DataModule(rows(), **arguments())
        fresh.load_state_dict(state)
        assert tensors(fresh.train_dataloader()) == tensors(batches)
        assert fresh.state_dict() == dm.state_dict()  # both at the end of epoch 0

    def test_a_state_of_other_data_is_refused(self):
        dm = DataModule(rows(), **arguments())
        next(iter(dm.train_dataloader()))
        other = DataModule(rows(49), **arguments())
        with pytest.raises(ValueError, match="data_fingerprint was .* when saved .*the training data differ"):
            other.load_state_dict(dm.state_dict())


class TestConfiguration:
    def test_from_configuration_rebuilds_the_module_given_its_data_again(self):
        dm = DataModule(rows(), **arguments(seed=None))  # a drawn seed is recorded
        rebuilt = DataModule.from_configuration(dm.configuration, train_data=rows())
        assert rebuilt.seed == dm.seed and rebuilt.configuration == dm.configuration
        assert tensors(rebuilt.train_dataloader()) == tensors(dm.train_dataloader())

    def test_arguments_that_are_not_plain_values_must_be_given_again(self):
        dm = DataModule(rows(), **arguments(train_transform=torch.clone))
        with pytest.raises(ValueError, match=r"pass train_transform=\.\.\. to load_from_checkpoint \(or from_conf"):
            DataModule.from_configuration(dm.configuration, train_data=rows())


def test_the_ranks_are_read_from_torch_distributed(monkeypatch):
    monkeypatch.setattr("engine.core.distributed.rank_and_world", lambda: (1, 2))
    dm = DataModule(rows(), **arguments())
    assert dm.split_sizes["train"] == 39 and (dm.rank, dm.world_size) == (1, 2)
    assert sum(len(batch["input_ids"]) for batch in dm.train_dataloader()) == 20  # its half of 39 rows, one padded
