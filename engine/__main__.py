"""Command line: ``python -m engine demo [--quick] [--max-steps N] [--tasks lm,cls,...]``.

The demo lives in its own package, ``demo`` (``python -m demo``); this entry point keeps the documented command.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv``; return the exit code (0 on success, 1 if a demo task's loss did not fall)."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="Universal data module engine.")
    parser.add_argument("command", choices=["demo"], help="demo: train a tiny model per preset task")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    from demo.__main__ import main as demo_main

    return demo_main(rest)


if __name__ == "__main__":
    sys.exit(main())
