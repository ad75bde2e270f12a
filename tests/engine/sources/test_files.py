"""engine/sources/files.py: paths to .csv, .json/.jsonl and .parquet files, or a folder, read by datasets into Arrow;
and pandas DataFrames of raw text or token columns. The files are written by the tests."""

import json
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from demo.sample_data import build_tokenizer
from engine import UniversalDataModule
from engine.sources.wrappers import HFSource
from task_spec import TaskSpec

SPEC = TaskSpec.cls_tiny()
TEXTS = ["the fox ran to the river.", "a baker opened the shop early.", "rain fell on the quiet hill.",
         "the shop was closed."] * 3
LABELS = [0, 1, 1, 0] * 3
TOKENS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]] * 3


def first_batch(data, spec=SPEC, **options):
    dm = UniversalDataModule(data, task_spec=spec, batch_size=4, shuffle=False, **options)
    return dm, next(iter(dm.train_dataloader()))


def padded(rows):
    width = max(len(row) for row in rows)
    return [row + [0] * (width - len(row)) for row in rows]


def write_csv(path: Path, texts, labels) -> Path:
    pd.DataFrame({"text": texts, "labels": labels}).to_csv(path, index=False)
    return path


class TestTextFiles:
    """Raw text + label columns, tokenized once with the local tokenizer: the batch holds each row's own ids."""

    def check_text_batch(self, dm, batch, texts=TEXTS, labels=LABELS):
        tokenizer = build_tokenizer()
        assert batch["input_ids"].tolist() == padded([tokenizer(text)["input_ids"] for text in texts[:4]])
        assert batch["labels"].tolist() == labels[:4]
        source = dm.datasets["train"]
        assert isinstance(source, HFSource) and source.dataset.cache_files  # memory-mapped Arrow, not Python rows

    def test_a_csv_file(self, tmp_path):
        path = write_csv(tmp_path / "train.csv", TEXTS, LABELS)
        dm, batch = first_batch(str(path), tokenizer=build_tokenizer())
        self.check_text_batch(dm, batch)

    def test_a_json_lines_file_given_as_a_pathlib_path(self, tmp_path):
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps({"text": t, "labels": y}) + "\n" for t, y in zip(TEXTS, LABELS)))
        self.check_text_batch(*first_batch(path, tokenizer=build_tokenizer()))

    def test_a_list_of_files_is_one_dataset_in_their_order(self, tmp_path):
        first = write_csv(tmp_path / "a.csv", TEXTS[:2], LABELS[:2])
        second = write_csv(tmp_path / "b.csv", TEXTS[2:], LABELS[2:])
        dm, batch = first_batch([first, str(second)], tokenizer=build_tokenizer())
        self.check_text_batch(dm, batch)
        assert len(dm.datasets["train"]) == len(TEXTS)

    def test_val_data_may_be_a_path_too(self, tmp_path):
        train = write_csv(tmp_path / "train.csv", TEXTS, LABELS)
        val = write_csv(tmp_path / "val.csv", TEXTS[:3], LABELS[:3])
        dm = UniversalDataModule(train, val_data=val, task_spec=SPEC, tokenizer=build_tokenizer(), batch_size=4)
        dm.setup()
        assert dm.split_sizes["train"] == len(TEXTS) and dm.split_sizes["val"] == 3


class TestTokenFiles:
    """Token-id columns stored as lists of ints come back unchanged, padded by the collator."""

    def test_a_parquet_file(self, tmp_path):
        path = tmp_path / "train.parquet"
        datasets.Dataset.from_dict({"input_ids": TOKENS, "labels": LABELS}).to_parquet(path)
        dm, batch = first_batch(path)
        assert batch["input_ids"].tolist() == padded(TOKENS[:4]) and batch["labels"].tolist() == LABELS[:4]
        assert isinstance(dm.datasets["train"].dataset.features["input_ids"], datasets.List)  # an Arrow list column

    def test_a_json_lines_file(self, tmp_path):
        path = tmp_path / "train.json"
        path.write_text("".join(json.dumps({"input_ids": ids, "labels": y}) + "\n" for ids, y in zip(TOKENS, LABELS)))
        _, batch = first_batch(path)
        assert batch["input_ids"].tolist() == padded(TOKENS[:4]) and batch["labels"].tolist() == LABELS[:4]


