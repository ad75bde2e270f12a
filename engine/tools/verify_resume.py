"""Resume you can prove: for a user's own module, N steps equal k steps + save + load + (N - k) steps, and a save on
W ranks resumed on W' ranks serves every row of its epoch once.

:func:`verify_resume` builds every module it runs afresh from the module's own constructor arguments
(``UniversalDataModule`` records them), so the module given is left untouched:

- **exact resume**: an uninterrupted run of ``steps`` training batches; a second run of ``at`` batches whose
  ``state_dict()`` goes through ``torch.save`` / ``torch.load(weights_only=True)`` (as a checkpoint does) into a
  third module, which serves the other ``steps - at``. Each batch is digested (a hash of every tensor's dtype, shape
  and bytes, per key) and the first step where the runs part is named with what differs: keys, shapes or values.
  A difference before the save means the batches are not a function of the seed at all (a collator or a source that
  draws from global randomness, rows that change between reads).
- **elastic resume** (``world`` -> ``to_world`` ranks, simulated in this process with the same global batch): the
  samplers of ``world`` ranks step ``at`` batches; rank 0's state is loaded by each of ``to_world`` ranks, which
  serve the rest of the epoch. Row ids are the samplers' indices; every row of the epoch's order must be served
  once, except for the padding that gives every rank the same number of steps (``uneven='pad'``: a rank's last
  batch, or whole trailing batches under a token budget) and the rows a fresh epoch on ``to_world`` ranks leaves
  out too (``uneven='drop'``, ``drop_last``). The simulated ranks sample in this process (``num_workers=0``): the
  samplers run in the parent whatever the workers, so the rows are the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import runpy
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.core.checks import check_int
from engine.core.compat import sampler_state_of
from engine.core.stateful import readable_state
from engine.sampling.modes import BUDGET_MODES

Digest = dict[str, tuple[str, tuple[int, ...], str]]
"""One batch: for each key (``input_ids``, ``pixel_values.0``), its dtype, shape and a hash of its values."""


@dataclasses.dataclass(frozen=True)
class Difference:
    """Where two runs' batches first part: the step, whether before the save or after the resume, and what differs."""

    step: int
    phase: str
    """``'before the save'`` (the batches are not a function of the seed) or ``'after the resume'``."""
    keys: tuple[str, ...]
    """Keys one batch has and the other lacks."""
    shapes: tuple[str, ...]
    """Keys whose dtype or shape differ, as ``key: (shape) vs (shape)``."""
    values: tuple[str, ...]
    """Keys of the same dtype and shape whose values differ."""

    def __str__(self) -> str:
        parts = [f"keys {list(self.keys)}" if self.keys else "", f"shapes {list(self.shapes)}" if self.shapes else "",
                 f"values of {list(self.values)}" if self.values else ""]
        return f"step {self.step} ({self.phase}): " + "; ".join(part for part in parts if part)


@dataclasses.dataclass(frozen=True)
class ElasticCheck:
    """The rows of one epoch served by ``world`` ranks before a save and ``to_world`` ranks after it."""

    world: int
    to_world: int
    epoch: int
    rows: int
    """Rows in the epoch's order (a row counted once per copy, where a mixture cycles a source)."""
    served_before: int
    served_after: int
    repeated: tuple[int, ...]
    """Row ids served more often than the epoch holds them, beyond the last batches' padding."""
    missing: tuple[int, ...]
    """Row ids of the epoch never served, beyond what a fresh epoch on ``to_world`` ranks leaves out."""

    @property
    def passed(self) -> bool:
        """Whether every row of the epoch was served once."""
        return not self.repeated and not self.missing


