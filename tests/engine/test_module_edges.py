"""UniversalDataModule at the edges: values a new user passes that used to be misread silently."""

import copy
import logging
import pickle
import re
import time

import datasets
import numpy as np
import pytest
import torch

from collators import CollatorRegistry
from demo.sample_data import build_tokenizer
from engine import DataLoaderConfig, UniversalDataModule
from engine.datamodule import module as plain_module
from engine.loading.factory import DataLoaderFactory
from task_spec import TaskSpec
from tests.engine.concurrency import first_loaders_from_threads

ROWS = [torch.randint(5, 100, (n,)) for n in range(5, 25)]


class TestPadId:
    def test_a_preset_pad_id_the_tokenizer_lacks_is_refused(self):
        tokenizer = copy.deepcopy(build_tokenizer())
        tokenizer.pad_token = tokenizer.eos_token = None  # no pad and no eos: the preset's 50256 would be used
        with pytest.raises(ValueError, match=r"^pad_token_id should be an id of the vocabulary \(0\.\.\d+, "
                                             r"len\(tokenizer\)=\d+\), but got pad_token_id=50256 from "
                                             r"spec.special_tokens\['pad_token_id'\]: the tokenizer has no pad token"):
            UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer)

    def test_a_causal_lm_tokenizer_without_pad_token_pads_with_its_eos(self, caplog):
        tokenizer = copy.deepcopy(build_tokenizer())
        tokenizer.pad_token = None  # as GPT-2 and Llama: an eos token, no pad token
        eos = tokenizer.eos_token_id
        rows = [torch.cat([torch.randint(20, 100, (n,)), torch.tensor([eos])]) for n in range(3, 23)]
        with caplog.at_level(logging.INFO, logger="collators"):
            dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=20)
            batches = list(dm.train_dataloader())
        said = [record.getMessage() for record in caplog.records if "has no pad token" in record.getMessage()]
        assert len(said) == 1 and f"padded with its eos token (id {eos})" in said[0]
        assert tokenizer.pad_token is None  # the user's tokenizer is not changed
        assert dm.collator.pad_token_id == eos  # not the preset's 50256
        (batch,) = batches
        padded, real = batch["attention_mask"] == 0, batch["attention_mask"] == 1
        assert batch["input_ids"][padded].unique().tolist() == [eos]
        assert (batch["labels"][padded] == -100).all()
        assert (batch["labels"][real] == batch["input_ids"][real]).all()  # every real eos keeps its label
        assert f"padding: with the tokenizer's eos token (id {eos}), as it has no pad token" in repr(dm)

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
        assert type(dm.train_config.batch_size) is int and dm.data_state()["batch_size"] == 4
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
        prepare, build = plain_module.prepare_inputs, DataLoaderFactory.train_dataloader

        def counted(name, function):
            def slow(*args, **kwargs):
                calls[name] += 1
                time.sleep(0.05)  # the window in which a check-then-act race would let another thread in
                return function(*args, **kwargs)
            return slow

        monkeypatch.setattr(plain_module, "prepare_inputs", counted("setup", prepare))
        monkeypatch.setattr(DataLoaderFactory, "train_dataloader", counted("loader", build))
        dm = UniversalDataModule(ROWS, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        loaders = first_loaders_from_threads(dm)
        assert calls == {"setup": 1, "loader": 1}
        assert all(loader is loaders[0] for loader in loaders) and dm.train_dataloader() is loaders[0]
        next(iter(loaders[0]))
        assert dm.data_state()["train_loader"] == loaders[0].data_state()  # the module tracks the loader handed out

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


class TestStringLabels:
    """Class labels given as strings are refused at construction, before any text is tokenized; a ClassLabel
    column gives the class names and count."""

    SPEC = TaskSpec.cls_tiny()

    def reviews(self, labels):
        return datasets.Dataset.from_dict({"text": ["good film", "bad film", "fine"] * 2, "labels": labels})

    def test_string_labels_are_refused_before_tokenizing(self, monkeypatch):
        tokenizer = build_tokenizer()
        monkeypatch.setattr(type(tokenizer), "__call__", lambda *args, **kwargs: pytest.fail("tokenized"))
        data = self.reviews(["positive", "negative", "neutral"] * 2)
        expected = ("train_data's label column 'labels' should hold class ids (ints) for task_type='classification', "
                    "but got strings: 'positive', 'negative', 'neutral', ...; encode them first: "
                    "train = train.class_encode_column('labels'), then each other split with "
                    "split = split.cast_column('labels', train.features['labels']) so that all share one mapping (a "
                    "DatasetDict's class_encode_column encodes each split on its own), or map them to ids yourself")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            UniversalDataModule(data, task_spec=self.SPEC, tokenizer=tokenizer)

    def test_string_labels_in_rows_are_refused_too(self):
        rows = {"input_ids": [torch.tensor([5, 6])] * 4, "labels": ["positive"] * 4}  # columns, not Arrow
        with pytest.raises(ValueError, match=re.escape("val_data's label column 'labels' should hold class ids (ints) "
                                                       "for task_type='classification', but got strings: 'positive'")):
            UniversalDataModule(self.reviews([0, 1, 2] * 2), val_data=rows, task_spec=self.SPEC,
                                tokenizer=build_tokenizer())

    def test_a_class_label_column_gives_the_names_and_count(self):
        data = self.reviews(["positive", "negative", "neutral"] * 2).class_encode_column("labels")
        spec = self.SPEC.replace(additional_config={"num_classes": 3})
        dm = UniversalDataModule(data, task_spec=spec, tokenizer=build_tokenizer(), batch_size=2)
        assert dm.id2label == {0: "negative", 1: "neutral", 2: "positive"}
        assert dm.label2id == {"negative": 0, "neutral": 1, "positive": 2} and dm.num_classes == 3
        assert sorted(next(iter(dm.train_dataloader()))["labels"].tolist()) in ([1, 2], [0, 2], [0, 1])

    def test_without_a_class_label_there_are_no_names(self):
        dm = UniversalDataModule(self.reviews([0, 1, 0] * 2), task_spec=self.SPEC, tokenizer=build_tokenizer())
        assert dm.id2label is None and dm.label2id is None and dm.num_classes == self.SPEC.num_classes

    def test_a_spec_num_classes_that_contradicts_the_class_label_is_refused(self):
        data = self.reviews(["positive", "negative", "neutral"] * 2).class_encode_column("labels")
        spec = self.SPEC.replace(additional_config={"num_classes": 2})
        expected = ("TaskSpec.num_classes should match train_data's ClassLabel column 'labels' (3 classes: "
                    "'negative', 'neutral', 'positive'), but got num_classes=2; set "
                    "spec.replace(additional_config={'num_classes': 3}), or re-encode the column")
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            UniversalDataModule(data, task_spec=spec, tokenizer=build_tokenizer())

    def test_splits_whose_class_labels_differ_are_refused(self):
        train = self.reviews(["positive", "negative", "neutral"] * 2).class_encode_column("labels")
        val = self.reviews(["positive", "negative", "negative"] * 2).class_encode_column("labels")
        spec = self.SPEC.replace(additional_config={"num_classes": 3})
        with pytest.raises(ValueError, match=re.escape("val_data's ClassLabel column 'labels' should have train_data's "
                                                       "class names ['negative', 'neutral', 'positive'], but got "
                                                       "['negative', 'positive']")):
            UniversalDataModule(train, val_data=val, task_spec=spec, tokenizer=build_tokenizer())
        shared = self.reviews(["positive", "negative", "negative"] * 2).cast_column("labels", train.features["labels"])
        dm = UniversalDataModule(train, val_data=shared, task_spec=spec, tokenizer=build_tokenizer())
        assert dm.id2label[2] == "positive"


class TestEmptyTokenRows:
    """A row of 0 tokens would be padded into an all-padding, fully masked row (NaN in attention): refused at setup,
    naming the row by its index in the data given, the split and the fix."""

    def test_an_empty_tensor_row_is_refused_at_setup(self):
        rows = [torch.arange(3, 3 + n) for n in range(4, 12)]
        rows[5] = torch.zeros(0, dtype=torch.long)
        dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4)
        with pytest.raises(ValueError, match=r"'input_ids' should hold at least one token in every row, but row 5 of "
                                             r"the train data holds 0 tokens; .* NaN in attention: filter empty rows"):
            dm.setup()

    def test_an_empty_arrow_row_cut_into_val_names_its_dataset_index(self):
        ids = [[5 + i] * (3 + i % 4) for i in range(20)]
        ids[13] = []
        data = datasets.Dataset.from_dict({"input_ids": ids, "labels": [i % 2 for i in range(20)]})
        spec = TaskSpec.cls_tiny().replace(additional_config={"num_classes": 2})
        from engine.sources.splits import plan_splits

        split = "val" if 13 in plan_splits(20, val_split=0.5, seed=3).val else "train"
        dm = UniversalDataModule(data, task_spec=spec, batch_size=4, val_split=0.5, seed=3)
        with pytest.raises(ValueError, match=rf"but row 13 of the {split} data holds 0 tokens"):
            dm.setup()


class EmptyRowAt9(torch.utils.data.Dataset):
    """Token rows read one by one (lengths unknown at setup), row 9 empty."""

    def __len__(self):
        return 16

    def __getitem__(self, index):
        return {"input_ids": torch.arange(5, 5 + (0 if index == 9 else 3 + index % 4))}


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_row_of_a_torch_dataset_is_refused_at_its_batch_by_its_dataset_index(workers):
    dm = UniversalDataModule(EmptyRowAt9(), task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=4, seed=1,
                             num_workers=workers)
    dm.setup()
    split = "train" if 9 in dm.split_plan.train else "val"
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    with pytest.raises(ValueError, match=rf"'input_ids' should hold at least one token in every row, but row 9 of "
                                         rf"the {split} data holds 0 tokens; .* filter empty rows"):
        list(loader)
