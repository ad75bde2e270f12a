"""A mixture of named sources of one task inside every batch: the weights, their schedule, what each source does
when its rows run out, and how a checkpoint of another mixture is treated.

:class:`Mixture` is the declaration; :mod:`engine.sampling.mixtures.order` turns it into each epoch's order of rows.
``docs/mixtures.md`` sets the semantics beside Mosaic's, Megatron's and torchdata's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIX_BY = ("rows", "tokens")
EXHAUST = ("cycle", "stop")
ON_CHANGE = ("refuse", "new_epoch", "continue")
RAMPS = ("step", "linear")


@dataclass(frozen=True)
class Mixture:
    """How the named sources are mixed in every training batch.

    Args:
        weights: ``{name: weight}`` for every source; weights are normalized to sum to 1 (0 is allowed: a source
            a schedule brings in later).
        by: ``'rows'``: the weights are shares of the rows (documents); ``'tokens'``: shares of the tokens.
        schedule: Weight changes, in training steps (global batches from the start of training):
            ``[(step, weights), ...]`` switches to ``weights`` at ``step``; ``(step, weights, 'linear')`` ramps
            linearly from the previous point (``(0, weights)`` for the first) to ``weights``, reached at ``step``.
        exhaust: Per source (or one value for all): ``'cycle'`` repeats the source in new seeded orders as often as
            the weights ask; ``'stop'`` ends the epoch when the source's rows have all been served once; an int
            ``k`` cycles at most ``k`` times in an epoch, then stops.
        samples_per_epoch: Rows of an epoch (all sources together). None: until the first ``'stop'`` source runs
            out, or, when every source cycles, the rows of all sources together.
        on_change: A checkpoint saved with another mixture: ``'refuse'`` names what changed; ``'new_epoch'``
            accepts it and starts the next epoch with this mixture (the rest of the saved epoch is not served);
            ``'continue'`` goes on in the saved epoch: its rest draws each source's rows not served in it yet, at
            this mixture's weights (plain batching; a source's ``exhaust`` may not switch between cycling and
            stopping).

    Example:
        >>> mix = Mixture({"web": 7, "code": 3}, schedule=[(100, {"web": 1, "code": 1}, "linear")])
        >>> mix.weights_at(0).tolist(), mix.weights_at(50).tolist(), mix.weights_at(200).tolist()
        ([0.7, 0.3], [0.6, 0.4], [0.5, 0.5])
    """

    weights: Mapping[str, float]
    by: str = "rows"
    schedule: Sequence[tuple[Any, ...]] = ()
    exhaust: str | int | Mapping[str, str | int] = "cycle"
    samples_per_epoch: int | None = None
    on_change: str = "refuse"
    names: tuple[str, ...] = field(init=False)
    points: tuple[tuple[int, tuple[float, ...], str], ...] = field(init=False)
    """The schedule's points, checked and normalized: (step, weights in the order of ``names``, ramp)."""

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise TypeError(f"Mixture weights should be a non-empty dict {{source name: weight}}, but got "
                            f"{self.weights!r}")
        names = tuple(self.weights)
        for name in names:
            if not isinstance(name, str) or not name:
                raise TypeError(f"Mixture source names should be non-empty strings, but got {name!r}")
        object.__setattr__(self, "names", names)
        _check_choice("by", self.by, MIX_BY)
        _check_choice("on_change", self.on_change, ON_CHANGE)
        object.__setattr__(self, "weights", dict(zip(names, _normalized(self.weights, names, "weights"))))
        object.__setattr__(self, "points", self._checked_schedule())
        object.__setattr__(self, "schedule", tuple(tuple(entry) for entry in self.schedule))  # lists from a checkpoint
        object.__setattr__(self, "exhaust", self._checked_exhaust())
        if self.samples_per_epoch is not None:
            _check_positive_int("samples_per_epoch", self.samples_per_epoch)

    def _checked_schedule(self) -> tuple[tuple[int, tuple[float, ...], str], ...]:
        if isinstance(self.schedule, (str, bytes, Mapping)) or not isinstance(self.schedule, Sequence):
            raise TypeError(f"Mixture schedule should be a list of (step, weights) or (step, weights, 'linear'), "
                            f"but got {self.schedule!r}")
        points, last = [], 0
        for number, entry in enumerate(self.schedule):
            if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) not in (2, 3):
                raise TypeError(f"Mixture schedule entry {number} should be (step, weights) or (step, weights, "
                                f"'linear'), but got {entry!r}")
            step, weights = entry[0], entry[1]
            ramp = entry[2] if len(entry) == 3 else "step"
            _check_positive_int(f"schedule entry {number}'s step", step)
            if step <= last:
                raise ValueError(f"Mixture schedule steps should increase from 1, but entry {number} has step={step} "
                                 f"after step {last}; list the changes in the order of their steps")
            _check_choice(f"schedule entry {number}'s ramp", ramp, RAMPS)
            points.append((int(step), _normalized(weights, self.names, f"schedule entry {number}'s weights"), ramp))
            last = step
        return tuple(points)

    def _checked_exhaust(self) -> dict[str, str | int]:
        given = self.exhaust
        if not isinstance(given, Mapping):
            given = dict.fromkeys(self.names, given)
        unknown = sorted(set(given) - set(self.names))
        if unknown:
            raise KeyError(f"Mixture exhaust names {unknown}, which are not sources of the mixture; the sources are "
                           f"{list(self.names)}")
        policies = {}
        for name in self.names:
            policy = given.get(name, "cycle")
            if isinstance(policy, numbers.Integral) and not isinstance(policy, bool):
                _check_positive_int(f"exhaust[{name!r}]", policy)
                policy = int(policy)
            elif policy not in EXHAUST:
                raise ValueError(f"Mixture exhaust[{name!r}] should be 'cycle', 'stop' or a positive int (the most "
                                 f"passes over the source in an epoch), but got {policy!r}")
            policies[name] = policy
        return policies

    def weights_at(self, step: int) -> np.ndarray:
        """The normalized weights at training ``step``, in the order of :attr:`names`."""
        before_step, before = 0, np.array([self.weights[name] for name in self.names])
        for point_step, weights, ramp in self.points:
            target = np.array(weights)
            if step >= point_step:
                before_step, before = point_step, target
                continue
            if ramp == "linear":
                share = (step - before_step) / (point_step - before_step)
                return before + share * (target - before)
            return before
        return before

    def constant_until(self, step: int) -> float | None:
        """The first step after ``step`` at which the weights may change (``inf``: never), if they hold from
        ``step`` until then; None when ``step`` is inside a linear ramp (they change at every step)."""
        before = 0
        for point_step, _, ramp in self.points:
            if step < point_step:
                return None if ramp == "linear" and step >= before else point_step
            before = point_step
        return math.inf

    def change_steps(self) -> tuple[int, ...]:
        """Steps at which the weights start to change: each point's step, and each ramp's start."""
        steps, before = set(), 0
        for step, _, ramp in self.points:
            steps.add(before if ramp == "linear" else step)
            before = step
        return tuple(sorted(steps - {0}))

    def passes(self, name: str) -> int | None:
        """The most passes over source ``name`` in an epoch; None: unbounded ('cycle')."""
        policy = self.exhaust[name]
        return 1 if policy == "stop" else None if policy == "cycle" else int(policy)

    def describe(self) -> dict[str, Any]:
        """The declaration as plain values: saved in checkpoints, compared on resume, shown in the report."""
        def rounded(values: Any) -> dict[str, float]:  # weights normalized again on rebuilding differ in last bits
            return {name: round(float(value), 12) for name, value in zip(self.names, values)}

        described = {"weights": rounded(self.weights.values()), "by": self.by, "exhaust": dict(self.exhaust),
                     "schedule": [[step, rounded(weights), ramp] for step, weights, ramp in self.points],
                     "samples_per_epoch": self.samples_per_epoch}
        if self.by == "tokens" and self.points:  # a checkpoint of the earlier rule (shares of the whole run) differs
            described["blocks"] = "each at its step's weights"
        return described

    def fingerprint(self) -> str:
        """A short hash of :meth:`describe`: equal mixtures, equal fingerprints."""
        return hashlib.blake2b(repr(self.describe()).encode(), digest_size=8).hexdigest()


