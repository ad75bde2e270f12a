"""Startup: what a process pays in imports before its first batch, beside ``import torch`` and torch's DataLoader.

Every case runs in a fresh interpreter, the best of several (one in a quick run), since a process imports a
module once. Import cases time ``import torch`` and then the statement, in the same process: the anchor is torch's
import, ours the two together, and the target is the statement within 500 ms of torch's import. First-batch
cases time a whole script, from its first line (before any import) to the first batch in hand, on the same rows:
our plain loop (``DataLoaderFactory`` and the registry's collator, no Lightning) at 0 workers, 2 fork and 2 spawn
workers, ``UniversalDataModule`` at 0 workers, and the anchor, torch's ``DataLoader`` with 2 spawn workers and a
plain collate doing the same work: ``pad_sequence`` and a mask for text; for images ``default_collate``, then the
uint8 batch scaled to [0, 1] and normalized with the CIFAR-10 statistics, as our collator does (torch's ops in the
same order, so the same values). Our plain loop's first batch is the same at 0, fork and spawn workers (the
benchmark checks it). The note names the heavy packages each process imported. The last rows show the cold first
batch from object storage of every reader in ``benchmarks/bench_streaming_peers.py``, read from its results
file (``benchmarks/results/streaming_peers.md``; that benchmark runs in the peers' own virtualenv).

The code measured is this checkout's, or the one at ``BENCH_STARTUP_ROOT`` (another checkout, e.g. the main
branch, to compare before and after):
``BENCH_STARTUP_ROOT=/path/to/other python -m benchmarks --only startup --out /tmp/before``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._harness import OutputMismatch

ROOT = Path(os.environ.get("BENCH_STARTUP_ROOT") or Path(__file__).resolve().parents[1])
PEERS_RESULTS = Path(__file__).resolve().parent / "results" / "streaming_peers.md"
"""The results file of ``benchmarks/bench_streaming_peers.py``, whose cold first batches the last rows show."""
"""The checkout whose startup is measured (its ``collators``, ``task_spec`` and ``engine``)."""
HEAVY = ("lightning", "torchvision", "torchaudio", "matplotlib", "pandas", "pyarrow", "datasets", "transformers",
         "numba")
"""Packages named in the notes when a process imported them."""
WITHIN_MS = 500.0
IMPORTS = {
    "import lightning": ("import lightning", None),
    "worker side: import collators, task_spec and the sources": (
        "import collators, task_spec, engine.sources.adapt, engine.sources.media, engine.collation.handoff",
        WITHIN_MS),
    "import engine": ("import engine", WITHIN_MS),
    "plain loop: from engine import DataLoaderFactory, Shards, Mixture, SeededBatchSampler": (
        "from engine import DataLoaderFactory, Shards, Mixture, SeededBatchSampler", WITHIN_MS),
    "plain module: from engine import DataModule": ("from engine import DataModule", WITHIN_MS),
    "Lightning: from engine import UniversalDataModule": ("from engine import UniversalDataModule", None),
}
"""``case -> (statement, target ms over import torch or None)``."""
LOADERS = {
    "factory-0": "our plain loop, 0 workers",
    "factory-fork": "our plain loop, 2 fork workers",
    "factory-spawn": "our plain loop, 2 spawn workers",
    "module-0": "UniversalDataModule, 0 workers",
}
SCRIPT = '''
import time

START = time.perf_counter()
import sys  # noqa: E402  (a spawned worker imports this file again, as __mp_main__: nothing heavy up here)

BATCH = 32
HEAVY = HEAVY_NAMES


class Rows:
    """Map-style rows made from a seed: token ids (16..128) or 3x32x32 uint8 images with a label."""

    def __init__(self, modality, count):
        import torch

        generator = torch.Generator().manual_seed(0)
        if modality == "text":
            lengths = torch.randint(16, 129, (count,), generator=generator).tolist()
            self.rows = [{"input_ids": torch.randint(5, 30000, (n,), generator=generator)} for n in lengths]
        else:
            images = torch.randint(0, 256, (count, 3, 32, 32), generator=generator, dtype=torch.uint8)
            self.rows = [{"pixel_values": image, "labels": index % 4} for index, image in enumerate(images)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def pad_collate(rows):
    """The plain recipe's text collate: pad_sequence and a mask."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    ids = [row["input_ids"] for row in rows]
    input_ids = pad_sequence(ids, batch_first=True)
    mask = pad_sequence([torch.ones_like(row) for row in ids], batch_first=True)
    return {"input_ids": input_ids, "attention_mask": mask}


