"""Text collation: TextCollator against transformers' collators and ``pad_sequence``, on one batch.

A batch is 64 rows of 32..512 word ids (~17.7k tokens). Every case first checks that ours and the anchor give
equal tensors (masked LM: equal deterministic parts, and both within 5 sigma of the 15% / 80-10-10 rule on more
than 100k tokens), then times both, single-threaded, best of several repeats.
"""

from __future__ import annotations

import math
from typing import Any

import datasets
import pyarrow as pa
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

from benchmarks._harness import OutputMismatch, best_seconds, check_same, mtok, result, token_lists, tokenizer
from collators.text import TextCollator

NAME = "text_collate"
BATCH, LOW, HIGH = 64, 32, 512
CLS, SEP, MASK = 2, 3, 4


def _within(share: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(share - p) <= sigmas * math.sqrt(p * (1 - p) / n)


def check_masking(batches: list[dict[str, torch.Tensor]], who: str) -> int:
    """15% of word tokens selected, 80/10/10 replaced, specials and padding never: raise otherwise. Returns tokens."""
    ids = torch.cat([b["original"].reshape(-1) for b in batches])
    masked = torch.cat([b["input_ids"].reshape(-1) for b in batches])
    labels = torch.cat([b["labels"].reshape(-1) for b in batches])
    real = torch.cat([b["attention_mask"].reshape(-1) for b in batches]).bool()
    eligible = real & (ids >= 5)
    selected = labels != -100
    words, chosen = int(eligible.sum()), int(selected.sum())
    problems = []
    if words < 100_000:
        problems.append(f"only {words} word tokens (need >= 100k)")
    if (selected & ~eligible).any():
        problems.append("a special or padding position was selected")
    if not torch.equal(labels[selected], ids[selected]) or not torch.equal(masked[~selected], ids[~selected]):
        problems.append("labels are not the original ids at selected positions, or an unselected id changed")
    shares = {"selected": (chosen / words, 0.15, words),
              "[MASK]": (int((masked[selected] == MASK).sum()) / chosen, 0.8, chosen),
              "kept": (int((masked[selected] == ids[selected]).sum()) / chosen, 0.1, chosen)}
    problems += [f"{name} share {share:.4f} is not within 5 sigma of {p}" for name, (share, p, n) in shares.items()
                 if not _within(share, p, n)]
    if problems:
        raise OutputMismatch(f"masked LM statistics of {who}: " + "; ".join(problems))
    return words


def _mlm_case(rows_ids: list[list[int]], tok: Any, repeats: int) -> dict[str, Any]:
    rows = [{"input_ids": [CLS, *ids, SEP]} for ids in rows_ids]
    theirs_fn = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15, seed=0)
    ours_fn = TextCollator(tokenizer=tok, task_type="masked_lm", mlm_probability=0.15)
    original = DataCollatorWithPadding(tok)(rows)["input_ids"]
    stats: dict[str, list[dict[str, torch.Tensor]]] = {"ours": [], "anchor": []}
    for seed in range(7):  # 7 x ~17.8k tokens > 100k, for each of the two
        generator = torch.Generator().manual_seed(seed)
        for who, batch in (("ours", ours_fn(rows, generator=generator)), ("anchor", theirs_fn(rows))):
            check_same(batch, {"attention_mask": (original != 0).long()}, ["attention_mask"], f"masked LM ({who})")
            stats[who].append({**batch, "original": original})
    words = {who: check_masking(batches, who) for who, batches in stats.items()}
    anchor_s = best_seconds(lambda: theirs_fn(rows), repeats=repeats)
    ours_s = best_seconds(lambda: ours_fn(rows), repeats=repeats)
    tokens = sum(len(r["input_ids"]) for r in rows)
    return result(NAME, "masked LM, 64 rows (15%, 80/10/10)", anchor="DataCollatorForLanguageModeling(mlm=True)",
                  anchor_s=anchor_s, ours_s=ours_s, target=">= 10x", minimum=10, throughput=mtok(tokens, ours_s),
                  note=f"same masking statistics checked on {words['ours']:,} / {words['anchor']:,} tokens")


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 5 if quick else 30
    tok = tokenizer()
    ids = token_lists(BATCH, LOW, HIGH, seed=0)
    tokens = sum(map(len, ids))
    rows = [{"input_ids": row} for row in ids]
    with_mask = [{"input_ids": row, "attention_mask": [1] * len(row)} for row in ids]
    ours_fn = TextCollator(tokenizer=tok)  # causal LM: labels = ids, -100 at padded positions
    pad_fn = DataCollatorWithPadding(tok)
    clm_fn = DataCollatorForLanguageModeling(tok, mlm=False)
    ours = ours_fn(rows)
    check_same(ours, pad_fn(rows), ["input_ids", "attention_mask"], "padding")
    check_same(ours, clm_fn(rows), ["input_ids", "attention_mask", "labels"], "causal LM labels")
    check_same(ours_fn(with_mask), pad_fn(with_mask), ["input_ids", "attention_mask"], "padding with masks")

    def by_pad_sequence() -> torch.Tensor:
        return pad_sequence([torch.tensor(row["input_ids"]) for row in rows], batch_first=True, padding_value=0)

    check_same(ours, {"input_ids": by_pad_sequence()}, ["input_ids"], "pad_sequence")
    arrow = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})
    columns = {name: pa.chunked_array(arrow.data.table.column(name).chunks) for name in arrow.column_names}
    check_same(ours_fn.collate_columns(columns), ours_fn(with_mask), ["input_ids", "attention_mask", "labels"],
               "columns vs rows")

    anchor_pad = best_seconds(lambda: pad_fn(rows), repeats=repeats)
    anchor_pad_mask = best_seconds(lambda: pad_fn(with_mask), repeats=repeats)
    anchor_seq = best_seconds(by_pad_sequence, repeats=repeats)
    ours_rows = best_seconds(lambda: ours_fn(rows), repeats=repeats)
    ours_mask = best_seconds(lambda: ours_fn(with_mask), repeats=repeats)
    ours_cols = best_seconds(lambda: ours_fn.collate_columns(columns), repeats=repeats)
    label = "incl. causal-LM labels"
    return [
        result(NAME, "pad 64 id lists", anchor="DataCollatorWithPadding", anchor_s=anchor_pad, ours_s=ours_rows,
               target=">= 10x", minimum=10, throughput=mtok(tokens, ours_rows), note=f"{tokens:,} tokens; {label}"),
        result(NAME, "pad 64 id lists", anchor="pad_sequence (list -> tensor)", anchor_s=anchor_seq,
               ours_s=ours_rows, target="> 1x", minimum=1.0, throughput=mtok(tokens, ours_rows),
               note="anchor pads ids only; ours also builds mask + labels"),
        result(NAME, "pad 64 rows with attention_mask", anchor="DataCollatorWithPadding", anchor_s=anchor_pad_mask,
               ours_s=ours_mask, target=">= 10x", minimum=10, throughput=mtok(tokens, ours_mask),
               note=f"tokenizer-style rows: two lists per row to convert; {label}"),
        result(NAME, "pad 64 rows from Arrow columns", anchor="DataCollatorWithPadding", anchor_s=anchor_pad_mask,
               ours_s=ours_cols, target=">= 10x", minimum=10, throughput=mtok(tokens, ours_cols),
               note="ours: collate_columns on Arrow list arrays (what HFSource hands over); anchor: the rows"),
        _mlm_case(ids, tok, repeats),
    ]
