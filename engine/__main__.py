"""Command line: ``python -m engine demo [--quick] [--max-steps N] [--tasks lm,cls,...]``."""

from __future__ import annotations

import argparse
import sys


def _tasks(value: str) -> tuple[str, ...]:
    from engine.demo import TASKS

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
    parser = argparse.ArgumentParser(prog="python -m engine", description="Universal data module engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a tiny model per preset task on bundled sample data")
    demo.add_argument("--quick", action="store_true", help="fewer steps and smaller datasets")
    demo.add_argument("--max-steps", type=_positive, default=None, help="training steps per task")
    demo.add_argument("--tasks", type=_tasks, default=None, help="comma-separated subset of the tasks")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv``; return the exit code (0 on success, 1 if a task's loss did not fall)."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from engine.demo import TASKS, run_demo

        rows = run_demo(quick=args.quick, max_steps=args.max_steps, tasks=args.tasks or TASKS)
        stuck = [row for row in rows if not row["loss_end"] < row["loss_start"]]
        if stuck:
            for row in stuck:
                print(f"error: the {row['task']} loss did not fall ({row['loss_start']:.3f} -> "
                      f"{row['loss_end']:.3f}); the demo's data or model is broken", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
