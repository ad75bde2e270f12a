"""The cost of mixing named sources in every batch, set beside the cost of collating a batch, in one process.

- **Order**: an epoch's mixture order (``MixtureOrder.plan`` then ``order``: the counts of every block, then the
  rows of every position) for 1M rows (quick: 200k) in 2 and 5 sources, by rows and by tokens, blocks of one global
  batch of 32 rows, at constant weights and under two schedules: the weights switched to the reverse order halfway
  through the epoch, and ramped linearly to it over the epoch. The figure is the epoch's time divided by its
  batches. The whole epoch is computed at once, when the sampler starts the epoch: the note gives that pause, and a
  plain permutation of the same rows for reference.
- **Collation** (the anchor of those rows): ``TextCollator`` with its value checks, as the module's loader runs it
  (the columns of 32 token rows, 16..128 ids), on the same length distribution.
- **Loader**: a whole ``num_workers=0`` epoch of ``UniversalDataModule`` over one dataset of token rows (the anchor)
  against the same rows as two named sources mixed at their shares (ours), per batch. The mixed epoch includes
  computing its order, and reading each batch through ``MixedSource`` (one read per source, then the batch's order
  back). Two rows time the read alone, 32 rows through ``MixedSource.__getitems__`` against the single source's:
  as columns (what the loader hands ``TextCollator``: the mixed read gathers each source's token spans into one
  buffer; target within 2x of the single source's read, which copies nothing), and as rows.

Checks before timing: by rows at the sources' shares (constant weights), the order is a permutation of every row
(each row once); otherwise each source's first pass is distinct rows; both loaders serve the same rows and tokens in
an epoch, and both reads the same rows.

Run: ``python -m benchmarks --only mixture --out benchmarks/results/mixture``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from benchmarks._harness import OutputMismatch, best_seconds, result
from engine.datamodule.universal import UniversalDataModule
from engine.sampling.mixtures.mixture import Mixture
from engine.sampling.mixtures.order import MixtureOrder
from task_spec import TaskSpec

NAME = "mixture"
BATCH = 32
LOW, HIGH = 16, 128  # within TaskSpec.lm_tiny()'s max_length: nothing is truncated
MINIMUM = 10.0
"""Target: mixing costs at most a tenth of collating the batch (ratio collation / mixing >= 10)."""
SOURCES = {2: (0.7, 0.3), 5: (0.4, 0.25, 0.15, 0.12, 0.08)}
SCHEDULES = ("constant", "switched", "ramped")
"""The weights over the epoch: the sources' shares throughout; switched to the shares in reverse order halfway
through the epoch; ramped linearly from the shares to the reverse over the epoch."""
READ_MINIMUM = 0.5
"""Target: a mixed batch read as columns within 2x of one source's (ratio single / mixed >= 0.5)."""


def sizes_of(rows: int, shares: tuple[float, ...]) -> list[int]:
    sizes = [int(rows * share) for share in shares]
    sizes[0] += rows - sum(sizes)
    return sizes


