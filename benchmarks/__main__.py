"""``python -m benchmarks [--quick] [--only NAME ...]``: run every ``benchmarks/bench_*.py`` and print one table.

Each module's ``run(quick)`` verifies equal outputs between its anchor and our path before timing (and raises if
they differ). Comparisons run single-threaded (``torch.set_num_threads(1)``); a module that fails is reported
and the exit status is 1.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
import traceback
from typing import Any

import torch

import benchmarks
from benchmarks._harness import format_table, machine


def discover() -> list[str]:
    """Names (without the ``bench_`` prefix) of the benchmark modules, sorted."""
    return sorted(info.name[len("bench_"):] for info in pkgutil.iter_modules(benchmarks.__path__)
                  if info.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    names = discover()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer repeats (about a minute)")
    parser.add_argument("--only", action="append", metavar="NAME", choices=names,
                        help=f"run only this benchmark (repeatable); one of: {', '.join(names)}")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("\n".join(machine()))
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
    mode = "quick" if args.quick else "full"
    print(f"\n{mode} run, {time.perf_counter() - start:.0f} s; ratio = anchor ms / ours ms (> 1: ours is faster); "
          f"ms are the best of several repeats, single thread unless the case says workers\n")
    print(format_table(rows))
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
