"""engine/datamodule/given.py and inputs.py: what a module was given, checked at construction, prepared at setup."""

import datasets
import pytest
import torch

from demo.sample_data import build_tokenizer
from engine.datamodule.given import prepare_inputs, take_inputs
from engine.sources.streams import EpochStream
from engine.sources.wrappers import HFSource, TensorListSource
from task_spec import TaskSpec

ROWS = [torch.arange(3, 3 + n) for n in range(4, 24)]


def take(train, **options):
    arguments = dict(val_data=None, test_data=None, predict_data=None, task_spec=TaskSpec.lm_tiny(), tokenizer=None,
                     val_split=0.0, test_split=0.0, shuffle=None, seed=0)
    arguments.update(options)
    return take_inputs(train, **arguments)


class TestTakeInputs:
    def test_each_role_becomes_a_source(self):
        given, stream = take(ROWS, predict_data=ROWS[:3])
        assert stream is None and sorted(given) == ["predict", "train"]
        assert isinstance(given["train"], TensorListSource) and given["train"].key == "input_ids"

    def test_a_dataset_dict_is_unpacked_into_its_splits(self):
        splits = datasets.DatasetDict({name: datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4})
                                       for name in ("train", "validation", "test")})
        given, _ = take(splits)
        assert sorted(given) == ["test", "train", "val"] and all(isinstance(s, HFSource) for s in given.values())

    def test_a_stream_is_kept_aside_and_its_first_row_checked(self):
        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 6}).to_iterable_dataset(num_shards=2)
        given, kept = take(stream)
        assert kept is stream and given["train"][0] == {"input_ids": [5, 6, 7]}
        with pytest.raises(ValueError, match="val_split/test_split cannot cut rows out of a stream"):
            take(stream, val_split=0.2)

    @pytest.mark.parametrize(("train", "options", "error", "message"), [
        (ROWS, dict(task_spec="lm"), TypeError, "task_spec should be a TaskSpec, but got str"),
        (ROWS, dict(val_split=1.5), ValueError, "val_split=1.5"),
        (ROWS, dict(val_split=0.2, val_data=ROWS), ValueError, "both val_data and val_split=0.2 were given"),
        (datasets.Dataset.from_dict({"text": ["a fox"] * 4}), {}, ValueError,
         "train_data holds raw text in 'text' but no tokenizer was given"),
        (datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4}), dict(task_spec=TaskSpec.cls_tiny()), ValueError,
         "train_data has no labels: the task 'cls_tiny'"),
        (datasets.Dataset.from_dict({"ids": [[5, 6]] * 4}), {}, ValueError,
         "train_data has no input field 'input_ids'.*available fields: 'ids'"),
        (None, {}, ValueError, "needs train_data"),
    ])
    def test_bad_inputs_are_refused_naming_the_field_and_the_fix(self, train, options, error, message):
        with pytest.raises(error, match=message):
            take(train, **options)

    def test_prediction_data_needs_no_target(self):
        unlabelled = datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4})
        labelled = datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4, "labels": [0, 1, 0, 1]})
        given, _ = take(labelled, predict_data=unlabelled, task_spec=TaskSpec.cls_tiny())
        assert sorted(given) == ["predict", "train"]


class TestPrepareInputs:
    def test_raw_text_is_tokenized_once_and_the_split_is_seeded(self):
        raw = datasets.Dataset.from_dict({"text": [f"the fox ran {i}" for i in range(20)]})
        tokenizer = build_tokenizer()
        given, _ = take(raw, tokenizer=tokenizer, val_split=0.25)
        sources, fingerprint, plan, _ = prepare_inputs(given, None, TaskSpec.lm_tiny(), tokenizer, val_split=0.25,
                                                       test_split=0, seed=0, rank=0, world_size=1)
        assert (len(sources["train"]), len(sources["val"])) == (15, 5) and "input_ids" in sources["train"][0]
        again = prepare_inputs(given, None, TaskSpec.lm_tiny(), tokenizer, val_split=0.25, test_split=0, seed=0,
                               rank=0, world_size=1)
        assert again[1] == fingerprint and again[2].fingerprint == plan.fingerprint

    def test_a_stream_becomes_an_epoch_stream_of_this_rank(self):
        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 6}).to_iterable_dataset(num_shards=2)
        given, kept = take(stream)
        sources, fingerprint, plan, _ = prepare_inputs(given, kept, TaskSpec.lm_tiny(), None, val_split=0,
                                                       test_split=0, seed=0, rank=1, world_size=2)
        assert isinstance(sources["train"], EpochStream) and sources["train"].world_size == 2
        assert plan is None and isinstance(fingerprint, str)


def test_a_multimodal_specs_text_column_is_tokenized_into_its_token_field():
    import numpy as np

    from engine import UniversalDataModule

    spec = TaskSpec(name="captions", task_type="classification", modality="multimodal",
                    input_fields=("pixel_values", "input_ids"), additional_config={"num_classes": 2})
    rows = datasets.Dataset.from_dict({"pixel_values": np.random.default_rng(0).random((8, 3, 4, 4)).tolist(),
                                       "text": ["a fox ran home"] * 8, "labels": [0, 1] * 4})
    tokenizer = build_tokenizer()
    batch = next(iter(UniversalDataModule(rows, task_spec=spec, tokenizer=tokenizer, batch_size=4,
                                          shuffle=False).train_dataloader()))
    expected = tokenizer("a fox ran home")["input_ids"]
    assert batch["input_ids"].tolist() == [expected] * 4 and batch["pixel_values"].shape == (4, 3, 4, 4)
    with pytest.raises(ValueError, match="holds raw text in 'text' but no tokenizer was given; .* token ids under "
                                         "'input_ids'"):
        UniversalDataModule(rows, task_spec=spec)
