"""Preset specs for small, fast experiments, as keyword arguments of ``TaskSpec``.

``TaskSpec.lm_tiny()`` and friends build specs from these; this module imports nothing of ``task_spec.spec``.
Each function returns a fresh dict, so a caller may change it before building a spec.
"""

from __future__ import annotations

from typing import Any

GPT2_EOS = 50256


def lm_tiny() -> dict[str, Any]:
    """Causal language modelling: GPT-2 sized vocabulary, 128-token sequences, pad shares the eos id."""
    return dict(
        name="lm_tiny",
        task_type="causal_lm",
        model_family="decoder",
        modality="text",
        input_fields=("input_ids",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("loss", "perplexity"),
        special_tokens={"pad_token_id": GPT2_EOS, "eos_token_id": GPT2_EOS},
        additional_config={"max_seq_len": 128, "vocab_size": 50257},
        input_schema={"input_ids": {"dtype": "int64", "shape": ["seq"]}},
        output_schema={"logits": {"dtype": "float32", "shape": ["seq", "vocab"]}},
    )


def mlm_tiny() -> dict[str, Any]:
    """Masked language modelling: BERT ids, 15% masking with the 80/10/10 replacement rule."""
    return dict(
        name="mlm_tiny",
        task_type="masked_lm",
        model_family="encoder",
        modality="text",
        input_fields=("input_ids",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("loss", "accuracy"),
        special_tokens={"pad_token_id": 0, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103},
        additional_config={"max_seq_len": 128, "vocab_size": 30522},
        preprocessing_config={"mlm_probability": 0.15},
    )


def cls_tiny() -> dict[str, Any]:
    """Sequence classification into 2 classes from token ids (label key ``labels``)."""
    return dict(
        name="cls_tiny",
        task_type="classification",
        model_family="encoder",
        modality="text",
        input_fields=("input_ids",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("accuracy",),
        special_tokens={"pad_token_id": 0},
        additional_config={"max_seq_len": 128, "vocab_size": 30522, "num_classes": 2},
    )


def seq2seq_tiny() -> dict[str, Any]:
    """Sequence to sequence (T5 sized vocabulary): inputs up to 128 tokens, targets up to 64."""
    return dict(
        name="seq2seq_tiny",
        task_type="seq2seq",
        model_family="encoder_decoder",
        modality="text",
        input_fields=("input_ids",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("loss",),
        special_tokens={"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},
        additional_config={"max_seq_len": 128, "max_target_len": 64, "vocab_size": 32128},
        preprocessing_config={"text_field": "source", "target_text_field": "target"},
    )


def vision_tiny() -> dict[str, Any]:
    """Image classification: 3x32x32 images, 4 classes, CIFAR-10 normalization."""
    return dict(
        name="vision_tiny",
        task_type="classification",
        model_family="cnn",
        modality="vision",
        input_fields=("pixel_values",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("accuracy",),
        additional_config={"image_size": [3, 32, 32], "num_classes": 4},
        input_schema={"pixel_values": {"dtype": "float32", "shape": [3, 32, 32]}},
        preprocessing_config={"normalization": "cifar10"},
    )


def audio_tiny() -> dict[str, Any]:
    """Audio classification: 16 kHz mono waveforms up to 1 s, 4 classes, 40-band log-mel features."""
    return dict(
        name="audio_tiny",
        task_type="classification",
        model_family="audio_encoder",
        modality="audio",
        input_fields=("input_values",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("accuracy",),
        additional_config={"sample_rate": 16000, "max_length": 16000, "num_classes": 4},
        preprocessing_config={"features": "log_mel", "n_mels": 40},
    )


def vlm_tiny() -> dict[str, Any]:
    """Vision-language causal LM: captions after their image, 32x32 RGB images of 16 image tokens (8x8 patches),
    64-token rows, the image placeholder at id 1 and padding at id 0. Rows carry ``input_ids`` (or ``text``) and
    ``image`` or ``images``; the collator makes ``pixel_values``."""
    return dict(
        name="vlm_tiny",
        task_type="causal_lm",
        model_family="vision_decoder",
        modality="multimodal",
        input_fields=("input_ids",),
        target_field="labels",
        loss_type="cross_entropy",
        metrics=("loss",),
        special_tokens={"pad_token_id": 0, "image_token_id": 1},
        additional_config={"max_seq_len": 64, "image_size": [3, 32, 32], "patch_size": 8},
        preprocessing_config={"normalization": "clip"},
    )


PRESETS = (lm_tiny, mlm_tiny, cls_tiny, seq2seq_tiny, vision_tiny, audio_tiny, vlm_tiny)
"""Every preset, in the order the docs list them."""
