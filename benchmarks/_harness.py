"""Shared pieces of the benchmarks: timing (min over repeats), result rows, output checks, the machine, the tables.

Timings on a shared machine are noisy in one direction only (other work makes a run slower, never faster), so
every figure is the best of several repeats, and anchor and ours are timed in the same process on the same data.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

COLUMNS = ("benchmark", "case", "anchor", "anchor_ms", "ours_ms", "ratio", "throughput", "target", "met", "note")
HEADERS = {"anchor_ms": "anchor ms", "ours_ms": "ours ms"}
RIGHT_ALIGNED = frozenset({"anchor_ms", "ours_ms", "ratio"})
PERFORMANCE_DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
"""The page that says what each benchmark measures and how; the results files link to it."""
LEGEND = ("ratio = anchor ms / ours ms (> 1: ours is faster); ms are the best of several repeats, single thread "
          "unless the case says workers")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Ids 0..4 of the benchmark tokenizer: pad 0, unk 1, cls 2, sep 3, mask 4 (BERT-like, words from id 5)."""


class OutputMismatch(AssertionError):
    """The anchor and our path disagree: the benchmark refuses to time different work."""


def best_seconds(fn: Callable[[], Any], *, repeats: int, number: int = 1, warmup: int = 1) -> float:
    """Best (minimum) over ``repeats`` of the mean time of ``number`` calls of ``fn``, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def result(benchmark: str, case: str, *, anchor: str, anchor_s: float, ours_s: float, target: str | None = None,
           minimum: float | None = None, throughput: str | None = None, note: str = "") -> dict[str, Any]:
    """One row of the table; ``met`` is ``ratio >= minimum`` when a minimum ratio is the target, else None."""
    ratio = anchor_s / ours_s
    return {
        "benchmark": benchmark, "case": case, "anchor": anchor, "anchor_ms": anchor_s * 1e3, "ours_ms": ours_s * 1e3,
        "ratio": ratio, "throughput": throughput, "target": target,
        "met": None if minimum is None else bool(ratio >= minimum), "note": note,
    }


def mtok(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds / 1e6:.1f} Mtok/s"


def check_same(ours: Mapping[str, Any], theirs: Mapping[str, Any], keys: Iterable[str], what: str) -> None:
    """Raise :class:`OutputMismatch` unless ``ours[key]`` and ``theirs[key]`` are equal tensors for every key."""
    for key in keys:
        a, b = torch.as_tensor(ours[key]), torch.as_tensor(theirs[key])
        if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
            raise OutputMismatch(f"{what}: {key!r} differs (ours {tuple(a.shape)}, anchor {tuple(b.shape)})")


@functools.lru_cache(maxsize=1)
def tokenizer(vocab: int = 30_000) -> Any:
    """A BERT-like fast tokenizer built locally (WordLevel over ``w0..w{vocab-1}``): nothing is downloaded."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {token: index for index, token in enumerate([*SPECIALS, *(f"w{i}" for i in range(vocab))])}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]")), pad_token="[PAD]",
        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def token_lists(count: int, low: int, high: int, *, seed: int, vocab: int = 30_005) -> list[list[int]]:
    """``count`` lists of word ids (>= 5, so never a special id), lengths uniform in ``[low, high]``."""
    rng = np.random.default_rng(seed)
    return [rng.integers(len(SPECIALS), vocab, int(n)).tolist() for n in rng.integers(low, high + 1, count)]


def machine() -> list[str]:
    """CPU model, cores, torch threads and library versions, one fact per line."""
    import datasets
    import pyarrow
    import torchdata
    import transformers

    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{value:.2f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [
        f"CPU: {model}; {os.cpu_count()} logical cores ({usable} usable); load average at start {load}",
        f"torch threads: {torch.get_num_threads()} (single-thread comparisons); {platform.platform()}",
        f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"transformers {transformers.__version__}, datasets {datasets.__version__}, pyarrow {pyarrow.__version__}, "
        f"torchdata {getattr(torchdata, '__version__', '?')}",
    ]


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column in ("anchor_ms", "ours_ms"):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    if column == "ratio":
        return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"
    if column == "met":
        return "yes" if value else "NO"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, columns aligned; the free-text note goes last, unpadded."""
    cells = [[_cell(column, row.get(column)) for column in COLUMNS] for row in rows]
    titles = [HEADERS.get(column, column) for column in COLUMNS]
    widths = [max(len(title), *(len(line[i]) for line in cells)) for i, title in enumerate(titles)]

    def line(values: list[str]) -> str:
        padded = [value.rjust(width) if column in RIGHT_ALIGNED else value.ljust(width)
                  for column, value, width in zip(COLUMNS[:-1], values[:-1], widths[:-1])]
        return " | ".join([*padded, values[-1]]).rstrip()

    rule = "-+-".join("-" * width for width in widths[:-1]) + "-+-" + "-" * len(titles[-1])
    return "\n".join([line(titles), rule, *(line(values) for values in cells)])


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The same table in Markdown: one row per result, ``|`` in a cell escaped, the figures right-aligned."""
    def line(values: Iterable[str]) -> str:
        return "| " + " | ".join(value.replace("|", "\\|") for value in values) + " |"

    rule = "|" + "|".join("---:" if column in RIGHT_ALIGNED else "---" for column in COLUMNS) + "|"
    body = (line(_cell(column, row.get(column)) for column in COLUMNS) for row in rows)
    return "\n".join([line(HEADERS.get(column, column) for column in COLUMNS), rule, *body])


def write_results(path: Path, rows: list[dict[str, Any]], *, mode: str, command: str, machine_lines: Sequence[str],
                  date: str, seconds: float, failed: Sequence[str] = ()) -> Path:
    """Write the run's table to ``path`` as Markdown, headed by the machine, the command and the date.

    Args:
        path: the file to write (its folder is created); an existing file is replaced.
        rows: the result rows (see :func:`result`), in the order they were measured.
        mode: ``"full"`` or ``"quick"``, for the title.
        command: the command line that produced them, to regenerate the file.
        machine_lines: what :func:`machine` returned at the start of the run.
        date: when the run started (e.g. ``2025-01-31 14:05 UTC``).
        seconds: the run's wall time.
        failed: the benchmarks that raised (their rows are missing from the table).

    Returns:
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    method = Path(os.path.relpath(PERFORMANCE_DOC, path.parent.resolve())).as_posix()
    lines = [
        f"# Benchmark results: {mode} run",
        "",
        f"Written by `{command}`; regenerate it with the same command rather than editing it. What each benchmark "
        f"measures, and how, is in [docs/performance.md]({method}).",
        "",
        f"- date: {date}",
        *(f"- {fact}" for fact in machine_lines),
        f"- wall time: {seconds:.0f} s",
        *([f"- **failed** (rows missing): {', '.join(failed)}"] if failed else []),
        "",
        LEGEND + ".",
        "",
        markdown_table(rows),
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
