"""A loader worker's private memory against the row count: the module on memory-mapped data vs the plain recipe.

Token rows (lengths 16..128) are written once per size as a ``datasets.Dataset`` (``save_to_disk``, read back
memory-mapped by ``load_from_disk``) and as Parquet shards of the same rows. Three cases, each in a fresh
interpreter, 2 fork workers, batch size 32, shuffled:

- ``ours``: ``UniversalDataModule(<memory-mapped Dataset>, task_spec=TaskSpec.lm_tiny())``'s train loader;
- ``shards``: the same module on ``Shards(folder, cache_dir=...)`` (row groups memory-mapped from the cache);
- ``plain``: torch ``DataLoader(dataset, shuffle=True, collate_fn=DataCollatorForLanguageModeling(tok, mlm=False))``
  on the same memory-mapped ``Dataset``.

Every 10 batches each worker's USS (psutil) and private dirty pages (``/proc/<pid>/smaps_rollup``) are sampled;
peaks and the last sample are reported. USS also counts the file pages of the memory-mapped rows that only that
worker has mapped (clean page cache, about 4 KiB per row read at random), so the target is judged on private dirty
pages: the worker's own memory, where per-row state built in the parent (an order, positions, lengths) would show
once a worker writes to its pages or builds its own copy. An epoch stops after ``BATCHES`` batches: shuffled indices
spread them over the whole dataset (the shards' block order over a few row groups, by design).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._harness import SPECIALS, result

CASES = {
    "ours": "UniversalDataModule on a memory-mapped datasets.Dataset",
    "shards": "UniversalDataModule on the same rows as Parquet shards (Shards)",
    "plain": "torch DataLoader + DataCollatorForLanguageModeling on the memory-mapped datasets.Dataset",
}
BATCHES = 2000
MARGIN = 16 * 2**20
"""The target: ours within this many bytes of the plain recipe's worker USS at the large size."""
MiB = 2**20


