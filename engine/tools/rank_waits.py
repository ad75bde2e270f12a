"""The wait for data on every rank, gathered in one table: one slow rank holds every other at the next collective,
so the step waits for the slowest rank's data. ``DataMonitor.rank_waits()`` gathers it (an ``all_gather`` of a few
floats per rank over gloo, once, at report time: nothing per step); its imbalance is the largest wait over the mean.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from engine.core.distributed import rank_and_world
from engine.core.stage_times import STAGES


@dataclass(frozen=True)
class RankWait:
    """One rank's wait for data since its monitor started."""

    rank: int
    batches: int
    wait_s: float
    """Seconds the loop waited for its batches, in all."""
    elapsed_s: float
    max_wait_ms: float
    """The longest wait for one batch."""
    stages_ms: dict[str, float] = field(default_factory=dict)
    """Milliseconds per batch of each stage timed (fetch, decode, collate, transfer)."""

    @property
    def mean_wait_ms(self) -> float:
        """The wait per batch, in milliseconds (0 before any batch)."""
        return 1000 * self.wait_s / self.batches if self.batches else 0.0

    def as_vector(self) -> torch.Tensor:
        """The numbers as one float64 tensor (a stage not timed is NaN), as :func:`gather_waits` sends them."""
        stages = [self.stages_ms.get(stage, math.nan) for stage in STAGES]
        return torch.tensor([self.rank, self.batches, self.wait_s, self.elapsed_s, self.max_wait_ms, *stages],
                            dtype=torch.float64)

    @classmethod
    def from_vector(cls, vector: torch.Tensor) -> RankWait:
        """The inverse of :meth:`as_vector`."""
        values = vector.tolist()
        stages = {stage: value for stage, value in zip(STAGES, values[5:]) if not math.isnan(value)}
        return cls(int(values[0]), int(values[1]), values[2], values[3], values[4], stages)


@dataclass(frozen=True)
class RankWaits:
    """Every rank's :class:`RankWait`, by rank, and how unequal the waits are."""

    ranks: tuple[RankWait, ...]

    @property
    def imbalance(self) -> float:
        """The largest rank's wait over the mean wait (1.0: equal; 2.0: one rank waited twice the mean); 1.0 when
        no rank waited."""
        waits = [rank.wait_s for rank in self.ranks]
        mean = sum(waits) / len(waits)
        return max(waits) / mean if mean > 0 else 1.0

    @property
    def slowest(self) -> int:
        """The rank that waited longest."""
        return max(self.ranks, key=lambda rank: rank.wait_s).rank

    def rows(self) -> list[list[str]]:
        """The table's cells: a header, then one row per rank."""
        stages = [stage for stage in STAGES if any(stage in rank.stages_ms for rank in self.ranks)]
        header = ["rank", "batches", "wait s", "wait/batch ms", "max wait ms", *(f"{stage} ms" for stage in stages)]
        return [header, *([str(rank.rank), str(rank.batches), f"{rank.wait_s:.3f}", f"{rank.mean_wait_ms:.2f}",
                           f"{rank.max_wait_ms:.2f}", *(f"{rank.stages_ms[stage]:.3f}" if stage in rank.stages_ms
                                                        else "-" for stage in stages)] for rank in self.ranks)]

    def summary(self) -> str:
        """One line: the imbalance and the slowest rank."""
        return (f"wait imbalance across {len(self.ranks)} rank{'s' if len(self.ranks) > 1 else ''}: "
                f"{self.imbalance:.2f} (max/mean), slowest rank {self.slowest}")

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
        return "\n".join([*lines, self.summary()])

    def to_html(self) -> str:
        """The table and its imbalance as an HTML fragment (the report's "waiting per rank" section)."""
        header, *body = self.rows()
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
        cells = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in body)
        return (f"<h4>waiting for data, per rank</h4><table><tr>{head}</tr>{cells}</table>"
                f"<p>{html.escape(self.summary())}</p>")

    _repr_html_ = to_html


_GLOO: dict[Any, Any] = {}
"""A gloo group over the default group's ranks, per default group, where that group's backend is not gloo."""


def gather_waits(local: RankWait, group: Any = None) -> RankWaits:
    """Every rank's ``local`` wait: a collective (every rank must call it) over ``group``, by default the default
    process group through gloo (a gloo group is made once where the default backend is another, e.g. NCCL, so the
    few floats stay on the CPU). Without ``torch.distributed`` initialized, this rank's alone."""
    world = rank_and_world()
    if world is None or world[1] == 1:
        return RankWaits((local,))
    if group is None and dist.get_backend() != "gloo":
        if dist.group.WORLD not in _GLOO:
            _GLOO[dist.group.WORLD] = dist.new_group(backend="gloo")
        group = _GLOO[dist.group.WORLD]
    vector = local.as_vector()
    gathered = [torch.empty_like(vector) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, vector, group=group)
    return RankWaits(tuple(sorted((RankWait.from_vector(each) for each in gathered), key=lambda rank: rank.rank)))
