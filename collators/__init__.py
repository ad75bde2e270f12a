"""Collators: turn lists of rows into padded, model-ready batches; chosen from a TaskSpec by the registry.

Importing the package imports the registry only. Each collator's module is imported when its name is first read
(``from collators import VisionCollator``, PEP 562) or when the registry first builds it, so a text task never
imports torchvision or torchaudio, in the main process or in its workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from collators.builtins import register_builtins
from collators.registry import CollatorEntry, CollatorRegistry, Resolution

if TYPE_CHECKING:
    from collators.audio import AudioCollator, create_audio_collator
    from collators.default import DefaultCollator, create_default_collator
    from collators.multimodal import ImageTextCollator, VisionLanguageCollator, create_multimodal_collator
    from collators.multimodal_packed import PackedVisionLanguageCollator, create_packed_vision_language_collator
    from collators.packed import PackedCollator, create_packed_collator
    from collators.text import TextCollator, create_text_collator, warm_token_loops
    from collators.vision import VisionCollator, create_vision_collator

register_builtins(CollatorRegistry.get_instance())

_LAZY = {
    "AudioCollator": "collators.audio",
    "create_audio_collator": "collators.audio",
    "DefaultCollator": "collators.default",
    "create_default_collator": "collators.default",
    "ImageTextCollator": "collators.multimodal",
    "VisionLanguageCollator": "collators.multimodal",
    "create_multimodal_collator": "collators.multimodal",
    "PackedCollator": "collators.packed",
    "PackedVisionLanguageCollator": "collators.multimodal_packed",
    "create_packed_vision_language_collator": "collators.multimodal_packed",
    "create_packed_collator": "collators.packed",
    "TextCollator": "collators.text",
    "create_text_collator": "collators.text",
    "warm_token_loops": "collators.text",
    "VisionCollator": "collators.vision",
    "create_vision_collator": "collators.vision",
}
"""The public names imported on first use, and their modules."""

__all__ = [
    "AudioCollator",
    "CollatorEntry",
    "CollatorRegistry",
    "DefaultCollator",
    "ImageTextCollator",
    "PackedCollator",
    "PackedVisionLanguageCollator",
    "Resolution",
    "TextCollator",
    "VisionCollator",
    "VisionLanguageCollator",
    "create_audio_collator",
    "create_default_collator",
    "create_multimodal_collator",
    "create_packed_collator",
    "create_packed_vision_language_collator",
    "create_text_collator",
    "create_vision_collator",
    "warm_token_loops",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'collators' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
