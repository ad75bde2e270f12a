"""The values a TaskSpec accepts: enumerated fields, per-modality defaults, and the mapping keys the data path reads."""

from __future__ import annotations

MODALITIES = ("text", "vision", "audio", "multimodal", "tabular")
TASK_TYPES = (
    "causal_lm",
    "masked_lm",
    "classification",
    "regression",
    "seq2seq",
    "token_classification",
)
LOSS_TYPES = ("cross_entropy", "mse", "l1", "bce", "ctc", "contrastive", "none")
SUPERVISED_TASK_TYPES = ("classification", "regression", "seq2seq", "token_classification")
"""Task types whose rows must carry a target; language modelling derives its labels from the inputs."""
LANGUAGE_MODELLING_TASK_TYPES = ("causal_lm", "masked_lm")
"""Task types that predict token ids of the inputs, so they need token ids (text or multimodal)."""

DEFAULT_INPUT_FIELDS = {
    "text": ("input_ids",),
    "vision": ("pixel_values",),
    "audio": ("input_values",),
    "multimodal": ("pixel_values", "input_ids"),
    "tabular": ("features",),
}
"""Input fields used when a spec names none: the conventional key for each modality."""

MAPPING_FIELDS = ("special_tokens", "additional_config", "input_schema", "output_schema", "preprocessing_config")
"""The TaskSpec fields that hold mappings; ``spec.replace`` merges these instead of replacing them."""

KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    # collators/_text_options.py (resolve_token_id, resolve_special_ids), engine/tools/validation.py, demo/run.py;
    # the rest are the ids a Hugging Face tokenizer defines, which users copy into a spec.
    "special_tokens": (
        "pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id", "mask_token_id", "cls_token_id",
        "sep_token_id", "decoder_start_token_id", "image_token_id",
    ),
    # TaskSpec properties, collators/text.py (max_target_len), collators/audio.py (sample_rate, max_length),
    # engine/sources/tokenizing/preprocess.py, engine/tools/_batch_checks.py (image_size, num_classes, vocab_size),
    # collators/multimodal.py (patch_size, image_tokens, max_image_size, max_tiles).
    "additional_config": (
        "max_seq_len", "max_target_len", "vocab_size", "num_classes", "image_size", "sample_rate", "max_length",
        "patch_size", "image_tokens", "max_image_size", "max_tiles",
    ),
    # collators/text.py and _text_options.py, collators/vision.py (normalization), collators/audio.py,
    # engine/sources/inputs.py (text fields), engine/sampling/modes.py (batching, max_tokens),
    # engine/sources/long_rows.py (long_rows, stride), collators/multimodal.py (resize, flip_probability,
    # decode_device).
    "preprocessing_config": (
        "text_field", "target_text_field", "padding_side", "mlm_probability", "normalization", "features",
        "n_mels", "n_fft", "hop_length", "batching", "max_tokens", "padding", "pad_to_buckets", "long_rows", "stride",
        "resize", "flip_probability", "decode_device",
    ),
}
"""Keys that some stage of the data path reads, per mapping field. Other keys are kept for the user's own use,
unless they are a near miss of one of these (see ``task_spec._keys``)."""

KEY_ALIASES = {
    "sampling_rate": "sample_rate",
    "max_seq_length": "max_seq_len",
    "max_sequence_length": "max_seq_len",
    "max_target_length": "max_target_len",
    "num_labels": "num_classes",
    "n_classes": "num_classes",
    "vocabulary_size": "vocab_size",
    "mask_probability": "mlm_probability",
    "text_column": "text_field",
    "target_text_column": "target_text_field",
}
"""Other libraries' names for known keys (Hugging Face's ``sampling_rate``, ``num_labels``, ...)."""

POSITIVE_INT_KEYS = {
    "additional_config": ("max_seq_len", "vocab_size", "num_classes", "sample_rate", "max_target_len", "max_length",
                          "patch_size", "image_tokens", "max_image_size", "max_tiles"),
    "preprocessing_config": ("n_mels", "n_fft", "hop_length", "max_tokens"),
}
"""Known keys whose value must be a positive int when given."""
