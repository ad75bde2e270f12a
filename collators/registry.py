"""CollatorRegistry: named collator factories, chosen for a TaskSpec by an explainable rule.

Resolution, most specific first: an explicit ``collator_name``; a registration whose modality and
task types both match the spec; one whose modality matches (registered without task types); the
collator named ``default``. Among equal matches the latest registration wins, so a user's decorator
overrides a built-in. Registration, removal and resolution hold one lock, so threads may register concurrently.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from collators._registration import (
    CollatorEntry,
    CollatorFactory,
    Resolution,
    check_selection,
    qualname,
    same_function,
    why_not,
)
from task_spec import TaskSpec

__all__ = ["DEFAULT_COLLATOR", "CollatorEntry", "CollatorFactory", "CollatorRegistry", "Resolution"]

DEFAULT_COLLATOR = "default"


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
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._entries: dict[str, CollatorEntry] = {}
        self._counter = itertools.count()
        self._lock = threading.RLock()

    @classmethod
    def get_instance(cls) -> CollatorRegistry:
        """The process-wide registry that holds the built-in collators."""
        with cls._instance_lock:
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
        callable ``(rows) -> batch``. Registering an existing name raises unless ``override=True`` or the factory
        is the registered one defined again (the same ``__module__`` and ``__qualname__``, as when a notebook cell
        runs twice), which replaces it. The factory may also be given as ``"module:function"``: the registry then
        imports that module when the entry is first built (the built-ins are registered so, so a text task never
        imports torchvision or torchaudio, and a spawned worker imports only its own collator's module).
        ``modality`` must be one of MODALITIES and ``task_types`` of TASK_TYPES (with a modality), or the
        entry could never be chosen for a spec.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"register() needs a non-empty collator name, but got name={name!r}")
        task_types = check_selection(name, modality, task_types)

        def decorator(factory: CollatorFactory) -> CollatorFactory:
            if not callable(factory) and not _is_reference(factory):
                raise TypeError(f"register({name!r}) decorates a factory function, but got {factory!r}")
            with self._lock:
                existing = self._entries.get(name)
                if existing is not None and not override and not same_function(existing.target, factory):
                    raise ValueError(
                        f"a collator named {name!r} is already registered ({qualname(existing.target)}); "
                        f"pass override=True to replace it with {qualname(factory)}, or choose another name"
                    )
                self._entries[name] = CollatorEntry(name, factory, modality, task_types, description,
                                                    next(self._counter))
            return factory

        return decorator

    def unregister(self, name: str) -> None:
        """Remove the registration called ``name``."""
        with self._lock:
            self._lookup(name)
            del self._entries[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return [entry.name for entry in self.entries()]

    def entries(self) -> list[CollatorEntry]:
        """Registered entries, in registration order."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.order)

    def resolve(self, task_spec: TaskSpec | None = None, collator_name: str | None = None) -> Resolution:
        """Choose the entry for ``task_spec`` (or ``collator_name``) and record why."""
        if task_spec is not None and not isinstance(task_spec, TaskSpec):
            raise TypeError(f"task_spec should be a TaskSpec, but got {type(task_spec).__name__}: {task_spec!r}")
        with self._lock:
            if collator_name is not None:
                entry = self._lookup(collator_name)
                why = f"collator_name={collator_name!r} was given"
                return Resolution(entry, why, ((entry.name, "named explicitly"),))
            candidates: list[tuple[str, str]] = []
            best: dict[str, CollatorEntry] = {}
            for entry in reversed(self.entries()):
                tier = entry.matches(task_spec) if task_spec is not None else None
                if tier is None:
                    candidates.append((entry.name, why_not(entry, task_spec)))
                elif tier in best:
                    candidates.append((entry.name, f"matches {tier} but {best[tier].name!r} was registered later"))
                else:
                    best[tier] = entry
                    candidates.append((entry.name, f"matches {tier}"))
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

        Exceptions raised by the factory propagate unchanged; there is no fallback. A factory that returns
        something not callable is refused here (TypeError naming it), not at the first batch.
        """
        return self.resolve(task_spec, collator_name).chosen.create(task_spec=task_spec, **kwargs)

    @contextlib.contextmanager
    def scoped(self) -> Iterator[CollatorRegistry]:
        """Context manager that restores the registrations on exit (for tests and notebooks)."""
        with self._lock:
            saved = dict(self._entries)
        try:
            yield self
        finally:
            with self._lock:
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


def _is_reference(factory: Any) -> bool:
    """Whether ``factory`` is a ``"module:function"`` reference to a factory imported on first use."""
    if not isinstance(factory, str):
        return False
    module, colon, function = factory.partition(":")
    return bool(colon) and all(part.isidentifier() for part in (*module.split("."), function))
