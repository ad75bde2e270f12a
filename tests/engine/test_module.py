import pickle

import datasets
import pytest
import torch
from torch.utils.data import Dataset

from collators import CollatorRegistry
from engine import DataModuleProtocol, UniversalDataModule
from task_spec import TaskSpec


class ImageRows(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, index):
        return {"pixel_values": torch.full((3, 8, 8), index, dtype=torch.uint8), "labels": index % 4}


class ImageRowsBare(ImageRows):
    def __getitem__(self, index):
        return super().__getitem__(index)["pixel_values"]


def ids_of(loader, key="row_id"):
    return [i for batch in loader for i in batch[key].tolist()]


class TestDataKinds:
    def test_list_of_tensors_one_liner_pads_with_the_spec_pad_id(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny())
        batch = next(iter(dm.train_dataloader()))
        padded = batch["attention_mask"] == 0
        assert padded.any()
        assert (batch["input_ids"][padded] == 50256).all()
        assert (batch["labels"][padded] == -100).all()
        assert torch.equal(batch["labels"][~padded], batch["input_ids"][~padded])

    def test_list_of_tensors_without_spec_stacks(self):
        dm = UniversalDataModule([torch.arange(4) + i for i in range(10)], batch_size=5, shuffle=False)
        assert torch.equal(next(iter(dm.train_dataloader())), torch.stack([torch.arange(4) + i for i in range(5)]))

    def test_hf_raw_text_is_tokenized_once_at_setup(self, text_rows, tokenizer):
        text_rows = text_rows.remove_columns("labels")  # causal LM derives its labels from the inputs
        dm = UniversalDataModule(text_rows, task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer, batch_size=8)
        dm.setup("fit")
        tokenized = dm.datasets["train"]
        dm.setup("validate")
        assert dm.datasets["train"] is tokenized
        assert "text" not in tokenized.column_names and "input_ids" in tokenized.column_names
        batch = next(iter(dm.train_dataloader()))
        first = tokenizer(text_rows[int(batch["row_id"][0])]["text"])["input_ids"]
        assert batch["input_ids"][0, : len(first)].tolist() == first
        assert text_rows.column_names == ["text", "row_id"]  # the caller's dataset is untouched

    def test_dataset_dict_uses_its_splits(self, text_rows, tokenizer):
        data = datasets.DatasetDict(
            {"train": text_rows.select(range(30)), "validation": text_rows.select(range(30, 40))}
        )
        dm = UniversalDataModule(data, task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer, batch_size=4)
        assert dm.split_sizes == {"train": 30, "val": 10, "test": 0, "predict": 0}
        assert sorted(ids_of(dm.val_dataloader())) == list(range(30, 40))

    def test_torch_dataset_with_vision_spec(self):
        dm = UniversalDataModule(ImageRows(), task_spec=TaskSpec.vision_tiny(), batch_size=4)
        batch = next(iter(dm.train_dataloader()))
        assert batch["pixel_values"].shape == (4, 3, 8, 8) and batch["pixel_values"].dtype == torch.float32
        assert batch["labels"].dtype == torch.int64

    def test_classification_labels_from_target_field(self, text_rows, tokenizer):
        dm = UniversalDataModule(text_rows, task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer, batch_size=40,
                                 shuffle=False)
        batch = next(iter(dm.train_dataloader()))
        assert batch["labels"].tolist() == text_rows["labels"]


class TestSplits:
    @pytest.mark.parametrize("val_split", [0.25, 10])
    def test_val_split_is_disjoint_complete_and_seeded(self, text_rows, tokenizer, val_split):
        def build(seed):
            return UniversalDataModule(text_rows, task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer,
                                       val_split=val_split, batch_size=7, seed=seed)

        dm = build(1)
        train, val = ids_of(dm.train_dataloader()), ids_of(dm.val_dataloader())
        assert len(val) == 10 and not set(train) & set(val) and sorted(train + val) == list(range(40))
        assert ids_of(build(1).val_dataloader()) == val
        assert ids_of(build(2).val_dataloader()) != val

    def test_test_split_and_test_data(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=0.1, test_split=0.2)
        assert dm.split_sizes["test"] == 12 and dm.split_sizes["val"] == 6 and dm.split_sizes["train"] == 42