def write_data(folder: Path, count: int) -> None:
    """``count`` token rows as a saved ``datasets.Dataset`` (``folder/hf``) and as Parquet shards
    (``folder/shards``, 8 files, row groups of 10,000 rows)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 129, count)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(len(SPECIALS), 30_000, int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    table = pa.table({"input_ids": column})
    datasets.Dataset(table).save_to_disk(str(folder / "hf"), max_shard_size="4GB")
    (folder / "shards").mkdir()
    per_file = -(-count // 8)
    for part, start in enumerate(range(0, count, per_file)):
        pq.write_table(table.slice(start, per_file), folder / "shards" / f"part-{part:03d}.parquet",
                       row_group_size=10_000)
    for path in folder.rglob("*"):  # written back to disk: pages of a file still being written count as dirty
        if path.is_file():                # in the USS and private dirty pages of a process that maps them
            with open(path, "rb") as file:
                os.fsync(file.fileno())


def worker_memory(workers: set[int]) -> dict[int, tuple[int, int]]:
    """Each worker's ``(USS, private dirty bytes)``: USS also counts file pages of the memory-mapped rows that only
    that worker has mapped (clean, dropped by the kernel under pressure); dirty private pages are the worker's own.
    ``workers``: the loader iterator's worker pids (another child process of the reader's is not a worker)."""
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        if child.pid not in workers:
            continue
        try:
            uss = child.memory_full_info().uss
            with open(f"/proc/{child.pid}/smaps_rollup") as rollup:
                dirty = sum(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Private_Dirty:"))
        except (psutil.Error, OSError):
            continue
        found[child.pid] = (uss, dirty)
    return found


def loader(case: str, folder: Path) -> Any:
    import datasets

    from benchmarks._harness import tokenizer
    from engine import Shards, UniversalDataModule
    from task_spec import TaskSpec

    options = dict(task_spec=TaskSpec.lm_tiny(), batch_size=32, num_workers=2, multiprocessing_context="fork")
    if case == "shards":
        return UniversalDataModule(Shards(str(folder / "shards"), cache_dir=str(folder / "cache")),
                                   **options).train_dataloader()
    data = datasets.load_from_disk(str(folder / "hf"))
    if case == "ours":
        return UniversalDataModule(data, **options).train_dataloader()
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling

    return DataLoader(data, batch_size=32, shuffle=True, num_workers=2, multiprocessing_context="fork",
                      collate_fn=DataCollatorForLanguageModeling(tokenizer(), mlm=False),
                      generator=torch.Generator().manual_seed(0))


def measure(case: str, folder: Path) -> dict[str, Any]:
    """Up to ``BATCHES`` batches of one case, in this process: the workers' peak, first and last USS."""
    import psutil

    batches = loader(case, folder)
    peaks: dict[int, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    dirty: dict[int, int] = {}
    start = time.perf_counter()
    steps = 0
    iterator = iter(batches)
    for steps, _ in enumerate(iterator, 1):
        if steps % 10 == 0:
            for pid, (uss, private_dirty) in worker_memory({w.pid for w in iterator._workers}).items():
                first.setdefault(pid, uss)
                peaks[pid] = max(peaks.get(pid, 0), uss)
                last[pid] = uss
                dirty[pid] = max(dirty.get(pid, 0), private_dirty)
        if steps == BATCHES:
            break
    seconds = time.perf_counter() - start
    return {"case": case, "batches": steps, "seconds": seconds, "workers": len(peaks),
            "uss": max(peaks.values()), "last": max(last.values()),
            "dirty": max(dirty.values()),
            "growth": max(peaks[pid] - first[pid] for pid in peaks),
            "parent_rss": psutil.Process().memory_info().rss}


def measure_fresh(case: str, folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.bench_worker_rows", "--measure", case, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900,
                          cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise RuntimeError(f"worker_rows case {case!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = (50_000, 500_000) if quick else (200_000, 2_000_000)
    found: dict[int, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-worker-rows-") as scratch:
        for count in sizes:
            folder = Path(scratch) / str(count)
            folder.mkdir()
            write_data(folder, count)
            found[count] = {case: measure_fresh(case, folder) for case in CASES}
    small, large = sizes
    rows = []
    for case in ("ours", "shards"):
        ours, plain = found[large][case], found[large]["plain"]
        growth = ours["uss"] - found[small][case]["uss"]
        plain_growth = plain["uss"] - found[small]["plain"]["uss"]
        rows.append(result(
            "worker_rows", f"worker USS, {large:,} token rows (16..128), 2 fork workers, {ours['batches']} batches",
            anchor=CASES["plain"], anchor_s=plain["seconds"], ours_s=ours["seconds"], target=(
                "worker's private dirty memory within 16 MiB of the plain recipe's at the large size, flat in rows"),
            throughput=f"{ours['batches'] * 32 / ours['seconds']:,.0f} rows/s ({case})",
            note=(f"{CASES[case]}; peak worker USS {ours['uss'] / MiB:.1f} MiB vs plain {plain['uss'] / MiB:.1f} "
                  f"MiB (gap {(ours['uss'] - plain['uss']) / MiB:+.1f} MiB); from {small:,} to {large:,} rows "
                  f"ours {found[small][case]['uss'] / MiB:.1f} -> {ours['uss'] / MiB:.1f} MiB ({growth / MiB:+.1f}), "
                  f"plain {found[small]['plain']['uss'] / MiB:.1f} -> {plain['uss'] / MiB:.1f} MiB "
                  f"({plain_growth / MiB:+.1f}); last sample ours {ours['last'] / MiB:.1f}, plain "
                  f"{plain['last'] / MiB:.1f} MiB; peak private dirty (the worker's own pages, no file pages) ours "
                  f"{found[small][case]['dirty'] / MiB:.1f} -> {ours['dirty'] / MiB:.1f}, plain "
                  f"{found[small]['plain']['dirty'] / MiB:.1f} -> {plain['dirty'] / MiB:.1f} MiB; "
                  f"USS growth within the epoch ours {ours['growth'] / MiB:.1f}, plain "
                  f"{plain['growth'] / MiB:.1f} MiB; parent RSS ours {ours['parent_rss'] / MiB:.0f}, plain "
                  f"{plain['parent_rss'] / MiB:.0f} MiB; ms = the {ours['batches']} batches"),
        ))
        # met: on the worker's own pages (private dirty), not on file pages of the rows it happened to map alone
        dirty_growth = ours["dirty"] - found[small][case]["dirty"]
        rows[-1]["met"] = bool(ours["dirty"] - plain["dirty"] <= MARGIN and dirty_growth <= MARGIN)
    return rows


if __name__ == "__main__":
    if "--measure" in sys.argv:
        at = sys.argv.index("--measure")
        print(json.dumps(measure(sys.argv[at + 1], Path(sys.argv[at + 2]))))
    else:
        for row in run(quick="--quick" in sys.argv):
            print(row)
