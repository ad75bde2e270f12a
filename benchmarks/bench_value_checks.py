"""The cost of the per-batch value checks of text collation: the same collator with and without them.

A batch is 64 rows of 32..512 word ids (~17.7k tokens), as in bench_text_collate. The anchor is
``TextCollator(check_values=False)``, ours the default (ids checked against ``len(tokenizer)``; for token
classification also the labels against ``num_classes``), both timed in this process on the same rows, single
thread, best of several repeats. A ratio near 1 means the checks cost next to nothing; 0.95 means 5% slower.

Run alone with ``python -m benchmarks.bench_value_checks [--quick]``.
"""

from __future__ import annotations

import sys
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import torch

from benchmarks._harness import best_seconds, check_same, format_table, mtok, result, token_lists, tokenizer
from collators._text_checks import check_range
from collators._text_inputs import flatten_ids
from collators.text import TextCollator

NAME = "value_checks"
BATCH, LOW, HIGH, CLASSES = 64, 32, 512, 9


def _interleaved(first, second, *, repeats: int) -> tuple[float, float]:
    """Best seconds of each, timed in alternating rounds, so load on the machine hits both alike."""
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for index, fn in enumerate((first, second)):
            best[index] = min(best[index], best_seconds(fn, repeats=1, number=5, warmup=0))
    return best[0], best[1]


def _case(case: str, call_with, call_without, keys: list[str], tokens: int, repeats: int,
          alone_s: float) -> dict[str, Any]:
    check_same(call_with(), call_without(), keys, case)
    call_with(), call_without()  # warm up both
    without_s, with_s = _interleaved(call_without, call_with, repeats=repeats)
    return result(NAME, case, anchor="same collator, check_values=False", anchor_s=without_s, ours_s=with_s,
                  target=">= 0.9x", minimum=0.9, throughput=mtok(tokens, with_s),
                  note=f"difference {(with_s - without_s) * 1e6:+.0f} us per batch (timing noise included); "
                       f"the checks alone: {alone_s * 1e6:.0f} us")


def _checks_alone(flat: Any, lengths: torch.Tensor, labels: Any = None) -> float:
    """Seconds of the checks by themselves on one batch's flat values (the noise-free figure)."""
    def checks() -> None:
        check_range(flat, "input_ids", high=30_005, limit="len(tokenizer)", lengths=lengths)
        if labels is not None:
            check_range(labels, "labels", high=CLASSES, limit="num_classes", ignore=-100, lengths=lengths)
    return best_seconds(checks, repeats=20, number=100)


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 5 if quick else 30
    tok = tokenizer()
    ids = token_lists(BATCH, LOW, HIGH, seed=0)
    tokens = sum(map(len, ids))
    rows = [{"input_ids": row} for row in ids]
    on, off = TextCollator(tokenizer=tok), TextCollator(tokenizer=tok, check_values=False)
    keys = ["input_ids", "attention_mask", "labels"]
    flat, lengths = flatten_ids(ids, "input_ids")
    alone = _checks_alone(flat, lengths)
    out = [_case("causal LM, 64 id lists", lambda: on(rows), lambda: off(rows), keys, tokens, repeats, alone)]

    arrow = datasets.Dataset.from_dict({"input_ids": ids})
    columns = {"input_ids": pa.chunked_array(arrow.data.table.column("input_ids").chunks)}
    out.append(_case("causal LM, 64 rows from Arrow columns", lambda: on.collate_columns(columns),
                     lambda: off.collate_columns(columns), keys, tokens, repeats,
                     _checks_alone(flat.numpy().astype(np.int32), lengths)))

    rng = np.random.default_rng(1)
    tagged = [{"input_ids": row, "labels": rng.integers(0, CLASSES, len(row)).tolist()} for row in ids]
    options = {"tokenizer": tok, "task_type": "token_classification", "num_classes": CLASSES}
    tag_on, tag_off = TextCollator(**options), TextCollator(**options, check_values=False)
    tag_flat = flatten_ids([row["labels"] for row in tagged], "labels")[0]
    out.append(_case(f"token classification, 64 rows ({CLASSES} classes)", lambda: tag_on(tagged),
                     lambda: tag_off(tagged), keys, tokens, repeats, _checks_alone(flat, lengths, tag_flat)))
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    table = run(quick="--quick" in sys.argv[1:])
    print(format_table(table))
    print("\nratio = without checks ms / with checks ms: "
          + ", ".join(f"{row['case']}: {row['ratio']:.3f}" for row in table))
