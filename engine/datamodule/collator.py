"""A data module's collator: the registry's choice for its spec, or the packed collator for ``batching='packed'``,
with ``keep_uint8`` for ``device_normalize`` and its pad id checked against the tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collators import Resolution
from engine.collation.seeded_collate import build_collator
from engine.datamodule import options
from engine.sampling.modes import packed_collator_name, with_packed_reason
from task_spec import TaskSpec


def module_collator(spec: TaskSpec | None, tokenizer: Any, collate_fn: Any, name: str | None,
                    kwargs: dict[str, Any] | None, *, device_normalize: bool, batching: str,
                    batching_reason: str) -> tuple[Callable[..., Any], Resolution | None]:
    """A data module's collator and how it was chosen: :func:`build_collator`, asking for the packed collator
    when ``batching='packed'`` (unless one was named or given), with ``keep_uint8`` for ``device_normalize``, and
    its pad id checked against the tokenizer."""
    asked = packed_collator_name(batching, name, collate_fn)
    collator, resolution = build_collator(spec, tokenizer, collate_fn, asked,
                                          options.device_normalize_kwargs(device_normalize, collate_fn, spec, kwargs))
    options.check_pad_id(collator, tokenizer)
    return collator, with_packed_reason(resolution, asked != name, batching_reason)
