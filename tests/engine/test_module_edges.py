"""UniversalDataModule at the edges: values a new user passes that used to be misread silently."""

import copy
import pickle

import datasets
import numpy as np
import pytest
import torch

from collators import CollatorRegistry
from demo.sample_data import build_tokenizer
from engine import DataLoaderConfig, UniversalDataModule
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