@dataclasses.dataclass(frozen=True)
class ResumeCheck:
    """What :func:`verify_resume` found: the digests per step of both runs, the first difference, the elastic check."""

    steps: int
    at: int
    reference: tuple[str, ...]
    """Digest of each step of the uninterrupted run."""
    resumed: tuple[str, ...]
    """Digest of each step of the run saved after ``at`` steps and resumed in a fresh module."""
    difference: Difference | None
    elastic: ElasticCheck | None

    @property
    def passed(self) -> bool:
        """Whether the resumed run served the uninterrupted run's batches and the elastic check (if run) passed."""
        return self.difference is None and (self.elastic is None or self.elastic.passed)

    def table(self) -> str:
        """A text table: one line per step with both digests, then the verdicts."""
        lines = [f"{'step':>5}  {'uninterrupted':<16}  {'resumed':<16}  ", "-" * 48]
        for step, (ours, theirs) in enumerate(zip(self.reference, self.resumed)):
            mark = ("" if ours == theirs else "DIFFERS") + ("  <- first after the load" if step == self.at else "")
            lines.append(f"{step:>5}  {ours:<16}  {theirs:<16}  {mark}")
        lines.append(f"exact resume at step {self.at} of {self.steps}: "
                     + ("passed" if self.difference is None else f"FAILED, first difference at {self.difference}"))
        if self.elastic is not None:
            check = self.elastic
            verdict = "passed" if check.passed else (f"FAILED, {len(check.repeated)} rows repeated "
                                                     f"{list(check.repeated[:8])}, {len(check.missing)} missing "
                                                     f"{list(check.missing[:8])}")
            lines.append(f"elastic resume {check.world} -> {check.to_world} ranks (epoch {check.epoch}, {check.rows} "
                         f"rows: {check.served_before} before the save, {check.served_after} after): {verdict}")
        return "\n".join(lines)


def digest(batch: Any) -> Digest:
    """Each tensor of ``batch`` (a dict, list or tuple of them, nested) by its key path: dtype, shape and a hash of
    its bytes; other values (a packed batch's ``max_length_q``) by their repr."""
    found: Digest = {}
    for key, value in _leaves(batch, ""):
        if torch.is_tensor(value):
            data = value.detach().cpu().contiguous()
            raw = data.view(torch.uint8) if data.dtype != torch.bool and data.numel() else data.to(torch.uint8)
            found[key] = (str(data.dtype), tuple(data.shape), hashlib.blake2b(raw.numpy().tobytes(),
                                                                              digest_size=8).hexdigest())
        else:
            found[key] = (type(value).__name__, (), hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest())
    return found


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            yield from _leaves(value[key], f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)) and any(torch.is_tensor(item) or isinstance(item, (Mapping, list, tuple))
                                                  for item in value):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}.{index}" if path else str(index))
    else:
        yield path or "batch", value


def step_hash(found: Digest) -> str:
    """One hash of a batch's :func:`digest`, as the table prints it."""
    return hashlib.blake2b(repr(sorted(found.items())).encode(), digest_size=8).hexdigest()


def compare(step: int, phase: str, ours: Digest, theirs: Digest) -> Difference | None:
    """What differs between two digests of step ``step``, or None when they are equal."""
    if ours == theirs:
        return None
    keys = tuple(sorted(set(ours) ^ set(theirs)))
    common = sorted(set(ours) & set(theirs))
    shapes = tuple(f"{key}: {ours[key][0]}{list(ours[key][1])} vs {theirs[key][0]}{list(theirs[key][1])}"
                   for key in common if ours[key][:2] != theirs[key][:2])
    values = tuple(key for key in common if ours[key][:2] == theirs[key][:2] and ours[key][2] != theirs[key][2])
    return Difference(step, phase, keys, shapes, values)


def twin(dm: Any, **changes: Any) -> Any:
    """A fresh module built as ``dm`` was (its recorded constructor arguments), with ``changes``."""
    return type(dm)(**{**dm.constructor_arguments, **changes})


def take(loader: Any, steps: int) -> list[Digest]:
    """The digests of ``steps`` batches of ``loader``, passing epochs as a plain training loop does."""
    found: list[Digest] = []
    while len(found) < steps:
        before = len(found)
        for batch in loader:
            found.append(digest(batch))
            if len(found) == steps:
                break
        if len(found) == before:
            raise ValueError("the train loader served no batch in a whole epoch; verify_resume needs training data")
    return found