class TestLoaders:
    def test_train_loader_is_reused_and_each_epoch_reshuffles(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), batch_size=8)
        loader = dm.train_dataloader()
        assert dm.train_dataloader() is loader
        first = [b["input_ids"][:, 0].tolist() for b in loader]
        second = [b["input_ids"][:, 0].tolist() for b in loader]
        assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))

    def test_same_seed_same_batches(self, token_tensors):
        def batches(seed):
            dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.mlm_tiny(), batch_size=8, seed=seed)
            return [b["input_ids"] for b in dm.train_dataloader()]

        assert all(torch.equal(a, b) for a, b in zip(batches(3), batches(3)))
        assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(batches(3), batches(4)))

    def test_masks_and_order_do_not_depend_on_num_workers(self, token_tensors):
        def batches(workers):
            dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.mlm_tiny(), batch_size=8, seed=5,
                                     num_workers=workers)
            loader = dm.train_dataloader()
            return [b for _ in range(2) for b in loader]

        serial, parallel = batches(0), batches(2)
        assert len(serial) == len(parallel)
        for a, b in zip(serial, parallel):
            assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])

    def test_eval_loaders_keep_storage_order(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=10, batch_size=4)
        dm.setup()
        val_rows = dm.datasets["val"]
        first = next(iter(dm.val_dataloader()))
        assert torch.equal(first["input_ids"][0, : len(val_rows[0]["input_ids"])], val_rows[0]["input_ids"])

    def test_missing_split_gives_an_empty_eval_loader_and_a_clear_train_error(self):
        dm = UniversalDataModule(predict_data=[torch.arange(3)] * 4, batch_size=2)
        assert dm.val_dataloader() == [] and len(list(dm.predict_dataloader())) == 2
        with pytest.raises(ValueError, match="there is no train data: pass train_data="):
            dm.train_dataloader()

    def test_collate_fn_and_collator_name(self, token_tensors):
        dm = UniversalDataModule(token_tensors, collate_fn=len, batch_size=8)
        assert next(iter(dm.train_dataloader())) == 8
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), collator_name="default")
        assert dm.collator_resolution.chosen.name == "default"

    def test_custom_registration_is_picked_for_the_modality(self, token_tensors):
        registry = CollatorRegistry.get_instance()
        with registry.scoped():
            @registry.register("count_rows", modality="text")
            def make(task_spec=None):
                return len

            dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), batch_size=8)
            assert dm.collator_resolution.chosen.name == "count_rows"
            assert next(iter(dm.train_dataloader())) == 8


class TestErrors:
    def test_empty_list(self):
        with pytest.raises(ValueError, match="the data is an empty list; give at least one row"):
            UniversalDataModule([], task_spec=TaskSpec.lm_tiny())

    def test_empty_dataset(self, text_rows, tokenizer):
        with pytest.raises(ValueError, match="train_data is empty: it has 0 rows"):
            UniversalDataModule(text_rows.select([]), task_spec=TaskSpec.lm_tiny(), tokenizer=tokenizer)

    @pytest.mark.parametrize(("val_split", "match"), [
        (1.5, r"val_split=1.5 is out of range"),
        (0.001, r"val_split=0.001 of 60 rows leaves an empty split"),
        (60, r"val_split=60 rows is out of range for 60 rows"),
    ])
    def test_bad_val_split(self, token_tensors, val_split, match):
        with pytest.raises(ValueError, match=match):
            UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=val_split)

    def test_mixed_types_in_list(self):
        with pytest.raises(TypeError, match=r"item 1 is a list; every item must be a torch.Tensor"):
            UniversalDataModule([torch.arange(3), [1, 2]])
        with pytest.raises(TypeError, match=r"item 0 is torch.int64 with 1 dims, item 1 is torch.float32"):
            UniversalDataModule([torch.arange(3), torch.ones(3)])

    def test_missing_input_field_names_the_available_ones(self):
        rows = datasets.Dataset.from_dict({"tokens": [[1, 2]], "labels": [0]})
        with pytest.raises(ValueError, match=r"no input field 'input_ids'.*available fields: 'tokens', 'labels'"):
            UniversalDataModule(rows, task_spec=TaskSpec.cls_tiny())

    def test_raw_text_needs_a_tokenizer(self, text_rows):
        with pytest.raises(ValueError, match=r"raw text in 'text' but no tokenizer was given; pass tokenizer="):
            UniversalDataModule(text_rows, task_spec=TaskSpec.lm_tiny())

    def test_supervised_spec_needs_labels(self, text_rows, tokenizer):
        with pytest.raises(ValueError, match=r"has no labels: the task 'cls_tiny'.*needs the target field 'labels'"):
            UniversalDataModule(text_rows.remove_columns("labels"), task_spec=TaskSpec.cls_tiny(), tokenizer=tokenizer)
        with pytest.raises(ValueError, match=r"has no labels: the task 'vision_tiny'.*fields are 'pixel_values'"):
            UniversalDataModule([torch.zeros(3, 4, 4)], task_spec=TaskSpec.vision_tiny())
        with pytest.raises(ValueError, match=r"rows are bare values without labels"):
            UniversalDataModule(ImageRowsBare(), task_spec=TaskSpec.vision_tiny())

    def test_val_data_and_val_split_together(self, token_tensors):
        with pytest.raises(ValueError, match="both val_data and val_split=0.1 were given; pass one"):
            UniversalDataModule(token_tensors, val_data=token_tensors, val_split=0.1)

    def test_task_spec_of_wrong_type(self, token_tensors):
        with pytest.raises(TypeError, match="task_spec should be a TaskSpec, but got dict"):
            UniversalDataModule(token_tensors, task_spec={"modality": "text"})

    def test_tokenizer_for_a_collator_that_takes_none(self, tokenizer):
        with pytest.raises(ValueError, match="tokenizer= was given, but the collator 'default'"):
            UniversalDataModule([torch.arange(3)], tokenizer=tokenizer)

    def test_factory_errors_propagate(self, token_tensors):
        registry = CollatorRegistry.get_instance()
        with registry.scoped():
            @registry.register("broken", modality="text")
            def make(task_spec=None):
                raise RuntimeError("factory exploded")

            with pytest.raises(RuntimeError, match="factory exploded"):
                UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny())

    def test_unpicklable_collate_fn_with_spawned_workers_fails_at_setup(self, token_tensors):
        dm = UniversalDataModule(token_tensors, collate_fn=lambda rows: rows, num_workers=2, seed=0)
        dm.train_config.multiprocessing_context = "spawn"
        with pytest.raises(TypeError, match="cannot be pickled.*Define it at module level"):
            dm.setup("fit")


