"""Tests for collators/registry.py: registration, the resolution order, explain, get_collator and scoping."""

from __future__ import annotations

import pickle
import re
import threading
import time

import pytest

from collators import CollatorRegistry, Resolution
from task_spec import TaskSpec


class Made(tuple):
    """What the test factories return: ``(name, task_spec, kwargs)``, callable on rows like a collator."""

    def __call__(self, rows):
        return rows


def make_default(task_spec=None, **kwargs):
    return Made(("default", task_spec, kwargs))


def make_text(task_spec=None, **kwargs):
    return Made(("text", task_spec, kwargs))


def make_text_lm(task_spec=None, **kwargs):
    return Made(("text_lm", task_spec, kwargs))


def make_other(task_spec=None, **kwargs):
    return Made(("other", task_spec, kwargs))


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

    def test_the_same_function_registered_again_replaces_it(self):
        """Re-running a notebook cell defines a new function object with the same module and qualified name."""
        registry = _registry(("text", make_text, {"modality": "text"}), ("other", make_other, {"modality": "text"}))
        namespace = {"__name__": make_text.__module__, "Made": Made}
        exec("def make_text(task_spec=None, **kwargs):\n    return Made(('rerun', task_spec, kwargs))\n", namespace)
        rerun = namespace["make_text"]
        assert rerun is not make_text and _qualname(rerun) == _qualname(make_text)
        assert registry.register("text", modality="text", description="again")(rerun) is rerun
        assert registry.names() == ["other", "text"]
        assert registry.entries()[1].description == "again"
        assert registry.get_collator(TaskSpec.lm_tiny())[0] == "rerun"

    def test_the_same_function_object_registered_again_replaces_it(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        registry.register("text", modality="text", task_types=["causal_lm"])(make_text)
        assert registry.entries()[0].task_types == ("causal_lm",)

    def test_lambdas_are_not_taken_for_the_same_function(self):
        registry = CollatorRegistry()
        registry.register("text", modality="text")(lambda task_spec=None, **kwargs: Made(("first",)))
        with pytest.raises(ValueError, match="is already registered"):
            registry.register("text", modality="text")(lambda task_spec=None, **kwargs: Made(("second",)))

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
        reasons = dict(resolution.candidates)
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
        reasons = dict(resolution.candidates)
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


class TestSelectionKeysAreChecked:
    """An entry registered under a modality or task type no TaskSpec can have could never be chosen: refused."""

    @pytest.mark.parametrize(("modality", "hint"), [("Text", " (did you mean 'text'?)"), ("speech", ""),
                                                    ("visoin", " (did you mean 'vision'?)")])
    def test_unknown_modality_lists_the_valid_ones(self, modality, hint):
        registry = CollatorRegistry()
        expected = (
            f"register('mine') modality should be one of 'text', 'vision', 'audio', 'multimodal', 'tabular' or None, "
            f"but got modality={modality!r}{hint}; no TaskSpec has it, so the entry could never be chosen"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            registry.register("mine", modality=modality)(make_text)
        assert "mine" not in registry

    def test_non_string_modality_is_a_type_error(self):
        with pytest.raises(TypeError, match=re.escape("modality should be one of 'text'")):
            CollatorRegistry().register("mine", modality=3)

    def test_misspelled_task_type_lists_the_valid_ones(self):
        registry = CollatorRegistry()
        expected = (
            "register('mine') task_types should hold values of 'causal_lm', 'masked_lm', 'classification', "
            "'regression', 'seq2seq', 'token_classification', but got 'classifcation' in "
            "task_types=('classifcation',) (did you mean 'classification'?)"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
            registry.register("mine", modality="text", task_types=("classifcation",))(make_text)
        with pytest.raises(ValueError, match=re.escape("but got 'Causal_LM' in task_types=('Causal_LM',)")):
            registry.register("mine", modality="text", task_types="Causal_LM")
        assert registry.names() == []

    def test_empty_task_types_are_refused(self):
        with pytest.raises(ValueError, match=re.escape("or be None for every task type, but got task_types=()")):
            CollatorRegistry().register("mine", modality="text", task_types=[])

    def test_task_types_without_a_modality_are_refused(self):
        expected = "register('mine') task_types need a modality, but got modality=None with task_types=('causal_lm',)"
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
            CollatorRegistry().register("mine", task_types=("causal_lm",))

    def test_every_valid_key_is_accepted(self):
        from task_spec import MODALITIES, TASK_TYPES

        registry = CollatorRegistry()
        for modality in MODALITIES:
            registry.register(modality, modality=modality, task_types=TASK_TYPES)(make_text)
        assert registry.names() == list(MODALITIES)


class SlowName(str):
    """A name whose hashing sleeps, so two threads are inside register's check-then-insert at the same time."""

    def __hash__(self):
        time.sleep(0.02)
        return str.__hash__(self)


class TestThreadSafety:
    def test_two_registrations_of_one_name_do_not_both_succeed(self):
        registry = CollatorRegistry()
        threads, barrier = 8, threading.Barrier(8)
        outcomes: list[str] = []

        def register(index):
            decorate = registry.register(SlowName("shared"), modality="text")
            factory = make_text if index % 2 else make_other
            barrier.wait()
            try:
                decorate(factory)
                outcomes.append(("registered", factory))
            except ValueError as error:
                assert "already registered" in str(error)
                outcomes.append(("refused", factory))

        workers = [threading.Thread(target=register, args=(index,)) for index in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        # the first registration wins; the same function registered again replaces it, the other one is refused
        winner = registry.entries()[0].factory
        assert sorted(outcome for outcome, factory in outcomes if factory is winner) == ["registered"] * (threads // 2)
        assert sorted(outcome for outcome, factory in outcomes if factory is not winner) == ["refused"] * (threads // 2)
        assert registry.names() == ["shared"]

    def test_resolving_while_others_register_and_unregister(self):
        registry = _registry(("default", make_default, {}))
        barrier, errors = threading.Barrier(4), []

        def churn(index):
            barrier.wait()
            try:
                for step in range(300):
                    name = f"t{index}_{step}"
                    registry.register(name, modality="text")(make_text)
                    registry.resolve(TaskSpec.lm_tiny())
                    registry.unregister(name)
            except Exception as error:  # noqa: BLE001 - any error from another thread fails the test
                errors.append(error)

        workers = [threading.Thread(target=churn, args=(index,)) for index in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        assert registry.names() == ["default"]


class TestFactoryResult:
    @pytest.mark.parametrize("returned", [None, 3, {"input_ids": [1]}])
    def test_non_callable_result_is_refused_when_the_collator_is_created(self, returned):
        def make_batch(task_spec=None, **kwargs):
            return returned

        registry = _registry(("default", make_default, {}), ("batchy", make_batch, {"modality": "text"}))
        expected = (
            f"collator factory 'batchy' ({_qualname(make_batch)}) should return a callable (rows) -> batch, but it "
            f"returned {type(returned).__name__}: {returned!r}; return the collator object or function itself"
        )
        with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
            registry.get_collator(TaskSpec.lm_tiny())
        with pytest.raises(TypeError, match=re.escape("collator factory 'batchy'")):
            registry.resolve(TaskSpec.lm_tiny()).chosen.create(task_spec=TaskSpec.lm_tiny())

    def test_create_passes_task_spec_and_kwargs(self):
        registry = _registry(("text", make_text, {"modality": "text"}))
        spec = TaskSpec.lm_tiny()
        assert registry.resolve(spec).chosen.create(task_spec=spec, max_length=4) == ("text", spec, {"max_length": 4})


class TestResolutionPickling:
    def test_pickling_depends_only_on_the_chosen_entry(self):
        registry = _registry(("default", make_default, {}), ("text", make_text, {"modality": "text"}))
        registry.register("notebook", modality="vision")(lambda task_spec=None, **kwargs: make_default())
        resolution = registry.resolve(TaskSpec.lm_tiny())
        restored = pickle.loads(pickle.dumps(resolution))
        assert restored == resolution
        assert restored.chosen.name == "text" and restored.chosen.factory is make_text
        assert dict(restored.candidates)["notebook"] == "modality 'vision' != 'text'"
        assert str(restored) == str(resolution)
