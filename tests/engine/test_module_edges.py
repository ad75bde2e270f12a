"""UniversalDataModule at the edges: values a new user passes that used to be misread silently."""

import copy
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import datasets
import numpy as np
import pytest
import torch

from collators import CollatorRegistry
from demo.sample_data import build_tokenizer
from engine import DataLoaderConfig, UniversalDataModule
from engine.datamodule import universal
from engine.loading.factory import DataLoaderFactory
from task_spec import TaskSpec

ROWS = [torch.randint(5, 100, (n,)) for n in range(5, 25)]


class TestPadId:
    def test_a_preset_pad_id_the_tokenizer_lacks_is_refused(self):
        tokenizer = copy.deepcopy(build_tokenizer())
        tokenizer.pad_token = None  # as with GPT-2: no pad token, so the preset's 50256 would be used
        with pytest.raises(ValueError, match=r"pad_token_id should be an id of the tokenizer \(0\.\.\d+\), but got "
                                             r"pad_token_id=50256.*tokenizer.pad_token = tokenizer.eos_token"):
            UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer)

    def test_the_tokenizers_own_pad_id_is_used(self):
        tokenizer = build_tokenizer()
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=20)
        batch = next(iter(dm.train_dataloader()))
        assert batch["input_ids"][batch["attention_mask"] == 0].unique().tolist() == [tokenizer.pad_token_id]


class TestIntegers:
    def test_numpy_integers_are_accepted_and_become_ints(self):
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=np.int64(4), seed=np.int32(3),
                                 num_workers=np.int64(0))
        assert [len(batch["input_ids"]) for batch in dm.train_dataloader()] == [4] * 5
        assert type(dm.train_config.batch_size) is int and dm.state_dict()["batch_size"] == 4
        assert type(DataLoaderConfig(batch_size=np.int16(2)).batch_size) is int

    @pytest.mark.parametrize(("options", "error", "message"), [
        (dict(batch_size=0), ValueError, "^batch_size should be a positive integer, but got batch_size=0$"),
        (dict(batch_size=True), TypeError, "batch_size should be a positive integer, but got batch_size=True"),
        (dict(batch_size=4.0), TypeError, "batch_size should be a positive integer, but got batch_size=4.0"),
        (dict(eval_batch_size=0), ValueError, "eval_batch_size should be a positive integer, but got "
                                              "eval_batch_size=0"),
        (dict(num_workers=-1), ValueError, "num_workers should be a non-negative integer"),
    ])
    def test_bad_integers_are_refused_in_torchs_form(self, options, error, message):
        with pytest.raises(error, match=message):
            UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), **options)


class TestThreads:
    def test_setup_and_the_first_train_dataloader_from_eight_threads_set_up_once_and_build_one_loader(
            self, monkeypatch):
        calls = {"setup": 0, "loader": 0}
        prepare, build = universal.prepare_inputs, DataLoaderFactory.train_dataloader

        def counted(name, function):
            def slow(*args, **kwargs):
                calls[name] += 1
                time.sleep(0.05)  # the window in which a check-then-act race would let another thread in
                return function(*args, **kwargs)
            return slow

        monkeypatch.setattr(universal, "prepare_inputs", counted("setup", prepare))
        monkeypatch.setattr(DataLoaderFactory, "train_dataloader", counted("loader", build))
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        barrier = threading.Barrier(8)

        def first_loader(thread):
            barrier.wait()
            if thread % 2:
                dm.setup("fit")
            return dm.train_dataloader()

        with ThreadPoolExecutor(8) as pool:
            loaders = list(pool.map(first_loader, range(8)))
        assert calls == {"setup": 1, "loader": 1}
        assert all(loader is loaders[0] for loader in loaders) and dm.train_dataloader() is loaders[0]
        next(iter(loaders[0]))
        assert dm.state_dict()["train_loader"] == loaders[0].state_dict()  # the module tracks the loader handed out

    def test_the_module_still_pickles(self):
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        restored = pickle.loads(pickle.dumps(dm))
        assert torch.equal(next(iter(restored.train_dataloader()))["input_ids"],
                           next(iter(dm.train_dataloader()))["input_ids"])


class TestPickling:
    def test_an_unrelated_unpicklable_registration_does_not_break_pickling(self):
        registry = CollatorRegistry.get_instance()
        with registry.scoped():
            registry.register("notebook_vision", modality="vision")(lambda task_spec=None, **kwargs: len)
            dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4)
            restored = pickle.loads(pickle.dumps(dm))
        assert restored.collator_resolution.chosen.name == dm.collator_resolution.chosen.name == "text"
        assert torch.equal(next(iter(restored.train_dataloader()))["input_ids"],
                           next(iter(dm.train_dataloader()))["input_ids"])

    def test_a_factory_returning_a_non_callable_is_refused_at_construction(self):
        registry = CollatorRegistry.get_instance()
        with registry.scoped():
            registry.register("broken", modality="text")(lambda task_spec=None, **kwargs: None)
            with pytest.raises(TypeError, match="collator factory 'broken' .* should return a callable"):
                UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny())


class TestPrediction:
    def test_unlabelled_prediction_rows_with_a_supervised_spec_give_batches_without_labels(self):
        labelled = datasets.Dataset.from_list([{"input_ids": list(range(5, 5 + n)), "labels": n % 2}
                                               for n in range(5, 25)])
        unlabelled = datasets.Dataset.from_list([{"input_ids": list(range(5, 5 + n))} for n in range(3, 9)])
        spec = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 2})
        dm = UniversalDataModule(labelled, task_spec=spec, predict_data=unlabelled, batch_size=4)
        batches = list(dm.predict_dataloader())
        assert [sorted(batch) for batch in batches] == [["attention_mask", "input_ids"]] * 2
        assert [len(batch["input_ids"]) for batch in batches] == [4, 2]
        assert sorted(next(iter(dm.train_dataloader()))) == ["attention_mask", "input_ids", "labels"]


class TestTruncationIsReported:
    def test_rows_cut_to_max_seq_len_are_counted_logged_and_shown(self, caplog):
        rows = [torch.randint(5, 100, (n,)) for n in range(100, 200)]  # max_seq_len is 128
        dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=8)
        with caplog.at_level("WARNING", logger="engine"):
            dm.setup()
        lost = sum(max(0, n - 128) for n in range(100, 200))
        assert dm.truncation == {"rows": 100, "long_rows": 71, "tokens": sum(range(100, 200)), "lost_tokens": lost}
        message = f"71 of 100 train rows are longer than max_length=128; truncating them drops {lost} of"
        assert [record.message for record in caplog.records if message in record.message]
        assert f"truncation: {message}" in repr(dm)

    def test_nothing_is_reported_when_nothing_is_cut(self, caplog):
        with caplog.at_level("WARNING", logger="engine"):
            dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4)
            dm.setup()
        assert dm.truncation["long_rows"] == 0 and "truncation" not in repr(dm) and not caplog.records