class TestStateAndSummary:
    def test_state_round_trip_and_mismatch(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=0.2, seed=1)
        state = pickle.loads(pickle.dumps(dm.state_dict()))
        UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=0.2, seed=1).load_state_dict(state)
        other = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=0.2, seed=2)
        with pytest.raises(ValueError, match="the checkpoint's data state does not match this data module: seed"):
            other.load_state_dict(state)

    def test_repr_and_html_show_sizes_collator_and_shapes(self, token_tensors):
        dm = UniversalDataModule(token_tensors, task_spec=TaskSpec.lm_tiny(), val_split=0.25, batch_size=8)
        before = repr(dm)
        assert "train=60" in before and "'text': registered for modality='text'" in before
        dm.setup()
        text, page = repr(dm), dm._repr_html_()
        assert "train=45, val=15" in text and "input_ids: [8, " in text and "labels: [8, " in text
        assert str(dm) == text
        assert "<table>" in page and "train=45, val=15" in page

    def test_protocol(self, token_tensors):
        assert isinstance(UniversalDataModule(token_tensors), DataModuleProtocol)
        assert not isinstance(object(), DataModuleProtocol)


class TestHFNonText:
    def test_image_column_reaches_the_vision_collator_as_uint8(self):
        import numpy as np
        from PIL import Image

        images = [Image.fromarray(np.full((8, 8, 3), 30 * i, dtype=np.uint8)) for i in range(6)]
        rows = datasets.Dataset.from_dict({"pixel_values": images, "labels": [i % 4 for i in range(6)]})
        rows = rows.cast_column("pixel_values", datasets.Image())
        dm = UniversalDataModule(rows, task_spec=TaskSpec.vision_tiny(), batch_size=6, shuffle=False,
                                 collator_kwargs={"normalize": False})
        batch = next(iter(dm.train_dataloader()))
        assert batch["pixel_values"].shape == (6, 3, 8, 8)
        assert torch.allclose(batch["pixel_values"][:, 0, 0, 0], torch.tensor([30.0 * i for i in range(6)]) / 255)

    def test_waveform_lists_reach_the_audio_collator_as_float_tensors(self):
        waves = [[0.5] * n for n in (100, 250, 40)]
        rows = datasets.Dataset.from_dict({"input_values": waves, "labels": [0, 1, 2]})
        spec = TaskSpec.audio_tiny().replace(preprocessing_config=TaskSpec.REMOVE)
        batch = next(iter(UniversalDataModule(rows, task_spec=spec, batch_size=3, shuffle=False).train_dataloader()))
        assert batch["input_values"].dtype == torch.float32 and batch["lengths"].tolist() == [100, 250, 40]
