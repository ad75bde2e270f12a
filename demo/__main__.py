"""Command line: ``python -m demo [--quick] [--max-steps N] [--tasks lm,cls,...]`` (also ``python -m engine demo``)."""

from __future__ import annotations

import argparse
import sys


def _tasks(value: str) -> tuple[str, ...]:
    from demo.run import TASKS

    tasks = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in tasks if name not in TASKS]
    if not tasks or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(TASKS)} (comma-separated), but got {value!r}")
    return tasks


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 2:
        raise argparse.ArgumentTypeError(f"should be an int >= 2, but got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m demo",
                                     description="Train a tiny model per preset task on the bundled sample data.")
    parser.add_argument("--quick", action="store_true", help="fewer steps and smaller datasets")
    parser.add_argument("--max-steps", type=_positive, default=None, help="training steps per task")
    parser.add_argument("--tasks", type=_tasks, default=None, help="comma-separated subset of the tasks")
    parser.add_argument("--reports", default="reports", metavar="DIR",
                        help="folder for one HTML data report per task (default: reports); '' writes none")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv``; return the exit code (0 on success, 1 if a task's loss did not fall)."""
    args = build_parser().parse_args(argv)
    from demo.run import TASKS, run_demo

    rows = run_demo(quick=args.quick, max_steps=args.max_steps, tasks=args.tasks or TASKS,
                    report_dir=args.reports or None)
    stuck = [row for row in rows if not row["loss_end"] < row["loss_start"]]
    for row in stuck:
        print(f"error: the {row['task']} loss did not fall ({row['loss_start']:.3f} -> "
              f"{row['loss_end']:.3f}); the demo's data or model is broken", file=sys.stderr)
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
