"""Where a loader's time goes, stage by stage, measured where each stage runs.

A batch is made in four stages: **fetch** (the source reads its rows or columns), **decode** (the split's per-row
transform: decoding, augmentation, tokenizing on the fly), **collate** (the collator pads and stacks) and
**transfer** (the copy to the device). The source stamps its stages' seconds on the rows it hands over
(:func:`stamp`), the collate step adds its own; in a worker process the times travel back with the batch (a dict of
a few floats beside it), in this process they are added at once. Each loader adds them up in one
:class:`StageTimes`. The transfer is timed by whoever copies the batch, outside the wait for it: in Lightning the
data module's transfer hooks add it to the train loader's times (:meth:`StageTimes.add_stage`), in a plain loop
:meth:`DataMonitor.wrap <engine.tools.monitor.DataMonitor.wrap>` with ``device=`` times its copy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

STAGES = ("fetch", "decode", "collate", "transfer")
"""The stages of a batch's path, in order."""


def stamp(rows: Any, stage: str, seconds: float) -> None:
    """Record on ``rows`` (a source's batch of rows or columns) that ``stage`` took ``seconds`` for them."""
    times = getattr(rows, "stage_s", None)
    rows.stage_s = {**times, stage: seconds} if times else {stage: seconds}


class StageTimes:
    """Seconds per stage summed over the batches a loader made, and the number of batches each stage timed.

    Thread-safe (a loader's background threads add their batches as they finish); pickles without its lock, so a
    collate function that holds one still goes to spawned workers (which time their batches, and send the times
    back with them).

    Example:
        >>> times = StageTimes()
        >>> times.add({"fetch": 0.002, "collate": 0.001})
        >>> times.add({"fetch": 0.004, "collate": 0.001})
        >>> times.batches, times.mean_ms()
        (2, {'fetch': 3.0, 'collate': 1.0})
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget every batch timed so far."""
        with self._lock:
            self.seconds: dict[str, float] = {}
            self.counts: dict[str, int] = {}
            self.batches = 0

    def add(self, times: Mapping[str, float]) -> None:
        """Add one batch's ``{stage: seconds}``."""
        with self._lock:
            self.batches += 1
            for stage, seconds in times.items():
                self._add(stage, seconds)

    def add_stage(self, stage: str, seconds: float) -> None:
        """Add one batch's ``seconds`` of a ``stage`` timed after the batch was made (the transfer, timed where the
        batch is copied): that stage counts one more batch, :attr:`batches` (the batches made) does not change."""
        with self._lock:
            self._add(stage, seconds)

    def _add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        self.counts[stage] = self.counts.get(stage, 0) + 1

    def total(self, stage: str) -> float:
        """Seconds of ``stage`` summed so far (0.0 before it was timed)."""
        with self._lock:
            return self.seconds.get(stage, 0.0)

    def totals(self) -> dict[str, float]:
        """Seconds per stage, summed, in the order of :data:`STAGES`."""
        with self._lock:
            return {stage: self.seconds[stage] for stage in STAGES if stage in self.seconds}

    def snapshot(self) -> tuple[dict[str, float], dict[str, int]]:
        """``(seconds, counts)`` per stage now, for :meth:`mean_ms` ``since`` then."""
        with self._lock:
            return dict(self.seconds), dict(self.counts)

    def mean_ms(self, since: tuple[dict[str, float], dict[str, int]] | None = None) -> dict[str, float]:
        """Milliseconds per batch for each stage timed (since a :meth:`snapshot`), in the order of :data:`STAGES`."""
        seconds, counts = since or ({}, {})
        with self._lock:
            timed = {stage: (self.seconds[stage] - seconds.get(stage, 0.0), self.counts[stage] - counts.get(stage, 0))
                     for stage in STAGES if stage in self.counts}
        return {stage: 1000 * total / count for stage, (total, count) in timed.items() if count}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@runtime_checkable
class TimesItsStages(Protocol):
    """A loader that adds up its batches' stage times (the engine's loaders)."""

    @property
    def stage_times(self) -> StageTimes: ...
