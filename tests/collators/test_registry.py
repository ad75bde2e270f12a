"""Tests for collators/registry.py: registration, the resolution order, explain, get_collator and scoping."""

from __future__ import annotations

import re

import pytest

from collators import CollatorRegistry, Resolution
from task_spec import TaskSpec


def make_default(task_spec=None, **kwargs):
    return ("default", task_spec, kwargs)


def make_text(task_spec=None, **kwargs):
    return ("text", task_spec, kwargs)


def make_text_lm(task_spec=None, **kwargs):
    return ("text_lm", task_spec, kwargs)


def make_other(task_spec=None, **kwargs):
    return ("other", task_spec, kwargs)


class FactoryError(RuntimeError):
    pass


def make_broken(task_spec=None, **kwargs):
    raise FactoryError("the broken factory failed: bad option x=1")


def _registry(*registrations: tuple) -> CollatorRegistry:
    """A fresh registry with ``(name, factory, register-kwargs)`` registrations, in order."""
    registry = CollatorRegistry()
    for name, factory, options in registrations:
        registry.register(name, **options)(factory)
    return registry


def _qualname(factory) -> str:
    return f"{factory.__module__}.{factory.__qualname__}"


class TestGetInstance:
    def test_returns_the_same_object_twice(self):
        assert CollatorRegistry.get_instance() is CollatorRegistry.get_instance()
        assert isinstance(CollatorRegistry.get_instance(), CollatorRegistry)

    def test_fresh_instances_are_independent(self):
        registry = _registry(("default", make_default, {}))
        assert "default" in registry
        assert CollatorRegistry() is not CollatorRegistry.get_instance()
        assert "default" not in CollatorRegistry()


class TestScoped:
    def test_restores_singleton_registrations(self):
        singleton = CollatorRegistry.get_instance()
        before = singleton.entries()
        with singleton.scoped() as registry:
            assert registry is singleton
            registry.register("scoped_test_only", modality="text")(make_text)
            assert "scoped_test_only" in singleton
        assert "scoped_test_only" not in singleton
        assert singleton.entries() == before

    def test_restores_registrations_when_the_body_raises(self):
        singleton = CollatorRegistry.get_instance()
        before = singleton.entries()
        with pytest.raises(FactoryError, match="boom"), singleton.scoped():
            singleton.register("scoped_test_only", modality="text")(make_text)
            for name in list(singleton.names()):
                if name != "scoped_test_only":
                    singleton.unregister(name)
            raise FactoryError("boom")
        assert "scoped_test_only" not in singleton
        assert singleton.entries() == before


