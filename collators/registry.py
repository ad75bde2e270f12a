"""CollatorRegistry: named collator factories, chosen for a TaskSpec by an explainable rule.

Resolution, most specific first: an explicit ``collator_name``; a registration whose modality and
task types both match the spec; one whose modality matches (registered without task types); the
collator named ``default``. Among equal matches the latest registration wins, so a user's decorator
overrides a built-in.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from task_spec import TaskSpec

DEFAULT_COLLATOR = "default"
CollatorFactory = Callable[..., Callable[..., Any]]


@dataclass(frozen=True)
class CollatorEntry:
    """One registration: the factory and the keys it is selected by."""

    name: str
    factory: CollatorFactory
    modality: str | None
    task_types: tuple[str, ...] | None
    description: str
    order: int
    """Registration counter; among equal matches the highest wins."""

    def matches(self, task_spec: TaskSpec) -> str | None:
        """The tier at which this entry matches ``task_spec`` (``"task_type"`` or ``"modality"``), else None."""
        if self.modality != task_spec.modality:
            return None
        if self.task_types is None:
            return "modality"
        return "task_type" if task_spec.task_type in self.task_types else None


@dataclass(frozen=True)
class Resolution:
    """Which collator a spec resolves to, and why; ``str()`` gives the printable explanation."""

    chosen: CollatorEntry
    reason: str
    candidates: tuple[tuple[CollatorEntry, str], ...]
    """Every entry considered, with why it was or was not taken."""

    def __str__(self) -> str:
        lines = [f"chosen: {self.chosen.name!r} ({self.reason})"]
        lines += [f"  - {entry.name!r}: {why}" for entry, why in self.candidates]
        return "\n".join(lines)


class CollatorRegistry:
    """A mapping from names to collator factories, with selection keyed by a TaskSpec.

    Example:
        >>> registry = CollatorRegistry.get_instance()
        >>> with registry.scoped():
        ...     @registry.register("my_text", modality="text", description="mine")
        ...     def make(task_spec=None, **kwargs):
        ...         return lambda rows: rows
        ...     registry.resolve(TaskSpec.lm_tiny()).chosen.name
        'my_text'
    """

    _instance: CollatorRegistry | None = None

    def __init__(self) -> None:
        self._entries: dict[str, CollatorEntry] = {}
        self._counter = itertools.count()

    @classmethod
    def get_instance(cls) -> CollatorRegistry:
        """The process-wide registry that holds the built-in collators."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def register(
        self,
        name: str,
        *,
        modality: str | None = None,
        description: str = "",
        task_types: tuple[str, ...] | list[str] | None = None,
        override: bool = False,
    ) -> Callable[[CollatorFactory], CollatorFactory]:
        """Decorator that records ``factory`` under ``name`` and returns it unchanged.

        The factory is called as ``factory(task_spec=spec_or_None, **kwargs)`` and must return a
        callable ``(rows) -> batch``. Registering an existing name raises unless ``override=True``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"register() needs a non-empty collator name, but got name={name!r}")
        if isinstance(task_types, str):
            task_types = (task_types,)

        def decorator(factory: CollatorFactory) -> CollatorFactory:
            if not callable(factory):
                raise TypeError(f"register({name!r}) decorates a factory function, but got {factory!r}")
            existing = self._entries.get(name)
            if existing is not None and not override:
                raise ValueError(
                    f"a collator named {name!r} is already registered ({_qualname(existing.factory)}); "
                    f"pass override=True to replace it with {_qualname(factory)}, or choose another name"
                )
            self._entries[name] = CollatorEntry(
                name=name,
                factory=factory,
                modality=modality,
                task_types=tuple(task_types) if task_types is not None else None,
                description=description,
                order=next(self._counter),
            )
            return factory

        return decorator

    def unregister(self, name: str) -> None:
        """Remove the registration called ``name``."""
        self._lookup(name)
        del self._entries[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return [entry.name for entry in sorted(self._entries.values(), key=lambda e: e.order)]

    def entries(self) -> list[CollatorEntry]:
        """Registered entries, in registration order."""
        return sorted(self._entries.values(), key=lambda e: e.order)

    def resolve(self, task_spec: TaskSpec | None = None, collator_name: str | None = None) -> Resolution:
        """Choose the entry for ``task_spec`` (or ``collator_name``) and record why."""
        if task_spec is not None and not isinstance(task_spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
        if collator_name is not None:
            entry = self._lookup(collator_name)
            return Resolution(entry, f"collator_name={collator_name!r} was given", ((entry, "named explicitly"),))
        candidates: list[tuple[CollatorEntry, str]] = []
        best: dict[str, CollatorEntry] = {}
        for entry in reversed(self.entries()):
            tier = entry.matches(task_spec) if task_spec is not None else None
            if tier is None:
                candidates.append((entry, _why_not(entry, task_spec)))
                continue
            if tier in best:
                candidates.append((entry, f"matches {tier} but {best[tier].name!r} was registered later"))
            else:
                best[tier] = entry
                candidates.append((entry, f"matches {tier}"))
        if task_spec is not None and "task_type" in best:
            chosen = best["task_type"]
            reason = f"registered for modality={task_spec.modality!r} and task_type={task_spec.task_type!r}"
        elif task_spec is not None and "modality" in best:
            chosen = best["modality"]
            reason = f"registered for modality={task_spec.modality!r}"
        else:
            chosen = self._lookup(DEFAULT_COLLATOR)
            reason = ("no task_spec was given" if task_spec is None
                      else f"nothing is registered for modality={task_spec.modality!r}") + "; using the default"
        return Resolution(chosen, reason, tuple(candidates))

    def explain(self, task_spec: TaskSpec | None = None, collator_name: str | None = None) -> Resolution:
        """Print and return the resolution for ``task_spec``: every candidate and why one was chosen."""
        resolution = self.resolve(task_spec, collator_name)
        print(resolution)
        return resolution

    def get_collator(
        self, task_spec: TaskSpec | None = None, collator_name: str | None = None, **kwargs: Any
    ) -> Callable[..., Any]:
        """Build the collator for ``task_spec`` (or the one named ``collator_name``) with ``kwargs``.

        Exceptions raised by the factory propagate unchanged; there is no fallback.
        """
        entry = self.resolve(task_spec, collator_name).chosen
        return entry.factory(task_spec=task_spec, **kwargs)

    @contextlib.contextmanager
    def scoped(self) -> Iterator[CollatorRegistry]:
        """Context manager that restores the registrations on exit (for tests and notebooks)."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries = saved

    def _lookup(self, name: str) -> CollatorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"no collator is registered as {name!r}; registered names: {', '.join(self.names()) or '(none)'}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"CollatorRegistry({', '.join(self.names())})"


def _why_not(entry: CollatorEntry, task_spec: TaskSpec | None) -> str:
    if task_spec is None:
        return "no task_spec to match"
    if entry.modality is None:
        return "registered without a modality (selected only by name or as the default)"
    if entry.modality != task_spec.modality:
        return f"modality {entry.modality!r} != {task_spec.modality!r}"
    return f"task_types {entry.task_types} exclude {task_spec.task_type!r}"


def _qualname(factory: Any) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"
