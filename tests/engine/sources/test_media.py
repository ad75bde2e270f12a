"""engine/sources/media.py: Hugging Face Image and Audio columns decoded to tensors, checked against independent
readers (datasets' own torch format, PIL, Python's wave module, torchaudio's resample) on files the tests write."""

import io
import wave
from pathlib import Path

import datasets
import numpy as np
import pytest
import soundfile
import torch
import torchaudio
from PIL import Image

from engine import UniversalDataModule
from engine.sources.media import decode_audio
from task_spec import TaskSpec

VISION = TaskSpec.vision_tiny().replace(additional_config={"num_classes": 2, "image_size": [3, 6, 5]},
                                        input_schema={"pixel_values": {"dtype": "float32", "shape": [3, 6, 5]}})
RATE = 16000


def batches(data, spec, num_workers=0, batch_size=4):
    dm = UniversalDataModule(data, task_spec=spec, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    return dm, list(dm.train_dataloader())


def write_image_folder(root: Path) -> Path:
    """cat/ and dog/ with three 6x5 images each, PNG and JPEG mixed, distinct colours."""
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{'jpg' if i == 2 else 'png'}")
    return root


class TestImageColumns:
    def load(self, tmp_path):
        folder = write_image_folder(tmp_path / "pets")
        return datasets.load_dataset("imagefolder", data_dir=str(folder), split="train").rename_columns(
            {"image": "pixel_values", "label": "labels"})

    def test_imagefolder_gives_the_same_chw_uint8_tensors_as_datasets_torch_format(self, tmp_path):
        pets = self.load(tmp_path)
        dm, _ = batches(pets, VISION)
        ours = [dm.datasets["train"][i] for i in range(len(pets))]
        reference = pets.with_format("torch")  # the trusted reader for RGB images
        for i, row in enumerate(ours):
            assert row["pixel_values"].dtype == torch.uint8 and row["pixel_values"].shape == (3, 6, 5)
            assert torch.equal(row["pixel_values"], reference[i]["pixel_values"])
            assert int(row["labels"]) == int(reference[i]["labels"])
        assert pets.features["labels"].names == ["cat", "dog"] and [int(r["labels"]) for r in ours] == [0] * 3 + [1] * 3

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_batches_have_the_presets_shapes_and_the_folder_labels(self, tmp_path, num_workers):
        _, (first, second) = batches(self.load(tmp_path), VISION, num_workers=num_workers, batch_size=3)
        assert first["pixel_values"].shape == (3, 3, 6, 5) and first["pixel_values"].dtype == torch.float32
        assert first["labels"].tolist() == [0, 0, 0] and second["labels"].tolist() == [1, 1, 1]

    def test_a_palette_image_is_read_as_its_colours_not_its_indices(self, tmp_path):
        rgb = np.zeros((4, 4, 3), dtype=np.uint8)
        rgb[:2] = (204, 0, 51)  # a web-palette colour, kept exactly by convert("P")
        path = tmp_path / "palette.png"
        Image.fromarray(rgb).convert("P").save(path)
        column = datasets.Dataset.from_dict({"pixel_values": [str(path)], "labels": [1]}).cast_column(
            "pixel_values", datasets.Image())
        dm, _ = batches(column, VISION, batch_size=1)
        expected = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
        assert torch.equal(dm.datasets["train"][0]["pixel_values"], expected)
        assert expected[:, 0, 0].tolist() == [204, 0, 51] and Image.open(path).mode == "P"


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE) -> str:
    soundfile.write(path, samples, rate, subtype="PCM_16")
    return str(path)


def read_with_wave(path: str) -> torch.Tensor:
    """The independent reference: Python's own WAV reader, 16-bit PCM scaled as libsndfile does (1 / 32768)."""
    with wave.open(path) as file:
        frames = np.frombuffer(file.readframes(file.getnframes()), dtype="<i2").reshape(-1, file.getnchannels())
    return torch.from_numpy(frames.T.astype(np.float32) / 32768).squeeze(0)


def audio_column(tmp_path: Path, lengths=(800, 1000, 700, 900, 600, 1100)) -> tuple[datasets.Dataset, list[str]]:
    rng = np.random.default_rng(1)
    paths = [write_wav(tmp_path / f"{i}.wav", rng.uniform(-0.5, 0.5, n)) for i, n in enumerate(lengths)]
    column = datasets.Dataset.from_dict({"input_values": paths, "labels": [i % 4 for i in range(len(paths))]})
    return column.cast_column("input_values", datasets.Audio()), paths  # as audiofolder stores it