class TestRegister:
    def test_decorator_returns_the_factory_unchanged(self):
        registry = CollatorRegistry()
        decorated = registry.register("text", modality="text")(make_text)
        assert decorated is make_text
        assert registry.get_collator(collator_name="text") == ("text", None, {})

    def test_records_the_entry(self):
        registry = CollatorRegistry()
        registry.register("lm", modality="text", task_types=["causal_lm"], description="mine")(make_text_lm)
        (entry,) = registry.entries()
        assert (entry.name, entry.factory, entry.modality, entry.task_types, entry.description) == (
            "lm", make_text_lm, "text", ("causal_lm",), "mine"
        )

    def test_string_task_types_become_a_tuple(self):
        registry = _registry(("lm", make_text_lm, {"modality": "text", "task_types": "causal_lm"}))
        assert registry.entries()[0].task_types == ("causal_lm",)
        assert registry.resolve(TaskSpec.lm_tiny()).chosen.name == "lm"

    def test_duplicate_name_names_both_factories_and_suggests_override(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        expected = (
            f"a collator named 'text' is already registered ({_qualname(make_text)}); "
            f"pass override=True to replace it with {_qualname(make_other)}, or choose another name"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            registry.register("text", modality="text")(make_other)
        assert registry.entries()[0].factory is make_text

    def test_override_replaces(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        assert registry.register("text", modality="text", override=True)(make_other) is make_other
        assert registry.names() == ["text"]
        assert registry.get_collator(TaskSpec.lm_tiny())[0] == "other"

    @pytest.mark.parametrize("name", ["", None, 3])
    def test_empty_or_non_string_name_raises(self, name):
        expected = f"register() needs a non-empty collator name, but got name={name!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            CollatorRegistry().register(name)

    def test_non_callable_factory_raises(self):
        with pytest.raises(TypeError, match=re.escape("register('x') decorates a factory function, but got 3")):
            CollatorRegistry().register("x")(3)


class TestResolve:
    def test_explicit_collator_name_wins_over_every_match(self):
        registry = _registry(
            ("default", make_default, {}),
            ("text", make_text, {"modality": "text"}),
            ("text_lm", make_text_lm, {"modality": "text", "task_types": ("causal_lm",)}),
            ("other", make_other, {"modality": "vision"}),
        )
        resolution = registry.resolve(TaskSpec.lm_tiny(), collator_name="other")
        assert resolution.chosen.name == "other"
        assert resolution.reason == "collator_name='other' was given"

    def test_modality_and_task_type_wins_over_modality_only(self):
        # The modality-only entry is registered later and still loses to the more specific match.
        registry = _registry(
            ("default", make_default, {}),
            ("text_lm", make_text_lm, {"modality": "text", "task_types": ("causal_lm",)}),
            ("text", make_text, {"modality": "text"}),
        )
        resolution = registry.resolve(TaskSpec.lm_tiny())
        assert resolution.chosen.name == "text_lm"
        assert resolution.reason == "registered for modality='text' and task_type='causal_lm'"

    def test_modality_only_wins_over_default(self):
        registry = _registry(
            ("default", make_default, {}),
            ("text", make_text, {"modality": "text"}),
        )
        resolution = registry.resolve(TaskSpec.cls_tiny())
        assert resolution.chosen.name == "text"
        assert resolution.reason == "registered for modality='text'"

    def test_default_when_nothing_matches_the_modality(self):
        registry = _registry(
            ("default", make_default, {}),
            ("text", make_text, {"modality": "text"}),
        )
        resolution = registry.resolve(TaskSpec.vision_tiny())
        assert resolution.chosen.name == "default"
        assert resolution.reason == "nothing is registered for modality='vision'; using the default"

    def test_no_task_spec_gives_default(self):
        registry = _registry(
            ("default", make_default, {}),
            ("text", make_text, {"modality": "text"}),
        )
        resolution = registry.resolve()
        assert resolution.chosen.name == "default"
        assert resolution.reason == "no task_spec was given; using the default"

    @pytest.mark.parametrize("options", [{"modality": "text"}, {"modality": "text", "task_types": ("causal_lm",)}])
    def test_latest_registration_wins_among_equal_matches(self, options):
        registry = _registry(
            ("default", make_default, {}),
            ("first", make_text, options),
            ("second", make_other, options),
        )
        resolution = registry.resolve(TaskSpec.lm_tiny())
        assert resolution.chosen.name == "second"
        reasons = dict((entry.name, why) for entry, why in resolution.candidates)
        assert "'second' was registered later" in reasons["first"]

    def test_override_counts_as_the_latest_registration(self):
        registry = _registry(
            ("default", make_default, {}),
            ("first", make_text, {"modality": "text"}),
            ("second", make_other, {"modality": "text"}),
        )
        registry.register("first", modality="text", override=True)(make_text)
        assert registry.resolve(TaskSpec.lm_tiny()).chosen.name == "first"
        assert registry.names() == ["default", "second", "first"]

    def test_excluding_task_types_are_not_chosen_at_the_modality_tier(self):
        registry = _registry(
            ("default", make_default, {}),
            ("text_cls", make_text, {"modality": "text", "task_types": ("classification",)}),
        )
        resolution = registry.resolve(TaskSpec.lm_tiny())
        assert resolution.chosen.name == "default"
        reasons = dict((entry.name, why) for entry, why in resolution.candidates)
        assert reasons["text_cls"] == "task_types ('classification',) exclude 'causal_lm'"

    def test_unknown_collator_name_lists_registered_names(self):
        registry = _registry(("default", make_default, {}), ("text", make_text, {"modality": "text"}))
        expected = "no collator is registered as 'nope'; registered names: default, text"
        with pytest.raises(KeyError, match=re.escape(expected)):
            registry.resolve(TaskSpec.lm_tiny(), collator_name="nope")

    def test_missing_default_lists_registered_names(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        expected = "no collator is registered as 'default'; registered names: text"
        with pytest.raises(KeyError, match=re.escape(expected)):
            registry.resolve(TaskSpec.vision_tiny())
        with pytest.raises(KeyError, match=re.escape(expected)):
            registry.resolve()

    def test_missing_default_on_an_empty_registry(self):
        expected = "no collator is registered as 'default'; registered names: (none)"
        with pytest.raises(KeyError, match=re.escape(expected)):
            CollatorRegistry().resolve()

    def test_missing_default_is_fine_when_a_match_exists(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        assert registry.resolve(TaskSpec.lm_tiny()).chosen.name == "text"

    @pytest.mark.parametrize("bad", ["lm_tiny", {"modality": "text"}, 3])
    def test_task_spec_of_the_wrong_type_raises(self, bad):
        registry = _registry(("default", make_default, {}))
        expected = f"task_spec should be a TaskSpec, but got {type(bad).__name__}: {bad!r}"
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            registry.resolve(bad)
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            registry.get_collator(bad)

    def test_task_spec_of_the_wrong_type_raises_with_collator_name(self):
        # Bug: registry.py resolve() returns for collator_name (line 140) before the type check (line 143),
        # so a wrong-typed task_spec reaches the factory.
        registry = _registry(("default", make_default, {}))
        expected = "task_spec should be a TaskSpec, but got str: 'lm_tiny'"
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            registry.resolve("lm_tiny", collator_name="default")


class TestExplain:
    def _registry(self) -> CollatorRegistry:
        return _registry(
            ("default", make_default, {}),
            ("vision", make_other, {"modality": "vision"}),
            ("text_cls", make_text, {"modality": "text", "task_types": ("classification",)}),
            ("text", make_text, {"modality": "text"}),
            ("text_lm", make_text_lm, {"modality": "text", "task_types": ("causal_lm",)}),
            ("text_lm_old", make_text_lm, {"modality": "text", "task_types": ("causal_lm",)}),
        )

    def test_prints_chosen_name_and_every_candidate_reason(self, capsys):
        resolution = self._registry().explain(TaskSpec.lm_tiny())
        printed = capsys.readouterr().out
        assert isinstance(resolution, Resolution)
        assert resolution.chosen.name == "text_lm_old"
        assert printed == str(resolution) + "\n"
        lines = printed.splitlines()
        assert lines[0] == "chosen: 'text_lm_old' (registered for modality='text' and task_type='causal_lm')"
        # Candidates are listed latest registration first, each with why it was or was not taken.
        assert lines[1:] == [
            "  - 'text_lm_old': matches task_type",
            "  - 'text_lm': matches task_type but 'text_lm_old' was registered later",
            "  - 'text': matches modality",
            "  - 'text_cls': task_types ('classification',) exclude 'causal_lm'",
            "  - 'vision': modality 'vision' != 'text'",
            "  - 'default': registered without a modality (selected only by name or as the default)",
        ]

    def test_without_task_spec(self, capsys):
        resolution = self._registry().explain()
        lines = capsys.readouterr().out.splitlines()
        assert resolution.chosen.name == "default"
        assert lines[0] == "chosen: 'default' (no task_spec was given; using the default)"
        assert len(lines) == 1 + len(self._registry().names())
        assert all(line.endswith(": no task_spec to match") for line in lines[1:])

    def test_with_collator_name(self, capsys):
        resolution = self._registry().explain(TaskSpec.lm_tiny(), collator_name="vision")
        assert capsys.readouterr().out.splitlines() == [
            "chosen: 'vision' (collator_name='vision' was given)",
            "  - 'vision': named explicitly",
        ]
        assert resolution.chosen.factory is make_other

    def test_str_lists_every_candidate(self):
        registry = self._registry()
        resolution = registry.resolve(TaskSpec.vision_tiny())
        text = str(resolution)
        assert text.splitlines()[0] == "chosen: 'vision' (registered for modality='vision')"
        assert len(resolution.candidates) == len(registry.names())
        for name in registry.names():
            assert f"  - {name!r}: " in text


class TestGetCollator:
    def test_passes_task_spec_and_kwargs_to_the_factory(self):
        calls = []

        def recording(task_spec=None, **kwargs):
            calls.append((task_spec, kwargs))
            return make_text

        registry = _registry(("default", make_default, {}), ("text", recording, {"modality": "text"}))
        spec = TaskSpec.lm_tiny()
        collator = registry.get_collator(spec, pad_to_multiple_of=8, padding_side="left")
        assert collator is make_text
        assert calls == [(spec, {"pad_to_multiple_of": 8, "padding_side": "left"})]
        assert calls[0][0] is spec

    def test_collator_name_and_no_spec(self):
        registry = _registry(("default", make_default, {}), ("text", make_text, {"modality": "text"}))
        assert registry.get_collator(collator_name="text", max_length=4) == ("text", None, {"max_length": 4})
        assert registry.get_collator() == ("default", None, {})

    def test_factory_exceptions_propagate_unchanged(self):
        registry = _registry(("default", make_default, {}), ("broken", make_broken, {"modality": "text"}))
        with pytest.raises(FactoryError) as excinfo:
            registry.get_collator(TaskSpec.lm_tiny())
        assert type(excinfo.value) is FactoryError
        assert str(excinfo.value) == "the broken factory failed: bad option x=1"

    def test_factory_type_error_from_bad_kwargs_propagates(self):
        registry = _registry(("default", make_default, {}))

        def strict(*, task_spec=None):
            return make_default

        registry.register("strict", modality="text")(strict)
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            registry.get_collator(TaskSpec.lm_tiny(), bogus=1)


class TestUnregisterNamesContains:
    def test_unregister_removes(self):
        registry = _registry(("default", make_default, {}), ("text", make_text, {"modality": "text"}))
        registry.unregister("text")
        assert "text" not in registry
        assert registry.names() == ["default"]
        assert registry.resolve(TaskSpec.lm_tiny()).chosen.name == "default"

    def test_unregister_unknown_lists_registered_names(self):
        registry = _registry(("default", make_default, {}), ("text", make_text, {"modality": "text"}))
        expected = "no collator is registered as 'nope'; registered names: default, text"
        with pytest.raises(KeyError, match=re.escape(expected)):
            registry.unregister("nope")
        assert registry.names() == ["default", "text"]

    def test_names_in_registration_order(self):
        registry = _registry(
            ("zeta", make_text, {}), ("alpha", make_text, {}), ("mid", make_text, {"modality": "audio"})
        )
        assert registry.names() == ["zeta", "alpha", "mid"]
        assert [entry.name for entry in registry.entries()] == ["zeta", "alpha", "mid"]
        assert repr(registry) == "CollatorRegistry(zeta, alpha, mid)"

    def test_contains(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        assert "text" in registry
        assert "vision" not in registry
        assert 3 not in registry
