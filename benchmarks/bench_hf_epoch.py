"""One epoch over a tokenized Hugging Face dataset: the usual DataLoader recipe against UniversalDataModule.

The dataset has 20k rows (quick: 5k) of ``input_ids`` + ``attention_mask`` with lengths 16..256, written by a
batched ``map`` the way tokenization writes it (several Arrow record batches). The anchor is
``DataLoader(ds, batch_size=64, shuffle=True, collate_fn=DataCollatorWithPadding(tokenizer))``; ours is
``UniversalDataModule(ds, task_spec=causal LM, tokenizer=..., batch_size=64).train_dataloader()``, which also
builds causal-LM labels. Before timing, one full unshuffled epoch of both is compared batch by batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from benchmarks._harness import OutputMismatch, best_seconds, check_same, mtok, result, token_lists, tokenizer
from engine.datamodule.universal import UniversalDataModule
from engine.sources.wrappers import HFSource
from task_spec import TaskSpec

NAME = "hf_epoch"
BATCH = 64
SPEC = TaskSpec(name="bench_causal_lm", task_type="causal_lm", modality="text")
"""No ``max_seq_len``: nothing is truncated, so ours and the anchor pad the same rows."""


def build_dataset(rows: int) -> datasets.Dataset:
    datasets.disable_progress_bars()
    ids = token_lists(rows, 16, 256, seed=1)
    plain = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]})
    return plain.map(lambda batch: batch, batched=True, batch_size=1000)  # the layout a tokenizing map leaves


def anchor_loader(ds: datasets.Dataset, workers: int, shuffle: bool = True) -> DataLoader:
    return DataLoader(ds, batch_size=BATCH, shuffle=shuffle, collate_fn=DataCollatorWithPadding(tokenizer()),
                      num_workers=workers, persistent_workers=workers > 0,
                      generator=torch.Generator().manual_seed(0))


def our_loader(ds: datasets.Dataset, workers: int, shuffle: bool = True) -> Any:
    module = UniversalDataModule(ds, task_spec=SPEC, tokenizer=tokenizer(), batch_size=BATCH, num_workers=workers,
                                 shuffle=shuffle, seed=0)
    return module.train_dataloader()


def verify_epoch(ds: datasets.Dataset) -> None:
    """Every batch of an unshuffled epoch: same ids and mask as the anchor, labels = ids with -100 at padding."""
    count = 0
    for ours, theirs in zip(our_loader(ds, 0, shuffle=False), anchor_loader(ds, 0, shuffle=False), strict=True):
        check_same(ours, theirs, ["input_ids", "attention_mask"], f"{NAME} batch {count}")
        expected = theirs["input_ids"].masked_fill(theirs["attention_mask"] == 0, -100)
        check_same(ours, {"labels": expected}, ["labels"], f"{NAME} batch {count} labels")
        count += 1
    if count != -(-len(ds) // BATCH):
        raise OutputMismatch(f"{NAME}: {count} batches compared, expected {-(-len(ds) // BATCH)}")


def epoch_seconds(loader: Iterable[Any], repeats: int) -> float:
    def drain() -> None:
        for _ in loader:
            pass

    return best_seconds(drain, repeats=repeats, warmup=1)


def fetch_case(ds: datasets.Dataset, tokens: int, repeats: int) -> dict[str, Any]:
    """Batched fetch alone: ``ds[indices]`` (datasets' Python rows) against ``HFSource.fetch_columns``."""
    source = HFSource(ds)
    order = np.random.default_rng(0).permutation(len(ds))
    batches = [order[start:start + BATCH].tolist() for start in range(0, len(ds), BATCH)]
    fetched = source.fetch_columns(batches[0])
    expected = ds[batches[0]]["input_ids"]
    if fetched["input_ids"].rows() != expected:
        raise OutputMismatch(f"{NAME}: fetch_columns and ds[indices] give different input_ids")

    def anchor() -> None:
        for batch in batches:
            ds[batch]  # noqa: B018 - the fetch is the work

    def ours() -> None:
        for batch in batches:
            source.fetch_columns(batch)

    anchor_s, ours_s = best_seconds(anchor, repeats=repeats), best_seconds(ours, repeats=repeats)
    return result(NAME, "fetch only (no collate)", anchor="ds[indices] per batch", anchor_s=anchor_s, ours_s=ours_s,
                  throughput=mtok(tokens, ours_s),
                  note="both fetch input_ids + attention_mask; ours as spans of Arrow buffers (the collator copies)")


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats = (5_000, 2) if quick else (20_000, 3)
    ds = build_dataset(rows)
    tokens = sum(len(row) for row in ds["input_ids"])
    verify_epoch(ds)
    out = [fetch_case(ds, tokens, repeats)]
    for workers, target, minimum in ((0, ">= 8x", 8.0), (2, "> 1x (still ahead)", 1.0)):
        anchor_s = epoch_seconds(anchor_loader(ds, workers), 1 if workers == 0 else repeats)
        ours_s = epoch_seconds(our_loader(ds, workers), repeats)
        note = f"{rows:,} rows, {tokens / 1e6:.2f}M tokens, shuffled; anchor {mtok(tokens, anchor_s)}"
        if workers:
            note += "; persistent workers, epochs after the first"
        out.append(result(NAME, f"epoch, batch {BATCH}, workers={workers}", anchor="DataLoader+DataCollatorWithPadding",
                          anchor_s=anchor_s, ours_s=ours_s, target=target, minimum=minimum,
                          throughput=mtok(tokens, ours_s), note=note))
    return out
