"""What a mixture's sampler has served, per source, over all ranks: rows and tokens since the start of training,
read from per-epoch running totals, so a state carries it in a few numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.sampling.elastic import taken_out

NEVER = np.iinfo(np.int64).max
"""The step of a position no step of the epoch serves (a rank's dropped rows)."""


class ServedMeter:
    """What a mixture's sampler has served, over all ranks, per source: rows and tokens since the start of
    training. It is a function of the sampler's position (the order is), read from per-epoch running totals, so a
    state carries it in a few numbers and a resumed run goes on counting from the saved totals."""

    def __init__(self, order: Any) -> None:
        self.order = order
        self.base = np.zeros((2, len(order.sizes)), dtype=np.int64)
        self.base_point: tuple[int, tuple[tuple[int, int], ...], int] = (0, (), 0)
        self._running: dict[tuple[object, ...], np.ndarray] = {}
        self._steps: dict[tuple[object, ...], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        """Per epoch (as :attr:`_running`), each source's draws' step served (-1: on other ranks before), with
        its running maximum and its minimum from each draw on: what :meth:`drawn` reads at any position."""
        self.left_out = np.zeros((2, len(order.sizes)), dtype=np.int64)
        """``[rows, tokens] x sources`` the loader left out (``on_error``) since the base: not served."""

    def served(self, sampler: Any) -> np.ndarray:
        """``[rows, tokens] x sources`` served up to the sampler's position (epochs are taken to run in turn)."""
        state = sampler._pass
        epoch, segments, position = state.epoch, state.served, state.position
        base_epoch, base_segments, base_position = self.base_point
        if epoch < base_epoch:
            return self.base.copy()
        first = self._totals(sampler, base_epoch, base_segments)
        if epoch == base_epoch and segments == base_segments:
            return self.base + first[min(position, len(first) - 1)] - first[min(base_position, len(first) - 1)] \
                - self.left_out
        served = self.base + first[-1] - first[min(base_position, len(first) - 1)] - self.left_out
        for between in range(base_epoch + 1, epoch):
            served = served + self._totals(sampler, between, ())[-1]
        now = self._totals(sampler, epoch, segments)
        return served + now[min(position, len(now) - 1)]

    def leave_out(self, rows: list[int]) -> None:
        """Rows of the mixed source that the loader left out of their batches (``on_error``), not to be counted."""
        if not rows:
            return
        rows_array = np.asarray(rows, dtype=np.int64)
        self.left_out += self._tally(rows_array, np.zeros(len(rows_array), dtype=np.int64), 1)[0]

    def rebase(self, sampler: Any, served: np.ndarray) -> None:
        """Count on from ``served`` (a loaded state's totals, rows left out already taken off) at the sampler's
        loaded position."""
        state = sampler._pass
        self.base, self.base_point = np.asarray(served, dtype=np.int64), (state.epoch, state.served, state.position)
        self.left_out = np.zeros_like(self.base)

    def drawn(self, sampler: Any) -> list[tuple[int, np.ndarray]]:
        """Each source's draws of the epoch served up to the sampler's position, over all ranks: how many of its
        first draws all were, and which later ones were too (a step's rows need not be the order's next rows:
        grouped, token-budget and packed batching cut the order in windows). What ``on_change='continue'``
        goes on from."""
        state = sampler._pass
        self._totals(sampler, state.epoch, state.served)
        drawn = []
        for steps, highest, lowest in self._steps[self._key(sampler, state.epoch, state.served)]:
            first = int(np.searchsorted(highest, state.position, side="left"))  # draws all served before it
            last = int(np.searchsorted(lowest, state.position, side="left"))  # no draw after it was served
            drawn.append((first, first + np.flatnonzero(steps[first:last] < state.position)))
        return drawn

    def _key(self, sampler: Any, epoch: int, segments: tuple[tuple[int, int], ...]) -> tuple[object, ...]:
        return (epoch, segments, sampler.num_replicas, sampler.per_rank_size)

    def _totals(self, sampler: Any, epoch: int, segments: tuple[tuple[int, int], ...]) -> np.ndarray:
        """``[steps + 1, 2, sources]``: served after each step of ``epoch`` on the sampler's ranks (all of them),
        after the ``segments`` served on other numbers of ranks."""
        key = self._key(sampler, epoch, segments)
        if key not in self._running:
            order, total = self.order.order(epoch), sampler.num_replicas * sampler.per_rank_size
            full, index = order, np.arange(len(order))
            when = np.full(len(order), NEVER, dtype=np.int64)
            before = np.zeros((2, len(self.order.sizes)), dtype=np.int64)
            for replicas, position in segments:
                rows = np.concatenate([np.asarray(row, dtype=np.int64) for rank in range(replicas) for row in
                                       sampler.batches_of(order, epoch, replicas, rank, total // replicas)[:position]]
                                      or [np.zeros(0, dtype=np.int64)])
                before += self._tally(rows, np.zeros(len(rows), dtype=np.int64), 1)[0]
                out = taken_out(order, rows)
                when[index[out]] = -1
                order, index = order[~out], index[~out]
            per_rank = [sampler.batches_of(order, epoch, sampler.num_replicas, rank, total // sampler.num_replicas)
                        for rank in range(sampler.num_replicas)]
            steps = max((len(batches) for batches in per_rank), default=0)
            flat, step_of = _rows_and_steps(per_rank)
            when[index] = _steps_served(order, flat, step_of)
            per_step = self._tally(flat, step_of, steps)
            kept = list(self._running)[-2:]  # the base epoch's and the current one's, and one more
            self._running = {**{one: self._running[one] for one in kept},
                             key: np.concatenate([before[None], before + np.cumsum(per_step, axis=0)])}
            which = self.order.source_of(full)
            self._steps = {**{one: self._steps[one] for one in kept if one in self._steps},
                           key: [_running_bounds(when[which == s]) for s in range(len(self.order.sizes))]}
        return self._running[key]

    def _tally(self, rows: np.ndarray, step_of: np.ndarray, steps: int) -> np.ndarray:
        """``[steps, 2, sources]``: rows and tokens of each source in each step."""
        sources = len(self.order.sizes)
        which = self.order.source_of(rows)
        out = np.zeros((max(steps, 1), 2, sources), dtype=np.int64)
        out[:, 0] = np.bincount(step_of * sources + which, minlength=max(steps, 1) * sources).reshape(-1, sources)
        if self.order.lengths is not None and len(rows):
            lengths = np.concatenate(self.order.lengths)[rows]
            out[:, 1] = np.bincount(step_of * sources + which, weights=lengths,
                                    minlength=max(steps, 1) * sources).reshape(-1, sources).astype(np.int64)
        return out[:steps] if steps else out[:0]


def _rows_and_steps(per_rank: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's batches as one array of rows and the step of each row: straight from the rows array of the
    plain sampler's batches (no Python list per batch), else batch by batch."""
    rows, steps = [], []
    for batches in per_rank:
        if isinstance(getattr(batches, "rows", None), np.ndarray) and len(batches):
            count = min(len(batches) * batches.size, len(batches.rows))
            rows.append(batches.rows[:count].astype(np.int64))
            steps.append(np.arange(count, dtype=np.int64) // batches.size)
            continue
        for step, batch in enumerate(batches):
            rows.append(np.asarray(batch, dtype=np.int64))
            steps.append(np.full(len(batch), step, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate(rows or [empty]), np.concatenate(steps or [empty])


def _steps_served(order: np.ndarray, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """For each position of ``order``, the step that served it (:data:`NEVER`: none), where ``rows[i]`` was served
    at ``steps[i]``: a row's copies served, earliest step first, fill its positions in the order, earliest first
    (as :func:`~engine.sampling.elastic.without` removes them); copies beyond its positions (padding) fill none."""
    when = np.full(len(order), NEVER, dtype=np.int64)
    if not len(rows):
        return when
    by_step = np.argsort(steps, kind="stable")  # runs of ascending steps, one a rank: merged
    rows, steps = rows[by_step], steps[by_step]
    if len(rows) <= len(order) and np.array_equal(rows, order[:len(rows)]):  # served in the order (plain)
        when[:len(rows)] = steps
        return when
    at = np.full(int(order.max()) + 1, -1, dtype=np.int64)
    at[order] = np.arange(len(order))
    if np.array_equal(at[order], np.arange(len(order))):  # each row once in the order: its position, at once
        served = at[rows]
        when[served[::-1]] = steps[::-1]  # a row served twice (padding) keeps its earliest step
        return when
    by_position = np.argsort(order, kind="stable")
    ordered = order[by_position]
    by_row = np.argsort(rows, kind="stable")
    served = rows[by_row]
    copy = np.arange(len(served)) - np.searchsorted(served, served, side="left")  # 0, 1, ... for a row's copies
    at = np.searchsorted(ordered, served, side="left") + copy  # the copy's position among the row's positions
    fits = at < len(ordered)
    fits[fits] = ordered[at[fits]] == served[fits]
    when[by_position[at[fits]]] = steps[by_row][fits]
    return when


def _running_bounds(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A source's draws' steps, their running maximum (the draws all served before a step: a prefix) and their
    minimum from each draw on (no draw past the last of them was served before it)."""
    highest = np.maximum.accumulate(steps) if len(steps) else steps
    lowest = np.minimum.accumulate(steps[::-1])[::-1] if len(steps) else steps
    return steps, highest, lowest
