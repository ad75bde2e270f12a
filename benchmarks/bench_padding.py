"""Padding share of length-aware batching vs a plain shuffle, on lengths uniform in 32..512.

Padding share = padded tokens not holding data / padded tokens, with a batch's padded size counted as
``len(batch) * max(lengths in batch)``. Rows report the share ratio (plain / ours) as ``ratio``; the ms
columns are the time to plan one epoch (min over repeats), the price of grouping.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from engine.sampling.length import LengthGroupedBatchSampler, TokenBudgetBatchSampler
from engine.sampling.seeded import SeededBatchSampler

BATCH_SIZE = 32
MAX_TOKENS = 8192  # about 32 rows of the mean length 272, so batch counts are comparable
TARGET = "padding <= 5% (plain shuffle ~45%), batch order still random per epoch"


def padding_share(batches: list[list[int]], lengths: np.ndarray) -> float:
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1 - real / padded


def plan_ms(sampler: Any, repeats: int) -> float:
    """Time to compute one epoch's batches (the base class caches an epoch, so call the pure function)."""
    times = []
    for epoch in range(repeats):
        start = time.perf_counter()
        sampler.epoch_batches(epoch)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def same_position_share(first: list[list[int]], second: list[list[int]]) -> float:
    """Share of batch positions whose batch is identical in two consecutive epochs (0 = fully reshuffled)."""
    return sum(a == b for a, b in zip(first, second)) / max(1, len(first))


def rank_note(lengths: np.ndarray, ranks: int = 4) -> str:
    """Whole batches the token-budget sampler repeats ('pad') or leaves out ('drop') to keep ranks equal."""
    parts = []
    for uneven, verb in (("pad", "repeated"), ("drop", "dropped")):
        samplers = [TokenBudgetBatchSampler(lengths, MAX_TOKENS, seed=0, num_replicas=ranks, rank=r, uneven=uneven)
                    for r in range(ranks)]
        # each rank's own batch count, before equalizing
        own = [len(s._pack(s.epoch_order(0)[r::ranks], s.max_tokens)) for r, s in enumerate(samplers)]
        counts = {len(s.epoch_batches(0)) for s in samplers}
        changed = sum(max(own) - c for c in own) if uneven == "pad" else sum(c - min(own) for c in own)
        parts.append(f"{uneven}: {'equal' if len(counts) == 1 else 'UNEQUAL'} {sorted(counts)} batches/rank, "
                     f"{changed} of {sum(own)} batches {verb}")
    return f"{ranks} ranks, " + "; ".join(parts)


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats = (5_000, 3) if quick else (50_000, 7)
    lengths = np.random.default_rng(0).integers(32, 513, rows)
    plain = SeededBatchSampler(rows, BATCH_SIZE, shuffle=True, seed=0)
    grouped = LengthGroupedBatchSampler(lengths, BATCH_SIZE, seed=0)
    budget = TokenBudgetBatchSampler(lengths, MAX_TOKENS, seed=0)
    epochs = 3
    plain_share = float(np.mean([padding_share(plain.epoch_batches(e), lengths) for e in range(epochs)]))
    plain_ms = plan_ms(plain, repeats)
    results = []
    for case, sampler, extra in (
        (f"grouped, batch_size={BATCH_SIZE}, mega_batch_factor=50", grouped, ""),
        (f"token budget, max_tokens={MAX_TOKENS}", budget, ""),
    ):
        plans = [sampler.epoch_batches(e) for e in range(epochs)]
        share = float(np.mean([padding_share(p, lengths) for p in plans]))
        moved = same_position_share(plans[0], plans[1])
        if sampler is budget:
            over = max(len(b) * int(lengths[b].max()) for p in plans for b in p)
            extra = f"; largest batch {over} <= {MAX_TOKENS} padded tokens; {rank_note(lengths)}"
        ours_ms = plan_ms(sampler, repeats)
        results.append({
            "benchmark": "padding",
            "case": f"{case}, {rows} rows, lengths U[32,512]",
            "anchor": "plain seeded shuffle (SeededBatchSampler)",
            "anchor_ms": round(plain_ms, 3),
            "ours_ms": round(ours_ms, 3),
            "ratio": round(plain_share / share, 2),
            "throughput": f"{rows / ours_ms * 1e3:,.0f} rows planned/s",
            "target": TARGET,
            "met": share <= 0.05 and moved < 0.05,
            "note": (f"ratio = padding share plain/ours; padding plain {plain_share:.1%} vs ours {share:.1%} "
                     f"(mean of {epochs} epochs), {len(plans[0])} vs {len(plain.epoch_batches(0))} batches; "
                     f"ms = planning one epoch; {moved:.1%} of batches at the same position next epoch{extra}"),
        })
    return results


if __name__ == "__main__":
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(row)
