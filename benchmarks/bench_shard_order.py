"""The epoch order of a sharded corpus: the block order (row groups permuted, rows shuffled within a window) against
a full permutation, on the same corpus, for its cost and for how well it shuffles.

Corpus: 1M rows (quick: 200k) in 64 shards of row groups of 2,000 rows, as the listing of a ``Shards`` source
describes it; nothing is read. Anchor: ``numpy.random.Generator.permutation`` of every row (a full shuffle). Ours:
``BlockOrder(row_groups, window=16384).permutation`` (what ``Shards`` trains on by default). Both are checked to be
permutations of every row. Quality, in the note, for each order:

- ``|rho|``: the absolute Spearman correlation of a row's position in the epoch and its shard (0: no drift from the
  first shards to the last);
- shards per batch: distinct shards among each 32 consecutive rows (a full shuffle mixes ~32 of 64; the block order
  mixes the few row groups its window spans);
- fetches: row groups read in the epoch by a reader that keeps 64 open (least recently used out): what the order
  costs in object storage; a full shuffle reads a row group for nearly every row.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from benchmarks._harness import OutputMismatch, best_seconds, result
from engine.sampling.blocks import BlockOrder

NAME = "shard_order"
SHARDS, GROUP_ROWS, WINDOW, BATCH, OPEN_GROUPS = 64, 2000, 16384, 32, 64


def spearman(order: np.ndarray, shard_of_row: np.ndarray) -> float:
    """|Spearman rho| of epoch position and shard (shards are ranks already; positions are 0..n-1)."""
    shards = shard_of_row[order].astype(np.float64)
    positions = np.arange(len(order), dtype=np.float64)
    return abs(float(np.corrcoef(positions, shards)[0, 1]))


def shards_per_batch(order: np.ndarray, shard_of_row: np.ndarray) -> float:
    usable = len(order) // BATCH * BATCH
    batches = np.sort(shard_of_row[order[:usable]].reshape(-1, BATCH), axis=1)
    return float(np.mean(1 + (np.diff(batches, axis=1) != 0).sum(axis=1)))


def fetches(order: np.ndarray, group_of_row: np.ndarray) -> int:
    """Row groups a reader with an LRU of ``OPEN_GROUPS`` open groups reads over the epoch."""
    open_groups: OrderedDict[int, None] = OrderedDict()
    count = 0
    groups = group_of_row[order]
    changes = np.r_[True, groups[1:] != groups[:-1]]
    for group in groups[changes].tolist():  # runs of one group cost one lookup
        if group in open_groups:
            open_groups.move_to_end(group)
            continue
        count += 1
        open_groups[group] = None
        if len(open_groups) > OPEN_GROUPS:
            open_groups.popitem(last=False)
    return count


def run(quick: bool) -> list[dict[str, Any]]:
    rows = 200_000 if quick else 1_000_000
    group_of_row = np.arange(rows) // GROUP_ROWS
    groups = int(group_of_row[-1]) + 1
    shard_of_row = (group_of_row * SHARDS // groups).astype(np.int64)
    block = BlockOrder(group_of_row, WINDOW)
    full = np.random.default_rng(0).permutation(rows)
    ours = block.permutation(0)
    for label, order in (("full permutation", full), ("block order", ours)):
        if not np.array_equal(np.sort(order), np.arange(rows)):
            raise OutputMismatch(f"{NAME}: the {label} is not a permutation of every row")
    repeats = 3 if quick else 5
    anchor_s = best_seconds(lambda: np.random.default_rng(1).permutation(rows), repeats=repeats)
    ours_s = best_seconds(lambda: block.permutation(1), repeats=repeats)
    quality = {label: (spearman(order, shard_of_row), shards_per_batch(order, shard_of_row),
                       fetches(order, group_of_row)) for label, order in (("full", full), ("block", ours))}
    note = "; ".join(f"{label}: |rho| {rho:.4f}, {mixed:.1f} shards per batch of {BATCH}, {count:,} row-group "
                     f"fetches" for label, (rho, mixed, count) in quality.items())
    row = result(NAME, f"epoch order of {rows // 1000}k rows in {groups} row groups of {GROUP_ROWS} ({SHARDS} "
                       f"shards), window {WINDOW}", anchor="Generator.permutation (full shuffle)",
                 anchor_s=anchor_s, ours_s=ours_s, target=f"fetches = row groups ({groups})",
                 note=f"{note}; rows {rows:,}")
    row["met"] = quality["block"][2] == groups
    return [row]
