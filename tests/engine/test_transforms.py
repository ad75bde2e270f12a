"""train_transform / eval_transform: applied per row where rows are read, after any cache, seeded by
(seed, epoch, dataset index), so augmented batches are the same at any worker count and after an exact resume,
fresh every epoch, and never the training augmentation on the validation split."""

import hashlib
import pickle
import random
import sys
import types

import numpy as np
import pytest
import torch
import torchaudio
from torchvision.transforms import v2

from demo.sample_data import audio_dataset, image_dataset
from engine import MultiDataModule, UniversalDataModule
from task_spec import TaskSpec

AUGMENT = v2.Compose([v2.RandomResizedCrop(32, scale=(0.4, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                      v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4)])
LM = TaskSpec.lm_tiny()


def digest(batch):
    hashed = hashlib.blake2b(digest_size=8)
    for key in sorted(batch):
        hashed.update(key.encode() + batch[key].numpy().tobytes())
    return hashed.hexdigest()


def images(workers=0, **options):
    settings = dict(task_spec=TaskSpec.vision_tiny(), batch_size=6, seed=5, num_workers=workers,
                    train_transform=AUGMENT)
    return UniversalDataModule(image_dataset(n=24), **{**settings, **options})


def passes(dm, count):
    loader = dm.train_dataloader()
    return [[digest(batch) for batch in loader] for _ in range(count)]


def indexed_rows(count=30):
    """Token rows whose tokens say their dataset index (index + 10), so a transform sees which row it has."""
    return [torch.full((4 + index % 5,), index + 10) for index in range(count)]


# Transforms at module level, so worker processes can receive them.

def jitter_tokens(row):
    """A user function on token rows drawing from Python's ``random`` and NumPy's global generators."""
    ids = row["input_ids"].clone()
    ids[random.randrange(len(ids))] = int(np.random.randint(200, 300))
    return {**row, "input_ids": ids}


def mark_train(row):
    return {**row, "input_ids": torch.full_like(row["input_ids"], 7)}


def mark_eval(row):
    return {**row, "input_ids": torch.full_like(row["input_ids"], 8)}


def fail_on_row_13(row):
    if int(row["input_ids"][0]) == 13 + 10:
        raise ValueError("cannot crop a row this short")
    return row


class MaskTime:
    """SpecAugment-style time masking on a row's waveform (``[T]`` seen as one band of ``T`` steps)."""

    def __init__(self, max_samples):
        self.mask = torchaudio.transforms.TimeMasking(time_mask_param=max_samples)

    def __call__(self, row):
        return {**row, "input_values": self.mask(row["input_values"][None])[0]}


class TestSameBatchesEverywhere:
    def test_v2_augmentation_is_the_same_at_0_1_and_2_workers(self):
        reference = passes(images(0), 2)
        assert passes(images(1), 2) == reference
        assert passes(images(2), 2) == reference

    def test_a_user_function_using_random_and_numpy_on_token_rows_is_the_same_at_0_and_2_workers(self):
        def build(workers):
            return UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, seed=3, num_workers=workers,
                                       train_transform=jitter_tokens)
        reference = passes(build(0), 2)
        assert passes(build(2), 2) == reference
        untransformed = passes(UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, seed=3), 1)
        assert reference[0] != untransformed[0]  # the function did change the rows

    def test_a_pass_neither_depends_on_nor_changes_the_global_random_state(self):
        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        first = passes(images(0), 1)
        assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
        assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), states[2]))
        torch.manual_seed(123), random.seed(123), np.random.seed(123)
        assert passes(images(0), 1) == first


class TestFreshEachEpoch:
    def test_each_row_is_augmented_anew_in_epoch_1_and_its_label_kept(self):
        loader = images(shuffle=False).train_dataloader()
        epoch0, epoch1 = list(loader), list(loader)
        for first, second in zip(epoch0, epoch1):
            assert torch.equal(first["labels"], second["labels"])  # the same rows, in storage order
            changed = [not torch.equal(a, b) for a, b in zip(first["pixel_values"], second["pixel_values"])]
            assert sum(changed) >= len(changed) - 1

    def test_the_augmented_pixels_differ_from_the_stored_ones(self):
        plain = next(iter(images(shuffle=False, train_transform=None).train_dataloader()))["pixel_values"]
        augmented = next(iter(images(shuffle=False).train_dataloader()))["pixel_values"]
        assert plain.shape == augmented.shape and not torch.equal(plain, augmented)


class TestExactResume:
    @pytest.mark.parametrize("workers", [0, 2])
    def test_resume_mid_epoch_gives_the_same_augmented_batches(self, workers):
        reference = [batch for epoch in passes(images(workers), 2) for batch in epoch]
        first = images(workers)
        loader, seen = first.train_dataloader(), []
        for batch in loader:
            seen.append(digest(batch))
            if len(seen) == 2:
                break
        resumed = images(workers)
        resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
        rest = passes(resumed, 2)
        assert seen + rest[0] + rest[1] == reference

    def test_resume_after_a_finished_epoch_gives_epoch_1s_augmentation(self):
        reference = passes(images(), 2)
        first = images()
        assert passes(first, 1) == reference[:1]
        resumed = images()
        resumed.load_state_dict(first.state_dict())
        assert passes(resumed, 1) == reference[1:]