class TestDataFrames:
    def test_raw_text_and_labels_are_tokenized(self):
        frame = pd.DataFrame({"text": TEXTS, "labels": LABELS})
        _, batch = first_batch(frame, tokenizer=build_tokenizer())
        tokenizer = build_tokenizer()
        assert batch["input_ids"].tolist() == padded([tokenizer(text)["input_ids"] for text in TEXTS[:4]])
        assert batch["labels"].tolist() == LABELS[:4] and list(frame.columns) == ["text", "labels"]  # not mutated

    def test_token_columns(self):
        _, batch = first_batch(pd.DataFrame({"input_ids": TOKENS, "labels": LABELS}))
        assert batch["input_ids"].tolist() == padded(TOKENS[:4]) and batch["labels"].tolist() == LABELS[:4]


def write_images(folder: Path) -> dict[str, list[np.ndarray]]:
    images = {}
    for label, name in enumerate(["cat", "dog"]):
        (folder / name).mkdir(parents=True)
        images[name] = [np.full((6, 5, 3), 30 * label + i, dtype=np.uint8) for i in range(3)]
        for i, pixels in enumerate(images[name]):
            Image.fromarray(pixels).save(folder / name / f"{i}.png")
    return images


class TestFolders:
    def test_a_folder_of_images_is_read_by_imagefolder_with_labels_from_its_subfolders(self, tmp_path):
        images = write_images(tmp_path / "pets")
        spec = TaskSpec.vision_tiny().replace(input_fields=("image",), target_field="label",
                                              additional_config={"num_classes": 2})
        dm = UniversalDataModule(tmp_path / "pets", task_spec=spec, batch_size=6, shuffle=False)
        dm.setup()
        rows = [dm.datasets["train"][i] for i in range(6)]
        names = dm.datasets["train"].dataset.features["label"].names
        assert names == ["cat", "dog"] and [int(row["label"]) for row in rows] == [0, 0, 0, 1, 1, 1]
        written = [torch.from_numpy(pixels).permute(2, 0, 1) for pixels in images["cat"] + images["dog"]]
        assert all(torch.equal(row["image"], pixels) for row, pixels in zip(rows, written))  # CHW uint8, exact
        batch = next(iter(dm.train_dataloader()))
        assert batch["image"].shape == (6, 3, 6, 5) and batch["label"].tolist() == [0, 0, 0, 1, 1, 1]

    def test_the_vision_preset_reads_a_folders_image_and_label_columns_as_its_fields(self, tmp_path):
        """vision_tiny reads pixel_values and labels; an image folder gives image and label (datasets' imagefolder):
        the folder is read as it is, by path or as the Dataset load_dataset('imagefolder') gives."""
        import datasets

        write_images(tmp_path / "pets")
        spec = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 2, "image_size": [3, 6, 5]})
        loaded = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "pets"), split="train")
        for data in (tmp_path / "pets", loaded):
            dm = UniversalDataModule(data, task_spec=spec, batch_size=6, shuffle=False, val_split=2, seed=0)
            batch = next(iter(dm.train_dataloader()))
            assert sorted(batch) == ["labels", "pixel_values"] and batch["pixel_values"].shape == (4, 3, 6, 5)
            assert sorted(next(iter(dm.val_dataloader()))) == ["labels", "pixel_values"]
            assert dm.report().numbers["class_names"] == ["cat", "dog"]
        assert loaded.column_names == ["image", "label"]  # the caller's dataset is not renamed

    def test_validation_images_of_another_size_than_the_specs_are_refused_naming_the_transform(self, tmp_path):
        write_images(tmp_path / "pets")  # 6x5 images; vision_tiny's image_size is 3x32x32
        spec = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 2})
        options = dict(task_spec=spec, batch_size=2, val_split=2, seed=0, train_transform=v2.Resize((32, 32)))
        dm = UniversalDataModule(tmp_path / "pets", **options)
        assert next(iter(dm.train_dataloader()))["pixel_values"].shape == (2, 3, 32, 32)
        with pytest.raises(ValueError, match=r"val row \d: 'pixel_values' should have the spec's image_size=\[3, 32, "
                                             r"32\] .* but got pixel_values of shape \[3, 6, 5\] in a val batch; add "
                                             r"eval_transform=v2.Compose"):
            next(iter(dm.val_dataloader()))
        resized = UniversalDataModule(tmp_path / "pets", eval_transform=v2.Resize((32, 32)), **options)
        assert next(iter(resized.val_dataloader()))["pixel_values"].shape == (2, 3, 32, 32)

    @pytest.mark.parametrize("workers", [0, 2])
    def test_grayscale_and_rgb_images_load_as_rgb_alike_by_both_folder_routes(self, tmp_path, workers):
        from engine.datasets import ImageFolderDataset

        write_images(tmp_path / "pets")
        gray = np.arange(30, dtype=np.uint8).reshape(6, 5)
        Image.fromarray(gray, "L").save(tmp_path / "pets" / "cat" / "3.png")
        two_classes = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 2})
        by_path = two_classes.replace(input_fields=("image",), target_field="label")
        options = dict(batch_size=7, shuffle=False, num_workers=workers)
        by_folder = UniversalDataModule(tmp_path / "pets", task_spec=by_path, **options)
        path_batch = next(iter(by_folder.train_dataloader()))
        class_batch = next(iter(UniversalDataModule(ImageFolderDataset(tmp_path / "pets"),
                                                    task_spec=two_classes, **options).train_dataloader()))
        assert path_batch["image"].shape == (7, 3, 6, 5)
        assert torch.equal(path_batch["image"], class_batch["pixel_values"])
        gray_row = by_folder.datasets["train"][3]["image"]
        assert torch.equal(gray_row, torch.from_numpy(gray).expand(3, 6, 5))  # gray copied to R, G and B

    def test_a_folder_with_several_splits_is_refused_naming_them(self, tmp_path):
        write_images(tmp_path / "pets" / "train")
        write_images(tmp_path / "pets" / "test")
        with pytest.raises(ValueError, match=r"is the folder '.*pets', which holds the splits \['train', 'test'\]; "
                                             r"pass each split's folder on its own"):
            UniversalDataModule(tmp_path / "pets", task_spec=TaskSpec.vision_tiny())


