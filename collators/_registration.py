"""What the registry stores and returns: one registration (CollatorEntry), the record of a choice (Resolution),
and the checks of the keys an entry is registered under."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from task_spec import MODALITIES, TASK_TYPES, TaskSpec

CollatorFactory = Callable[..., Callable[..., Any]]


@dataclass(frozen=True)
class CollatorEntry:
    """One registration: the factory and the keys it is selected by."""

    name: str
    target: CollatorFactory | str
    """The factory, or where it lives as ``"module:function"``: a factory imported when the entry is first built or
    its ``factory`` read. The built-ins are registered so, so a text task never imports torchvision or torchaudio."""
    modality: str | None
    task_types: tuple[str, ...] | None
    description: str
    order: int
    """Registration counter; among equal matches the highest wins."""

    @property
    def factory(self) -> CollatorFactory:
        """The factory function (imported from its module on first use when registered as ``"module:function"``)."""
        return load_factory(self.target)

    def matches(self, task_spec: TaskSpec) -> str | None:
        """The tier at which this entry matches ``task_spec`` (``"task_type"`` or ``"modality"``), else None."""
        if self.modality != task_spec.modality:
            return None
        if self.task_types is None:
            return "modality"
        return "task_type" if task_spec.task_type in self.task_types else None

    def create(self, task_spec: TaskSpec | None = None, **kwargs: Any) -> Callable[..., Any]:
        """Call the factory as ``factory(task_spec=..., **kwargs)`` and check that it returned a collator.

        Raises:
            TypeError: the factory returned something that cannot be called on rows (None, a batch, ...).
        """
        collator = self.factory(task_spec=task_spec, **kwargs)
        if not callable(collator):
            raise TypeError(
                f"collator factory {self.name!r} ({qualname(self.target)}) should return a callable "
                f"(rows) -> batch, but it returned {type(collator).__name__}: {collator!r}; return the collator "
                f"object or function itself"
            )
        return collator


@dataclass(frozen=True)
class Resolution:
    """Which collator a spec resolves to, and why; ``str()`` gives the printable explanation."""

    chosen: CollatorEntry
    reason: str
    candidates: tuple[tuple[str, str], ...]
    """``(name, why)`` of every entry considered; names only, so pickling needs only the chosen factory."""

    def __str__(self) -> str:
        lines = [f"chosen: {self.chosen.name!r} ({self.reason})"]
        lines += [f"  - {name!r}: {why}" for name, why in self.candidates]
        return "\n".join(lines)


def check_selection(name: str, modality: Any, task_types: Any) -> tuple[str, ...] | None:
    """``task_types`` as a tuple, after refusing keys no TaskSpec can have (the entry could never be chosen)."""
    if modality is not None and modality not in MODALITIES:
        error = TypeError if not isinstance(modality, str) else ValueError
        raise error(f"register({name!r}) modality should be one of {_listed(MODALITIES)} or None, but got "
                    f"modality={modality!r}{_hint(modality, MODALITIES)}; no TaskSpec has it, so the entry could "
                    f"never be chosen")
    if task_types is None:
        return None
    if isinstance(task_types, str):
        task_types = (task_types,)
    try:
        task_types = tuple(task_types)
    except TypeError:
        raise TypeError(f"register({name!r}) task_types should be a sequence of task types or None, but got "
                        f"task_types={task_types!r}") from None
    if not task_types:
        raise ValueError(f"register({name!r}) task_types should name at least one of {_listed(TASK_TYPES)}, or be "
                         f"None for every task type, but got task_types=(); the entry could never be chosen")
    for task_type in task_types:
        if task_type not in TASK_TYPES:
            raise ValueError(f"register({name!r}) task_types should hold values of {_listed(TASK_TYPES)}, but got "
                             f"{task_type!r} in task_types={task_types!r}{_hint(task_type, TASK_TYPES)}")
    if modality is None:
        raise ValueError(f"register({name!r}) task_types need a modality, but got modality=None with task_types="
                         f"{task_types!r}; an entry without a modality is chosen only by name or as the default, "
                         f"so pass modality=... (one of {_listed(MODALITIES)})")
    return task_types


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(repr(value) for value in values)


def _hint(value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        return ""
    close = [value.lower()] if value.lower() in allowed else difflib.get_close_matches(value, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def why_not(entry: CollatorEntry, task_spec: TaskSpec | None) -> str:
    if task_spec is None:
        return "no task_spec to match"
    if entry.modality is None:
        return "registered without a modality (selected only by name or as the default)"
    if entry.modality != task_spec.modality:
        return f"modality {entry.modality!r} != {task_spec.modality!r}"
    return f"task_types {entry.task_types} exclude {task_spec.task_type!r}"


def load_factory(target: CollatorFactory | str) -> CollatorFactory:
    """The factory ``target`` names: itself, or for ``"module:function"`` that module's function, imported now."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def qualname(factory: Any) -> str:
    """``module.qualname`` of a factory (just the qualname when it has no module, as in an exec'd notebook cell);
    a ``"module:function"`` reference reads as ``module.function`` without importing it."""
    if isinstance(factory, str):
        return factory.replace(":", ".")
    name = getattr(factory, "__qualname__", repr(factory))
    module = getattr(factory, "__module__", None)
    return f"{module}.{name}" if module else name


def same_function(registered: Any, new: Any) -> bool:
    """Whether ``new`` is ``registered`` defined again, as when a notebook cell runs twice.

    That is the same object, or the same ``__module__`` and ``__qualname__``. Lambdas are never taken for one another:
    they all share one name.
    """
    if new is registered:
        return True
    names = [tuple(f.split(":", 1)) if isinstance(f, str) else (getattr(f, "__module__", None),
                                                               getattr(f, "__qualname__", None))
             for f in (registered, new)]
    (module, name), other = names
    return (isinstance(module, str) and isinstance(name, str) and "<lambda>" not in name
            and names[0] == other)
