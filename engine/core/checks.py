"""Argument checks shared by the engine, in torch's form: "batch_size should be a positive integer, but got
batch_size=0". A wrong type raises TypeError, a wrong value ValueError; numpy integers count as integers."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any


def _describe(minimum: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")


def check_int(name: str, value: Any, *, minimum: int | None = None, hint: str = "") -> int:
    """``value`` as a Python int; TypeError unless an integer (bools refused), ValueError if below ``minimum``."""
    expected = _describe(minimum) if minimum is not None else "an integer"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} should be {expected}, but got {name}={value!r} ({type(value).__name__}){hint}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} should be {expected}, but got {name}={value!r}{hint}")
    return int(value)


SAVED_INT_LIMIT = 2**63
"""Numbers in a saved state are below this (torch's int64): anything larger was not written by the engine."""


def check_saved_int(owner: str, key: str, value: Any, *, low: int = 0) -> int:
    """``value``, the number under ``key`` of a saved state of ``owner`` (e.g. "sampler state"), as an int in
    ``[low, 2**63)``; a TypeError or ValueError naming the key, the value and the range otherwise, so a crafted or
    corrupted state is refused before any of it sizes an allocation or a loop."""
    allowed = f"{_describe(low)} (below 2**63)"
    fix = "; the state was not saved by this engine, or was changed since: resume from the checkpoint as written"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}'s {key} should be {allowed}, but got {key}={value!r} ({type(value).__name__}){fix}")
    if not low <= value < SAVED_INT_LIMIT:
        raise ValueError(f"{owner}'s {key} should be {allowed}, but got {key}={value!r}{fix}")
    return int(value)


def check_rank(rank: Any, num_replicas: Any) -> tuple[int, int]:
    """``(rank, num_replicas)`` as ints, with ``0 <= rank < num_replicas``."""
    num_replicas = check_int("num_replicas", num_replicas, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ValueError(f"rank should be in [0, num_replicas={num_replicas}), but got rank={rank}")
    return rank, num_replicas


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``; ValueError listing them otherwise."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} should be one of {', '.join(repr(c) for c in choices)}, but got {name}={value!r}")
    return value


def keyword_or_spec(name: str, value: Any, spec: Any, default: Any = None) -> tuple[Any, str]:
    """``(setting, where it came from)`` for a setting a module takes as a keyword or from
    ``spec.preprocessing_config[name]``: the one given, else ``default``. Given in both places with different
    values, it is refused naming both, so no setting is silently overridden."""
    config = getattr(spec, "preprocessing_config", None) or {}
    if name not in config:
        return (default, "the default") if value is None else (value, f"{name}= was given")
    if value is not None and value != config[name]:
        raise ValueError(
            f"{name}={value!r} contradicts spec.preprocessing_config[{name!r}]={config[name]!r}; set it in one place: "
            f"drop {name}= to use the spec's, or give the spec {name}={value!r} "
            f"(spec.replace(preprocessing_config={{..., {name!r}: {value!r}}}))")
    return config[name], f"spec.preprocessing_config[{name!r}]"