class TestFoldersOfSeveralKinds:
    @pytest.mark.parametrize("csv_files", [2, 9])  # datasets would read the more numerous kind, dropping the other
    def test_a_folder_of_images_and_csv_files_is_refused_naming_each_kind(self, tmp_path, csv_files):
        write_images(tmp_path / "mixed")
        for i in range(csv_files):
            write_csv(tmp_path / "mixed" / f"rows{i}.csv", TEXTS, LABELS)
        kinds = [f"{csv_files} csv files \\(e.g. '.*rows0.csv'\\)", r"6 image files \(e.g. '.*cat.0.png'\)"]
        found = " and ".join(kinds if csv_files > 6 else kinds[::-1])
        with pytest.raises(ValueError, match=rf"train_data should be a folder of one kind of data file, but got the "
                                             rf"folder '.*mixed' with {found}; .*pass a sub-folder that holds "
                                             rf"only it"):
            UniversalDataModule(tmp_path / "mixed", task_spec=TaskSpec.vision_tiny())

    def test_hidden_files_notes_and_imagefolder_metadata_are_not_a_second_kind(self, tmp_path):
        write_images(tmp_path / "pets")
        (tmp_path / "pets" / "README.md").write_text("cats and dogs\n")
        (tmp_path / "pets" / ".cache").mkdir()
        write_csv(tmp_path / "pets" / ".cache" / "old.csv", TEXTS, LABELS)
        names = [f"{name}/{i}.png" for name in ("cat", "dog") for i in range(3)]
        pd.DataFrame({"file_name": names, "kind": [0, 1] * 3}).to_csv(tmp_path / "pets" / "metadata.csv", index=False)
        spec = TaskSpec.vision_tiny().replace(input_fields=("image",), target_field="kind",
                                              additional_config={"num_classes": 2})
        dm = UniversalDataModule(tmp_path / "pets", task_spec=spec, batch_size=6, shuffle=False)
        assert next(iter(dm.train_dataloader()))["kind"].tolist() == [0, 1] * 3  # the images, labelled by metadata