def vision_collate(rows):
    """The plain recipe's image collate: default_collate, then to float in [0, 1] and normalized (CIFAR-10)."""
    import torch
    from torch.utils.data import default_collate

    batch = default_collate(rows)
    mean = torch.tensor((0.4914, 0.4822, 0.4465)).view(-1, 1, 1)
    std = torch.tensor((0.2470, 0.2435, 0.2616)).view(-1, 1, 1)
    batch["pixel_values"] = batch["pixel_values"].to(torch.float32).mul_(1.0 / 255).sub_(mean).div_(std)
    return batch


def heavy():
    return sorted(name for name in HEAVY if name in sys.modules)


def first_batch(modality, case):
    import hashlib

    import torch

    rows = Rows(modality, 2048 if modality == "text" else 512)
    if case == "torch-spawn":
        from torch.utils.data import DataLoader

        loader = DataLoader(rows, batch_size=BATCH, shuffle=True, num_workers=2, multiprocessing_context="spawn",
                            collate_fn=pad_collate if modality == "text" else vision_collate)
    elif case == "module-0":
        from engine import UniversalDataModule
        from task_spec import TaskSpec

        spec = TaskSpec.lm_tiny() if modality == "text" else TaskSpec.vision_tiny()
        data = [row["input_ids"] for row in rows.rows] if modality == "text" else rows
        loader = UniversalDataModule(data, task_spec=spec, batch_size=BATCH).train_dataloader()
    else:
        from collators import CollatorRegistry
        from engine import DataLoaderConfig, DataLoaderFactory
        from task_spec import TaskSpec

        spec, options = (TaskSpec.lm_tiny(), {"pad_token_id": 0}) if modality == "text" else (
            TaskSpec.vision_tiny(), {})
        collator = CollatorRegistry.get_instance().get_collator(spec, **options)
        workers, context = {"factory-0": (0, None), "factory-fork": (2, "fork"),
                            "factory-spawn": (2, "spawn")}[case]
        config = DataLoaderConfig(batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                                  multiprocessing_context=context, collate_fn=collator)
        loader = DataLoaderFactory().create_dataloader(rows, config)
    batch = next(iter(loader))
    seconds = time.perf_counter() - START
    values = batch["input_ids" if modality == "text" else "pixel_values"]
    assert len(values) == BATCH
    return seconds, hashlib.sha256(values.numpy().tobytes()).hexdigest()


if __name__ == "__main__":
    import json

    kind, argument = sys.argv[1], sys.argv[2]
    if kind == "import":
        began = time.perf_counter()
        import torch  # noqa: F401

        torch_s = time.perf_counter() - began
        began = time.perf_counter()
        exec(argument)
        result = {"torch_s": torch_s, "statement_s": time.perf_counter() - began}
    else:
        modality, case = argument.split(":")
        seconds, digest = first_batch(modality, case)
        result = {"seconds": seconds, "digest": digest}
    print(json.dumps({**result, "heavy": heavy()}))
