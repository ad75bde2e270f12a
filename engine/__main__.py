"""Command line: ``python -m engine demo [--quick] [--max-steps N] [--tasks lm,cls,...]`` and
``python -m engine verify-resume script.py [--steps N] [--at K] [--world W] [--to-world W2]``.

The demo lives in its own package, ``demo`` (``python -m demo``); this entry point keeps the documented command.
``verify-resume`` checks that the data module a script defines resumes exactly (docs/reproducibility.md).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv``; return the exit code (0 on success; 1 if a demo task's loss did not fall, or if
    the module did not resume exactly)."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="Universal data module engine.")
    parser.add_argument("command", choices=["demo", "verify-resume"],
                        help="demo: train a tiny model per preset task; verify-resume: check a module's resume")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command == "verify-resume":
        from engine.tools.verify_resume import main as verify_main

        return verify_main(rest)
    from demo.__main__ import main as demo_main

    return demo_main(rest)


if __name__ == "__main__":
    sys.exit(main())
