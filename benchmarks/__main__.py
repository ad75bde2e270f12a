"""``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``: run every ``benchmarks/bench_*.py``, print one
table and write it to ``DIR/full.md`` (or ``DIR/quick.md``).

Each module's ``run(quick)`` verifies equal outputs between its anchor and our path before timing (and raises if
they differ). Comparisons run single-threaded (``torch.set_num_threads(1)``); a module that fails is reported
and the exit status is 1. A run of only some benchmarks (``--only``) writes its table only where ``--out`` is given,
so that it never replaces the whole table in ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import shlex
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import benchmarks
from benchmarks._harness import LEGEND, format_table, machine, write_results

RESULTS = Path(benchmarks.__file__).resolve().parent / "results"
"""Where the whole run's table is written unless ``--out`` says otherwise."""


def discover() -> list[str]:
    """Names (without the ``bench_`` prefix) of the benchmark modules, sorted."""
    return sorted(info.name[len("bench_"):] for info in pkgutil.iter_modules(benchmarks.__path__)
                  if info.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks that ``argv`` selects, print the table, write it as Markdown; 1 if any module failed."""
    argv = sys.argv[1:] if argv is None else argv
    names = discover()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer repeats (about a minute)")
    parser.add_argument("--only", action="append", metavar="NAME", choices=names,
                        help=f"run only this benchmark (repeatable); one of: {', '.join(names)}")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="folder for the Markdown table, full.md or quick.md (default benchmarks/results; "
                             "with --only, written only where --out is given)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine_lines = machine()
    print("\n".join(machine_lines))
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    start = time.perf_counter()
    for name in args.only or names:
        began = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            rows.extend(module.run(quick=args.quick))
        except Exception:  # report every module's failure, then exit non-zero
            failed.append(name)
            print(f"\nbenchmark {name!r} FAILED:\n{traceback.format_exc()}", file=sys.stderr)
        print(f"  {name}: {time.perf_counter() - began:.1f} s", flush=True)
    seconds = time.perf_counter() - start
    mode = "quick" if args.quick else "full"
    print(f"\n{mode} run, {seconds:.0f} s; {LEGEND}\n")
    print(format_table(rows))
    out = args.out or (None if args.only else RESULTS)
    if out is not None:
        path = write_results(out / f"{mode}.md", rows, mode=mode,
                             command=shlex.join(["python", "-m", "benchmarks", *argv]),
                             machine_lines=machine_lines, date=date, seconds=seconds, failed=failed)
        print(f"\ntable written to {path}")
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
