"""Static shapes: distinct batch widths per epoch and padding share, for dynamic padding, length buckets and
``padding="max_length"``; and the time to collate a batch to ``max_length`` beside transformers'
``DataCollatorWithPadding(padding="max_length")`` on the same rows (outputs checked equal first).

torch.compile, CUDA graphs and XLA recompile (or capture) once per distinct shape, so the count of widths per
epoch is what they pay; the padding share is what the model computes in vain.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from transformers import DataCollatorWithPadding

from benchmarks._harness import best_seconds, check_same, result, tokenizer
from collators import TextCollator
from engine.sampling.length import LengthGroupedBatchSampler
from engine.sampling.seeded import SeededBatchSampler

BATCH, MAX_LENGTH, BUCKETS = 32, 512, (128, 256, 384, 512)
TARGET = "<= 4 widths per epoch with buckets; max_length padding no slower than transformers'"


def widths_and_padding(batches: list[list[int]], lengths: np.ndarray, collate: TextCollator) -> tuple[int, float]:
    """Distinct widths ``collate`` gives these batches, and the share of padded positions (from lengths alone)."""
    widths, real, padded = set(), 0, 0
    for batch in batches:
        longest = int(lengths[batch].max())
        width = collate_width(collate, longest)
        widths.add(width)
        real += int(lengths[batch].sum())
        padded += len(batch) * width
    return len(widths), 1 - real / padded


def collate_width(collate: TextCollator, longest: int) -> int:
    from collators._padding import padded_length

    return padded_length(longest, max_length=collate.max_length, padding=collate.padding,
                         buckets=collate.pad_to_buckets, pad_to_multiple_of=collate.pad_to_multiple_of)


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats = (5_000, 5) if quick else (20_000, 20)
    lengths = np.random.default_rng(0).integers(32, MAX_LENGTH + 1, rows)
    plain = SeededBatchSampler(rows, BATCH, shuffle=True, seed=0).epoch_batches(0)
    grouped = LengthGroupedBatchSampler(lengths, BATCH, seed=0).epoch_batches(0)
    cases = [
        ("dynamic (longest), shuffled", plain, TextCollator(pad_token_id=0, max_length=MAX_LENGTH)),
        ("dynamic (longest), grouped", grouped, TextCollator(pad_token_id=0, max_length=MAX_LENGTH)),
        (f"buckets {BUCKETS}, shuffled", plain, TextCollator(pad_token_id=0, max_length=MAX_LENGTH,
                                                              pad_to_buckets=BUCKETS)),
        (f"buckets {BUCKETS}, grouped", grouped, TextCollator(pad_token_id=0, max_length=MAX_LENGTH,
                                                             pad_to_buckets=BUCKETS)),
        ("max_length", plain, TextCollator(pad_token_id=0, max_length=MAX_LENGTH, padding="max_length")),
    ]
    summary = "; ".join(f"{name}: {count} widths, padding {share:.1%}"
                        for name, batches, collate in cases
                        for count, share in [widths_and_padding(batches, lengths, collate)])
    tok = tokenizer()
    generator = np.random.default_rng(1)
    batch = [{"input_ids": generator.integers(5, len(tok), int(n)).tolist()} for n in lengths[plain[0]]]
    ours_fn = TextCollator(tokenizer=tok, task_type="classification", padding="max_length", max_length=MAX_LENGTH)
    theirs_fn = DataCollatorWithPadding(tok, padding="max_length", max_length=MAX_LENGTH)
    check_same(ours_fn(batch), theirs_fn(batch), ["input_ids", "attention_mask"], "max_length padding")
    anchor = best_seconds(lambda: theirs_fn(batch), repeats=repeats)
    ours = best_seconds(lambda: ours_fn(batch), repeats=repeats)
    buckets_count, _ = widths_and_padding(plain, lengths, cases[2][2])
    row = result("static_shapes", f"{BATCH} rows to max_length={MAX_LENGTH}, {rows} rows U[32,{MAX_LENGTH}]",
                 anchor="DataCollatorWithPadding(padding='max_length')", anchor_s=anchor, ours_s=ours, target=TARGET,
                 minimum=1.0, note=summary)
    row["met"] = bool(row["met"] and buckets_count <= len(BUCKETS))
    return [row]


if __name__ == "__main__":
    import sys

    for item in run(quick="--quick" in sys.argv):
        print(item)
