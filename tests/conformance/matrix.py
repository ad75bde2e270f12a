"""Which cells the conformance suite runs: the axes, the refusals and known bugs, and a deterministic covering.

The default run takes an all-pairs covering of each property's axes: every value of one axis meets every value of
every other axis in at least one cell, so a fault that needs two settings together (a kind of source and a batching
mode, a batching mode and a loader) is caught, at a fraction of the full product's cost. ``CONFORMANCE=full``
runs the full product instead. See docs/conformance.md.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.conformance.sources import KINDS

FULL = os.environ.get("CONFORMANCE", "").lower() == "full"
"""``CONFORMANCE=full`` runs every cell of the product; by default an all-pairs covering of it."""

BATCHING = {"plain": {}, "grouped": {"batching": "grouped"},
            "token_budget": {"batching": "token_budget", "max_tokens": 40},
            "packed": {"batching": "packed", "max_tokens": 40},
            "packed_balanced": {"batching": "packed", "max_tokens": 40, "balance": "compute", "attention_weight": 0.05},
            "token_budget_balanced": {"batching": "token_budget", "max_tokens": 40, "balance": "compute",
                                      "attention_weight": 0.05}}
"""The batching modes; ``packed_balanced`` and ``token_budget_balanced`` are packing and token budgets whose steps
are balanced across ranks by compute (refused, served and checked as their unbalanced modes are)."""
LOADERS = {"workers0": {}, "fork2": {"num_workers": 2, "multiprocessing_context": "fork", "timeout": 60},
           "spawn2": {"num_workers": 2, "multiprocessing_context": "spawn", "timeout": 120},
           "threads2": {"num_threads": 2}}
SPAWN_CELLS = (("user_sqlite", "tokens", "packed"),)
"""Spawned workers start a fresh interpreter each, which imports the engine and its collator's compiled loops anew
(seconds per worker on a quiet machine, tens of seconds on a loaded one), so the default run spawns in this cell
only: the user-defined source, which must pickle without its open connection, under packed batching.
``CONFORMANCE=full`` spawns in every cell of the product."""


@dataclass(frozen=True)
class Refusal:
    """A combination the engine refuses, and where: ``at`` is ``"construction"`` (the module's constructor),
    or ``"load_state_dict"`` for a resume it refuses."""

    error: type[BaseException]
    match: str
    at: str = "construction"


@dataclass(frozen=True)
class Bug:
    """A combination that is neither served right nor refused at construction: the cell is an ``xfail(strict)``."""

    reason: str


STREAM_BATCHING = r"batching='{}' needs every row's length up front, which a stream \(datasets.IterableDataset\)"
STREAM_THREADS = r"num_threads=2 loads map-style data through its batch sampler, but the data is an IterableDataset"
NOT_LM_PACKED = r"batching='packed' \(batching= was given\) concatenates documents for language modelling"
RAW_TEXT_LENGTHS = (r"batching='{}' plans each epoch from every row's token count, but train_data \(\w+\) holds raw "
                    r"text, which the collator tokenizes a batch at a time")
IMAGES_NO_LENGTH = (r"batching='{}' plans each epoch from every row's length of 'image', which train_data does not "
                    r"have \((column 'image' is (struct|binary)|its rows hold encoded images there)")
IMAGE_KINDS = ("image_folder", "shards_images", "shards_tar", "shards_tar_s3", "image_text_folder")
"""The kinds that hold images: an image folder, and the image-text sources (images handed over encoded)."""
def expectation(kind: str, rows: str, batching: str, loader: str = "workers0") -> Refusal | Bug | None:
    """What the engine does with a cell: serves it (None), refuses it (:class:`Refusal`) or gets it wrong
    (:class:`Bug`)."""
    batching = batching.removesuffix("_balanced")
    if kind == "stream":
        if batching != "plain":
            return Refusal(ValueError, STREAM_BATCHING.format(batching))
        if loader == "threads2":
            return Refusal(ValueError, STREAM_THREADS)
    if kind in IMAGE_KINDS and batching == "packed":
        return Refusal(ValueError, NOT_LM_PACKED)
    if kind in IMAGE_KINDS and batching in ("grouped", "token_budget"):
        return Refusal(ValueError, IMAGES_NO_LENGTH.format(batching))
    if kind in ("torch", "user_sqlite") and rows == "text" and batching != "plain":
        return Refusal(ValueError, RAW_TEXT_LENGTHS.format(batching))
    return None


def sources() -> list[tuple[str, str]]:
    """Every (kind, rows) the suite builds: each kind with each kind of row it can hold."""
    return [(kind.name, rows) for kind in KINDS.values() for rows in kind.rows]


def all_pairs(axes: dict[str, list[Any]], valid: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """A deterministic all-pairs covering of ``axes``: cells of the product (only ``valid`` ones) such that every
    pair of values of two axes that some valid cell holds is held by a chosen cell. Greedy: each step takes the
    first cell, in product order, that covers the most pairs not yet covered (the classic AETG-style choice; not
    minimal, but small and stable from run to run)."""
    names = list(axes)
    cells = [dict(zip(names, values)) for values in itertools.product(*axes.values())]
    cells = [cell for cell in cells if valid(cell)]

    def pairs(cell: dict[str, Any]) -> set[tuple]:
        return {(a, cell[a], b, cell[b]) for a, b in itertools.combinations(names, 2)}

    uncovered = set().union(*(pairs(cell) for cell in cells)) if cells else set()
    chosen = []
    while uncovered:
        best = max(cells, key=lambda cell: len(pairs(cell) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def cells(axes: dict[str, list[Any]], valid: Callable[[dict[str, Any]], bool],
          extra: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The full product under ``CONFORMANCE=full``, else an all-pairs covering plus ``extra`` cells."""
    if FULL:
        names = list(axes)
        return [cell for values in itertools.product(*axes.values()) if valid(cell := dict(zip(names, values)))]
    chosen = all_pairs(axes, valid)
    return chosen + [cell for cell in extra if cell not in chosen and valid(cell)]


def cell_id(cell: dict[str, Any]) -> str:
    return "-".join(str(value) for value in cell.values())