class TestRefusals:
    def test_a_missing_file_is_named(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"no such file or folder: '.*missing.csv'; train_data should "
                                                    r"name an existing file or folder \(a path ending in .csv, .json, "
                                                    r".jsonl, .parquet"):
            UniversalDataModule(str(tmp_path / "missing.csv"), task_spec=SPEC)

    @pytest.mark.parametrize("path", ["no/such/dir", "no/such/notes.txt", "missing.tsv", ["no/such/a.csv"]])
    def test_a_missing_path_is_named_as_missing_not_as_a_wrong_type(self, path):
        name = path[0] if isinstance(path, list) else path
        with pytest.raises(FileNotFoundError, match=rf"no such file or folder: '{name}'; train_data should name an "
                                                    rf"existing file or folder .* but got train_data='{name}'"):
            UniversalDataModule(path, task_spec=SPEC)

    def test_a_folder_of_no_readable_kind_names_what_it_holds_and_the_kinds_read(self, tmp_path):
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "rows.xyz").write_text("1,2\n")
        with pytest.raises(ValueError, match=r"train_data is the folder '.*data', which holds no file of a kind "
                                             r"datasets reads \(it holds \['.xyz'\]\); train_data should be a path "
                                             r"ending in .csv, .json, .jsonl, .parquet or a folder of images or audio"):
            UniversalDataModule(tmp_path / "data", task_spec=SPEC)

    def test_an_empty_folder_is_named(self, tmp_path):
        (tmp_path / "empty").mkdir()
        with pytest.raises(ValueError, match=r"the folder '.*empty', which holds no file .* \(it holds no files\)"):
            UniversalDataModule(tmp_path / "empty", task_spec=SPEC)

    def test_an_unknown_suffix_is_refused_with_the_accepted_ones(self, tmp_path):
        path = tmp_path / "notes.txt"
        path.write_text("hello\n")
        with pytest.raises(ValueError, match=r"val_data names the file '.*notes.txt', whose suffix '.txt' is not "
                                             r"accepted: give a path ending in .csv, .json, .jsonl, .parquet or a "
                                             r"folder"):
            UniversalDataModule(write_csv(tmp_path / "a.csv", TEXTS, LABELS), val_data=str(path), task_spec=SPEC,
                                tokenizer=build_tokenizer())

    def test_files_of_two_kinds_are_refused(self, tmp_path):
        csv = write_csv(tmp_path / "a.csv", TEXTS, LABELS)
        parquet = tmp_path / "b.parquet"
        datasets.Dataset.from_dict({"text": TEXTS, "labels": LABELS}).to_parquet(parquet)
        with pytest.raises(ValueError, match=r"train_data mixes files of kinds \['csv', 'parquet'\]"):
            UniversalDataModule([csv, parquet], task_spec=SPEC)

    def test_a_string_that_is_no_path_is_refused_listing_the_accepted_kinds(self):
        with pytest.raises(TypeError, match=r"train_data should be .* a path \(str or pathlib.Path, or a list of "
                                            r"them\) to .csv, .json, .jsonl or .parquet files .* but got str: 'hello'"):
            UniversalDataModule("hello", task_spec=SPEC)


def test_an_audio_folder_that_datasets_cannot_encode_names_the_fix(tmp_path, monkeypatch):
    """datasets' audiofolder needs torchcodec (and FFmpeg) to build; when it is missing, the error says so and how
    to go around it, whatever this machine has installed (the failure is simulated as datasets raises it)."""
    def load_dataset(path, **kwargs):
        try:
            raise ImportError("To support encoding audio data, please install 'torchcodec'.")
        except ImportError as cause:
            raise datasets.exceptions.DatasetGenerationError("An error occurred while generating the dataset") \
                from cause

    (tmp_path / "sounds").mkdir()
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(ImportError, match=r"the folder '.*sounds', which datasets reads with audiofolder, .* needs "
                                          r"torchcodec with FFmpeg .*\.cast_column\('audio', datasets.Audio\(\)\)"):
        UniversalDataModule(tmp_path / "sounds", task_spec=TaskSpec.audio_tiny())


