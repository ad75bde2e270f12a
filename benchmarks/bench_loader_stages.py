"""The per-batch CPU cost of our loading path, stage by stage: 64 rows from a flat buffer, from Arrow, and 64 uint8
images (3x32x32, ``TaskSpec.vision_tiny()``) from a torch Dataset of dict rows and from a dict of column tensors.

Stages, each timed alone on the same batches (best of several repeats, single thread): sampling (the batch sampler's
indices, seed derivation excluded), seed derivation (``batch_seed``, and the batch's generator for a collator that
draws random numbers), fetch (``__getitems__`` and the columns it hands over), collate (``TextCollator`` or
``VisionCollator`` without value checks), value checks (the difference with ``check_values=True``, or with
``num_classes`` for labels), their sum (our own path, target <= 0.15 ms for the token cases), and the whole
``num_workers=0`` loader per batch (the same target), whose excess over the stages is the loader's glue (torch's and
torchdata's ``DataLoader`` iteration and our wrappers). The floor is a copy of the finished batch's tensors (a
memcpy). The stages run back to back, with warm caches; a training step evicts them, so the loader is also timed the
way a loop meets it: the median ``next()`` after a step of single-thread matmuls (about 3 ms), with cold caches. On
a shared machine much of that penalty is the machine's: the last rows time a fixed workload that is not ours back to
back and after the same step (on a shared machine, a spin loop that touches nothing is slowed after a step too, so
those rows tell the machine's share from ours).

Where a stage has a row path, the anchor column holds it: the path these batches take as rows instead of columns
(per-row views of the buffer, or ``datasets``' row dicts, then the collator on rows), on the same rows and
with the same result (checked). For images, collation is compared with the usual recipe: torchvision v2 transforms
per image (``ToDtype`` + ``Normalize``) then ``default_collate``, equal bit for bit (checked).

Run: ``PYTHONPATH=. python -m benchmarks.bench_loader_stages [--quick]`` or ``python -m benchmarks --only
loader_stages``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks._harness import best_seconds, check_same, format_table, machine, tokenizer
from benchmarks.bench_hf_epoch import SPEC as ARROW_SPEC
from benchmarks.bench_hf_epoch import build_dataset
from benchmarks.bench_step_overhead import ImageRows
from benchmarks.bench_vision import PerSampleFloat
from collators.text import TextCollator
from collators.vision import VisionCollator
from engine.core.rng import batch_seed, generator_from
from engine.datamodule.universal import UniversalDataModule
from engine.sampling.seeded import SeededBatchSampler
from task_spec import TaskSpec

NAME = "loader_stages"
BATCH = 64
TARGET_MS = 0.15


def token_module(rows: int) -> UniversalDataModule:
    rng = np.random.default_rng(0)
    data = [torch.from_numpy(rng.integers(0, 50_000, int(n))) for n in rng.integers(32, 513, rows)]
    return UniversalDataModule(data, task_spec=TaskSpec.lm_tiny(), batch_size=BATCH, seed=0)


def arrow_module(rows: int) -> UniversalDataModule:
    return UniversalDataModule(build_dataset(rows), task_spec=ARROW_SPEC, tokenizer=tokenizer(), batch_size=BATCH,
                               seed=0)


def _row(case: str, stage: str, ours_s: float, *, anchor: str = "-", anchor_s: float | None = None,
         target: str | None = None, met: bool | None = None, note: str = "") -> dict[str, Any]:
    return {"benchmark": NAME, "case": f"{case}: {stage}", "anchor": anchor,
            "anchor_ms": None if anchor_s is None else anchor_s * 1e3, "ours_ms": ours_s * 1e3,
            "ratio": None if anchor_s is None else anchor_s / ours_s, "throughput": None, "target": target,
            "met": met, "note": note}


def per_batch(function: Callable[[list[int]], Any], batches: list[list[int]], repeats: int) -> float:
    """Best over ``repeats`` of the mean seconds of ``function`` over ``batches``. Each result is dropped before the
    next call, as a loop drops its batch: kept, every output would be fresh memory (page faults on each batch)."""

    def calls() -> None:
        for batch in batches:
            function(batch)

    return best_seconds(calls, repeats=repeats) / len(batches)


def stages(case: str, dm: UniversalDataModule, *, repeats: int) -> list[dict[str, Any]]:
    dm.setup()
    source, collator = dm.datasets["train"], dm.collator
    handing = source.handing_columns()  # what a loader whose collator reads columns fetches from
    unchecked = TextCollator(task_spec=dm.task_spec, tokenizer=dm.tokenizer, check_values=False)
    sampler = SeededBatchSampler(len(source), BATCH, shuffle=True, seed=0)
    batches = [list(batch) for batch in sampler][:100]
    seeds = [batch_seed(0, 1, batch) for batch in batches]
    sampling_only, seeding = _sampling_and_seeding(sampler, batches, repeats, collator.draws_random)
    fetch = per_batch(lambda batch: handing.__getitems__(batch).to_columns(), batches, repeats)
    fetch_rows = per_batch(lambda batch: list(source.__getitems__(batch)), batches, repeats)
    columns = {tuple(batch): handing.__getitems__(batch).to_columns() for batch in batches}
    rows = {tuple(batch): list(source.__getitems__(batch)) for batch in batches}
    for index, (key, seed) in enumerate(zip(columns, seeds)):
        check_same(collator.collate_columns(columns[key], generator_from(seed)),
                   collator(rows[key], generator=generator_from(seed)), ["input_ids", "attention_mask", "labels"],
                   f"{NAME} {case} batch {index} (columns vs rows)")
    collate = per_batch(lambda batch: unchecked.collate_columns(columns[tuple(batch)]), batches, repeats)
    checked = per_batch(lambda batch: collator.collate_columns(columns[tuple(batch)]), batches, repeats)
    collate_rows = per_batch(lambda batch: collator(rows[tuple(batch)]), batches, repeats)
    whole, after_step = _whole_loader(dm, repeats), _after_a_step(dm)
    outputs = [collator.collate_columns(columns[tuple(batch)]) for batch in batches]
    floor = per_batch(lambda batch: {key: value.clone() for key, value in outputs[0].items()}, batches[:1], repeats)
    parts = sampling_only + seeding + fetch + checked
    return [
        _row(case, "sampling (indices of a batch)", sampling_only),
        _row(case, "seed derivation (batch_seed, + generator if drawn)", seeding),
        _row(case, "fetch (columns of 64 rows)", fetch, anchor="row path: fetch rows", anchor_s=fetch_rows),
        _row(case, "collate (no value checks)", collate),
        _row(case, "value checks (ids in vocabulary)", max(checked - collate, 0.0)),
        _row(case, "fetch + collate + checks", fetch + checked, anchor="row path: fetch rows + collate rows",
             anchor_s=fetch_rows + collate_rows),
        _row(case, "own path (sampling + seeds + fetch + collate + checks)", parts, target=f"<= {TARGET_MS} ms",
             met=bool(parts * 1e3 <= TARGET_MS)),
        _row(case, "whole loader per batch, workers=0", whole, target=f"<= {TARGET_MS} ms",
             met=bool(whole * 1e3 <= TARGET_MS), note=f"glue {max(whole - parts, 0.0) * 1e3:.3f} ms"),
        _row(case, "whole loader per batch, workers=0, after a step", after_step, note="cold caches"),
        _row(case, "floor: copy of the finished batch", floor),
    ]


def image_stages(case: str, dm: UniversalDataModule, *, repeats: int) -> list[dict[str, Any]]:
    """The stages of a batch of images. Collation has no "before" path left to run: its anchor is the usual recipe
    (torchvision v2 per image, then ``default_collate``), checked equal bit for bit first."""
    dm.setup()
    source, collator = dm.datasets["train"], dm.collator
    unchecked = VisionCollator(mean=collator.mean, std=collator.std, input_field=collator.input_field,
                               target_field=collator.target_field)
    recipe = PerSampleFloat(collator.mean, collator.std)
    sampler = SeededBatchSampler(len(source), BATCH, shuffle=True, seed=0)
    batches = [list(batch) for batch in sampler][:100]
    sampling_only, seeding = _sampling_and_seeding(sampler, batches, repeats)
    rows = {tuple(batch): source.__getitems__(batch) for batch in batches}
    for index, batch in enumerate(rows.values()):
        check_same(collator(batch), recipe(batch), ["pixel_values", "labels"], f"{NAME} {case} batch {index}")
    fetch = per_batch(lambda batch: source.__getitems__(batch), batches, repeats)
    collate = per_batch(lambda batch: unchecked(rows[tuple(batch)]), batches, repeats)
    checked = per_batch(lambda batch: collator(rows[tuple(batch)]), batches, repeats)
    collate_recipe = per_batch(lambda batch: recipe(rows[tuple(batch)]), batches, repeats)
    whole, after_step = _whole_loader(dm, repeats), _after_a_step(dm)
    output = collator(rows[tuple(batches[0])])
    floor = per_batch(lambda batch: {key: value.clone() for key, value in output.items()}, batches[:1], repeats)
    parts = sampling_only + seeding + fetch + checked
    recipe_name = "torchvision v2 per image + default_collate"
    return [
        _row(case, "sampling (indices of a batch)", sampling_only),
        _row(case, "seed derivation (batch_seed, + generator if drawn)", seeding),
        _row(case, "fetch (rows of 64 images)", fetch),
        _row(case, "collate (no value checks)", collate, anchor=recipe_name, anchor_s=collate_recipe),
        _row(case, "value checks (labels in num_classes)", max(checked - collate, 0.0)),
        _row(case, "fetch + collate + checks", fetch + checked, anchor=f"fetch + {recipe_name}",
             anchor_s=fetch + collate_recipe),
        _row(case, "whole loader per batch, workers=0", whole, note=f"glue {max(whole - parts, 0.0) * 1e3:.3f} ms"),
        _row(case, "whole loader per batch, workers=0, after a step", after_step, note="cold caches"),
        _row(case, "floor: copy of the finished batch", floor),
    ]


def _sampling_and_seeding(sampler: SeededBatchSampler, batches: list[list[int]], repeats: int,
                          draws_random: bool = True) -> tuple[float, float]:
    """Seconds per batch of drawing indices (seed derivation excluded) and of deriving the batch's seed, and its
    generator when the collator ``draws_random`` (the engine builds none for one that does not)."""

    def sample() -> None:
        for _ in sampler:
            pass

    sampling = best_seconds(sample, repeats=repeats) / len(sampler)
    derive = (lambda batch: generator_from(batch_seed(0, 1, batch))) if draws_random else (
        lambda batch: batch_seed(0, 1, batch))
    seeding = per_batch(derive, batches, repeats)
    return max(sampling - per_batch(lambda batch: batch_seed(0, 1, batch), batches, repeats), 0.0), seeding


def _whole_loader(dm: UniversalDataModule, repeats: int) -> float:
    """Seconds per batch of a whole pass of the module's training loader."""
    loader = dm.train_dataloader()

    def epoch() -> None:
        for _ in loader:
            pass

    return best_seconds(epoch, repeats=repeats) / len(loader)