class TokenDicts(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, index):
        return {"input_ids": torch.arange(5, 8 + index % 7)}


CALLS = []


def counted(row):
    CALLS.append(len(row["input_ids"]))
    return row


def test_length_grouped_batching_measures_the_stored_rows_without_running_the_transform():
    CALLS.clear()
    dm = UniversalDataModule(TokenDicts(), task_spec=LM, batch_size=4, batching="grouped", train_transform=counted)
    loader = dm.train_dataloader()
    assert CALLS == []
    assert sum(len(batch["input_ids"]) for batch in loader) == 24 and len(CALLS) == 24


class TestSplits:
    def test_val_split_rows_get_the_eval_transform_and_training_rows_the_train_one(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, val_split=6, seed=2,
                                 train_transform=mark_train, eval_transform=mark_eval)
        for batch in dm.train_dataloader():
            assert set(batch["input_ids"][batch["attention_mask"].bool()].tolist()) == {7}
        for batch in dm.val_dataloader():
            assert set(batch["input_ids"][batch["attention_mask"].bool()].tolist()) == {8}

    def test_without_an_eval_transform_the_val_split_is_read_as_stored(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, val_split=6, seed=2,
                                 train_transform=mark_train)
        val_ids = sorted(int(batch["input_ids"][row, 0]) - 10 for batch in dm.val_dataloader()
                         for row in range(len(batch["input_ids"])))
        assert val_ids == dm.split_plan.val.tolist()
        assert dm.datasets["val"].transform is None and dm.datasets["train"].transform.role == "train"

    def test_several_named_datasets_pass_the_transforms_to_each(self):
        dm = MultiDataModule({"a": indexed_rows(), "b": indexed_rows()}, task_spec=LM, batch_size=4,
                             val_split=6, train_transform=mark_train, eval_transform=mark_eval)
        for name, batch in dm.train_dataloader():
            assert set(batch["input_ids"][batch["attention_mask"].bool()].tolist()) == {7}, name
        for name, loader in dm.val_dataloader().items():
            for batch in loader:
                assert set(batch["input_ids"][batch["attention_mask"].bool()].tolist()) == {8}, name

    def test_repr_names_the_transforms(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, val_split=6, train_transform=mark_train)
        assert "transforms: train_transform=<function mark_train at" in repr(dm)
        assert "eval_transform" not in repr(dm)

    def test_eval_transform_is_seeded_without_the_epoch(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, val_split=8, seed=2,
                                 eval_transform=jitter_tokens)
        loader = dm.val_dataloader()
        assert [digest(batch) for batch in loader] == [digest(batch) for batch in loader]


class TestErrors:
    # One worker: after a worker raises, torch's DataLoader takes 5 s per worker to shut its workers down.
    @pytest.mark.parametrize("workers", [0, 1])
    def test_a_failing_transform_is_named_with_the_row_and_split(self, workers):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, val_split=6, seed=2,
                                 num_workers=workers, train_transform=fail_on_row_13, eval_transform=fail_on_row_13)
        dm.setup()
        split = "train" if 13 in dm.split_plan.train else "val"
        argument = "train_transform" if split == "train" else "eval_transform"
        loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
        with pytest.raises(ValueError, match=rf"{argument} failed on row 13 of the {split} data; fix the transform "
                                             r"or that row \(ValueError: cannot crop a row this short\)"):
            list(loader)

    def test_a_transform_that_is_not_callable_is_refused_at_construction(self):
        with pytest.raises(TypeError, match=r"train_transform should be a callable applied to each row .* but got "
                                            r"train_transform='flip' \(str\)"):
            UniversalDataModule(indexed_rows(), task_spec=LM, train_transform="flip")

    def test_a_transform_spawned_workers_cannot_receive_is_refused_at_construction(self, monkeypatch):
        monkeypatch.setattr("engine.loading.factory.multiprocessing.get_start_method", lambda allow_none=False: "spawn")
        with pytest.raises(TypeError, match=r"num_workers=2 with the 'spawn' start method sends the eval_transform "
                                            r"to each worker by pickling, but it cannot be pickled"):
            UniversalDataModule(indexed_rows(), task_spec=LM, num_workers=2, eval_transform=lambda row: row)

    def test_a_transform_of_a_notebook_is_refused_under_spawn_naming_it_and_the_fix(self, monkeypatch):
        notebook = types.ModuleType("__main__")  # no __file__, no __spec__: as in Jupyter, python -c or stdin

        def shift(row):
            return row

        shift.__module__, shift.__qualname__, notebook.shift = "__main__", "shift", shift
        monkeypatch.setitem(sys.modules, "__main__", notebook)
        with pytest.raises(TypeError, match=r"the train_transform should be importable by the workers that "
                                            r"num_workers=2 starts with the 'spawn' start method, but it refers to "
                                            r"shift, defined in __main__, which has no file here"):
            UniversalDataModule(indexed_rows(), task_spec=LM, num_workers=2, multiprocessing_context="spawn",
                                train_transform=shift)

    def test_a_stream_refuses_a_train_transform(self):
        import datasets

        stream = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]] * 8}).to_iterable_dataset()
        with pytest.raises(ValueError, match=r"train_transform is seeded by each row's dataset index, which a stream"):
            UniversalDataModule(stream, task_spec=LM, train_transform=mark_train)

    def test_a_checkpointed_configuration_asks_for_the_transform_again(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, train_transform=mark_train)
        assert "train_transform" in dm.hparams_initial["not_checkpointed"]


