"""Deep-freezing of the mappings a TaskSpec carries, so a spec is an immutable, hashable value."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


class FrozenDict(dict):
    """A read-only, hashable dict that still pickles (unlike ``MappingProxyType``), so specs reach workers."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "TaskSpec mappings are read-only; derive a new spec with spec.replace(field={...}) instead"
        )

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]
    __ior__ = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda item: repr(item[0]))))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return repr(dict(self))


def freeze(value: Any) -> Any:
    """Return ``value`` with mappings turned into FrozenDicts and lists/sets into tuples, recursively.

    Integers of other types (``numpy.int64``, ...) become ``int``, so a size read from an array is accepted
    and the spec stays a plain, JSON-friendly value; bools stay bools (and are refused where ints are expected).
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, int):
        return int(value)
    if isinstance(value, Mapping):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(freeze(item) for item in value))
    return value
