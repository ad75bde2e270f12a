"""Each epoch's order of a mixture: which source every position draws from, and which of its rows.

The sources are laid end to end (source ``s``'s row ``i`` is row ``offsets[s] + i`` of the mixed source). An epoch
is cut into *blocks* of ``block`` positions (the global batch under plain and grouped batching, so a block is one
training step); :mod:`engine.sampling.mixtures.plan` sets how many rows of each source every block takes, keeping
each source within a row of its share. The positions of a block are then shuffled (seeded), and each source's
draws are its rows in a seeded permutation per pass. So the order is a pure function of (seed, epoch, the mixture),
like every order of the engine, and exact resume, elastic resume and every batching mode work on it unchanged.

Passes: a ``'cycle'`` source's draws go on across epochs (pass after pass, each a new permutation), so every row
is served once per pass; a ``'stop'`` source starts a fresh pass each epoch and ends the epoch when its pass is
served; a source capped at ``k`` passes starts fresh each epoch and stops after ``k``. The block in which a source
stops takes its last rows and the other sources fill the rest of the block at their weights.

A checkpoint of another mixture, taken over with ``on_change='continue'``, makes its epoch's rest an epoch of its
own here. The state says which draws of each source the epoch served (``taken``): how many of its first draws all
were, and the numbers of the later ones served too. Under plain batching the rows served after ``k`` steps are the
first ``k`` blocks, so there are none; grouped, token-budget and packed batching cut the order in windows (sorted by
length, packed), so a step serves rows from anywhere in its window, and those served ahead of the first unserved
draw are named (at most a window's rows). The rest starts each kept source's draws after its first unserved one,
passing over those named, a new source's at its first, and counts the rows and steps served before towards the
epoch's. The draws passed over are kept in the state while they lie ahead (``epoch_start``'s ``skipped``), so a
resume rebuilds the same order and a cycling source's next epoch does not draw them again in their pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.core.rng import derive_seed
from engine.sampling.blocks import BlockOrder
from engine.sampling.mixtures.mixture import Mixture, as_mixture, changes
from engine.sampling.mixtures.plan import Draws, EpochPlan, walk
from engine.sampling.mixtures.served import ServedMeter


class MixtureOrder:
    """The orders of a :class:`~engine.sampling.mixtures.Mixture` over sources of ``sizes`` rows, epoch by epoch.

    Args:
        mixture: The declared mixture.
        sizes: Rows of each source, in the order of ``mixture.names``.
        block: Positions per block: the global batch (ranks x batch size) under plain and grouped batching.
        seed: The module's seed.
        lengths: Each source's row lengths (tokens), for ``by='tokens'`` and for token counts; None: rows only.
        within: Each source's order of a pass, for sharded sources their block order (reads stay local); None
            (or a None entry): a seeded permutation.
    """

    always = True
    """The mixture's order serves whether or not the sampler shuffles."""
    varies = True
    """Epochs may differ in length (a schedule, a source that stops): samplers count each epoch's batches."""

    def __init__(self, mixture: Mixture, sizes: Sequence[int], *, block: int, seed: int,
                 lengths: Sequence[np.ndarray] | None = None, within: Sequence[BlockOrder | None] | None = None
                 ) -> None:
        self.mixture, self.block, self.seed = mixture, int(block), seed
        self.within = list(within) if within is not None else [None] * len(sizes)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(self.sizes)].astype(np.int64)
        self.lengths = [np.asarray(one, dtype=np.int64) for one in lengths] if lengths is not None else None
        if mixture.by == "tokens" and self.lengths is None:
            raise ValueError("Mixture(by='tokens') needs the token lengths of every source's rows, but this task's "
                             "rows have no token field; mix by='rows'")
        self.means = [max(float(one.mean()), 1.0) if len(one) else 1.0 for one in self.lengths] \
            if self.lengths is not None else None
        self._plans: dict[int, EpochPlan] = {}
        """The latest epochs' plans (two: each epoch's plan starts where the one before ended)."""
        self._epoch_expected: dict[int, np.ndarray] = {}
        """Per epoch whose plan was let go: the rows its weights asked for over the whole epoch, for the summary."""
        self._orders: dict[int, np.ndarray] = {}
        self._drawn: tuple[tuple[int, tuple[int, ...]], list[Draws]] | None = None
        """The latest draws made, by (epoch, starts): those of the plan that :meth:`order` turns into rows."""
        self.meter = ServedMeter(self)
        self._origin: tuple[int, int, tuple[int, ...] | None, int, int, dict[str, int], dict[str, tuple[int, ...]]] \
            = (0, 0, None, 0, 0, {}, {})
        """(epoch, step, each source's first draw, rows and steps of the epoch before that step, the draws of the
        epoch's sources that this mixture left out, each source's draws after its first already served) this
        mixture's epochs start from: (0, 0, None: fresh, 0, 0, {}, {}), where a checkpoint of another mixture
        handed over (``on_change='new_epoch'``: its next epoch; ``'continue'``: the rest of its epoch), or the
        start of a loaded state's epoch (:meth:`anchor`: a resume plans its own epoch only, whatever its number)."""
        self.history: list[tuple[int, dict[str, Any]]] = []
        """The mixtures served before this one, each with the step it ended at (a checkpoint of another mixture
        loaded with ``on_change='continue'`` or ``'new_epoch'``), for the report's weights by step."""
        self._skips: dict[int, tuple[np.ndarray, ...]] = {}
        """Per planned epoch, each source's draws after its first not to draw (served before, see
        :meth:`skips`)."""
        self._expected_before = np.zeros(len(self.sizes))
        """Rows counted as on target before the origin: what another mixture served, or the epochs before."""
        self._start: dict[str, Any] | None = None
        """The ``epoch_start`` of the latest state saved (see :meth:`saved`)."""

    def saved(self, sampler: Any) -> dict[str, Any]:
        """What a sampler's state holds of the mixture: its declaration, the rows and tokens served so far, and
        where the current epoch starts (so a resume plans that epoch only, see :meth:`anchor`)."""
        served = self.meter.served(sampler)
        epoch = sampler._pass.epoch
        if self._start is None or self._start["epoch"] != epoch:  # once an epoch: a state is saved every few steps
            plan = self.plan(epoch)
            rows_before, steps_before, left_out, left_skips = self._origin[3:] if epoch == self._origin[0] \
                else (0, 0, {}, {})
            skipped = {**{name: list(skip) for name, skip in left_skips.items() if name not in self.mixture.names},
                       **{name: skip.tolist() for name, skip in zip(self.mixture.names, self.skips(epoch))
                          if len(skip)}}
            self._start = {"epoch": int(epoch), "step": int(plan.start_step),
                           "starts": [int(one) for one in plan.starts],
                           "expected": [float(one) for one in self._expected_rows(epoch, 0)],
                           "rows": int(rows_before), "steps": int(steps_before), "left_out": dict(left_out),
                           **({"skipped": skipped} if skipped else {})}
        start = {**self._start, "starts": list(self._start["starts"]), "expected": list(self._start["expected"]),
                 "left_out": dict(self._start["left_out"])}
        if "skipped" in start:
            start["skipped"] = {name: list(skip) for name, skip in start["skipped"].items()}
        return {"declared": self.mixture.describe(), "names": list(self.mixture.names), "step": self.step(sampler),
                "served": {name: [int(served[0, s]), int(served[1, s])] for s, name in enumerate(self.mixture.names)},
                "epoch_start": start, "history": [[step, dict(declared)] for step, declared in self.history],
                "taken": self._taken(sampler)}

    def _taken(self, sampler: Any) -> dict[str, Any]:
        """What ``on_change='continue'`` goes on from: the steps of the epoch served (all ranks, every part),
        whether they are all of it, and each source's draws served, in the numbers of its stream of draws: all
        draws from the epoch's first up to ``rows`` past it, and (``skipped``, only where there are some) the
        later ones served too, the order's windows having served them ahead (see the module's docstring)."""
        state = sampler._pass
        epoch = state.epoch
        plan = self.plan(epoch)
        rows, skipped = [], {}
        for name, start, skip, (first, later) in zip(self.mixture.names, plan.starts, self.skips(epoch),
                                                     self.meter.drawn(sampler)):
            following = int(_stream(start, skip, np.asarray([first]))[0])  # the first draw not served
            ahead = np.sort(np.concatenate([_stream(start, skip, later), skip[skip > following]]),
                            kind="stable")  # two increasing runs, apart: merged
            rows.append(following - int(start))
            if len(ahead):
                skipped[name] = ahead.tolist()
        steps = sum(position for _, position in state.served) + state.position
        ended = state.position >= len(sampler._batches(epoch, state.served))
        return {"steps": int(steps), "rows": rows, "ended": bool(ended), **({"skipped": skipped} if skipped else {})}

    def skips(self, epoch: int) -> tuple[np.ndarray, ...]:
        """Each source's draws of ``epoch``, after its first, served before in the epoch (another mixture's,
        ``on_change='continue'``) or in the pass (a cycling source's draws passed over the epoch before):
        numbers in its stream of draws that the epoch's draws pass over."""
        self.plan(epoch)
        return self._skips[epoch]

    def anchor(self, saved: Any) -> Any:
        """Start this mixture's epochs where a loaded state's epoch starts (its ``epoch_start``), so resuming at
        epoch ``E`` plans epoch ``E`` alone, not every epoch before it. Returns what :meth:`unanchor` puts back
        (the state may yet be refused); None for a state without it (saved before: planned from the start)."""
        start = saved.get("epoch_start") if isinstance(saved, dict) else None
        if start is None:
            return None
        sources = len(self.sizes)
        if not isinstance(start, dict) or not all(
                _is_count(start.get(key)) for key in ("epoch", "step")) or not isinstance(start.get("starts"), list) \
                or len(start["starts"]) != sources or not all(_is_count(one) for one in start["starts"]) \
                or not isinstance(start.get("expected"), list) or len(start["expected"]) != sources or not all(
                    isinstance(one, (int, float)) and not isinstance(one, bool) and np.isfinite(one) and one >= 0
                    for one in start["expected"]) \
                or not all(_is_count(start.get(key, 0)) for key in ("rows", "steps")) \
                or not _is_draws(start.get("left_out", {})) or not _is_skipped(start.get("skipped", {})):
            raise ValueError(f"sampler state's mixture epoch_start should be {{'epoch', 'step': integers >= 0, "
                             f"'starts': {sources} integers >= 0, 'expected': {sources} numbers >= 0, 'rows', "
                             f"'steps': integers >= 0, 'left_out': {{source name: integer >= 0}}, 'skipped' "
                             f"(optional): {{source name: increasing integers >= 0}}}}, but got {start!r:.300}; the "
                             f"state was not saved by this engine")
        skipped = start.get("skipped", {})
        if any(name in skipped and skipped[name][0] <= first for name, first in zip(self.mixture.names,
                                                                                    start["starts"])):
            raise ValueError(f"sampler state's mixture epoch_start skipped should name draws after each source's "
                             f"first of the epoch {start['starts']}, but got skipped={skipped!r:.200}; the state was "
                             f"not saved by this engine")
        history = _checked_history(saved.get("history", []))
        if start["epoch"] < self._origin[0]:
            return None
        undo = (self._origin, self._expected_before, self._plans, self._orders, self._epoch_expected, self.history,
                self._skips)
        self._origin = (start["epoch"], start["step"], tuple(start["starts"]), start.get("rows", 0),
                        start.get("steps", 0), dict(start.get("left_out", {})),
                        {name: tuple(skip) for name, skip in start.get("skipped", {}).items()})
        self._expected_before = np.asarray(start["expected"], dtype=np.float64)
        self._plans, self._orders, self._epoch_expected, self._start, self._skips = {}, {}, {}, None, {}
        self.history = history
        return undo

    def unanchor(self, undo: Any) -> None:
        """Put back what :meth:`anchor` replaced (the state it anchored on was refused)."""
        if undo is not None:
            (self._origin, self._expected_before, self._plans, self._orders, self._epoch_expected, self.history,
             self._skips) = undo
            self._start = None

    def steps_before(self, epoch: int) -> int:
        """Steps of ``epoch`` served under another mixture before this one went on with it
        (``on_change='continue'``): its order holds the rest, and a caller counts them among the epoch's steps."""
        return self._origin[4] if epoch == self._origin[0] else 0

    def step(self, sampler: Any) -> int:
        """The training step at the sampler's position, counted in blocks (exact under plain and grouped
        batching) from the start of training."""
        plan = self.plan(sampler._pass.epoch)
        return int(plan.start_step + min(sampler._pass.position, len(plan.counts)))

    def check_saved(self, saved: Any) -> bool:
        """Whether a state's mixture (:meth:`saved`) is this one; a different one is refused naming what changed,
        unless ``on_change='new_epoch'`` (then False: the caller starts the next epoch)."""
        if saved is None:
            raise ValueError("sampler state was saved without a mixture, but this loader mixes sources "
                             f"{list(self.mixture.names)}; resume with the data module the state was saved from")
        if not isinstance(saved, dict) or not {"declared", "names", "served"} <= set(saved):
            raise ValueError(f"sampler state's mixture should be a dict with 'declared', 'names' and 'served', but "
                             f"got {saved!r}; the state was not saved by this engine")
        declared = dict(saved["declared"]) if isinstance(saved["declared"], dict) else {}
        differences = changes(declared, self.mixture.describe())
        if saved["names"] != list(self.mixture.names):
            differences.insert(0, f"sources: saved {saved['names']}, now {list(self.mixture.names)}")
        if not differences:
            self._check_served(saved["served"])
            return True
        if self.mixture.on_change == "new_epoch":
            return False
        if self.mixture.on_change == "continue":
            self._check_continuable(saved)
            return False
        raise ValueError(f"the checkpoint was saved with another mixture ({'; '.join(differences)}); resuming would "
                         f"serve other rows. Resume with the mixture saved, or pass Mixture(..., "
                         f"on_change='new_epoch') to go on with this one from the next epoch, or "
                         f"on_change='continue' to go on with it in the saved epoch")

    def continues(self, saved: Any) -> bool:
        """Whether a checkpoint of another mixture (:meth:`check_saved` returned False) goes on in its own epoch
        (``on_change='continue'`` and the epoch not over), not from the next one."""
        return self.mixture.on_change == "continue" and not saved["taken"]["ended"]

    def check_taken(self, saved: dict[str, Any], steps: int) -> None:
        """Refuse a state whose ``taken`` is not what its position served: ``steps`` steps of its epoch (all ranks,
        every part), or all of the epoch's steps when fewer."""
        taken = saved["taken"]
        if taken["steps"] > steps or (taken["steps"] < steps and not taken["ended"]):
            raise ValueError(f"sampler state's mixture taken should count the {steps} steps its position served, but "
                             f"got taken={taken!r}; the state was not saved by this engine, or was changed since")

    def _check_continuable(self, saved: dict[str, Any]) -> None:
        """Refuse to go on in the epoch of a state that does not say what it served, or whose sources keep their
        draws under another rule (cycling against stopping: their passes are numbered otherwise)."""
        names = saved["names"]
        taken, start = saved.get("taken"), saved.get("epoch_start")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names) \
                or not isinstance(taken, dict) or not _is_count(taken.get("steps")) \
                or not isinstance(taken.get("ended"), bool) or not isinstance(taken.get("rows"), list) \
                or len(taken["rows"]) != len(names) or not all(_is_count(one) for one in taken["rows"]) \
                or not isinstance(start, dict) or not isinstance(start.get("starts"), list) \
                or len(start["starts"]) != len(names) or not all(_is_count(one) for one in start["starts"]) \
                or not all(_is_count(start.get(key, 0)) for key in ("step", "rows", "steps")) \
                or not _is_draws(start.get("left_out", {})) or not _is_skipped(start.get("skipped", {})) \
                or not _is_skipped(taken.get("skipped", {})) or not set(taken.get("skipped", {})) <= set(names) \
                or not all(skip[0] > first + count for name, first, count in zip(names, start["starts"], taken["rows"])
                           for skip in [taken.get("skipped", {}).get(name, [math.inf])]):
            raise ValueError(f"sampler state's mixture should have 'names', 'taken' {{'steps', 'rows': one integer "
                             f">= 0 a source, 'ended', 'skipped' (optional): {{source name: increasing integers "
                             f"past its first unserved draw}}}} and 'epoch_start' {{'starts': one integer >= 0 a "
                             f"source, 'step', 'rows', 'steps', 'left_out', 'skipped' (optional)}} to go on in its "
                             f"epoch, but got {saved!r:.300}; the draws its epoch served are not known, so resume "
                             f"with the mixture saved, or use on_change='new_epoch'")
        exhaust = saved["declared"].get("exhaust") if isinstance(saved["declared"], dict) else None
        if not isinstance(exhaust, dict) or set(exhaust) != set(names):
            raise ValueError(f"sampler state's mixture declared exhaust should name each source {names}, but got "
                             f"{exhaust!r}; the state was not saved by this engine")
        switched = [f"{name!r}: saved {exhaust[name]!r}, now {self.mixture.exhaust[name]!r}" for name in names
                    if name in self.mixture.exhaust
                    and (exhaust[name] == "cycle") != (self.mixture.passes(name) is None)]
        if switched:
            raise ValueError(f"Mixture(on_change='continue') goes on with each source's draws of the saved epoch, "
                             f"but exhaust switches between cycling and stopping for {'; '.join(switched)}, whose "
                             f"draws are numbered otherwise; keep each source's exhaust, or use on_change='new_epoch'")

    def summary(self, sampler: Any) -> dict[str, Any]:
        """Target against served, per source, at the sampler's position: the weights of the current step, the
        rows and tokens served since the start (all ranks) and their shares, and (by rows) the share the weights
        asked for over the steps served. Steps are counted in blocks: exact under plain and grouped batching."""
        served = self.meter.served(sampler)
        state = sampler._pass
        step = self.step(sampler)
        rows, tokens = served[0], served[1]
        expected = self._expected_rows(state.epoch, state.position)
        total_expected = expected.sum()
        sources = {}
        for s, (name, weight) in enumerate(zip(self.mixture.names, self.mixture.weights_at(step))):
            sources[name] = {"weight": float(weight), "rows": int(rows[s]), "tokens": int(tokens[s]),
                             "row_share": float(rows[s] / rows.sum()) if rows.sum() else 0.0,
                             "token_share": float(tokens[s] / tokens.sum()) if tokens.sum() else 0.0,
                             "target_share": float(expected[s] / total_expected) if total_expected else float(weight)}
        return {"by": self.mixture.by, "step": int(step), "epoch": int(state.epoch), "sources": sources,
                "tokens_known": self.lengths is not None}

    def weights_by_step(self, until: int) -> dict[str, Any]:
        """Each source's weight from step 0 to ``until``, over the mixtures served before this one (:attr:`history`)
        and this one: ``{'steps': [...], 'weights': {name: [...]}, 'changes': [steps]}``, with the steps where a
        weight switches (a schedule's point, a checkpoint of another mixture taken over: ``changes``) given twice,
        before and at the switch, so a line through the points steps there. A source not in a mixture weighs 0."""
        parts, begin = [], 0
        for end, declared in self.history:
            parts.append((begin, end, as_mixture(declared)))
            begin = end
        parts.append((begin, max(until, begin), self.mixture))
        names = list(dict.fromkeys(name for _, _, mixture in parts for name in mixture.names))
        steps: list[int] = []
        weights: dict[str, list[float]] = {name: [] for name in names}
        for number, (begin, end, mixture) in enumerate(parts):
            last = end if number == len(parts) - 1 else max(begin, end - 1)  # before the next mixture's first step
            inside = {begin, last}
            before = 0
            for point, _, ramp in mixture.points:
                inside |= {point - 1, point, before} if ramp == "step" else {point, before}
                before = point
            for step in sorted(one for one in inside if begin <= one <= last):
                at = dict(zip(mixture.names, mixture.weights_at(step).tolist()))
                steps.append(int(step))
                for name in names:
                    weights[name].append(float(at.get(name, 0.0)))
        return {"steps": steps, "weights": weights, "changes": [int(end) for end, _ in self.history]}

    def _expected_rows(self, epoch: int, position: int) -> np.ndarray:
        """Rows (or, by tokens, token shares times rows) the weights asked for up to ``position`` of ``epoch``."""
        expected = self._expected_before.copy()
        for number in range(self._origin[0] if epoch >= self._origin[0] else 0, epoch):
            expected += self._epoch_expected[number] if number in self._epoch_expected else _expected(
                self.plan(number), None)
        return expected + _expected(self.plan(epoch), position)

    def _check_served(self, served: Any, names: list[str] | None = None) -> None:
        names = list(self.mixture.names) if names is None else names
        if not isinstance(served, dict) or list(served) != names or any(
                not isinstance(pair, (list, tuple)) or len(pair) != 2 or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in pair) for pair in served.values()):
            raise ValueError(f"sampler state's mixture 'served' should map each source {names} to [rows, tokens] "
                             f"(integers >= 0), but got {served!r}; the state was not saved by this engine")

    def _served_of(self, saved: dict[str, Any] | None) -> np.ndarray:
        """``[rows, tokens] x sources`` of a state's served counts, by name (0 for a source it did not have)."""
        served = np.zeros((2, len(self.mixture.names)), dtype=np.int64)
        if saved is not None:
            self._check_served(saved["served"], names=list(saved["served"]) if isinstance(saved["served"], dict)
                               else None)
            for s, name in enumerate(self.mixture.names):
                served[:, s] = saved["served"].get(name, [0, 0])
        return served

    def restore(self, sampler: Any, saved: dict[str, Any] | None) -> None:
        """Count served rows on from a loaded state's totals (kept from before a changed mixture too, by name)."""
        self.meter.rebase(sampler, self._served_of(saved))

    def start_at(self, epoch: int, saved: dict[str, Any] | None) -> None:
        """Take over from another mixture's checkpoint: this one's epochs start at ``epoch``, at the saved step (so
        a schedule counts the run's steps), and what the other served counts as on target. Going on in the saved
        epoch (:meth:`continues`), each source's draws start after those the epoch served (a new source's at its
        first), and the epoch's rows and steps so far count towards its length."""
        step = saved.get("step", 0) if isinstance(saved, dict) else 0
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"sampler state's mixture step should be an integer >= 0, but got {step!r}; the state "
                             f"was not saved by this engine")
        history = _checked_history(saved.get("history", []) if isinstance(saved, dict) else [])
        if isinstance(saved, dict) and isinstance(saved.get("declared"), dict):
            history.append((step, dict(saved["declared"])))
        if isinstance(saved, dict) and self.continues(saved):
            start, taken = saved["epoch_start"], saved["taken"]
            drawn = {**start.get("left_out", {}), **{name: first + count for name, first, count in
                                                      zip(saved["names"], start["starts"], taken["rows"])}}
            before, ahead = start.get("skipped", {}), taken.get("skipped", {})
            skipped = {**{name: skip for name, skip in before.items() if name not in saved["names"]}, **ahead}
            served = sum(taken["rows"]) + sum(len(skip) for skip in ahead.values()) \
                - sum(len(before.get(name, ())) for name in saved["names"])  # the rows this mixture served
            starts = tuple(int(drawn.get(name, 0)) for name in self.mixture.names)  # a new source: its first draw
            left_out = {name: int(count) for name, count in drawn.items() if name not in self.mixture.names}
            self._origin = (epoch, step, starts, start.get("rows", 0) + served, start.get("steps", 0) + taken["steps"],
                            left_out, {name: tuple(int(one) for one in skip) for name, skip in skipped.items()})
        else:
            self._origin = (epoch, step, None, 0, 0, {}, {})
        self._plans, self._orders, self._epoch_expected, self._start, self._skips = {}, {}, {}, None, {}
        self._expected_before = self._served_of(saved)[0].astype(np.float64)
        self.history = history

    @property
    def size(self) -> int:
        """Rows of the first epoch (later epochs can differ: see :attr:`varies`)."""
        return self.plan(0).size

    @property
    def key(self) -> tuple[str, ...]:
        """What a sampler's fingerprint adds for this order."""
        return ("mixture", str(self.block))  # the mixture itself is checked by name (:meth:`check_saved`)

    def epoch_rows(self, seed: int, epoch: int) -> np.ndarray:
        """The rows of ``epoch``, as indices of the mixed source (a sampler's ``epoch_order``)."""
        del seed  # the module's seed made this order; samplers pass their own, the same one
        return self.order(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """Every position of ``epoch``: blocks in turn, each with its sources' rows in a seeded order."""
        if epoch not in self._orders:
            plan = self.plan(epoch)
            blocks, sources = plan.counts.shape
            labels = np.repeat(np.tile(np.arange(sources, dtype=np.int32), blocks), plan.counts.ravel())
            rng = np.random.default_rng(derive_seed(self.seed, "mixture-blocks", epoch))
            sizes = plan.counts.sum(axis=1)
            full = int(np.argmax(sizes != self.block)) if (sizes != self.block).any() else blocks
            cut = full * self.block  # full blocks shuffled as one [blocks, block] array, the short ones alone
            if full:
                labels[:cut] = rng.permuted(labels[:cut].reshape(full, self.block), axis=1).reshape(-1)
            start = cut
            for size in sizes[full:].tolist():
                labels[start:start + size] = rng.permutation(labels[start:start + size])
                start += size
            order = np.empty(len(labels), dtype=np.int64)
            drawn = self._drawn if self._drawn is not None and self._drawn[0] == (epoch, plan.starts) else None
            draws = drawn[1] if drawn is not None else self._new_draws(epoch, plan.starts)
            from engine.sampling.mixtures import _kernels  # numba, compiled on first use

            rows = tuple(one.rows(count) for one, count in zip(draws, plan.counts.sum(axis=0).tolist()))
            _kernels.place_rows(labels, rows, self.offsets, order)  # each source's rows at its positions, in turn
            self._orders, self._drawn = {epoch: order}, None  # one epoch at a time: the one the sampler serves
        return self._orders[epoch]

    def source_of(self, rows: np.ndarray) -> np.ndarray:
        """The source (its position in ``mixture.names``) of each row of the mixed source."""
        return np.searchsorted(self.offsets, np.asarray(rows, dtype=np.int64), side="right") - 1

    def plan(self, epoch: int) -> EpochPlan:
        """The counts of ``epoch`` (and of every epoch before it: each starts where the last ended)."""
        origin_epoch, origin_step, origin_starts, rows_before = self._origin[:4] if epoch >= self._origin[0] \
            else (0, 0, None, 0)
        first = max((known for known in self._plans if origin_epoch <= known <= epoch), default=origin_epoch - 1)
        for number in range(first + 1, epoch + 1):
            start_step, starts = (origin_step, origin_starts or (0,) * len(self.sizes)) if number == origin_epoch \
                else (0, ())
            skips = tuple(np.asarray(self._origin[6].get(name, ()) if number == origin_epoch else (), dtype=np.int64)
                          for name in self.mixture.names)
            if number > origin_epoch:
                before = self._plans[number - 1]
                start_step = before.start_step + len(before.counts)
                totals = before.counts.sum(axis=0)
                following = [int(_stream(start, skip, np.asarray([total]))[0]) for start, skip, total in
                             zip(before.starts, self._skips[number - 1], totals.tolist())]
                starts = tuple(after if self.mixture.passes(name) is None else 0
                               for after, name in zip(following, self.mixture.names))
                skips = tuple(skip[skip > after] if self.mixture.passes(name) is None else skip[:0]
                              for skip, after, name in zip(self._skips[number - 1], following, self.mixture.names))
            self._skips[number] = skips
            self._plans[number] = walk(self, number, start_step, starts, rows_before if number == origin_epoch else 0)
        plan = self._plans[epoch]
        for number in sorted(self._plans)[:-2]:  # the summary keeps what it needs of older epochs: one row a source
            self._epoch_expected[number] = _expected(self._plans.pop(number), None)
            self._skips.pop(number, None)
        return plan

    def _new_draws(self, epoch: int, starts: tuple[int, ...]) -> list[Draws]:
        """Each source's draws of ``epoch`` from ``starts``, kept until :meth:`order` takes their rows (the plan
        read the draws' first rows already: a pass's permutation is made once an epoch)."""
        skips = self._skips[epoch]
        draws = [Draws(self.seed, name, int(size), start, None if self.mixture.passes(name) is None else epoch,
                       self.lengths[index] if self.lengths is not None else None, self.within[index], skips[index])
                 for index, (name, size, start) in enumerate(zip(self.mixture.names, self.sizes, starts))]
        self._drawn = ((epoch, starts), draws)
        return draws


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_draws(value: Any) -> bool:
    """Whether ``value`` is ``{source name: draws}``: an epoch's draws of the sources a mixture left out."""
    return isinstance(value, dict) and all(isinstance(name, str) and _is_count(count) for name, count in value.items())


def _is_skipped(value: Any) -> bool:
    """Whether ``value`` is ``{source name: draws}``, each source's draws numbers in increasing order."""
    return isinstance(value, dict) and all(
        isinstance(name, str) and isinstance(skip, list) and skip and all(_is_count(one) for one in skip)
        and all(a < b for a, b in zip(skip, skip[1:])) for name, skip in value.items())


def _stream(start: int, skip: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The numbers in a source's stream of its draws ``draws`` (0: the first) of an epoch whose draws start at
    ``start`` and pass over ``skip`` (increasing numbers after ``start``)."""
    passed = skip - start - np.arange(len(skip))  # draws before each skipped number
    return start + draws + np.searchsorted(passed, draws, side="right")


def _checked_history(value: Any) -> list[tuple[int, dict[str, Any]]]:
    """A state's ``history`` (the mixtures served before, each with the step it ended at), checked."""
    if not isinstance(value, list) or not all(
            isinstance(entry, (list, tuple)) and len(entry) == 2 and _is_count(entry[0])
            and isinstance(entry[1], dict) and isinstance(entry[1].get("weights"), dict) for entry in value):
        raise ValueError(f"sampler state's mixture history should be a list of [step, declared mixture], but got "
                         f"{value!r:.200}; the state was not saved by this engine")
    return [(int(step), dict(declared)) for step, declared in value]


def _expected(plan: EpochPlan, blocks: int | None) -> np.ndarray:
    """Rows per source that ``plan``'s weights asked for over its first ``blocks`` blocks (None: all of them)."""
    blocks = len(plan.counts) if blocks is None else min(blocks, len(plan.counts))
    return (plan.weights[:blocks] * plan.counts[:blocks].sum(axis=1, keepdims=True)).sum(axis=0)
