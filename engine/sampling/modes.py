"""Which batching mode a module uses: ``plain``, ``grouped``, ``token_budget`` or ``packed``, from its argument or
the spec."""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.core.checks import check_int, keyword_or_spec
from engine.sampling.balance import check_balance

BATCHING_MODES = ("plain", "grouped", "token_budget", "packed")
BUDGET_MODES = ("token_budget", "packed")
"""The modes that take ``max_tokens``: a padded-token budget per batch, or the length of one packed sequence."""


def resolve_batching(spec: Any, batching: str | None, max_tokens: int | None,
                     shuffle: bool = True) -> tuple[str, int | None, str]:
    """``(batching, max_tokens, reason)``: each from its keyword or ``spec.preprocessing_config`` (refused when the
    two disagree), else 'plain'."""
    batching, reason = keyword_or_spec("batching", batching, spec, default="plain")
    if batching not in BATCHING_MODES:
        raise ValueError(f"batching should be one of {BATCHING_MODES}, but got batching={batching!r} ({reason})")
    if batching != "plain" and not shuffle:
        raise ValueError(f"batching={batching!r} ({reason}) shuffles batches every epoch, but shuffle=False; pass "
                         f"shuffle=True, or batching='plain' for a fixed order")
    if batching not in BUDGET_MODES:
        max_tokens, source = keyword_or_spec("max_tokens", max_tokens, spec)
        if max_tokens is not None:  # a budget no batch would follow
            raise ValueError(f"max_tokens={max_tokens!r} applies only to batching='token_budget' or 'packed', but "
                             f"batching={batching!r} ({reason}); drop max_tokens ({source}) or pass "
                             f"batching='token_budget' or 'packed'")
        return batching, None, reason
    task_type = getattr(spec, "task_type", None)
    if batching == "packed" and spec is not None:
        from collators.packed import PACKED_TASK_TYPES  # the packed collator's module (numba): packed batches only

        if task_type not in PACKED_TASK_TYPES:
            raise ValueError(f"batching='packed' ({reason}) concatenates documents for language modelling "
                             f"({', '.join(PACKED_TASK_TYPES)}), but the spec's task_type={task_type!r}; use "
                             f"batching='plain', 'grouped' or 'token_budget' for {task_type}")
    max_tokens, _ = keyword_or_spec("max_tokens", max_tokens, spec)
    if max_tokens is None:
        raise ValueError(f"batching={batching!r} needs max_tokens=... (or spec.preprocessing_config['max_tokens'])")
    return batching, check_int("max_tokens", max_tokens, minimum=1), reason


def resolve_balance(spec: Any, balance: str | None, attention_weight: float | None, batching: str, *,
                    stream: bool = False) -> tuple[str, float | None]:
    """``(balance, attention_weight)``: each from its keyword or ``spec.preprocessing_config`` (refused when the two
    disagree), else ``'tokens'`` and None. ``'compute'`` is refused where it cannot hold: without a token budget
    (packed or token-budget batching; a stream has none), or without a weight."""
    balance, reason = keyword_or_spec("balance", balance, spec, default="tokens")
    attention_weight, _ = keyword_or_spec("attention_weight", attention_weight, spec)
    if balance == "compute" and stream:
        raise ValueError(f"balance='compute' ({reason}) deals each step's documents to ranks by their lengths, which a "
                         f"stream (datasets.IterableDataset) does not have up front; use a map-style Dataset with "
                         f"batching='packed' or 'token_budget', or drop balance")
    if balance == "compute" and batching not in BUDGET_MODES:
        raise ValueError(f"balance='compute' ({reason}) deals the documents of each step's token-budget batches to "
                         f"ranks by their cost, but batching={batching!r}; pass batching='packed' or 'token_budget' "
                         f"and max_tokens=..., or drop balance")
    return balance, check_balance(balance, attention_weight)


def packed_collator_name(batching: str, collator_name: str | None, collate_fn: Any,
                         modality: str | None = None) -> str | None:
    """The registry name the module asks for: for packed batches, unless the user chose a collator, 'packed'
    ('vision_language_packed' for a multimodal spec, whose rows pack with their image tokens)."""
    if batching == "packed" and collator_name is None and collate_fn is None:
        return "vision_language_packed" if modality == "multimodal" else "packed"
    return collator_name


def with_packed_reason(resolution: Any, asked_for_packed: bool, batching_reason: str) -> Any:
    """``resolution`` with a reason that says the module asked for 'packed' because of the batching mode."""
    if not asked_for_packed or resolution is None:
        return resolution
    return dataclasses.replace(resolution, reason=f"batching='packed' ({batching_reason}) packs documents")