_MATRIX = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))


def _step() -> None:
    """A training step's stand-in: eight single-thread 256x256 matmuls, about 3 ms here."""
    for _ in range(8):
        _MATRIX @ _MATRIX


def _after_a_step(dm: UniversalDataModule, passes: int = 3) -> float:
    """Median seconds of ``next()`` on the module's training loader when each call follows a :func:`_step`: the
    caches are as a training loop leaves them. The lowest median of ``passes`` passes."""
    loader, medians = dm.train_dataloader(), []
    for _ in range(passes):
        batches, waits = iter(loader), []
        while True:
            _step()
            start = time.perf_counter()
            if next(batches, None) is None:
                break
            waits.append(time.perf_counter() - start)
        medians.append(float(np.median(waits)))
    return min(medians)


def machine_reference(calls: int = 200) -> list[dict[str, Any]]:
    """What the machine does to code that is not ours: a fixed workload (``np.sort`` of 20,000 floats and a pass
    over a 3,000-key dict), timed back to back and right after a :func:`_step`, medians of ``calls`` calls. Their
    ratio is the slowdown a step's gap alone causes here, to read the loader's "after a step" row against."""
    values, table = np.random.default_rng(0).random(20_000), {index: str(index) for index in range(3_000)}

    def work() -> None:
        np.sort(values)
        sum(len(text) for text in table.values())

    medians = []
    for before in (lambda: None, _step):
        times = []
        for _ in range(calls):
            before()
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        medians.append(float(np.median(times)))
    case = "machine reference (np.sort of 20k floats + a 3,000-key dict pass, not ours)"
    return [_row(case, "back to back", medians[0]),
            _row(case, "after a step", medians[1], note=f"{medians[1] / medians[0]:.2f}x back to back")]


def image_modules(rows: int) -> list[tuple[str, UniversalDataModule]]:
    """uint8 images as a torch Dataset of dict rows (labels Python ints) and as a dict of columns (0-d tensors)."""
    data = ImageRows(rows)
    columns = {"pixel_values": data.images, "labels": torch.arange(rows) % 4}
    options = dict(task_spec=TaskSpec.vision_tiny(), batch_size=BATCH, seed=0)
    return [("images uint8 Dataset", UniversalDataModule(data, **options)),
            ("images dict of columns", UniversalDataModule(columns, **options))]


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows, repeats = (3_200, 3) if quick else (12_800, 5)
    out = stages("tokens List[Tensor]", token_module(rows), repeats=repeats) + \
        stages("HF Arrow", arrow_module(rows), repeats=repeats)
    for case, dm in image_modules(rows):
        out += image_stages(case, dm, repeats=repeats)
    return out + machine_reference()


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("\n".join(machine()))
    print(format_table(run(quick="--quick" in sys.argv)))
