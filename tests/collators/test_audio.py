"""Tests for collators.audio: padding against pad_sequence, masks, features against per-row torchaudio, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torchaudio
from torch.nn.utils.rnn import pad_sequence

from collators.audio import AudioCollator, create_audio_collator
from task_spec import TaskSpec


def _waves(lengths: tuple[int, ...], seed: int = 0, channels: int | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (lambda n: (channels, n)) if channels else (lambda n: (n,))
    return [torch.randn(shape(n), generator=gen) * 0.1 for n in lengths]


def _rows(waves: list[torch.Tensor], **extra: object) -> list[dict]:
    return [{"input_values": wave, **extra} for wave in waves]


class Batch(list):
    """Rows as the engine hands them: with their split and their indices in the data the user gave."""

    role, indices = "train", [4, 9, 11]


def scale_by_two(batch: torch.Tensor) -> torch.Tensor:
    return batch * 2


class TestPadding:
    def test_equals_pad_sequence(self) -> None:
        waves = _waves((5, 9, 1, 7))
        batch = AudioCollator()(_rows(waves))
        torch.testing.assert_close(batch["input_values"], pad_sequence(waves, batch_first=True), atol=0, rtol=0)
        assert batch["lengths"].tolist() == [5, 9, 1, 7] and batch["lengths"].dtype == torch.int64
        expected_mask = (pad_sequence([torch.ones(len(w)) for w in waves], batch_first=True)).long()
        assert batch["attention_mask"].dtype == torch.int64
        assert torch.equal(batch["attention_mask"], expected_mask)

    def test_left_padding(self) -> None:
        waves = _waves((2, 4))
        batch = AudioCollator(padding_side="left", pad_value=-1.0)(_rows(waves))
        torch.testing.assert_close(batch["input_values"][0], torch.cat([torch.full((2,), -1.0), waves[0]]))
        assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]

    def test_max_length_truncates_and_multiple_rounds_up(self) -> None:
        waves = _waves((3, 10))
        batch = AudioCollator(max_length=6)(_rows(waves))
        assert batch["input_values"].shape == (2, 6) and batch["lengths"].tolist() == [3, 6]
        torch.testing.assert_close(batch["input_values"][1], waves[1][:6])
        rounded = AudioCollator(pad_to_multiple_of=4)(_rows(waves))
        assert rounded["input_values"].shape == (2, 12) and rounded["attention_mask"].sum().item() == 13

    def test_numpy_list_and_bare_inputs(self) -> None:
        waves = _waves((3, 5))
        expected = AudioCollator()(_rows(waves))["input_values"]
        as_numpy = AudioCollator()(_rows([w.numpy().astype(np.float64) for w in waves]))["input_values"]
        as_list = AudioCollator()(_rows([w.tolist() for w in waves]))["input_values"]
        bare = AudioCollator()(waves)["input_values"]
        for other in (as_numpy, as_list, bare):
            assert other.dtype == torch.float32
            torch.testing.assert_close(other, expected, atol=0, rtol=0)

    def test_multichannel(self) -> None:
        waves = _waves((4, 6), channels=2)
        batch = AudioCollator()(_rows(waves))
        assert batch["input_values"].shape == (2, 2, 6) and batch["lengths"].tolist() == [4, 6]
        expected = pad_sequence([w.T for w in waves], batch_first=True).transpose(1, 2)
        torch.testing.assert_close(batch["input_values"], expected, atol=0, rtol=0)
        assert batch["attention_mask"].shape == (2, 6)

    def test_hugging_face_audio_dict(self) -> None:
        rows = [{"input_values": {"array": np.zeros(4, dtype=np.float32), "sampling_rate": 16000}, "labels": 2}]
        batch = AudioCollator()(rows)
        assert batch["input_values"].shape == (1, 4) and batch["labels"].tolist() == [2]


class TestErrors:
    def test_sampling_rate_mismatch_names_row_and_resample(self) -> None:
        rows = _rows(_waves((3, 3)), sampling_rate=16000)
        rows[1] = {**rows[1], "sampling_rate": 8000}
        with pytest.raises(ValueError, match=r"row 1: sampling_rate is 8000 Hz but the collator expects "
                                             r"sample_rate=16000; .*torchaudio.functional.resample"):
            AudioCollator()(rows)
        with pytest.raises(ValueError, match="row 0: sampling_rate is 44100 Hz"):
            AudioCollator()([{"input_values": {"array": np.zeros(3), "sampling_rate": 44100}}])
        assert AudioCollator(sample_rate=8000)(rows[1:])["input_values"].shape == (1, 3)

    @pytest.mark.parametrize("features", [None, "log_mel"])
    def test_an_empty_waveform_is_refused_naming_the_row(self, features) -> None:
        rows = Batch(_rows([torch.rand(400) - 0.5, torch.zeros(0), torch.zeros(2, 0)[0]]))
        with pytest.raises(ValueError, match=r"train row 9: 'input_values' should hold at least one sample, but got "
                                             r"input_values of shape \(0,\) \(an empty waveform"):
            AudioCollator(features=features)(rows)
        with pytest.raises(ValueError, match=r"^row 0: 'input_values' should hold at least one sample, but got "
                                             r"input_values of shape \(2, 0\)"):
            AudioCollator()([{"input_values": torch.zeros(2, 0)}, {"input_values": torch.zeros(2, 5)}])

    def test_mixed_layouts_and_bad_types(self) -> None:
        with pytest.raises(ValueError, match=r"row 1: 'input_values' has shape \(2, 3\) but row 0 has shape \(3,\)"):
            AudioCollator()(_rows([torch.zeros(3), torch.zeros(2, 3)]))
        with pytest.raises(ValueError, match=r"row 1: 'input_values' has shape \(1, 3\) but row 0 has shape \(2, 3\)"):
            AudioCollator()(_rows([torch.zeros(2, 3), torch.zeros(1, 3)]))
        with pytest.raises(TypeError, match=r"row 0: 'input_values' has dtype torch.int16; .* / 32768"):
            AudioCollator()(_rows([torch.zeros(3, dtype=torch.int16)]))
        with pytest.raises(ValueError, match=r"row 0: 'input_values' should be 1-D \[time\] or 2-D"):
            AudioCollator()(_rows([torch.zeros(1, 1, 3)]))
        with pytest.raises(TypeError, match=r"row 0: 'input_values' should be a float tensor, .* but got str"):
            AudioCollator()(_rows(["clip.wav"]))
        with pytest.raises(KeyError, match=r"row 0 has no 'input_values' key \(keys: \['audio'\]\)"):
            AudioCollator()([{"audio": torch.zeros(3)}])

    def test_labels_in_some_rows_only(self) -> None:
        with pytest.raises(ValueError, match=r"row 0 has no 'labels' but row 1 has one"):
            AudioCollator()([{"input_values": torch.zeros(2)}, {"input_values": torch.zeros(2), "labels": 1}])

    def test_bad_options(self) -> None:
        with pytest.raises(ValueError, match="padding_side should be 'right' or 'left', but got padding_side='up'"):
            AudioCollator(padding_side="up")
        with pytest.raises(ValueError, match="max_length should be a positive int or None, but got max_length=0"):
            AudioCollator(max_length=0)
        with pytest.raises(ValueError, match="features should be None, 'mel', 'log_mel' or a callable"):
            AudioCollator(features="mfcc")
        with pytest.raises(ValueError, match="features need padding_side='right'"):
            AudioCollator(features="mel", padding_side="left")
        with pytest.raises(TypeError, match="cannot be pickled .* use a module-level function"):
            AudioCollator(features=lambda batch: batch)


class TestFeatures:
    @pytest.mark.parametrize("kind", ["mel", "log_mel"])
    def test_equals_per_row_transform_on_frames_inside_the_signal(self, kind: str) -> None:
        waves = _waves((4000, 16000, 9999, 450))
        batch = AudioCollator(features=kind, n_mels=40)(_rows(waves))
        mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, hop_length=160, n_mels=40)
        to_db = torchaudio.transforms.AmplitudeToDB()
        assert batch["input_features"].shape == (4, 40, 16000 // 160 + 1)
        for index, wave in enumerate(waves):
            expected = mel(wave) if kind == "mel" else to_db(mel(wave))
            frames = int(batch["feature_lengths"][index])
            assert frames == expected.shape[-1] == len(wave) // 160 + 1
            # With center=True frame t covers samples [t*hop - n_fft/2, t*hop + n_fft/2). Frames reaching past the
            # end see the batch's zero padding where the unpadded row sees reflect padding, so they differ (by a
            # lot); only frames whose window lies fully inside the signal are compared.
            inside = (len(wave) - 400 // 2) // 160 + 1
            torch.testing.assert_close(batch["input_features"][index, :, :inside], expected[:, :inside],
                                       atol=1e-5, rtol=1e-5)

    def test_waveform_outputs_kept_alongside_features(self) -> None:
        batch = AudioCollator(features="log_mel")(_rows(_waves((500, 800)), labels=1))
        assert set(batch) == {"input_values", "lengths", "attention_mask", "input_features", "feature_lengths",
                              "labels"}
        assert batch["feature_lengths"].tolist() == [500 // 160 + 1, 800 // 160 + 1]

    def test_short_batches_still_get_features(self) -> None:
        batch = AudioCollator(features="mel")(_rows(_waves((10, 20))))
        assert batch["input_values"].shape == (2, 201) and batch["lengths"].tolist() == [10, 20]
        assert batch["feature_lengths"].tolist() == [1, 1]

    def test_callable_features(self) -> None:
        batch = AudioCollator(features=scale_by_two)(_rows(_waves((3, 5))))
        torch.testing.assert_close(batch["input_features"], batch["input_values"] * 2)
        assert "feature_lengths" not in batch


class TestContract:
    def test_rows_not_mutated_and_outputs_not_aliased(self) -> None:
        waves = _waves((4, 4))
        arrays = [np.ones(4, dtype=np.float32)]
        snapshot = [w.clone() for w in waves]
        batch = AudioCollator()(_rows(waves))
        batch["input_values"].fill_(5.0)
        AudioCollator()(_rows(arrays))["input_values"].fill_(5.0)
        for wave, before in zip(waves, snapshot):
            torch.testing.assert_close(wave, before, atol=0, rtol=0)
        assert (arrays[0] == 1.0).all()

    def test_pickle_round_trip_with_transform(self) -> None:
        collator = AudioCollator(features="log_mel", n_mels=16, max_length=900)
        clone = pickle.loads(pickle.dumps(collator))
        assert repr(clone) == repr(collator)
        rows = _rows(_waves((700, 1000)))
        for key, value in collator(rows).items():
            torch.testing.assert_close(clone(rows)[key], value, atol=0, rtol=0)

    def test_repr_names_options(self) -> None:
        text = repr(AudioCollator(features="mel", n_mels=16, pad_to_multiple_of=8))
        assert "features='mel', n_mels=16" in text and "pad_to_multiple_of=8" in text

    def test_generator_accepted_and_global_rng_untouched(self) -> None:
        state = torch.get_rng_state()
        AudioCollator(features="mel")(_rows(_waves((300,))), generator=torch.Generator().manual_seed(3))
        assert torch.equal(torch.get_rng_state(), state)


class TestFactory:
    def test_audio_tiny_defaults(self) -> None:
        collator = create_audio_collator(task_spec=TaskSpec.audio_tiny())
        assert (collator.features, collator.n_mels, collator.max_length, collator.sample_rate) == (
            "log_mel", 40, 16000, 16000)
        batch = collator([{"input_values": torch.zeros(20000), "labels": 3}, {"input_values": torch.zeros(800),
                                                                              "labels": 0}])
        assert batch["input_values"].shape == (2, 16000)
        assert batch["input_features"].shape == (2, 40, 101)
        assert batch["labels"].dtype == torch.int64 and batch["feature_lengths"].tolist() == [101, 6]

    def test_kwargs_override_spec(self) -> None:
        collator = create_audio_collator(task_spec=TaskSpec.audio_tiny(), features=None, max_length=None)
        assert collator.features is None and collator.max_length is None
        assert "input_features" not in collator(_rows(_waves((3,))))

    def test_no_spec(self) -> None:
        assert repr(create_audio_collator()) == repr(AudioCollator())