class TestEmptyFiles:
    """A file with no data rows is named, with the fix, instead of datasets' 'Instruction "train" corresponds to no
    data!'."""

    @pytest.mark.parametrize(("name", "content"), [("train.csv", "text,labels\n"), ("train.csv", ""),
                                                   ("train.json", "[]"), ("train.jsonl", "")])
    def test_a_file_with_a_header_only_or_nothing_names_the_file(self, tmp_path, name, content):
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=rf"train_data should hold at least one data row, but the file "
                                             rf"'.*{name}' has no data rows \(nothing, or a header only\); add rows"):
            UniversalDataModule(tmp_path / name, task_spec=SPEC)

    def test_an_empty_val_file_is_named_as_val_data(self, tmp_path):
        (tmp_path / "val.csv").write_text("text,labels\n")
        with pytest.raises(ValueError, match=r"val_data should hold at least one data row, but the file '.*val.csv'"):
            UniversalDataModule(write_csv(tmp_path / "a.csv", TEXTS, LABELS), val_data=tmp_path / "val.csv",
                                task_spec=SPEC, tokenizer=build_tokenizer())

    def test_an_empty_parquet_file_is_named(self, tmp_path):
        datasets.Dataset.from_dict({"text": [], "labels": []}).to_parquet(tmp_path / "train.parquet")
        with pytest.raises(ValueError, match=r"the file '.*train.parquet' has no data rows"):
            UniversalDataModule(tmp_path / "train.parquet", task_spec=SPEC)

    def test_a_folder_of_empty_text_files_names_them(self, tmp_path):
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "a.txt").write_text("")
        with pytest.raises(ValueError, match=r"the file '.*a.txt' has no data rows"):
            UniversalDataModule(tmp_path / "docs", task_spec=SPEC)

    def test_one_empty_file_among_others_is_read(self, tmp_path):
        (tmp_path / "empty.csv").write_text("text,labels\n")
        dm, batch = first_batch([write_csv(tmp_path / "a.csv", TEXTS, LABELS), tmp_path / "empty.csv"],
                                tokenizer=build_tokenizer())
        assert batch["labels"].tolist() == LABELS[:4]


class TestEmptyTextCells:
    """A None text cell is refused at construction, naming the column, the row and the fix (not a tokenizer error
    without either)."""

    def test_a_none_text_cell_names_the_column_and_row(self):
        texts = TEXTS[:5] + [None] + TEXTS[6:9] + [None] + TEXTS[10:]
        data = datasets.Dataset.from_dict({"text": texts, "labels": LABELS})
        with pytest.raises(ValueError, match=r"'text' should be a string in every row of train_data, but got "
                                             r"text=None in row 5 \(and 1 more rows\); .* filter those rows out .* or "
                                             r"fill them"):
            UniversalDataModule(data, task_spec=SPEC, tokenizer=build_tokenizer())

    def test_an_empty_csv_cell_in_val_data_names_val_data(self, tmp_path):
        path = tmp_path / "val.csv"
        path.write_text('text,labels\n"the fox ran",1\n,0\n')
        with pytest.raises(ValueError, match=r"'text' should be a string in every row of val_data, but got "
                                             r"text=None in row 1;"):
            UniversalDataModule(write_csv(tmp_path / "a.csv", TEXTS, LABELS), val_data=path, task_spec=SPEC,
                                tokenizer=build_tokenizer())

    def test_a_selected_view_counts_rows_in_the_view(self):
        data = datasets.Dataset.from_dict({"text": [None] + TEXTS, "labels": [0] + LABELS}).select([3, 4, 0, 5])
        with pytest.raises(ValueError, match=r"text=None in row 2;"):
            UniversalDataModule(data, task_spec=SPEC, tokenizer=build_tokenizer())
