"""The cost of ``on_error='skip'``: an epoch with it against the same epoch with ``on_error='raise'`` (the anchor).

Data: a map-style torch Dataset of token rows (lengths 16..128), batch 64, causal-LM collation, no workers (so
any cost is on the step's path). Cases: clean data (the cost of being ready to skip: nothing should change), and
data where 1% of the rows raise in ``__getitem__`` (a failing batch is read again row by row, once).
Before timing: on clean data the two settings give the same batches; with bad rows, each batch equals the clean
one less its bad rows.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks._harness import OutputMismatch, best_seconds, check_same, result
from engine.datamodule.universal import UniversalDataModule
from task_spec import TaskSpec

NAME = "bad_rows"
BATCH = 64
SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 30_000})


class TokenRows(torch.utils.data.Dataset):
    """Rows of token ids; those whose index is in ``bad`` raise, as an unreadable file would."""

    def __init__(self, count: int, bad: frozenset[int] = frozenset()) -> None:
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(16, 129, (count,), generator=generator).tolist()
        self.rows = [torch.randint(5, 30_000, (n,), generator=generator) for n in lengths]
        self.bad = bad

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index in self.bad:
            raise OSError(f"unreadable row {index}")
        return {"input_ids": self.rows[index], "row_id": index}


def epoch(dm: UniversalDataModule) -> list[dict[str, Any]]:
    return list(dm.train_dataloader())


def module(data: TokenRows, on_error: str) -> UniversalDataModule:
    return UniversalDataModule(data, task_spec=SPEC, batch_size=BATCH, seed=0, on_error=on_error)


def verify(clean: TokenRows, bad: TokenRows) -> None:
    reference = epoch(module(clean, "raise"))
    for index, (ours, anchor) in enumerate(zip(epoch(module(clean, "skip")), reference, strict=True)):
        check_same(ours, anchor, list(anchor), f"{NAME} clean batch {index} (skip vs raise)")
    for index, (ours, anchor) in enumerate(zip(epoch(module(bad, "skip")), reference, strict=True)):
        kept = [i for i, row in enumerate(anchor["row_id"].tolist()) if row not in bad.bad]
        if ours["row_id"].tolist() != anchor["row_id"][kept].tolist():
            raise OutputMismatch(f"{NAME}: batch {index} with bad rows is not the clean batch less its bad rows")


def run(quick: bool = False) -> list[dict[str, Any]]:
    count, repeats = (3_200, 3) if quick else (12_800, 7)
    clean = TokenRows(count)
    bad = TokenRows(count, frozenset(range(7, count, 100)))  # 1% of the rows
    verify(clean, bad)
    modules = {"anchor": module(clean, "raise"), "clean data": module(clean, "skip"),
               "1% of rows raise": module(bad, "skip")}
    best = dict.fromkeys(modules, float("inf"))
    for _ in range(repeats):  # interleaved, so that load from other work falls on all three alike
        for name, dm in modules.items():
            best[name] = min(best[name], best_seconds(lambda dm=dm: epoch(dm), repeats=1))
    anchor_s = best["anchor"]
    out = []
    for case in ("clean data", "1% of rows raise"):
        dm, ours_s = modules[case], best[case]
        batches = -(-count // BATCH)
        out.append(result(NAME, f"on_error='skip', {case}, {count} rows, batch {BATCH}, workers=0",
                          anchor="on_error='raise' on clean data", anchor_s=anchor_s / batches,
                          ours_s=ours_s / batches, target="clean: ratio >= 0.95" if case == "clean data" else None,
                          minimum=0.95 if case == "clean data" else None,
                          note=f"ms per batch; {dm.skipped.count} rows left out in all timed epochs"))
    return out