class TestAudio:
    def test_torchaudio_time_masking_on_the_audio_preset_is_seeded_and_fresh_each_epoch(self):
        def build(workers):
            return UniversalDataModule(audio_dataset(n=8), task_spec=TaskSpec.audio_tiny(), batch_size=4,
                                       shuffle=False, num_workers=workers, train_transform=MaskTime(3000))
        loader = build(0).train_dataloader()
        epoch0, epoch1 = list(loader), list(loader)
        for batch in epoch0:
            assert batch["input_features"].shape[:2] == (4, 40)
            for wave, length in zip(batch["input_values"], batch["lengths"]):
                assert 0 < int((wave[:length] == 0).sum()) <= 3000  # one masked span (noisy tones have no zeros)
        assert not torch.equal(epoch0[0]["input_values"], epoch1[0]["input_values"])
        assert [digest(batch) for batch in epoch0] == [digest(batch) for batch in build(2).train_dataloader()]


@pytest.mark.filterwarnings("ignore")
def test_lightning_sees_the_plain_loops_augmented_batches_in_every_epoch():
    import lightning

    from tests.engine.test_resume import SPEC, fingerprint
    from tests.engine.test_resume_lightning import Recorder

    def build():  # masked LM: the collator's masks are random too
        return UniversalDataModule(indexed_rows(), task_spec=SPEC, batch_size=4, val_split=6, seed=3,
                                   train_transform=jitter_tokens, eval_transform=mark_eval)
    loader = build().train_dataloader()
    expected = [fingerprint(batch) for _ in range(2) for batch in loader]
    recorder = Recorder()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False).fit(recorder, datamodule=build())
    assert recorder.seen == expected


def returns_nothing(row):
    row["input_ids"] = row["input_ids"] + 1  # changes the row, forgets to return it


class TestATransformThatReturnsNone:
    """A transform that returns None is named, with the row, the split and what it must return (not blamed on the
    collator's input key)."""

    @pytest.mark.parametrize("workers", [0, 2])
    def test_the_train_transform_is_named_with_the_row_and_split(self, workers):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, shuffle=False, seed=2,
                                 num_workers=workers, train_transform=returns_nothing)
        with pytest.raises(TypeError, match=r"train_transform should return the row, but got None from "
                                            r"train_transform\(row\) on row 0 of the train data; end the transform "
                                            r"with `return row`"):
            next(iter(dm.train_dataloader()))

    def test_the_eval_transform_is_named_with_a_val_split_rows_dataset_index(self):
        dm = UniversalDataModule(indexed_rows(), task_spec=LM, batch_size=4, val_split=6, seed=2,
                                 eval_transform=returns_nothing, on_error="skip")
        dm.setup()
        first = int(dm.split_plan.val[0])
        with pytest.raises(TypeError, match=rf"eval_transform should return the row, but got None from "
                                            rf"eval_transform\(row\) on row {first} of the val data"):
            next(iter(dm.val_dataloader()))


def doubles_in_place(row):
    row["pixel_values"].mul_(2)
    return row


class TestATransformThatChangesTheStoredRowInPlace:
    """A transform that writes into a tensor the data holds would change the rows of every later epoch: refused at
    the first row it changes, naming the row, the split, the key and the fix (rows made afresh by each read may be
    changed)."""

    def test_an_image_tensor_of_a_dict_of_columns_is_refused(self):
        pictures = {"pixel_values": [torch.full((3, 4, 4), 0.25)] * 8, "labels": [0, 1] * 4}
        dm = UniversalDataModule(pictures, task_spec=TaskSpec.vision_tiny(), batch_size=4, shuffle=False,
                                 train_transform=doubles_in_place)
        with pytest.raises(ValueError, match=r"train_transform should return new values and leave the row it is "
                                             r"given as it is, but got train_transform\(row\) changing "
                                             r"row\['pixel_values'\] of row 0 of the train data in place"):
            next(iter(dm.train_dataloader()))