class TestAudioColumns:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_wav_files_become_the_presets_padded_waveforms(self, tmp_path, num_workers):
        column, paths = audio_column(tmp_path)
        _, loaded = batches(column, TaskSpec.audio_tiny(), num_workers=num_workers, batch_size=3)
        waves = [read_with_wave(path) for path in paths]
        for start, batch in zip((0, 3), loaded):
            expected = waves[start:start + 3]
            assert batch["lengths"].tolist() == [len(w) for w in expected]
            for row, reference in zip(batch["input_values"], expected):
                assert torch.equal(row[: len(reference)], reference) and not row[len(reference):].any()
            assert batch["input_features"].shape[:2] == (3, 40)
        assert loaded[0]["labels"].tolist() == [0, 1, 2] and loaded[1]["labels"].tolist() == [3, 0, 1]

    def test_audio_stored_as_bytes_decodes_like_the_file(self, tmp_path):
        _, paths = audio_column(tmp_path)
        stored = datasets.Dataset.from_dict({"input_values": [Path(p).read_bytes() for p in paths],
                                             "labels": [0] * 6}).cast_column("input_values", datasets.Audio())
        dm, _ = batches(stored, TaskSpec.audio_tiny())
        row = dm.datasets["train"][1]["input_values"]
        assert row["sampling_rate"] == RATE and torch.equal(row["array"], read_with_wave(paths[1]))

    def test_a_column_with_a_sampling_rate_is_resampled_as_torchaudio_does(self, tmp_path):
        column, paths = audio_column(tmp_path)
        column = column.cast_column("input_values", datasets.Audio(sampling_rate=8000))
        spec = TaskSpec.audio_tiny().replace(additional_config={"sample_rate": 8000})
        _, (batch, _) = batches(column, spec, batch_size=3)
        reference = torchaudio.functional.resample(read_with_wave(paths[0]), RATE, 8000)
        assert batch["lengths"][0] == 400 and torch.allclose(batch["input_values"][0, :400], reference)

    def test_a_rate_other_than_the_specs_is_refused_not_resampled_silently(self, tmp_path):
        column, _ = audio_column(tmp_path)
        spec = TaskSpec.audio_tiny().replace(additional_config={"sample_rate": 8000})
        with pytest.raises(ValueError, match="sampling_rate is 16000 Hz but the collator expects sample_rate=8000"):
            batches(column, spec)

    def test_stereo_stays_two_channels_or_is_mixed_down_when_the_column_asks(self, tmp_path):
        stereo = np.stack([np.linspace(-0.5, 0.5, 300), np.linspace(0.25, -0.25, 300)], axis=1)
        value = {"bytes": None, "path": write_wav(tmp_path / "stereo.wav", stereo)}
        reference = read_with_wave(value["path"])
        assert torch.equal(decode_audio(value)["array"], reference) and reference.shape == (2, 300)
        assert torch.allclose(decode_audio(value, num_channels=1)["array"], reference.mean(dim=0))
        with pytest.raises(ValueError, match=r"asks for num_channels=3, but '.*stereo.wav' has 2; only a mix down"):
            decode_audio(value, num_channels=3)


def test_shuffled_splits_are_the_same_rows_at_0_and_2_workers_each_row_once(tmp_path):
    column, _ = audio_column(tmp_path, lengths=tuple(500 + 10 * i for i in range(10)))
    seen = []
    for num_workers in (0, 2):
        dm = UniversalDataModule(column, task_spec=TaskSpec.audio_tiny(), batch_size=3, val_split=2, seed=3,
                                 num_workers=num_workers)
        seen.append([batch["lengths"].tolist() for loader in (dm.train_dataloader(), dm.val_dataloader())
                     for batch in loader])
    assert seen[0] == seen[1] and sorted(sum(seen[0], [])) == [500 + 10 * i for i in range(10)]
    assert sum(seen[0], [])[:8] != sorted(sum(seen[0], [])[:8])  # the training rows were shuffled


def test_an_image_target_keeps_its_values_while_the_input_is_read_as_colours(tmp_path):
    """A segmentation pair: the palette image's indices stand for colours, the palette mask's for classes."""
    rgb = np.zeros((4, 4, 3), dtype=np.uint8)
    rgb[:2] = (204, 0, 51)
    Image.fromarray(rgb).convert("P").save(tmp_path / "image.png")
    Image.fromarray(np.eye(4, dtype=np.uint8)).convert("P").save(tmp_path / "mask.png")
    pairs = datasets.Dataset.from_dict({"pixel_values": [str(tmp_path / "image.png")],
                                        "labels": [str(tmp_path / "mask.png")]})
    pairs = pairs.cast_column("pixel_values", datasets.Image()).cast_column("labels", datasets.Image())
    dm = UniversalDataModule(pairs, task_spec=VISION, batch_size=1)
    dm.setup()
    row = dm.datasets["train"][0]
    assert row["pixel_values"][:, 0, 0].tolist() == [204, 0, 51]
    assert torch.equal(row["labels"], torch.eye(4, dtype=torch.uint8)[None])


class SeenRows:
    """A collator that reports what each row holds: its fields and the type of each image."""

    def __call__(self, rows):
        return {"fields": [sorted(row) for row in rows], "image": [row["image"] for row in rows],
                "images": [row["images"] for row in rows]}


def test_a_multimodal_spec_gets_image_columns_encoded_for_the_collator_to_decode():
    from demo.sample_data import build_tokenizer

    def encoded(doc):
        buffer = io.BytesIO()
        Image.new("RGB", (5, 3), (doc, 0, 0)).save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": None}

    data = datasets.Dataset.from_dict(
        {"image": [encoded(doc) for doc in range(8)], "images": [[encoded(doc), encoded(doc + 1)] for doc in range(8)],
         "text": [f"picture {doc}" for doc in range(8)]},
        features=datasets.Features({"image": datasets.Image(), "images": datasets.List(datasets.Image()),
                                    "text": datasets.Value("string")}))
    spec = TaskSpec(name="captions", task_type="causal_lm", modality="multimodal", model_family="llava",
                    input_fields=("image", "input_ids"), loss_type="cross_entropy")
    dm = UniversalDataModule(data, task_spec=spec, tokenizer=build_tokenizer(), batch_size=4, val_split=0, seed=0,
                             shuffle=False, collate_fn=SeenRows())
    batch = next(iter(dm.train_dataloader()))
    assert batch["fields"][0] == ["attention_mask", "image", "images", "input_ids"]
    assert batch["image"][1] == encoded(1) and batch["images"][1] == [encoded(1), encoded(2)]