def schedule_of(names: list[str], shares: list[float], schedule: str, blocks: int) -> list[tuple[Any, ...]]:
    """``Mixture(schedule=...)`` for one of :data:`SCHEDULES` over an epoch of ``blocks`` steps."""
    reverse = dict(zip(names, reversed(shares)))
    return {"constant": [], "switched": [(blocks // 2, reverse)], "ramped": [(blocks, reverse, "linear")]}[schedule]


def order_seconds(sizes: list[int], by: str, schedule: str, lengths: list[np.ndarray], repeats: int
                  ) -> tuple[float, int]:
    """Best seconds to compute epoch 0's order from a fresh :class:`MixtureOrder`, and the epoch's blocks."""
    names = [f"s{index}" for index in range(len(sizes))]
    shares = [size / sum(sizes) for size in sizes]
    mixture = Mixture(dict(zip(names, shares)), by=by,
                      schedule=schedule_of(names, shares, schedule, sum(sizes) // BATCH))

    def compute() -> MixtureOrder:
        order = MixtureOrder(mixture, sizes, block=BATCH, seed=1, lengths=lengths if by == "tokens" else None)
        order.order(0)
        return order

    order = compute()  # by tokens under a schedule, this compiles its loop (cached on disk) before timing
    check_order(order, sizes, by if schedule == "constant" else "draws")
    return best_seconds(compute, repeats=repeats, warmup=0), len(order.plan(0).counts)


def check_order(order: MixtureOrder, sizes: list[int], by: str) -> None:
    rows = order.order(0)
    if by == "rows" and not np.array_equal(np.sort(rows), np.arange(sum(sizes))):
        raise OutputMismatch(f"{NAME}: by rows at the sources' shares, the epoch is not each row once")
    which = order.source_of(rows)
    for index, size in enumerate(sizes):
        mine = rows[which == index][:size]  # by tokens a source may go on into its next pass
        if len(np.unique(mine)) != len(mine):
            raise OutputMismatch(f"{NAME}: source {index} repeats a row within its first pass")
    if by == "draws" and order.plan(0).counts.sum(axis=1).max() > BATCH:
        raise OutputMismatch(f"{NAME}: a block of the epoch holds more than {BATCH} rows")


def token_rows(count: int, seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(5, 30_000, int(n))) for n in rng.integers(LOW, HIGH + 1, count)]


def collate_seconds(repeats: int) -> float:
    """Seconds to collate the columns of a batch of 32 token rows, as the module's loader does."""
    dm = UniversalDataModule(token_rows(BATCH * 64, seed=2), task_spec=TaskSpec.lm_tiny(), batch_size=BATCH, seed=0)
    dm.setup()
    handing, collator = dm.datasets["train"].handing_columns(), dm.collator
    batches = [list(range(start, start + BATCH)) for start in range(0, BATCH * 64, BATCH)]
    columns = [handing.__getitems__(batch).to_columns() for batch in batches]

    def calls() -> None:
        for one in columns:
            collator.collate_columns(one)

    return best_seconds(calls, repeats=repeats) / len(columns)


def epoch_seconds(dm: UniversalDataModule, repeats: int) -> tuple[float, int, int, int]:
    """Best seconds of a whole epoch of ``dm``'s train loader (each repeat a new epoch), its batches, rows, tokens."""
    loader = dm.train_dataloader()
    served = [0, 0, 0]

    def epoch() -> None:
        served[:] = [0, 0, 0]
        for batch in loader:
            served[0] += 1
            served[1] += batch["input_ids"].shape[0]
            served[2] += int(batch["attention_mask"].sum())

    seconds = best_seconds(epoch, repeats=repeats)
    return seconds, served[0], served[1], served[2]


def loader_rows(rows: int, repeats: int) -> list[dict[str, Any]]:
    data = token_rows(rows, seed=3)
    cut = int(rows * 0.7)
    spec = TaskSpec.lm_tiny()
    single = UniversalDataModule(data, task_spec=spec, batch_size=BATCH, seed=0)
    mixed = UniversalDataModule({"web": data[:cut], "code": data[cut:]}, task_spec=spec, batch_size=BATCH, seed=0,
                                mix={"web": cut, "code": rows - cut})
    anchor_s, anchor_batches, anchor_rows, anchor_tokens = epoch_seconds(single, repeats)
    ours_s, batches, served_rows, tokens = epoch_seconds(mixed, repeats)
    if (anchor_batches, anchor_rows, anchor_tokens) != (batches, served_rows, tokens):
        raise OutputMismatch(f"{NAME}: an epoch of one dataset served {anchor_batches} batches, {anchor_rows} rows, "
                             f"{anchor_tokens} tokens, the mixture {batches}, {served_rows}, {tokens}")
    rows_out = [result(NAME, f"loader epoch per batch: {rows // 1000}k token rows as 2 mixed sources (0.7/0.3), "
                        f"batch {BATCH}, workers=0", anchor="the same rows as one dataset",
                  anchor_s=anchor_s / anchor_batches, ours_s=ours_s / batches, target=">= 0.9x", minimum=0.9,
                  note=f"{batches} batches an epoch; each epoch's order computed in it")]
    return rows_out + fetch_rows(single, mixed, repeats)


def plain(rows: Any) -> list[Any]:
    """Rows as lists of ids, whether a row is a tensor, a list or a dict of them."""
    def ids(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else list(value)
    return [{key: ids(value) for key, value in row.items()} if isinstance(row, dict) else ids(row) for row in rows]


def fetch_rows(single: UniversalDataModule, mixed: UniversalDataModule, repeats: int) -> list[dict[str, Any]]:
    """The read of 32 rows through ``MixedSource`` against the single source: as columns, then as rows."""
    one, both = single.datasets["train"], mixed.datasets["train"]
    batches = [list(range(start, len(one), len(one) // BATCH))[:BATCH] for start in range(64)]
    out = []
    for form, pair in (("columns", (one.handing_columns(), both.handing_columns())), ("rows", (one, both))):
        for batch in batches[:4]:
            if plain(pair[0].__getitems__(batch)) != plain(pair[1].__getitems__(batch)):
                raise OutputMismatch(f"{NAME}: MixedSource read other rows than the single source ({form})")

        def reads(source: Any) -> float:
            def calls() -> None:
                for batch in batches:
                    source.__getitems__(batch)
            return best_seconds(calls, repeats=repeats * 3) / len(batches)

        columns = form == "columns"
        out.append(result(NAME, f"read {BATCH} rows through MixedSource (2 sources) as {form}",
                          anchor=f"the single source, {form}", anchor_s=reads(pair[0]), ours_s=reads(pair[1]),
                          target="<= 2x the single source" if columns else None,
                          minimum=READ_MINIMUM if columns else None,
                          note="what the loader hands TextCollator; the single source's read copies no tokens, the "
                               "mixed one gathers them into one buffer" if columns else "rows for a collator of rows"))
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows = 200_000 if quick else 1_000_000
    repeats = 2 if quick else 3
    collate_s = collate_seconds(repeats=3 if quick else 5)
    rng = np.random.default_rng(0)
    out = []
    for count, shares in SOURCES.items():
        sizes = sizes_of(rows, shares)
        lengths = [rng.integers(LOW, HIGH + 1, size) for size in sizes]
        permutation_s = best_seconds(lambda: np.random.default_rng(1).permutation(rows), repeats=repeats)
        for by in ("rows", "tokens"):
            for schedule in SCHEDULES:
                seconds, blocks = order_seconds(sizes, by, schedule, lengths, repeats)
                out.append(result(
                    NAME, f"epoch order per batch: {rows // 1000}k rows, {count} sources, by {by}, {schedule} "
                          f"weights, batch {BATCH}",
                    anchor=f"collate {BATCH} token rows ({LOW}..{HIGH} ids)", anchor_s=collate_s,
                    ours_s=seconds / blocks, target=f"mixing <= 1/{MINIMUM:.0f} of collation", minimum=MINIMUM,
                    note=f"whole epoch {seconds:.2f} s at its start ({blocks:,} batches); a plain permutation of "
                         f"the rows {permutation_s * 1e3:.0f} ms"))
    out.extend(loader_rows(8_000 if quick else 32_000, repeats))
    return out