def as_mixture(mix: Any) -> Mixture:
    """``mix=`` as given to a module: a :class:`Mixture`, its weights ``{name: weight}``, or its fields as a
    checkpoint's configuration holds them (``{"weights": {...}, "by": ..., ...}``)."""
    if isinstance(mix, Mixture):
        return mix
    if isinstance(mix, Mapping) and isinstance(mix.get("weights"), Mapping):
        fields = {field.name for field in dataclasses.fields(Mixture) if field.init}
        return Mixture(**{name: value for name, value in mix.items() if name in fields})
    if isinstance(mix, Mapping):
        return Mixture(mix)
    raise TypeError(f"mix should be a Mixture or a dict {{source name: weight}}, but got {type(mix).__name__}: "
                    f"{mix!r}")


def changes(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """What differs between two :meth:`Mixture.describe` values, each named with both values."""
    return [f"{key}: saved {saved.get(key)!r}, now {mine.get(key)!r}" for key in sorted(set(saved) | set(mine))
            if saved.get(key) != mine.get(key)]


def _normalized(weights: Any, names: tuple[str, ...], what: str) -> tuple[float, ...]:
    if not isinstance(weights, Mapping):
        raise TypeError(f"Mixture {what} should be a dict {{source name: weight}}, but got {weights!r}")
    if set(weights) != set(names):
        missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
        raise KeyError(f"Mixture {what} should name every source {list(names)} once; missing {missing}, unknown "
                       f"{extra} (give 0 to a source that is not drawn yet)")
    values = []
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
            raise ValueError(f"Mixture {what}[{name!r}] should be a finite number >= 0, but got {value!r}")
        values.append(float(value))
    total = math.fsum(values)
    if total <= 0:
        raise ValueError(f"Mixture {what} should have a positive sum, but got {dict(zip(names, values))}")
    return tuple(value / total for value in values)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"Mixture {name} should be one of {', '.join(map(repr, choices))}, but got {name}={value!r}")


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Mixture {name} should be a positive integer, but got {value!r}")
