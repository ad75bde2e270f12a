"""Cost of saving the data state mid-epoch: ``dm.state_dict()`` against torchdata's own ``state_dict()``.

Ours: ``UniversalDataModule(data, batch_size=64, num_workers=0).state_dict()`` a few batches into an epoch
(version, seed, data and split fingerprints, world size, epoch and the StatefulDataLoader state, whose sampler part
is a few integers). Anchor: ``StatefulDataLoader(data, batch_size=64, sampler=RandomSampler(data)).state_dict()``
over the same data at the same point (torchdata saves how many samples its sampler yielded and replays it on
resume). Data: 100k rows of token ids (lengths 16..64), as a list of tensors and as a Hugging Face
``datasets.Dataset``. Each figure is the mean of many calls, best of several repeats. Both states are
checked to resume exactly: a new loader that loads the state yields the same next batch as the one that saved it.

Elastic state: the same ``dm.state_dict()`` in the rest of an epoch saved on 2 ranks (64 rows each, ranks simulated
in one process) and resumed on 1 (128 rows), against the fixed-topology state of a 1-rank run (128 rows) at the same
step; the resumed rest is checked to be the epoch's rows not served before the save, each once. The one-off cost of
loading it (computing the rows left) is in the note.
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
from engine.core.compat import sampler_state_of
from engine.datamodule.universal import UniversalDataModule
from task_spec import TaskSpec

NAME = "state"
ROWS, BATCH, SEED, CONSUMED = 100_000, 64, 0, 5
SPEC = TaskSpec(name="bench_state", task_type="causal_lm", modality="text", special_tokens={"pad_token_id": 0})
TARGET_MS = 1.0
SAMPLER_TARGET_MS, TARGET_BYTES = 0.1, 4096
"""The elastic state's own part (the sampler's) stays under 0.1 ms and the whole state under 4 KB."""


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


class Ranks:
    """A stand-in for a Lightning trainer that tells the module its rank and world size (ranks in one process)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.global_rank, self.world_size, self._accelerator_connector = rank, world_size, None


def on_ranks(data: Any, rank: int, world_size: int) -> UniversalDataModule:
    dm = UniversalDataModule(data, task_spec=SPEC, batch_size=2 * BATCH // world_size, num_workers=0, seed=SEED)
    dm.trainer = Ranks(rank, world_size)
    return dm


def elastic_case(label: str, data: Any, repeats: int, number: int) -> dict[str, Any]:
    saving = [on_ranks(data, rank, 2) for rank in range(2)]
    for dm in saving:
        iterator = iter(dm.train_dataloader())
        for _ in range(CONSUMED):
            next(iterator)
    saved = pickle.loads(pickle.dumps(saving[0].state_dict()))
    served = {row for dm in saving for batch in dm.train_dataloader().batch_sampler.epoch_batches(0)[:CONSUMED]
              for row in batch}
    start = time.perf_counter()
    resumed = on_ranks(data, 0, 1)
    resumed.setup()
    setup_s = time.perf_counter() - start
    start = time.perf_counter()
    resumed.load_state_dict(saved)
    load_s = time.perf_counter() - start
    sampler = on_ranks(data, 0, 1).train_dataloader().batch_sampler  # the loaded sampler, stepped by itself
    sampler.load_state_dict(sampler_state_of(saving[0].data_state()["train_loader"]))
    rest = [row for batch in sampler for row in batch]
    if served & set(rest) or len(rest) != len(set(rest)) or len(served) + len(rest) != len(data):
        raise OutputMismatch(f"{NAME} elastic {label}: the rest of the epoch does not serve each remaining row once")
    iterator = iter(resumed.train_dataloader())
    for _ in range(CONSUMED):
        next(iterator)
    fixed = on_ranks(data, 0, 1)
    fixed_iterator = iter(fixed.train_dataloader())
    for _ in range(CONSUMED):
        next(fixed_iterator)
    ours_s = best_seconds(resumed.state_dict, repeats=repeats, number=number, warmup=10)
    anchor_s = best_seconds(fixed.state_dict, repeats=repeats, number=number, warmup=10)
    ours_bytes, anchor_bytes = len(pickle.dumps(resumed.state_dict())), len(pickle.dumps(fixed.state_dict()))
    sampler_s = best_seconds(resumed.train_dataloader().batch_sampler.state_dict, repeats=repeats, number=number)
    fixed_sampler_s = best_seconds(fixed.train_dataloader().batch_sampler.state_dict, repeats=repeats, number=number)
    row = result(NAME, f"elastic: dm.state_dict() in an epoch saved on 2 ranks, resumed on 1, {label}",
                 anchor="dm.state_dict() of a 1-rank run (fixed topology)", anchor_s=anchor_s, ours_s=ours_s,
                 target=f"< {TARGET_MS:g} ms; sampler < {SAMPLER_TARGET_MS:g} ms; < {TARGET_BYTES} B",
                 throughput=f"{1 / ours_s:,.0f} saves/s",
                 note=f"pickled state {ours_bytes} B (fixed topology {anchor_bytes} B); the sampler's own "
                      f"state_dict {sampler_s * 1e6:.1f} us (fixed topology {fixed_sampler_s * 1e6:.1f} us); "
                      f"loading it on 1 rank, once: "
                      f"{load_s * 1e3:.0f} ms (setup {setup_s * 1e3:.0f} ms); the rest of the epoch checked: "
                      f"each remaining row once")
    row["met"] = ours_s * 1e3 < TARGET_MS and sampler_s * 1e3 < SAMPLER_TARGET_MS and ours_bytes < TARGET_BYTES
    return row


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats, number = (ROWS, 3, 200) if quick else (ROWS, 7, 2000)
    ids = token_lists(rows, 16, 64, seed=3)
    tensors, hf = rows_as_tensors(ids), rows_as_hf(ids)
    return [case("list of tensors", tensors, repeats, number), case("HF Dataset", hf, repeats, number),
            elastic_case("list of tensors", tensors, repeats, number), elastic_case("HF Dataset", hf, repeats, number)]


if __name__ == "__main__":
    import argparse

    from benchmarks._harness import format_table, machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    torch.set_num_threads(1)
    quick = parser.parse_args().quick
    print("\n".join(machine()))
    print(format_table(run(quick=quick)))
