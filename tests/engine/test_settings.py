"""One home per setting: a setting given in two places that disagree is refused naming both, at construction."""

import dataclasses
import inspect

import pytest
import torch

from engine import DataLoaderConfig, UniversalDataModule
from engine.core.checks import keyword_or_spec
from engine.datamodule.options import NOT_PLAIN
from engine.loading.settings import BY_NAME, LOADER_SETTINGS, RESUMED, SETTINGS
from engine.loading.state import IDENTITY_CHECKS
from engine.tools.summary import summary_rows
from task_spec import REMOVE, TaskSpec

ROWS = [torch.arange(3, 3 + n) for n in range(4, 24)]


class TestKeywordOrSpec:
    def test_the_one_given_else_the_default(self):
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"batching": "grouped"})
        assert keyword_or_spec("batching", None, spec, "plain") == ("grouped", "spec.preprocessing_config['batching']")
        assert keyword_or_spec("batching", "grouped", spec, "plain")[0] == "grouped"  # both, agreeing
        assert keyword_or_spec("batching", "packed", None, "plain") == ("packed", "batching= was given")
        assert keyword_or_spec("batching", None, TaskSpec.lm_tiny(), "plain") == ("plain", "the default")

    def test_two_places_that_disagree_are_refused_naming_both(self):
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"stride": 4})
        with pytest.raises(ValueError, match=r"stride=2 contradicts spec.preprocessing_config\['stride'\]=4; set it in "
                                             r"one place: drop stride= to use the spec's"):
            keyword_or_spec("stride", 2, spec)


class TestCollatorKwargs:
    @pytest.mark.parametrize(("spec", "kwargs", "match"), [
        (TaskSpec.lm_tiny(), {"max_length": 64},
         r"collator_kwargs\['max_length'\]=64 contradicts spec.max_seq_len=128; the spec describes the task"),
        (TaskSpec.lm_tiny(), {"pad_token_id": 7}, r"contradicts spec.special_tokens\['pad_token_id'\]=50256"),
        (TaskSpec.cls_tiny(), {"num_classes": 5}, r"collator_kwargs\['num_classes'\]=5 contradicts spec.num_classes=2"),
        (TaskSpec.cls_tiny(), {"target_field": "label"}, r"contradicts spec.target_field='labels'"),
        (TaskSpec.lm_tiny(), {"task_type": "masked_lm"}, r"contradicts spec.task_type='causal_lm'"),
        (TaskSpec.lm_tiny(), {"seed": 3}, r"collator_kwargs\['seed'\]=3 is set by the data module; use the module's "
                                          r"seed="),
        (TaskSpec.vision_tiny(), {"keep_uint8": True}, r"is set by the data module; use device_normalize=True"),
        (TaskSpec.vision_tiny().replace(preprocessing_config={"normalization": "imagenet"}), {"mean": (0.5,)},
         r"collator_kwargs\['mean'\]=\(0.5,\) contradicts spec.preprocessing_config\['normalization'\]='imagenet'"),
    ])
    def test_a_contradiction_with_the_spec_or_the_module_is_refused(self, spec, kwargs, match):
        with pytest.raises(ValueError, match=match):
            UniversalDataModule(ROWS, task_spec=spec, collator_kwargs=kwargs)

    def test_options_the_spec_leaves_open_or_agrees_with_are_taken(self):
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(),
                                 collator_kwargs={"max_length": 128, "pad_to_multiple_of": 8})
        assert dm.collator.max_length == 128 and dm.collator.pad_to_multiple_of == 8
        open_spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": REMOVE})
        dm = UniversalDataModule(ROWS, task_spec=open_spec, collator_kwargs={"max_length": 16})
        assert dm.collator.max_length == 16


class TestBatchingAndLongRows:
    def test_keyword_and_spec_disagreeing_are_refused(self):
        spec = TaskSpec.lm_tiny().replace(preprocessing_config={"batching": "token_budget", "max_tokens": 256})
        with pytest.raises(ValueError, match=r"batching='grouped' contradicts spec.preprocessing_config\['batching'\]"):
            UniversalDataModule(ROWS, task_spec=spec, batching="grouped")
        assert UniversalDataModule(ROWS, task_spec=spec, batching="token_budget").max_tokens == 256


