"""Worker memory over an epoch: token rows in one flat buffer + offsets vs Python lists in a torch Dataset.

Forked workers share the parent's pages until they write to them, and merely reading a Python object writes
its reference count (and the garbage collector writes the headers of containers), so each worker slowly
copies every page that holds Python objects it touches (pytorch #13246). :class:`TensorListSource` keeps all
rows in one tensor buffer plus an offsets tensor: two Python objects, whatever the row count.

Each case runs in a fresh interpreter (so no other case's objects sit in the forked heap), with the same
rows, the same torch ``DataLoader`` (2 fork workers, shuffled, pad collate): only the storage differs.
Workers' USS (private pages), PSS and RSS are sampled with psutil through the first epoch; the peak is reported.
The epoch time is that of a second epoch, without sampling (new workers: ``persistent_workers=False``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from engine.sources.wrappers import TensorListSource

CASES = {
    "flat": "flat buffer + offsets (TensorListSource)",
    "tensors": "list of tensors in a torch Dataset",
    "lists": "list of lists of ints in a torch Dataset",
}
TARGET = "no copy-on-read growth in workers: flat buffer USS far below Python lists"
MiB = 2**20


class ListDataset(Dataset):
    """The usual user Dataset: a Python list of rows (lists of ints or tensors), converted per item."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        row = self.rows[index]
        return row if isinstance(row, torch.Tensor) else torch.tensor(row)


def pad_collate(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)


def token_rows(count: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(32, 513, count)
    ids = torch.from_numpy(rng.integers(1_000, 50_000, int(lengths.sum()))).long()  # no small-int cache hits
    return list(torch.split(ids, lengths.tolist()))


def build(case: str, count: int) -> Dataset:
    rows = token_rows(count)
    if case == "flat":
        return TensorListSource(rows)
    if case == "tensors":
        return ListDataset([row.clone() for row in rows])  # own storages, as loaded one by one
    return ListDataset([row.tolist() for row in rows])


def worker_memory() -> list[dict[str, int]]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            info = child.memory_full_info()
        except (psutil.Error, OSError):
            continue
        found.append({"pid": child.pid, "uss": info.uss, "pss": getattr(info, "pss", 0), "rss": info.rss})
    return found


def measure(case: str, count: int) -> dict[str, Any]:
    """One epoch of one case, in this process; returns peaks over the epoch and the epoch time."""
    dataset = build(case, count)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2, collate_fn=pad_collate,
                        multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    peaks: dict[int, dict[str, int]] = {}
    first: dict[int, int] = {}
    start = time.perf_counter()
    for step, _ in enumerate(loader):
        if step % 10 == 0:
            for sample in worker_memory():
                first.setdefault(sample["pid"], sample["uss"])
                peak = peaks.setdefault(sample["pid"], dict(sample))
                for key in ("uss", "pss", "rss"):
                    peak[key] = max(peak[key], sample[key])
    sampled_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for _ in loader:  # a second epoch without sampling (reading /proc/*/smaps is slow): the time to report
        pass
    seconds = time.perf_counter() - start
    workers = list(peaks.values())
    return {
        "case": case, "epoch_ms": seconds * 1e3, "sampled_epoch_ms": sampled_ms, "workers": len(workers),
        "uss": max(w["uss"] for w in workers), "pss": max(w["pss"] for w in workers),
        "rss": max(w["rss"] for w in workers),
        "growth": max(peaks[pid]["uss"] - first[pid] for pid in peaks),
        "parent_rss": psutil.Process().memory_info().rss,
    }


def measure_fresh(case: str, count: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", case, str(count)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode:
        raise RuntimeError(f"memory case {case!r} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict[str, Any]]:
    count = 20_000 if quick else 100_000
    results = {case: measure_fresh(case, count) for case in CASES}
    ours = results["flat"]
    tokens = sum(len(r) for r in token_rows(count)) if quick else None
    rows = []
    for case in ("lists", "tensors"):
        anchor = results[case]
        rows.append({
            "benchmark": "memory",
            "case": f"worker USS over one epoch, {count:,} token rows (lengths 32..512), 2 fork workers",
            "anchor": CASES[case],
            "anchor_ms": round(anchor["epoch_ms"], 1),
            "ours_ms": round(ours["epoch_ms"], 1),
            "ratio": round(anchor["uss"] / ours["uss"], 2),
            "throughput": f"{count / ours['epoch_ms'] * 1e3:,.0f} rows/s (ours)",
            "target": TARGET,
            "met": anchor["uss"] > ours["uss"] and ours["growth"] < 64 * MiB,
            "note": (f"ratio = peak worker USS anchor/ours; per worker USS {anchor['uss'] / MiB:.0f} vs "
                     f"{ours['uss'] / MiB:.0f} MiB, PSS {anchor['pss'] / MiB:.0f} vs {ours['pss'] / MiB:.0f} MiB, "
                     f"RSS {anchor['rss'] / MiB:.0f} vs {ours['rss'] / MiB:.0f} MiB; USS growth during the epoch "
                     f"{anchor['growth'] / MiB:.0f} vs {ours['growth'] / MiB:.0f} MiB; parent RSS "
                     f"{anchor['parent_rss'] / MiB:.0f} vs {ours['parent_rss'] / MiB:.0f} MiB"
                     + (f"; {tokens:,} tokens" if tokens else "") + "; ms = one epoch"),
        })
    return rows


if __name__ == "__main__":
    if "--measure" in sys.argv:
        case, count = sys.argv[sys.argv.index("--measure") + 1], int(sys.argv[sys.argv.index("--measure") + 2])
        print(json.dumps(measure(case, count)))
    else:
        for result in run(quick="--quick" in sys.argv):
            print(result)
