"""Cost of saving the data state mid-epoch: ``dm.state_dict()`` against torchdata's own ``state_dict()``.

Ours: ``UniversalDataModule(data, batch_size=64, num_workers=0).state_dict()`` a few batches into an epoch
(version, seed, data and split fingerprints, world size, epoch and the StatefulDataLoader state, whose sampler part
is three integers). Anchor: ``StatefulDataLoader(data, batch_size=64, sampler=RandomSampler(data)).state_dict()``
over the same data at the same point (torchdata saves how many samples its sampler yielded and replays it on
resume). Data: 100k rows of token ids (lengths 16..64), as a list of tensors and as a Hugging Face
``datasets.Dataset``. Each figure is the mean of many calls, best of several repeats. Both states are
checked to resume exactly: a new loader that loads the state yields the same next batch as the one that saved it.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import datasets
import torch
from torch.utils.data import RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks._harness import OutputMismatch, best_seconds, check_same, result, token_lists
from engine.module import UniversalDataModule
from task_spec import TaskSpec

NAME = "state"
ROWS, BATCH, SEED, CONSUMED = 100_000, 64, 0, 5
SPEC = TaskSpec(name="bench_state", task_type="causal_lm", modality="text", special_tokens={"pad_token_id": 0})
TARGET_MS = 1.0


def rows_as_tensors(ids: list[list[int]]) -> list[torch.Tensor]:
    return [torch.tensor(row) for row in ids]


def rows_as_hf(ids: list[list[int]]) -> datasets.Dataset:
    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict({"input_ids": ids})


def identity(rows: list[Any]) -> list[Any]:
    return rows


def anchor_loader(data: Any) -> StatefulDataLoader:
    generator = torch.Generator().manual_seed(SEED)
    return StatefulDataLoader(data, batch_size=BATCH, sampler=RandomSampler(data, generator=generator),
                              collate_fn=identity)


def module(data: Any) -> UniversalDataModule:
    return UniversalDataModule(data, task_spec=SPEC, batch_size=BATCH, num_workers=0, seed=SEED)


def same_rows(a: list[Any], b: list[Any], what: str) -> None:
    """The anchor's batches are lists of rows (tensors or dicts of lists): compare them row by row."""
    def plain(row: Any) -> Any:
        return row.tolist() if torch.is_tensor(row) else row
    if [plain(row) for row in a] != [plain(row) for row in b]:
        raise OutputMismatch(f"{what}: the batch after resuming differs from the uninterrupted one")


def case(label: str, data: Any, repeats: int, number: int) -> dict[str, Any]:
    start = time.perf_counter()
    dm = module(data)
    dm.setup()  # the fingerprints are computed here, once
    setup_s = time.perf_counter() - start
    ours_iter = iter(dm.train_dataloader())
    for _ in range(CONSUMED):
        next(ours_iter)
    anchor = anchor_loader(data)
    anchor_iter = iter(anchor)
    for _ in range(CONSUMED):
        next(anchor_iter)

    ours_s = best_seconds(dm.state_dict, repeats=repeats, number=number, warmup=10)
    anchor_s = best_seconds(anchor.state_dict, repeats=repeats, number=number, warmup=10)

    # Both states must resume exactly, or the comparison is between different work.
    saved, anchor_saved = dm.state_dict(), anchor.state_dict()
    ours_bytes, anchor_bytes = len(pickle.dumps(saved)), len(pickle.dumps(anchor_saved))
    resumed = module(data)
    resumed.load_state_dict(pickle.loads(pickle.dumps(saved)))
    check_same(next(iter(resumed.train_dataloader())), next(ours_iter), ["input_ids", "labels"],
               f"{NAME} {label} (ours)")
    anchor_resumed = anchor_loader(data)
    anchor_resumed.load_state_dict(pickle.loads(pickle.dumps(anchor_saved)))
    same_rows(next(iter(anchor_resumed)), next(anchor_iter), f"{NAME} {label} (anchor)")

    row = result(NAME, f"dm.state_dict() mid-epoch, {label}, {len(data) // 1000}k rows, workers=0",
                 anchor="StatefulDataLoader(RandomSampler).state_dict()", anchor_s=anchor_s, ours_s=ours_s,
                 target=f"< {TARGET_MS:g} ms", throughput=f"{1 / ours_s:,.0f} saves/s",
                 note=f"pickled state {ours_bytes} B (anchor {anchor_bytes} B); building the module + setup "
                      f"(fingerprints included), once: {setup_s * 1e3:.0f} ms; both resume exactly")
    row["met"] = ours_s * 1e3 < TARGET_MS
    return row


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats, number = (ROWS, 3, 200) if quick else (ROWS, 7, 2000)
    ids = token_lists(rows, 16, 64, seed=3)
    return [case("list of tensors", rows_as_tensors(ids), repeats, number),
            case("HF Dataset", rows_as_hf(ids), repeats, number)]


if __name__ == "__main__":
    import argparse

    from benchmarks._harness import format_table, machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    torch.set_num_threads(1)
    quick = parser.parse_args().quick
    print("\n".join(machine()))
    print(format_table(run(quick=quick)))