class TestLoaderOptions:
    def test_timeout_and_start_method_reach_both_loaders(self):
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), num_workers=1, timeout=30,
                                 multiprocessing_context="spawn")
        for config in (dm.train_config, dm.eval_config):
            kwargs, _ = config.resolve()
            assert kwargs["timeout"] == 30 and kwargs["multiprocessing_context"] == "spawn"
        with pytest.raises(ValueError, match=r"multiprocessing_context should be one of"):
            UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), multiprocessing_context="threads")

    def test_batch_size_that_no_loader_would_use_is_refused(self):
        budget = dict(task_spec=TaskSpec.lm_tiny(), batching="token_budget", max_tokens=64)
        with pytest.raises(ValueError, match=r"batch_size=8 is used by no loader: batching='token_budget' cuts "
                                             r"training batches by max_tokens, and eval_batch_size=4"):
            UniversalDataModule(ROWS, batch_size=8, eval_batch_size=4, **budget)
        assert UniversalDataModule(ROWS, batch_size=8, **budget).eval_config.batch_size == 8  # sizes evaluation
        assert UniversalDataModule(ROWS, **budget).train_config.batch_size == 32  # the default, as before
        assert UniversalDataModule(ROWS, batch_size=8, eval_batch_size=4, task_spec=TaskSpec.lm_tiny()).eval_config \
            .batch_size == 4


class TestDeclarations:
    """Each keyword is declared once (engine/loading/settings.py); the signature, DataLoaderConfig, the checks, the
    checkpoint's configuration, the resume identity and repr's loader line follow the declarations."""

    def test_the_signature_is_the_declarations(self):
        parameters = inspect.signature(UniversalDataModule).parameters
        assert list(parameters) and set(parameters) == set(BY_NAME)
        for name, parameter in parameters.items():
            setting = BY_NAME[name]
            assert (parameter.annotation, type(parameter.default), parameter.default) == \
                (setting.type, type(setting.default), setting.default), name
            assert parameter.kind is (inspect.Parameter.POSITIONAL_OR_KEYWORD if name == "train_data"
                                      else inspect.Parameter.KEYWORD_ONLY)

    def test_data_loader_config_has_a_field_per_loader_setting(self):
        fields = dataclasses.fields(DataLoaderConfig)
        assert [(f.name, f.type, f.default) for f in fields] == \
            [(s.name, s.loader.type, s.loader.default) for s in LOADER_SETTINGS]
        assert all(f"{s.name} ({s.loader.type}" in DataLoaderConfig.__doc__ for s in LOADER_SETTINGS)

    @pytest.mark.parametrize("setting", [s for s in SETTINGS if s.check is not None], ids=lambda s: s.name)
    def test_every_declared_check_refuses_through_the_module(self, setting):
        wrong = {"int": -1, "number": -1, "bool": "yes", "choice": "nope", "callable": 3}[setting.check.kind]
        with pytest.raises((TypeError, ValueError), match=rf"{setting.name} should be .*, but got "):
            UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), **{setting.name: wrong})

    def test_the_checks_keep_torchs_form(self):
        with pytest.raises(ValueError, match=r"^batch_size should be a positive integer, but got batch_size=0$"):
            UniversalDataModule(ROWS, batch_size=0)
        with pytest.raises(ValueError, match=r"^uneven should be 'pad' or 'drop', but got uneven='spread'$"):
            UniversalDataModule(ROWS, uneven="spread")
        with pytest.raises(ValueError, match=r"^eval_batch_size should be a positive integer, but got "
                                             r"eval_batch_size=0$"):
            UniversalDataModule(ROWS, eval_batch_size=0)

    def test_the_checkpoint_records_the_declared_settings(self):
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4, seed=None)
        recorded = {s.name for s in SETTINGS if s.recorded}
        assert set(dm.hparams_initial) == recorded | {NOT_PLAIN}
        assert dm.hparams_initial["seed"] == dm.seed and dm.hparams_initial["batch_size"] == 4

    def test_a_resume_checks_the_declared_settings(self):
        identity = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), uneven="drop").identity()
        assert set(RESUMED) <= set(identity) and set(RESUMED) <= set(IDENTITY_CHECKS)
        assert identity["uneven"] == "drop" and identity["batch_size"] == 32 and identity["batching"] == "plain"

    def test_repr_shows_the_declared_loader_settings(self):
        line = dict(summary_rows(UniversalDataModule(ROWS, batch_size=4, num_threads=2), shapes=False))["loader"]
        assert line == "batch_size=4, shuffle=True, num_workers=0, drop_last=False, num_threads=2"
        line = dict(summary_rows(UniversalDataModule(ROWS, batch_size=4), shapes=False))["loader"]
        assert line == "batch_size=4, shuffle=True, num_workers=0, drop_last=False"
