"""Collators: turn lists of rows into padded, model-ready batches; chosen from a TaskSpec by the registry."""

from collators.audio import AudioCollator, create_audio_collator
from collators.builtins import register_builtins
from collators.default import DefaultCollator, create_default_collator
from collators.packed import PackedCollator, create_packed_collator
from collators.registry import CollatorEntry, CollatorRegistry, Resolution
from collators.text import TextCollator, create_text_collator, warm_token_loops
from collators.vision import VisionCollator, create_vision_collator

register_builtins(CollatorRegistry.get_instance())

__all__ = [
    "AudioCollator",
    "CollatorEntry",
    "CollatorRegistry",
    "DefaultCollator",
    "PackedCollator",
    "Resolution",
    "TextCollator",
    "VisionCollator",
    "create_audio_collator",
    "create_default_collator",
    "create_packed_collator",
    "create_text_collator",
    "create_vision_collator",
    "warm_token_loops",
]