def through_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` after ``torch.save`` and ``torch.load(weights_only=True)``, as a Lightning checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def verify_resume(dm: Any, *, steps: int = 8, at: int | None = None, world: int | None = 2,
                  to_world: int | None = 1) -> ResumeCheck:
    """Check that ``dm``'s configuration resumes exactly, and (with ``world`` and ``to_world``) elastically.

    Args:
        dm: A ``UniversalDataModule``; it is not iterated: every run builds a fresh one from its arguments.
        steps: Training batches of the uninterrupted run (N).
        at: The step after which the second run saves and a fresh module loads (k); default ``steps // 2``.
        world, to_world: Ranks that save and ranks that resume, simulated in this process with the same global
            batch; None skips the elastic check.

    Returns:
        A :class:`ResumeCheck`: ``passed``, the digests per step, the first difference, the elastic check;
        ``print(check.table())`` shows them.

    Raises:
        ValueError: ``steps``, ``at`` or the ranks are out of range, or the ranks do not divide the global batch.

    Example:
        >>> check = verify_resume(dm, steps=6, at=2)  # doctest: +SKIP
        >>> check.passed, check.difference  # doctest: +SKIP
        (True, None)
    """
    steps = check_int("steps", steps, minimum=2)
    at = steps // 2 if at is None else check_int("at", at, minimum=1)
    if at >= steps:
        raise ValueError(f"at should be a step before steps={steps} (the save happens after `at` steps and the "
                         f"resumed run serves the rest), but got at={at}; pass at between 1 and {steps - 1}")
    if (world is None) != (to_world is None):
        raise ValueError(f"world and to_world should be given together (the ranks that save and the ranks that "
                         f"resume), but got world={world} and to_world={to_world}; pass both, or None for both")
    per_rank = _per_rank(dm, world, to_world) if world is not None else None
    reference = take(twin(dm).train_dataloader(), steps)
    first = twin(dm)
    before = take(first.train_dataloader(), at)
    state = through_checkpoint(first.state_dict())
    resumed = twin(dm)
    resumed.load_state_dict(state)
    after = before + take(resumed.train_dataloader(), steps - at)
    difference = next((found for step, (ours, theirs) in enumerate(zip(reference, after))
                       if (found := compare(step, "before the save" if step < at else "after the resume", ours,
                                            theirs)) is not None), None)
    elastic = _elastic(dm, per_rank, world, to_world, at) if per_rank is not None else None
    return ResumeCheck(steps, at, tuple(map(step_hash, reference)), tuple(map(step_hash, after)), difference, elastic)


def _per_rank(dm: Any, world: int, to_world: int) -> Callable[[int], dict[str, Any]]:
    """The arguments giving each number of ranks ``dm``'s global batch (rows, or tokens under a token budget)."""
    world, to_world = check_int("world", world, minimum=1), check_int("to_world", to_world, minimum=1)
    dm.setup()
    name = "max_tokens" if dm.batching in BUDGET_MODES else "batch_size"
    total = (dm.max_tokens if name == "max_tokens" else dm.train_config.batch_size) * dm.world_size
    for argument, ranks in (("world", world), ("to_world", to_world)):
        if total % ranks:
            raise ValueError(f"{argument} should divide the global batch ({name}={total // dm.world_size} x "
                             f"{dm.world_size} ranks = {total}), so that every rank serves an equal share of each "
                             f"step, but got {argument}={ranks}; pass a divisor of {total}")
    return lambda ranks: {name: total // ranks, "num_workers": 0, "num_threads": 0}


def on_rank(dm: Any, rank: int, world: int) -> Any:
    """``dm`` as rank ``rank`` of ``world`` sees itself: the module's ``_world`` hook answers for it, whether it
    reads ``torch.distributed`` (``DataModule``) or a trainer (``UniversalDataModule``)."""
    dm._world = lambda: (rank, world)
    return dm


def _elastic(dm: Any, per_rank: Callable[[int], dict[str, Any]], world: int, to_world: int, at: int) -> ElasticCheck:
    """Simulated ranks: ``world`` samplers step ``at`` batches, ``to_world`` samplers load rank 0's state and finish
    the epoch; the module's ``load_state_dict`` checks the state first, as in a real resume."""
    served: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(world):
        saving = on_rank(twin(dm, **per_rank(world)), rank, world)
        sampler, batches = saving.train_dataloader().batch_sampler, []
        while len(batches) < at:
            batches += [(batch.epoch, list(batch)) for batch in _one_pass(sampler, at - len(batches))]
        epoch = sampler.state_dict()["epoch"]
        served += [row for batch_epoch, rows in batches if batch_epoch == epoch for row in rows]
        if rank == 0:
            state = through_checkpoint(saving.state_dict())
    rests: list[list[list[int]]] = []
    fresh: list[int] = []
    for rank in range(to_world):
        resuming = on_rank(twin(dm, **per_rank(to_world)), rank, to_world)
        resuming.load_state_dict(state)  # the module's checks of identity and position
        sampler = resuming.train_dataloader().batch_sampler
        sampler.load_state_dict(sampler_state_of(readable_state(state, resuming.state_leaf())["train_loader"]))
        rests.append([list(batch) for batch in _one_pass(sampler, None)])
        order = sampler.epoch_order(epoch)
        clean = on_rank(twin(dm, **per_rank(to_world)), rank, to_world).train_dataloader().batch_sampler
        fresh += [row for rows in clean.epoch_batches(epoch) for row in rows]
    after = [row for rest in rests for rows in rest for row in rows]
    padding = Counter(row for rows in _padding(rests) for row in rows)
    rows = Counter(int(row) for row in order)
    total = Counter(served) + Counter(after)
    repeated = (total - rows) - padding
    left_out = rows - Counter(fresh)
    missing = rows - total
    allowed = sum(left_out.values())
    return ElasticCheck(world, to_world, epoch, sum(rows.values()), len(served), len(after),
                        tuple(sorted(repeated.elements())),
                        tuple(sorted(missing.elements())) if sum(missing.values()) > allowed else ())


def _padding(ranks: list[list[list[int]]]) -> list[list[int]]:
    """The batches that may repeat rows to give every rank the same number of steps: each rank's last batch
    (``uneven='pad'`` tops it up with rows from the start of the order) and, before it, the trailing batches that
    repeat a batch served earlier on any rank (a token budget pads with whole batches)."""
    padding = []
    for number, batches in enumerate(ranks):
        others = {tuple(batch) for other, theirs in enumerate(ranks) if other != number for batch in theirs}
        end = len(batches) - 1
        while end > 0 and (tuple(batches[end]) in others or batches[end] in batches[:end]):
            end -= 1
        padding += batches[max(end, 0):]
    return padding


def _one_pass(sampler: Any, limit: int | None) -> Iterator[Any]:
    """Up to ``limit`` batches (all if None) of one pass of ``sampler``."""
    if limit == 0:
        return
    for count, batch in enumerate(sampler, start=1):
        yield batch
        if count == limit:  # before the sampler steps past the batch this pass stops at
            return


FACTORY = "make_datamodule"
"""What a script given to ``python -m engine verify-resume`` defines: a function of no arguments that returns the
module (called once; the check builds its runs from the module's arguments), or else a module named ``dm``."""


def load_script(path: str | Path) -> Any:
    """The module a script defines: ``make_datamodule()``'s, else its top-level ``dm``. The script runs as
    ``__main__`` would not (``__name__`` is ``'__verify_resume__'``), so a training loop under
    ``if __name__ == '__main__':`` does not start."""
    script = Path(path)
    if not script.is_file():
        raise FileNotFoundError(f"script should be a Python file that defines {FACTORY}() or dm, but got "
                                f"script={str(path)!r}, which is not a file")
    names = runpy.run_path(str(script), run_name="__verify_resume__")
    if callable(names.get(FACTORY)):
        return names[FACTORY]()
    if "dm" in names:
        return names["dm"]
    raise ValueError(f"script {str(path)!r} should define {FACTORY}() (returning the data module) or a top-level "
                     f"dm, but defines neither; add def {FACTORY}(): return UniversalDataModule(...)")


def main(argv: Sequence[str]) -> int:
    """``python -m engine verify-resume script.py [--steps N] [--at K] [--world W] [--to-world W2]``: print the
    table and return 0 if the resume is exact (and elastic), else 1."""
    parser = argparse.ArgumentParser(prog="python -m engine verify-resume",
                                     description="Check that a data module's configuration resumes exactly.")
    parser.add_argument("script", help=f"a Python file defining {FACTORY}() or a top-level dm")
    parser.add_argument("--steps", type=int, default=8, help="training batches of the uninterrupted run (N)")
    parser.add_argument("--at", type=int, default=None, help="the step after which to save and load (default N // 2)")
    parser.add_argument("--world", type=int, default=2, help="ranks that save, simulated (0: no elastic check)")
    parser.add_argument("--to-world", type=int, default=1, help="ranks that resume, simulated")
    args = parser.parse_args(list(argv))
    elastic = {"world": args.world, "to_world": args.to_world} if args.world else {"world": None, "to_world": None}
    check = verify_resume(load_script(args.script), steps=args.steps, at=args.at, **elastic)
    print(check.table())
    return 0 if check.passed else 1
