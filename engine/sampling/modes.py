"""Which batching mode a module uses: ``plain``, ``grouped`` or ``token_budget``, from its argument or the spec."""

from __future__ import annotations

from typing import Any

from engine._checks import check_int

BATCHING_MODES = ("plain", "grouped", "token_budget")


def resolve_batching(spec: Any, batching: str | None, max_tokens: int | None,
                     shuffle: bool = True) -> tuple[str, int | None, str]:
    """``(batching, max_tokens, reason)``: the arguments, else ``spec.preprocessing_config``, else 'plain'."""
    config = dict(getattr(spec, "preprocessing_config", None) or {})
    if batching is not None:
        reason = "batching= was given"
    elif "batching" in config:
        batching, reason = config["batching"], "spec.preprocessing_config['batching']"
    else:
        batching, reason = "plain", "the default"
    if batching not in BATCHING_MODES:
        raise ValueError(f"batching should be one of {BATCHING_MODES}, but got batching={batching!r} ({reason})")
    if batching != "plain" and not shuffle:
        raise ValueError(f"batching={batching!r} ({reason}) shuffles batches every epoch, but shuffle=False; pass "
                         f"shuffle=True, or batching='plain' for a fixed order")
    if batching != "token_budget":
        if max_tokens is not None:
            raise ValueError(f"max_tokens={max_tokens!r} applies only to batching='token_budget', but batching="
                             f"{batching!r}; drop max_tokens or pass batching='token_budget'")
        return batching, None, reason
    max_tokens = max_tokens if max_tokens is not None else config.get("max_tokens")
    if max_tokens is None:
        raise ValueError("batching='token_budget' needs max_tokens=... (or spec.preprocessing_config['max_tokens'])")
    return batching, check_int("max_tokens", max_tokens, minimum=1), reason
