"""Image and audio columns of Hugging Face data (``imagefolder``/``audiofolder``, or ``cast_column``) decoded to
tensors on fetch: images to CHW uint8, audio to float32 waveforms, so the collators see one layout whatever the
storage.

Images are decoded by ``datasets`` and converted with the vision collator's PIL rules (palette and alpha images
become RGB, so a palette is never read as gray levels). Audio is decoded here with ``soundfile`` (libsndfile: wav,
flac, ogg, mp3), not by ``datasets``, whose decoder in this version needs torchcodec and a system FFmpeg; an
``Audio(sampling_rate=...)`` column is resampled with ``torchaudio.functional.resample`` as ``datasets`` would.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch

FOLDER_COLUMNS = ("image", "label")
"""The columns of an image folder as ``datasets``' imagefolder names them: the image, and the class of its
subfolder."""


def folder_columns(dataset: Any, spec: Any) -> Any:
    """``dataset`` with an image folder's columns (:data:`FOLDER_COLUMNS`) under the names a vision ``spec`` reads
    (``input_fields[0]``, ``target_field``: ``pixel_values`` and ``labels`` for the presets), when the data holds an
    ``Image`` column ``image`` and no column of the spec's name; a rename of Arrow metadata, nothing is copied.
    Other data, or a spec that names ``image`` itself, is returned as it is."""
    import datasets

    if spec is None or spec.modality != "vision" or dataset.features is None:
        return dataset
    columns, field, target = dataset.column_names, spec.input_fields[0], spec.target_field
    image, label = FOLDER_COLUMNS
    if field in columns or not isinstance(dataset.features.get(image), datasets.Image):
        return dataset
    names = {image: field}
    if target is not None and label in columns and target not in columns:
        names[label] = target
    return dataset.rename_columns(names)


def encoded_images(dataset: Any) -> Any:
    """``dataset`` whose ``Image`` columns (and lists of them, ``List(Image())``) come back encoded: the struct
    ``{"bytes", "path"}`` that ``datasets`` stores, not a decoded PIL image. Image-text rows are handed over so,
    and their images decoded by the collator in the loader's workers (or on the device). A cast of the features'
    metadata: nothing is rewritten."""
    import datasets

    def undecoded(feature: Any) -> Any:
        if isinstance(feature, datasets.Image):
            return datasets.Image(mode=feature.mode, decode=False) if feature.decode else feature
        if isinstance(feature, (datasets.List, datasets.LargeList)):
            inner = undecoded(feature.feature)
            return feature if inner is feature.feature else type(feature)(inner)
        return feature

    features = dataset.features or {}
    casts = {name: undecoded(feature) for name, feature in features.items()}
    for name, feature in casts.items():
        if feature is not features[name]:
            dataset = dataset.cast_column(name, feature)
    return dataset


def media_columns(dataset: Any, fields: list[str]) -> dict[str, Any]:
    """``{column: feature}`` of the ``fields`` that hold decodable images or audio."""
    import datasets

    features = dataset.features or {}
    return {name: features[name] for name in fields if name in features
            and isinstance(features[name], (datasets.Image, datasets.Audio)) and features[name].decode}


def with_media_decoded(dataset: Any, fields: list[str], target: str | None = None) -> Any:
    """``dataset`` whose ``fields`` come back as tensors: image and audio columns decoded as the module docstring
    says, numbers and lists of numbers as tensors (as ``with_format('torch')``); other columns unchanged. An image
    column named ``target`` (a segmentation mask) keeps its values: a palette mask's class indices."""
    import datasets

    media = media_columns(dataset, fields)
    audio = {name: feature for name, feature in media.items() if isinstance(feature, datasets.Audio)}
    for name, feature in audio.items():  # keep the file's bytes or path; decoded by DecodeMedia below
        dataset = dataset.cast_column(name, datasets.Audio(decode=False, sampling_rate=feature.sampling_rate,
                                                           num_channels=feature.num_channels))
    return dataset.with_transform(DecodeMedia(fields, images=[n for n in media if n not in audio], audio={
        name: (feature.sampling_rate, feature.num_channels) for name, feature in audio.items()}, target=target))


class DecodeMedia:
    """A picklable ``with_transform`` function (it travels to worker processes) for :func:`with_media_decoded`."""

    def __init__(self, fields: list[str], images: list[str], audio: dict[str, tuple[int | None, int | None]],
                 target: str | None = None) -> None:
        self.fields, self.images, self.audio, self.target = fields, images, audio, target

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if self.images:  # torchvision and PIL, imported where images are decoded (in the worker, not at import)
            from torchvision.transforms.v2.functional import pil_to_tensor

            from collators.images import to_chw
        out = dict(batch)
        for name in self.fields:
            if name in self.images and name == self.target:
                out[name] = [pil_to_tensor(image) for image in batch[name]]
            elif name in self.images:
                out[name] = [to_chw(image, index, name) for index, image in enumerate(batch[name])]
            elif name in self.audio:
                out[name] = [decode_audio(value, *self.audio[name]) for value in batch[name]]
            elif name in batch:
                out[name] = [_as_tensor(value) for value in batch[name]]
        return out


def _as_tensor(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) or (isinstance(value, list) and not _holds_text(value)):
        return torch.tensor(value)
    return value


def _holds_text(values: list[Any]) -> bool:
    while isinstance(values, list) and values:
        values = values[0]
    return isinstance(values, (str, bytes)) or values is None


def decode_audio(value: Mapping[str, Any], sampling_rate: int | None = None,
                 num_channels: int | None = None) -> dict[str, Any]:
    """``{"array": float32 waveform, "sampling_rate": Hz}`` from an ``Audio`` value ``{"bytes", "path"}``: 1-D
    ``[T]`` for one channel, ``[C, T]`` for more; resampled to ``sampling_rate`` and mixed down to one channel
    when the column asks for it.

    Raises:
        ImportError: soundfile is not installed.
        ValueError: The column asks for ``num_channels`` other than 1 or the file's own count.
    """
    try:
        import soundfile
    except ImportError as error:  # pragma: no cover - a declared dependency
        raise ImportError("decoding an Audio column needs soundfile: pip install soundfile") from error
    source = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]
    samples, rate = soundfile.read(source, dtype="float32", always_2d=True)  # [T, C]
    wave = torch.from_numpy(samples.T.copy())
    if num_channels is not None and num_channels != wave.shape[0]:
        if num_channels != 1:
            raise ValueError(f"the Audio column asks for num_channels={num_channels}, but {value.get('path')!r} has "
                             f"{wave.shape[0]}; only a mix down to num_channels=1 is done here: cast the column to "
                             f"Audio(num_channels=1) or Audio(num_channels=None)")
        wave = wave.mean(dim=0, keepdim=True)
    if sampling_rate is not None and sampling_rate != rate:
        import torchaudio

        wave, rate = torchaudio.functional.resample(wave, rate, sampling_rate), sampling_rate
    return {"array": wave[0] if wave.shape[0] == 1 else wave, "sampling_rate": int(rate)}
