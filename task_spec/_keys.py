"""Near misses of the mapping keys the data path reads: ``max_seq_length`` for ``max_seq_len`` is refused, not
silently ignored, while keys far from every known one stay free for the user's own use."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from task_spec.choices import KEY_ALIASES, KNOWN_KEYS

CUTOFF = 0.85
"""difflib ratio from which an unknown key counts as a typo of a known one (``min_seq_len`` vs ``max_seq_len``
is 0.82 and stays allowed; ``max_seq_length`` is 0.88)."""
MIN_PREFIX = 5
"""An unknown key this long that starts a known key (``mlm_prob``, ``vocab``) is taken as an abbreviation of it."""

_TOKEN_SUFFIX = re.compile(r"(_token)?(_ids?)?$")


def _squash(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "").replace(" ", "")


def near_miss(field_name: str, key: str) -> str | None:
    """The known key of ``field_name`` that ``key`` most likely meant, or None (known, or clearly distinct)."""
    known = KNOWN_KEYS[field_name]
    if key in known:
        return None
    normal = key.strip().lower().replace("-", "_").replace(" ", "_")
    by_squash = {_squash(name): name for name in known}
    if _squash(key) in by_squash:
        return by_squash[_squash(key)]
    if KEY_ALIASES.get(normal) in known:
        return KEY_ALIASES[normal]
    if field_name == "special_tokens":  # compare stems: the shared "_token_id" would make every pair look close
        stems = {name.removesuffix("_token_id"): name for name in known}
        close = difflib.get_close_matches(_TOKEN_SUFFIX.sub("", normal), stems, n=1, cutoff=CUTOFF)
        return stems[close[0]] if close else None
    prefixed = [name for name in known if len(normal) >= MIN_PREFIX and name.startswith(normal)]
    close = difflib.get_close_matches(normal, known, n=1, cutoff=CUTOFF)
    return close[0] if close else (prefixed[0] if prefixed else None)


def home_of(key: str, field_name: str) -> str | None:
    """The other mapping field that reads ``key`` exactly, when ``field_name`` does not."""
    if key in KNOWN_KEYS.get(field_name, ()):
        return None
    return next((name for name, keys in KNOWN_KEYS.items() if name != field_name and key in keys), None)


def check_keys(field_name: str, mapping: Mapping[Any, Any]) -> None:
    """Raise ValueError for a key of ``mapping`` that belongs to another field or is a near miss of a known key."""
    for key in mapping:
        if not isinstance(key, str):
            continue
        home = home_of(key, field_name)
        if home is not None:
            raise ValueError(
                f"TaskSpec.{field_name} should not hold {key!r}, which is read from {home}, but got "
                f"{field_name}={{{key!r}: {mapping[key]!r}, ...}}; move it: {home}={{{key!r}: {mapping[key]!r}}}"
            )
        meant = near_miss(field_name, key)
        if meant is not None:
            first_word = key.lower().split("_")[0]
            others = [name for name in difflib.get_close_matches(key.lower(), KNOWN_KEYS[field_name], n=3, cutoff=0.75)
                      if name != meant and name.split("_")[0] == first_word]
            also = f" (or {', '.join(repr(name) for name in others)})" if others else ""
            raise ValueError(
                f"TaskSpec.{field_name} keys should be ones the data path reads or names clearly distinct from "
                f"them, but got {key!r}, a near miss of {meant!r}{also}, which nothing reads; rename it to "
                f"{meant!r} (known keys: {', '.join(KNOWN_KEYS[field_name])})"
            )
