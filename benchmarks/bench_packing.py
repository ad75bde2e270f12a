"""Packing (padding-free batches) against padded batches and transformers' ``DataCollatorWithFlattening``.

On the same documents (lengths uniform in 32..512, word ids of the benchmark tokenizer):

- real-token share: tokens holding data / positions the model computes on, for packed bins
  (``PackedBatchSampler``, ``[1, T]`` with ``T`` the bin's tokens), plain shuffled batches of 32 and length-grouped
  batches of 32 (both padded to their longest row); and how full the packed bins are (tokens / bins x max_tokens);
- collation time per real token of each layout (``PackedCollator`` vs ``TextCollator`` on the same epoch's first
  batches), so packing must cost no more per token than padding;
- ``PackedCollator`` vs ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` on the same bins, after
  checking every field is equal; from row lists (what both take) and from Arrow columns (what the engine hands ours).

Single thread, best of several repeats, anchor and ours in one process on the same data. A shared machine is noisy.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from transformers import DataCollatorWithFlattening

from benchmarks._harness import OutputMismatch, best_seconds, check_same, mtok, result, token_lists
from collators.packed import PACKED_FIELDS, PackedCollator
from collators.text import TextCollator
from engine.sampling.length import LengthGroupedBatchSampler
from engine.sampling.packed import PackedBatchSampler
from engine.sampling.seeded import SeededBatchSampler

NAME = "packing"
BATCH_SIZE, MAX_TOKENS, LOW, HIGH = 32, 8192, 32, 512  # 32 rows of mean length 272 ~ one 8192-token bin


def real_share(batches: list[list[int]], lengths: np.ndarray, packed: bool) -> float:
    """Real tokens / positions computed on: a packed bin has no padding, a padded batch is rows x longest."""
    real = sum(int(lengths[b].sum()) for b in batches)
    positions = real if packed else sum(len(b) * int(lengths[b].max()) for b in batches)
    return real / positions


def check_flattening(ours: dict[str, Any], theirs: dict[str, Any], what: str) -> None:
    """Every packed field equal (tensors by value and dtype, max lengths as ints), or refuse to time."""
    check_same(ours, theirs, [key for key in PACKED_FIELDS if torch.is_tensor(theirs[key])], what)
    for key in PACKED_FIELDS:
        if torch.is_tensor(theirs[key]) and ours[key].dtype != theirs[key].dtype:
            raise OutputMismatch(f"{what}: {key!r} is {ours[key].dtype}, the anchor's {theirs[key].dtype}")
        if not torch.is_tensor(theirs[key]) and ours[key] != theirs[key]:
            raise OutputMismatch(f"{what}: {key!r} is {ours[key]!r}, the anchor's {theirs[key]!r}")


def collate_all(call: Any, batches: list[Any]) -> list[Any]:
    return [call(batch) for batch in batches]


def alternating(functions: list[Any], repeats: int) -> list[float]:
    """Best seconds of each function, timed in turns (a, b, a, b, ...) so drifting machine load hits them alike."""
    best = [best_seconds(fn, repeats=1) for fn in functions]
    for _ in range(repeats):
        best = [min(seconds, best_seconds(fn, repeats=1, warmup=0)) for seconds, fn in zip(best, functions)]
    return best


def _arrow(batch_rows: list[dict[str, list[int]]]) -> dict[str, Any]:
    return {"input_ids": pa.array([row["input_ids"] for row in batch_rows], type=pa.list_(pa.int64()))}


def run(quick: bool = False) -> list[dict[str, Any]]:
    count, repeats, timed = (3_000, 3, 8) if quick else (30_000, 15, 24)
    documents = token_lists(count, LOW, HIGH, seed=0)
    lengths = np.array([len(doc) for doc in documents])
    rows = [{"input_ids": doc} for doc in documents]
    layouts = {
        "packed": PackedBatchSampler(lengths, MAX_TOKENS, seed=0).epoch_batches(0),
        "plain": SeededBatchSampler(count, BATCH_SIZE, shuffle=True, seed=0).epoch_batches(0),
        "grouped": LengthGroupedBatchSampler(lengths, BATCH_SIZE, seed=0).epoch_batches(0),
    }
    shares = {name: real_share(batches, lengths, name == "packed") for name, batches in layouts.items()}
    fill = float(lengths.sum()) / (len(layouts["packed"]) * MAX_TOKENS)
    packed_collate, padded_collate = PackedCollator(), TextCollator(pad_token_id=0, task_type="causal_lm")
    flattening = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    batches = {name: [[rows[i] for i in b] for b in found[:timed]] for name, found in layouts.items()}
    tokens = {name: sum(len(row["input_ids"]) for b in found for row in b) for name, found in batches.items()}
    arrow = {name: [_arrow(b) for b in found] for name, found in batches.items()}
    forms = {"row lists": (batches, lambda collate: collate), "Arrow columns": (arrow, lambda c: c.collate_columns)}
    results = []
    for form, (inputs, entry) in forms.items():
        for name in ("plain", "grouped"):
            padded_s, packed_s = alternating([partial(collate_all, entry(padded_collate), inputs[name]),
                                              partial(collate_all, entry(packed_collate), inputs["packed"])], repeats)
            ours_per_token, theirs_per_token = packed_s / tokens["packed"], padded_s / tokens[name]
            results.append(result(
                NAME, f"time per real token, {form}: packed [1, <={MAX_TOKENS}] vs padded {name} batches of "
                      f"{BATCH_SIZE}", anchor=f"TextCollator, {name} batches, padded", anchor_s=theirs_per_token * 1e6,
                ours_s=ours_per_token * 1e6, target=">= 1x (no more time per token than padding)", minimum=1.0,
                throughput=mtok(tokens["packed"], packed_s),
                note=(f"ms columns are ns per real token; real tokens / positions: packed {shares['packed']:.1%}, "
                      f"{name} {shares[name]:.1%} (ratio {shares['packed'] / shares[name]:.2f}x); packed bins "
                      f"{fill:.2%} full of max_tokens={MAX_TOKENS}; {len(layouts['packed'])} bins vs "
                      f"{len(layouts[name])} batches per epoch; {count} docs U[{LOW},{HIGH}]")))
    for form, (inputs, entry) in forms.items():
        call = entry(packed_collate)
        for ours_input, theirs_input in zip(inputs["packed"], batches["packed"]):
            check_flattening(call(ours_input), flattening(theirs_input), f"packed from {form}")
        ours_s = best_seconds(lambda call=call, inputs=inputs: [call(b) for b in inputs["packed"]], repeats=repeats)
        theirs_s = best_seconds(lambda: [flattening(b) for b in batches["packed"]], repeats=repeats)
        results.append(result(
            NAME, f"packed from {form}, {timed} bins of <= {MAX_TOKENS} tokens",
            anchor="DataCollatorWithFlattening(return_flash_attn_kwargs=True), row lists", anchor_s=theirs_s,
            ours_s=ours_s, target=">= 1x", minimum=1.0, throughput=mtok(tokens["packed"], ours_s),
            note="every field checked equal first (input_ids, labels, position_ids, cu_seq_lens_q/k, max_length_q/k)"))
    return results


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)
    for row in run(quick="--quick" in sys.argv):
        print(row)
