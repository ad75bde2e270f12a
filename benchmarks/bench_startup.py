"""Startup: what a process pays in imports before its first batch, beside ``import torch`` and torch's DataLoader.

Every case runs in a fresh interpreter, the best of several (one in a quick run), since a process imports a
module once. Import cases time ``import torch`` and then the statement, in the same process: the anchor is torch's
import, ours the two together, and the target is the statement within 500 ms of torch's import. First-batch
cases time a whole script, from its first line (before any import) to the first batch in hand, on the same rows:
our plain loop (``DataLoaderFactory`` and the registry's collator, no Lightning) at 0 workers, 2 fork and 2 spawn
workers, ``UniversalDataModule`` at 0 workers, and the anchor, torch's ``DataLoader`` with 2 spawn workers and a
plain collate (``pad_sequence``, ``default_collate``). The note names the heavy packages each process imported.

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

ROOT = Path(os.environ.get("BENCH_STARTUP_ROOT") or Path(__file__).resolve().parents[1])
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


def heavy():
    return sorted(name for name in HEAVY if name in sys.modules)


def first_batch(modality, case):
    import torch

    rows = Rows(modality, 2048 if modality == "text" else 512)
    if case == "torch-spawn":
        from torch.utils.data import DataLoader, default_collate

        loader = DataLoader(rows, batch_size=BATCH, shuffle=True, num_workers=2, multiprocessing_context="spawn",
                            collate_fn=pad_collate if modality == "text" else default_collate)
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
    assert len(batch["input_ids" if modality == "text" else "pixel_values"]) == BATCH
    return time.perf_counter() - START


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
        result = {"seconds": first_batch(modality, case)}
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
        for case, name in LOADERS.items():
            runs = measure("batch", f"{modality}:{case}", repeats)
            best = min(runs, key=lambda run: run["seconds"])
            rows.append({
                "benchmark": "startup", "case": f"first batch, {modality}: {name}",
                "anchor": "torch DataLoader, 2 spawn workers, plain collate", "anchor_ms": anchor_s * 1e3,
                "ours_ms": best["seconds"] * 1e3, "ratio": anchor_s / best["seconds"], "throughput": None,
                "target": None, "met": None,
                "note": (f"ms from the script's first line to the first batch of 32; fresh process each, best of "
                         f"{repeats}; {_heavy(best['heavy'])}; {where}"),
            })
    return rows
