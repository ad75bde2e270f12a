"""Waveform collation: pad variable-length audio into one batch, optionally with (log-)mel features.

Padding uses the shared vectorized ``pad_sequences``; features are one ``torchaudio`` transform applied to the
padded batch, so per-row Python work is limited to type conversion.
"""

from __future__ import annotations

import math
import numbers
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torchaudio

from collators._extra import add_extra_keys
from collators._padding import PADDING_SIDES, pad_sequences, padded_length
from collators.default import MISSING, check_targets_present, collate_labels
from collators.targets import row_name
from task_spec import TaskSpec

FEATURES = ("mel", "log_mel")
"""Named feature transforms; ``features`` may also be a picklable callable ``[B, (C,) T] -> tensor``."""

SAMPLE_LIMIT = 2.0
"""How far float samples may stray outside [-1, 1]: resampling and gain overshoot a little, while integer PCM
stored as float (int16: up to 32767) is far outside it."""


class AudioCollator:
    """Pad waveforms to ``input_values`` ``[B, T]`` (or ``[B, C, T]``) with ``lengths`` and ``attention_mask``.

    Rows are dicts holding a waveform under ``input_field``: a 1-D (mono) or 2-D ``[channels, time]`` float tensor,
    numpy array or list, or a ``{"array": ..., "sampling_rate": ...}`` dict as a Hugging Face ``Audio`` column
    gives; bare waveforms are accepted too. A row's ``sampling_rate`` (in the row or that dict) must equal
    ``sample_rate``: nothing is resampled silently. Labels under ``target_field`` are optional (all rows or none:
    rows without any, or with None, are a batch for prediction and give no labels, unless ``require_targets`` and
    the batch serves the train, val or test split). Samples must be finite and within [-1, 1] up to
    :data:`SAMPLE_LIMIT` (one check per batch): NaN would make the features NaN, and int16-scale floats are
    integer PCM that was never scaled.

    With ``features`` set, ``input_features`` and ``feature_lengths`` are added. 'mel' is
    ``torchaudio.transforms.MelSpectrogram`` (power 2, ``center=True``); 'log_mel' adds ``AmplitudeToDB`` with
    ``top_db=None``, because a ``top_db`` clamp depends on the loudest row and would make a row's features
    depend on its batch. ``feature_lengths = lengths // hop_length + 1`` counts the frames whose centre lies in
    the signal; up to ``ceil(n_fft / (2 * hop_length))`` of those, at the end, also see padding where an unpadded
    row would see its reflection. With mel features, batches are padded to at least ``n_fft // 2 + 1`` samples
    (the STFT's reflect padding needs them). A callable ``features`` gets the padded ``input_values`` and adds
    no lengths.

    Args:
        input_field: Key of the waveform in rows and batch.
        target_field: Key of the label in rows and batch; None ignores labels.
        sample_rate: Sampling rate rows must have, in Hz; also the mel transform's.
        pad_value: Value written into padding.
        padding_side: 'right' or 'left' (features need 'right').
        max_length: Longest kept waveform, in samples; longer rows are truncated at the end.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        features: None, 'mel', 'log_mel' or a picklable callable.
        n_mels: Mel bands; n_fft: FFT size; hop_length: samples between frames.
        num_classes: Int labels must lie in ``[0, num_classes)`` (or be -100, ignored); None skips the check.
        require_targets: A batch of the train, val or test split (the engine's batches say which, ``rows.role``) must
            carry a label in every row; the registry's factory sets it for a supervised spec.

    Raises:
        ValueError: Bad options, a sampling-rate mismatch, an empty waveform, waveforms of different ranks/channel
            counts, samples that are NaN, infinite or far outside [-1, 1], labels outside the classes or not finite,
            or a training or validation row without its label.
        TypeError: A waveform that is not a float tensor, array or list.

    Example:
        >>> batch = AudioCollator()([{"input_values": torch.ones(3)}, {"input_values": torch.ones(5)}])
        >>> batch["input_values"].shape, batch["lengths"].tolist()
        (torch.Size([2, 5]), [3, 5])
    """

    def __init__(
        self,
        *,
        input_field: str = "input_values",
        target_field: str | None = "labels",
        sample_rate: int = 16000,
        pad_value: float = 0.0,
        padding_side: str = "right",
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        features: str | Callable[[torch.Tensor], torch.Tensor] | None = None,
        n_mels: int = 80,
        n_fft: int = 400,
        hop_length: int = 160,
        num_classes: int | None = None,
        require_targets: bool = False,
    ) -> None:
        for name, value, optional in (("sample_rate", sample_rate, False), ("max_length", max_length, True),
                                      ("num_classes", num_classes, True),
                                      ("pad_to_multiple_of", pad_to_multiple_of, True), ("n_mels", n_mels, False),
                                      ("n_fft", n_fft, False), ("hop_length", hop_length, False)):
            if not (optional and value is None) and (not isinstance(value, int) or isinstance(value, bool)
                                                     or value <= 0):
                raise ValueError(f"{name} should be a positive int{' or None' if optional else ''}, but got "
                                 f"{name}={value!r}")
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side should be 'right' or 'left', but got padding_side={padding_side!r}")
        if isinstance(pad_value, bool) or not isinstance(pad_value, numbers.Real) or not math.isfinite(pad_value):
            raise ValueError(f"pad_value should be a finite number, but got pad_value={pad_value!r}")
        if require_targets and target_field is None:
            raise ValueError("require_targets=True needs the key of the label, but got target_field=None; pass "
                             "target_field=... or require_targets=False")
        if features is not None and not callable(features) and features not in FEATURES:
            raise ValueError(f"features should be None, 'mel', 'log_mel' or a callable, but got features={features!r}")
        if features is not None and padding_side == "left":
            raise ValueError("features need padding_side='right': left padding shifts each row's frame grid; "
                             "pass padding_side='right' or features=None")
        if callable(features):
            try:
                pickle.dumps(features)
            except Exception as error:
                raise TypeError(f"features={features!r} cannot be pickled ({error}), so worker processes could not "
                                f"receive it; use a module-level function or an nn.Module") from None
        self.input_field, self.target_field = input_field, target_field
        self.sample_rate, self.pad_value, self.padding_side = sample_rate, float(pad_value), padding_side
        self.max_length, self.pad_to_multiple_of = max_length, pad_to_multiple_of
        self.features, self.n_mels, self.n_fft, self.hop_length = features, n_mels, n_fft, hop_length
        self.num_classes, self.require_targets = num_classes, bool(require_targets)
        self._transform = self._make_transform()

    def _make_transform(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if self.features in FEATURES:
            mel = torchaudio.transforms.MelSpectrogram(
                sample_rate=self.sample_rate, n_fft=self.n_fft, hop_length=self.hop_length, n_mels=self.n_mels
            )
            return torch.nn.Sequential(mel, torchaudio.transforms.AmplitudeToDB()) \
                if self.features == "log_mel" else mel
        return self.features if callable(self.features) else None

    def __getstate__(self) -> dict[str, Any]:
        """The options only: a named feature transform is made again on unpickling, so pickling with torch's
        reductions (a spawn or forkserver worker) never moves this process's filter banks to shared memory."""
        return {key: value for key, value in self.__dict__.items() if key != "_transform"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._transform = self._make_transform()

    def __call__(self, rows: Sequence[Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Collate ``rows``; ``generator`` is accepted for the collator contract and unused (nothing is random)."""
        if len(rows) == 0:
            raise ValueError("AudioCollator got an empty list of rows; a batch needs at least one row")
        waves, labels = [], []
        for index, row in enumerate(rows):
            wave, label = self._split(row, index)
            waves.append(wave)
            labels.append(label)
        check_targets_present(labels, rows, str(self.target_field), self.require_targets)
        self._check_not_empty(waves, rows)
        first = waves[0].shape
        for index, wave in enumerate(waves):
            if wave.ndim != len(first) or wave.shape[:-1] != first[:-1]:
                raise ValueError(
                    f"row {index}: {self.input_field!r} has shape {tuple(wave.shape)} but row 0 has shape "
                    f"{tuple(first)}; give every row the same channel layout (1-D mono or [channels, time]), "
                    f"e.g. wave.mean(0) to downmix"
                )
        length = padded_length(max(wave.shape[-1] for wave in waves), max_length=self.max_length,
                               pad_to_multiple_of=self.pad_to_multiple_of)
        if self.features in FEATURES:  # the STFT's reflect padding needs more than n_fft // 2 samples
            length = max(length, self.n_fft // 2 + 1)
        channels = first[0] if len(first) == 2 else 1
        # [C, T] rows are padded as C one-dimensional rows each, then viewed back as [B, C, T].
        flat = [channel for wave in waves for channel in wave] if len(first) == 2 else waves
        values, lengths = pad_sequences(flat, pad_value=self.pad_value, padding_side=self.padding_side,
                                        length=length, dtype=torch.float32)
        if len(first) == 2:
            values, lengths = values.view(len(waves), channels, length), lengths[::channels].clone()
        positions = torch.arange(length).unsqueeze(0)
        if self.padding_side == "right":
            mask = positions < lengths.unsqueeze(1)
        else:
            mask = positions >= (length - lengths).unsqueeze(1)
        self._check_samples(values, mask, rows)
        batch = {self.input_field: values, "lengths": lengths, "attention_mask": mask.long()}
        if self._transform is not None:
            with torch.no_grad():
                batch["input_features"] = self._transform(values)
            if self.features in FEATURES:
                batch["feature_lengths"] = lengths // self.hop_length + 1
        if any(label is not MISSING for label in labels):
            batch[str(self.target_field)] = collate_labels(labels, key=str(self.target_field),
                                                           num_classes=self.num_classes, rows=rows)
        return add_extra_keys(batch, rows, {self.input_field, str(self.target_field), "sampling_rate"})

    def _check_not_empty(self, waves: list[torch.Tensor], rows: Sequence[Any]) -> None:
        """Refuse a waveform of no samples: padded, it would be a row of padding only, with a mel frame (the STFT
        centres one on the padding) and ``feature_lengths`` 1, trained on as if it were sound."""
        for position, wave in enumerate(waves):
            if wave.shape[-1] == 0:
                key = self.input_field
                raise ValueError(f"{row_name(rows, position)}: {key!r} should hold at least one sample, but got {key} "
                                 f"of shape {tuple(wave.shape)} (an empty waveform: a file that decodes to no "
                                 f"audio); drop that row (dataset.filter(lambda row: len(row[{key!r}]) > 0)) or fix "
                                 f"its file")

    def _check_samples(self, values: torch.Tensor, mask: torch.Tensor, rows: Sequence[Any]) -> None:
        """Refuse samples that are not finite or lie far outside [-1, 1]: one max over the padded batch (NaN
        propagates through it); the row at fault, among the real samples only, is searched when it fails."""
        if float(values.abs().amax()) <= SAMPLE_LIMIT:
            return
        real = mask if values.ndim == 2 else mask.unsqueeze(1).expand_as(values)
        magnitudes = values.abs().masked_fill(~real, 0).reshape(len(values), -1)
        bad = ~(magnitudes.amax(dim=1) <= SAMPLE_LIMIT)
        if not bool(bad.any()):
            return  # only the padding (a pad_value beyond the limit) is that large
        position = int(bad.nonzero()[0])
        where, key = row_name(rows, position), self.input_field
        flat = values[position].reshape(-1)
        broken = ~torch.isfinite(flat)
        if bool(broken.any()):
            index = int(broken.nonzero()[0])
            sample, channel = index % values.shape[-1], index // values.shape[-1]
            at = f"sample {sample}" + (f" of channel {channel}" if values.ndim == 3 else "")
            raise ValueError(f"{where}: {key!r} should hold finite samples, but got {key}={float(flat[index])} at "
                             f"{at} (its features would be NaN); fix or drop that file, or replace the bad samples "
                             f"in a dataset transform (torch.nan_to_num(wave, nan=0.0))")
        raise ValueError(
            f"{where}: float {key!r} should hold samples in [-1, 1] (peaks up to {SAMPLE_LIMIT} pass), but got {key} "
            f"with max abs={float(magnitudes[position].max()):.4g}; integer PCM stored as float? divide it by 32768 "
            f"(int16) or 2**31 (int32) in a dataset transform, e.g. wave / 32768"
        )

    def _split(self, row: Any, index: int) -> tuple[torch.Tensor, Any]:
        label, rate = MISSING, None
        if isinstance(row, Mapping):
            if self.input_field not in row:
                raise KeyError(f"row {index} has no {self.input_field!r} key (keys: {sorted(row)}); pass input_field= "
                               f"naming the waveform key, or set the spec's input_fields")
            wave, rate = row[self.input_field], row.get("sampling_rate")
            if self.target_field is not None and row.get(self.target_field) is not None:
                label = row[self.target_field]
        else:
            wave = row
        if isinstance(wave, Mapping) and "array" in wave:
            wave, rate = wave["array"], wave.get("sampling_rate", rate)
        if rate is not None and rate != self.sample_rate:
            raise ValueError(
                f"row {index}: sampling_rate is {rate} Hz but the collator expects sample_rate={self.sample_rate}; "
                f"resample in a dataset transform with torchaudio.functional.resample(wave, orig_freq={rate}, "
                f"new_freq={self.sample_rate}), or pass sample_rate={rate}"
            )
        return _to_wave(wave, f"row {index}: {self.input_field!r}"), label

    def __repr__(self) -> str:
        features = "" if self.features is None else (
            f", features={self.features!r}, n_mels={self.n_mels}, n_fft={self.n_fft}, hop_length={self.hop_length}"
        )
        return (
            f"AudioCollator(input_field={self.input_field!r}, target_field={self.target_field!r}, "
            f"sample_rate={self.sample_rate}, pad_value={self.pad_value}, padding_side={self.padding_side!r}, "
            f"max_length={self.max_length}, pad_to_multiple_of={self.pad_to_multiple_of}{features}, "
            f"num_classes={self.num_classes}, require_targets={self.require_targets})"
        )


def create_audio_collator(task_spec: TaskSpec | None = None, **kwargs: Any) -> AudioCollator:
    """Factory for the registry: an :class:`AudioCollator` with defaults from ``task_spec``, overridden by kwargs.

    From the spec: ``input_fields[0]``, ``target_field``, ``additional_config`` ``sample_rate`` and
    ``max_length``, ``num_classes`` (with a cross-entropy loss), ``require_targets`` for a supervised task, and
    ``preprocessing_config`` ``features``, ``n_mels``, ``n_fft``, ``hop_length``, ``padding_side``.
    """
    if task_spec is not None:
        target = kwargs.get("target_field", task_spec.target_field)
        defaults = {"input_field": task_spec.input_fields[0], "target_field": task_spec.target_field,
                    "require_targets": task_spec.is_supervised and target is not None}
        if task_spec.loss_type == "cross_entropy":
            defaults["num_classes"] = task_spec.num_classes
        for key in ("sample_rate", "max_length"):
            defaults[key] = task_spec.additional_config.get(key)
        for key in ("features", "n_mels", "n_fft", "hop_length", "padding_side"):
            defaults[key] = task_spec.preprocessing_config.get(key)
        kwargs = {**{key: value for key, value in defaults.items() if value is not None}, **kwargs}
    return AudioCollator(**kwargs)


def _to_wave(wave: Any, where: str) -> torch.Tensor:
    """A float32 1-D or 2-D tensor; may share memory with ``wave`` (padding copies)."""
    if isinstance(wave, np.ndarray):
        if not wave.flags.writeable or any(stride < 0 for stride in wave.strides):
            wave = wave.copy()  # torch.from_numpy rejects negative strides and warns on read-only arrays
        wave = torch.from_numpy(wave)
    elif isinstance(wave, (list, tuple)):
        try:
            wave = torch.tensor(wave, dtype=torch.float32)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{where} should be a list of floats (or of equal-length lists), but {error}") from None
    elif not isinstance(wave, torch.Tensor):
        raise TypeError(f"{where} should be a float tensor, numpy array or list of floats, but got "
                        f"{type(wave).__name__}")
    if not wave.is_floating_point():
        raise TypeError(f"{where} has dtype {wave.dtype}; expected float samples in [-1, 1]: convert integer PCM "
                        f"with wave.float() / 32768 (int16) in a dataset transform")
    if wave.ndim not in (1, 2):
        raise ValueError(f"{where} should be 1-D [time] or 2-D [channels, time], but got shape {tuple(wave.shape)}")
    return wave.to(torch.float32)
