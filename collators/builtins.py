"""Registration of the built-in collators. Each is registered for its modality only (no task types), so
any later registration for that modality, such as a user's decorator, takes precedence. ``packed`` and
``vision_language_packed`` are registered for no modality: they are chosen by name only (the module asks for one
when ``batching='packed'``, by the spec's modality).

Each factory is registered as ``"module:function"`` and imported when first built: the vision collator imports
torchvision and the audio one torchaudio, which a text task (and its spawned workers) never needs."""

from __future__ import annotations

from collators.registry import DEFAULT_COLLATOR, CollatorRegistry

BUILTIN_NAMES = (DEFAULT_COLLATOR, "text", "vision", "audio_waveform", "vision_language", "packed",
                 "vision_language_packed")


def register_builtins(registry: CollatorRegistry) -> None:
    """Register the default, text, vision, audio, vision-language and packed collators on ``registry`` (once)."""
    if all(name in registry for name in BUILTIN_NAMES):
        return
    registry.register(DEFAULT_COLLATOR, description="torch default_collate that keeps every dict key")(
        "collators.default:create_default_collator"
    )
    registry.register(
        "text",
        modality="text",
        description="dynamic padding; causal/masked LM, classification, seq2seq labels from the spec",
    )("collators.text:create_text_collator")
    registry.register("vision", modality="vision", description="images to normalized float (or uint8) batches")(
        "collators.vision:create_vision_collator"
    )
    registry.register(
        "audio_waveform", modality="audio", description="pads waveforms; lengths, mask, optional mel features"
    )("collators.audio:create_audio_collator")
    registry.register(
        "vision_language", modality="multimodal",
        description="images with text: placeholders expanded to image tokens for causal_lm; image-text pairs else",
    )("collators.multimodal:create_multimodal_collator")
    registry.register(
        "packed", description="whole documents in one [1, T] sequence, position_ids and cu_seq_lens; no padding"
    )("collators.packed:create_packed_collator")
    registry.register(
        "vision_language_packed",
        description="whole rows of text with images in one [1, T] sequence, image tokens counted; by name only",
    )("collators.multimodal_packed:create_packed_vision_language_collator")
