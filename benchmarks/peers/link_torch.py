"""Puts an installed torch (and torchvision) into another virtualenv by hard links, with the packages they need.

PyPI's Linux wheel of torch is the CUDA build (several GiB with its nvidia-* wheels); the project's .venv already
has torch, so the peers' virtualenv takes that one instead of downloading it again. For each distribution in the
closure of ``torch`` and ``torchvision``'s requirements (markers evaluated, extras left out) that is installed in
the source, every file its RECORD lists under site-packages is hard-linked (copied where the two folders are on
different filesystems) to the same place in the target's site-packages, its ``.dist-info`` included, so pip sees
it as installed and resolves the rest around it. Files outside site-packages (console scripts, whose first line
names the source's interpreter) are left out. Usage::

    .venv-peers/bin/python benchmarks/peers/link_torch.py /path/to/.venv
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from importlib.metadata import Distribution, distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOTS = ("torch", "torchvision")


def site_packages(venv: Path) -> Path:
    """The site-packages folder of ``venv`` (same Python version as this interpreter)."""
    found = sorted(venv.glob("lib/python*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"venv should hold one lib/python*/site-packages folder, but got {found} in {venv}")
    return found[0]


def closure(installed: dict[str, Distribution]) -> list[Distribution]:
    """``ROOTS`` and every distribution they require, transitively, that ``installed`` holds."""
    todo, seen = list(ROOTS), set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name not in installed:
            continue
        seen.add(name)
        for line in installed[name].requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    missing = [root for root in ROOTS if canonicalize_name(root) not in seen]
    if missing:
        raise SystemExit(f"the source venv should have {missing} installed, but it does not")
    return [installed[name] for name in sorted(seen)]


def link_tree(dist: Distribution, source: Path, target: Path) -> int:
    """Links ``dist``'s files under ``source`` to the same paths under ``target``; returns how many."""
    count = 0
    for entry in dist.files or []:
        path = (source / entry).resolve()
        if not path.is_relative_to(source.resolve()) or not path.is_file():
            continue  # console scripts (../../bin) and files RECORD names but the install no longer has
        dest = target / path.relative_to(source.resolve())
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.unlink()
        try:
            os.link(path, dest)
        except OSError:  # another filesystem
            shutil.copy2(path, dest)
        count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python link_torch.py /path/to/source/venv (the target is this interpreter's venv)")
    source = site_packages(Path(argv[0]))
    target = Path(sysconfig.get_paths()["purelib"])
    if source.resolve() == target.resolve():
        raise SystemExit(f"the source venv should differ from this interpreter's, but both are {source}")
    installed = {canonicalize_name(d.metadata["Name"]): d for d in distributions(path=[str(source)])}
    for dist in closure(installed):
        print(f"linked {dist.metadata['Name']} {dist.version}: {link_tree(dist, source, target)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
