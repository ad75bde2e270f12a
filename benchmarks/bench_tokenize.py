"""Tokenizing raw text at scale: the module's path (``num_proc=2`` processes, into the on-disk cache that every
rank then memory-maps) beside a plain ``Dataset.map`` in one process, on >= 1M short rows (100k with --quick).

Each side runs in a fresh subprocess on the same rows. Its peak memory is sampled while it tokenizes: the PSS
(proportional set size, so pages a forked worker shares with its parent count once) of the process and all its
workers, above what the process held before. The outputs are checked equal (Arrow columns) before any figure is
printed. The tokenizer is the demo's byte-level BPE, trained locally: nothing is downloaded. The anchor's fast
tokenizer may already use both cores for encoding (Rust threads, ``TOKENIZERS_PARALLELISM`` unset), as it does
for users.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from benchmarks._harness import OutputMismatch, result

ROWS, QUICK_ROWS, NUM_PROC = 1_000_000, 100_000, 2
TARGET = f">= 1.7x faster with num_proc={NUM_PROC} on 2 cores"


def rows(count: int) -> Any:
    """``count`` short rows of text: the bundled corpus's lines (1 to 3 sentences), numbered so none repeats."""
    import datasets

    from demo.sample_data import load_corpus

    corpus = load_corpus()
    return datasets.Dataset.from_dict({"text": [f"{corpus[i % len(corpus)]} ({i})" for i in range(count)]})


def side(which: str, count: int, out: str) -> dict[str, Any]:
    """Run one side in this process: tokenize ``count`` rows, save the token column for the check, time it."""
    from demo.sample_data import build_tokenizer
    from engine.sources.tokenizing.preprocess import tokenize_cached, tokenize_dataset
    from engine.sources.tokenizing.token_cache import TokenCache
    from task_spec import TaskSpec

    data, tokenizer, spec = rows(count), build_tokenizer(), TaskSpec.lm_tiny()
    with PeakMemory() as memory:
        start = time.perf_counter()
        if which == "anchor":  # what users write: one process, the result held in memory
            tokenized = tokenize_dataset(data, spec, tokenizer)
        else:  # the module's setup: num_proc processes into the cache, memory-mapped back
            tokenized = tokenize_cached(data, spec, tokenizer, TokenCache(out, NUM_PROC))
        seconds = time.perf_counter() - start
    tokenized.select_columns(["input_ids"]).to_parquet(os.path.join(out, f"{which}.parquet"))
    return {"seconds": seconds, "before_mb": memory.before / 2**20, "peak_mb": memory.peak / 2**20}


class PeakMemory:
    """Samples the PSS of this process and its workers every 50 ms; ``peak`` is the largest sum above ``before``."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.before, self.peak = self.pss(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def pss(self) -> int:
        total = 0
        for process in [self.process, *self.process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a worker that just ended
                total += process.memory_full_info().pss
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.pss() - self.before)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.pss() - self.before)


def measure(which: str, count: int, out: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.bench_tokenize", "--side", which, str(count), out]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ})
    if done.returncode:
        raise RuntimeError(f"the {which} side failed:\n{done.stderr[-3000:]}")
    print(f"  tokenize, {which}: {done.stdout.strip().splitlines()[-1]}", file=sys.stderr, flush=True)  # kept early
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    count = QUICK_ROWS if quick else ROWS
    with tempfile.TemporaryDirectory() as out:
        anchor, ours = measure("anchor", count, out), measure("ours", count, out)
        theirs_ids, our_ids = (pq.read_table(os.path.join(out, f"{name}.parquet")) for name in ("anchor", "ours"))
        if not theirs_ids.column("input_ids").equals(our_ids.column("input_ids")):
            raise OutputMismatch("tokenize: the cached num_proc tokenization differs from Dataset.map's")
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    note = (f"peak memory above the {anchor['before_mb']:.0f} MB held before (PSS, workers included): anchor "
            f"{anchor['peak_mb']:.0f} MB, ours {ours['peak_mb']:.0f} MB; {os.cpu_count()} cores, load average "
            f"{load} after the run (the machine is shared)")
    return [result("tokenize", f"{count:,} short rows, num_proc={NUM_PROC} + on-disk cache", anchor="Dataset.map",
                   anchor_s=anchor["seconds"], ours_s=ours["seconds"], target=TARGET, minimum=1.7,
                   throughput=f"{count / ours['seconds'] / 1e3:.0f}k rows/s", note=note)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(side(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        from benchmarks._harness import format_table

        print(format_table(run(quick="--quick" in sys.argv)))