'''


def measure(kind: str, argument: str, repeats: int) -> list[dict[str, Any]]:
    """The results of ``repeats`` fresh interpreters running the script's ``kind`` case on ``argument``."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "startup_case.py"
        script.write_text(SCRIPT.replace("HEAVY_NAMES", repr(HEAVY)))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
        for _ in range(repeats):
            done = subprocess.run([sys.executable, str(script), kind, argument], capture_output=True, text=True,
                                  cwd=folder, env=env, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"startup case {kind} {argument!r} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def _heavy(names: list[str]) -> str:
    return f"imports {', '.join(names)}" if names else "imports none of " + "/".join(HEAVY[:5])


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 1 if quick else 3
    where = f"code at {ROOT.name}"
    rows = []
    for case, (statement, within) in IMPORTS.items():
        runs = measure("import", statement, repeats)
        best = min(runs, key=lambda run: run["torch_s"] + run["statement_s"])
        extra = min(run["statement_s"] for run in runs) * 1e3
        anchor_s, ours_s = best["torch_s"], best["torch_s"] + best["statement_s"]
        rows.append({
            "benchmark": "startup", "case": case, "anchor": "import torch", "anchor_ms": anchor_s * 1e3,
            "ours_ms": ours_s * 1e3, "ratio": anchor_s / ours_s, "throughput": f"+{extra:.0f} ms over torch",
            "target": f"<= import torch + {within:.0f} ms" if within is not None else None,
            "met": None if within is None else extra <= within,
            "note": f"fresh process each, best of {repeats}; {_heavy(best['heavy'])}; {where}",
        })
    for modality in ("text", "vision"):
        anchor_runs = measure("batch", f"{modality}:torch-spawn", repeats)
        anchor_s = min(run["seconds"] for run in anchor_runs)
        digests = {}
        for case, name in LOADERS.items():
            runs = measure("batch", f"{modality}:{case}", repeats)
            best = min(runs, key=lambda run: run["seconds"])
            digests[case] = {run["digest"] for run in runs}
            spawn = case == "factory-spawn"
            rows.append({
                "benchmark": "startup", "case": f"first batch, {modality}: {name}",
                "anchor": "torch DataLoader, 2 spawn workers, plain collate (same work)", "anchor_ms": anchor_s * 1e3,
                "ours_ms": best["seconds"] * 1e3, "ratio": anchor_s / best["seconds"], "throughput": None,
                "target": f"<= anchor + {WITHIN_MS:.0f} ms" if spawn else None,
                "met": best["seconds"] - anchor_s <= WITHIN_MS / 1e3 if spawn else None,
                "note": (f"ms from the script's first line to the first batch of 32; fresh process each, best of "
                         f"{repeats}; {_heavy(best['heavy'])}; {where}"),
            })
        plain = [digests[case] for case in ("factory-0", "factory-fork", "factory-spawn")]
        if any(len(found) != 1 or found != plain[0] for found in plain):
            raise OutputMismatch(f"{modality}: our plain loop's first batch differs between 0, fork and spawn "
                                 f"workers or between runs: {plain}")
    return rows + peers_cold_first_batch()


def peers_cold_first_batch(results: Path = PEERS_RESULTS) -> list[dict[str, Any]]:
    """The cold first batch from object storage of each reader of ``benchmarks/bench_streaming_peers.py`` in each
    of its runs, with the import of its package, as its results file's table "Cold first batch in every run" shows
    them: one row per reader (ms: its slowest run), none when the file is missing."""
    if not results.exists():
        return []
    lines = results.read_text().splitlines()
    start = next((at for at, line in enumerate(lines) if line.startswith("| reader | run 1")), None)
    if start is None:
        return []
    runs = [cell.strip() for cell in lines[start].strip("|").split("|")][1:]
    rows = []
    for body in lines[start + 2:]:
        cells = [cell.strip() for cell in body.strip("|").split("|")]
        if not body.startswith("|") or cells[0] == "first":
            break
        seconds = [float(cell.split()[0]) for cell in cells[1:] if cell.endswith(")")]
        rows.append({
            "benchmark": "startup", "case": f"first batch from object storage, cold: {cells[0]}",
            "anchor": None, "anchor_ms": None, "ours_ms": max(seconds) * 1e3 if seconds else None, "ratio": None,
            "throughput": None, "target": None, "met": None,
            "note": "; ".join(f"{run}: {cell}" for run, cell in zip(runs, cells[1:])) + f"; from {results.name}",
        })
    return rows
