"""Each epoch's order of a mixture: which source every position draws from, and which of its rows.

The sources are laid end to end (source ``s``'s row ``i`` is row ``offsets[s] + i`` of the mixed source). An epoch
is cut into *blocks* of ``block`` positions (the global batch under plain and grouped batching, so a block is one
training step). Block by block, the counts of each source are set so that every source's running count stays
within one row of its target share (rows), or its running token count within about one row's tokens of its
share (tokens): each block gives each source the whole part of its deficit and the rest of the block to the
largest remainders. The positions of a block are then shuffled (seeded), and each source's draws are its rows in
a seeded permutation per pass. So the order is a pure function of (seed, epoch, the mixture), like every order of
the engine, and exact resume, elastic resume and every batching mode work on it unchanged.

Passes: a ``'cycle'`` source's draws go on across epochs (pass after pass, each a new permutation), so every row
is served once per pass; a ``'stop'`` source starts a fresh pass each epoch and ends the epoch when its pass is
served; a source capped at ``k`` passes starts fresh each epoch and stops after ``k``. The block in which a source
stops takes its last rows and the other sources fill the rest of the block at their weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.rng import derive_seed
from engine.sampling.blocks import BlockOrder
from engine.sampling.elastic import without
from engine.sampling.mixture import Mixture, changes


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of a mixture: the first training step, how many rows of each source every block takes (and how
    many tokens, when lengths are known), and where each cycling source's draws start."""

    epoch: int
    start_step: int
    counts: np.ndarray
    """``[blocks, sources]`` rows of each source in each block."""
    tokens: np.ndarray | None
    """``[blocks, sources]`` tokens of those rows; None without lengths."""
    starts: tuple[int, ...]
    """Each source's first draw of the epoch in its stream of draws (0 for a source that starts fresh)."""
    weights: np.ndarray
    """``[blocks, sources]``: the weights each block was drawn at."""

    @property
    def size(self) -> int:
        return int(self.counts.sum())


class _Draws:
    """One source's draws in one epoch: its rows pass after pass, each pass a seeded permutation (read ahead in
    growing steps, with the running token count of the draws when lengths are known)."""

    def __init__(self, seed: int, name: str, size: int, start: int, fresh_epoch: int | None,
                 lengths: np.ndarray | None, within: BlockOrder | None = None) -> None:
        self.seed, self.name, self.size, self.start = seed, name, size, start
        self.fresh_epoch, self.lengths, self.within = fresh_epoch, lengths, within
        self.taken = 0
        self._rows = np.zeros(0, dtype=np.int64)
        self._running = np.zeros(1, dtype=np.int64)  # tokens of the first k draws, k = 0, 1, ...

    def _permutation(self, number: int) -> np.ndarray:
        key = ("epoch", self.fresh_epoch, number) if self.fresh_epoch is not None else ("pass", number)
        seed = derive_seed(self.seed, "mixture", self.name, *key)
        if self.within is not None:  # sharded data: row groups in turn, rows shuffled within a window
            return self.within.permutation(seed)
        return np.random.default_rng(seed).permutation(self.size)

    def _ensure(self, count: int) -> None:
        """Draws up to ``count`` at hand, read ahead to at least twice what was at hand (the cost stays linear)."""
        have = len(self._rows)
        if have >= count:
            return
        chunks, want = [], max(count, 2 * have, 1024)
        while have < want:
            number, within = divmod(self.start + have, self.size)
            chunks.append(self._permutation(number)[within:])
            have += len(chunks[-1])
        added = np.concatenate(chunks).astype(np.int64, copy=False)
        self._rows = np.concatenate([self._rows, added])
        if self.lengths is not None:
            self._running = np.concatenate([self._running, self._running[-1] + np.cumsum(self.lengths[added])])

    def rows(self, count: int) -> np.ndarray:
        """The first ``count`` draws of the epoch, as row indices of the source."""
        self._ensure(count)
        return self._rows[:count]

    def take(self, count: int) -> int:
        """Take the next ``count`` draws; their tokens (0 without lengths)."""
        tokens = 0
        if count and self.lengths is not None:
            self._ensure(self.taken + count)
            tokens = int(self._running[self.taken + count]) - int(self._running[self.taken])
        self.taken += count
        return tokens

    def take_blocks(self, counts: np.ndarray) -> np.ndarray:
        """Take the next draws, ``counts[k]`` for block ``k``; the tokens of each block (0 without lengths)."""
        total = int(counts.sum())
        sums = np.zeros(len(counts), dtype=np.int64)
        if total and self.lengths is not None:
            self._ensure(self.taken + total)
            sums = np.diff(self._running[self.taken + np.r_[0, np.cumsum(counts)]])
        self.taken += total
        return sums


class MixtureOrder:
    """The orders of a :class:`~engine.sampling.mixture.Mixture` over sources of ``sizes`` rows, epoch by epoch.

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
        self._orders: dict[int, np.ndarray] = {}
        self.meter = ServedMeter(self)
        self._origin = (0, 0)
        """(epoch, step) this mixture's epochs start from: (0, 0), or where a checkpoint of another mixture
        handed over (``on_change='new_epoch'``)."""
        self._expected_before = np.zeros(len(self.sizes))
        """Rows counted as on target before the origin: what another mixture served."""

    def saved(self, sampler: Any) -> dict[str, Any]:
        """What a sampler's state holds of the mixture: its declaration and the rows and tokens served so far."""
        served = self.meter.served(sampler)
        return {"declared": self.mixture.describe(), "names": list(self.mixture.names), "step": self.step(sampler),
                "served": {name: [int(served[0, s]), int(served[1, s])] for s, name in enumerate(self.mixture.names)}}

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
        raise ValueError(f"the checkpoint was saved with another mixture ({'; '.join(differences)}); resuming would "
                         f"serve other rows. Resume with the mixture saved, or pass Mixture(..., "
                         f"on_change='new_epoch') to go on with this one from the next epoch")

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

    def _expected_rows(self, epoch: int, position: int) -> np.ndarray:
        """Rows (or, by tokens, token shares times rows) the weights asked for up to ``position`` of ``epoch``."""
        expected = self._expected_before.copy()
        for number in range(self._origin[0] if epoch >= self._origin[0] else 0, epoch + 1):
            plan = self.plan(number)
            blocks = len(plan.counts) if number < epoch else min(position, len(plan.counts))
            expected += (plan.weights[:blocks] * plan.counts[:blocks].sum(axis=1, keepdims=True)).sum(axis=0)
        return expected

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
        a schedule counts the run's steps), and what the other served counts as on target."""
        step = saved.get("step", 0) if isinstance(saved, dict) else 0
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"sampler state's mixture step should be an integer >= 0, but got {step!r}; the state "
                             f"was not saved by this engine")
        self._origin = (epoch, step)
        self._plans, self._orders = {}, {}
        self._expected_before = self._served_of(saved)[0].astype(np.float64)

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
            where = np.argsort(labels, kind="stable")  # each source's positions, in order
            bounds = np.r_[0, np.cumsum(np.bincount(labels, minlength=sources))]
            for index, draws in enumerate(self._new_draws(epoch, plan.starts)):
                places = where[bounds[index]:bounds[index + 1]]
                order[places] = draws.rows(len(places)) + self.offsets[index]
            self._orders = {epoch: order}  # one epoch at a time: the sampler asks for the epoch it serves
        return self._orders[epoch]

    def source_of(self, rows: np.ndarray) -> np.ndarray:
        """The source (its position in ``mixture.names``) of each row of the mixed source."""
        return np.searchsorted(self.offsets, np.asarray(rows, dtype=np.int64), side="right") - 1

    def plan(self, epoch: int) -> EpochPlan:
        """The counts of ``epoch`` (and of every epoch before it: each starts where the last ended)."""
        origin_epoch, origin_step = self._origin if epoch >= self._origin[0] else (0, 0)
        first = max((known for known in self._plans if origin_epoch <= known <= epoch), default=origin_epoch - 1)
        for number in range(first + 1, epoch + 1):
            start_step, starts = (origin_step, (0,) * len(self.sizes)) if number == origin_epoch else (0, ())
            if number > origin_epoch:
                before = self._plans[number - 1]
                start_step = before.start_step + len(before.counts)
                totals = before.counts.sum(axis=0)
                starts = tuple(int(start + total) if self.mixture.passes(name) is None else 0
                               for start, total, name in zip(before.starts, totals, self.mixture.names))
            self._plans[number] = self._walk(number, start_step, starts)
        return self._plans[epoch]

    def _new_draws(self, epoch: int, starts: tuple[int, ...]) -> list[_Draws]:
        return [_Draws(self.seed, name, int(size), start, None if self.mixture.passes(name) is None else epoch,
                       self.lengths[index] if self.lengths is not None else None, self.within[index])
                for index, (name, size, start) in enumerate(zip(self.mixture.names, self.sizes, starts))]

    def _walk(self, epoch: int, start_step: int, starts: tuple[int, ...]) -> EpochPlan:
        """Block by block: each source's rows so that its running share stays within a row of its target."""
        mixture, sources = self.mixture, len(self.sizes)
        caps = [None if mixture.passes(name) is None else mixture.passes(name) * int(size)
                for name, size in zip(mixture.names, self.sizes)]
        limit = mixture.samples_per_epoch
        if limit is None and all(cap is None for cap in caps):
            limit = int(self.sizes.sum())
        by_tokens = mixture.by == "tokens"
        if by_tokens and not mixture.points:
            return self._merged_by_tokens(epoch, start_step, starts, caps, limit)
        draws = self._new_draws(epoch, starts)
        targets, served, token_served = [0.0] * sources, [0] * sources, [0] * sources
        counts, tokens, used, total, step = [], [], [], 0, start_step  # chunks of [blocks, sources]
        cached_step, weights = None, None
        last_change = mixture.points[-1][0] if mixture.points else 0
        while True:
            size = self.block if limit is None else min(self.block, limit - total)
            if size <= 0:
                break
            if cached_step is None or mixture.points:
                weights = mixture.weights_at(step).tolist()
                cached_step = step
            if limit is None and not any(weight > 0 and cap is not None for weight, cap in zip(weights, caps)) \
                    and step >= last_change:
                stopping = [name for name, cap in zip(mixture.names, caps) if cap is not None]
                raise ValueError(f"the mixture's epoch would never end: from step {step} on, the sources that stop "
                                 f"({stopping}) have weight 0 and the others cycle; give samples_per_epoch=..., or "
                                 f"a stopping source a weight")
            room = [math.inf if cap is None else cap - taken for cap, taken in zip(caps, served)]
            stretch = None if by_tokens else self._stretch(weights, targets, served, room, step, limit, total)
            if stretch is not None:  # blocks at constant weights, in one vectorized step
                targets = [target + weight * self.block * len(stretch) for target, weight in zip(targets, weights)]
                chunk_tokens = np.stack([one.take_blocks(stretch[:, s]) for s, one in enumerate(draws)], axis=1)
                counts.append(stretch)
                used.append(np.tile(weights, (len(stretch), 1)))
                tokens.append(chunk_tokens)
                served = [count + int(taken) for count, taken in zip(served, stretch.sum(axis=0))]
                token_served = [count + int(taken) for count, taken in zip(token_served, chunk_tokens.sum(axis=0))]
                total += int(stretch.sum())
                step += len(stretch)
                continue
            if by_tokens:
                want = self._token_wants(weights, token_served, size)
            else:
                targets = [target + weight * size for target, weight in zip(targets, weights)]
                want = [target - count for target, count in zip(targets, served)]
            block = _apportion(want, weights, size, room)
            if not any(block):
                break
            block_tokens = [one.take(count) for one, count in zip(draws, block)]
            counts.append([block])  # one block as nested lists, joined with the stretches' arrays below
            used.append([weights])
            tokens.append([block_tokens])
            served = [count + taken for count, taken in zip(served, block)]
            token_served = [count + taken for count, taken in zip(token_served, block_tokens)]
            total += sum(block)
            step += 1
            if sum(block) < size or any(r != math.inf and taken >= r for r, taken in zip(room, block)):
                break  # a source ran out (its last rows are in this block), or every source did
        return EpochPlan(epoch, start_step, _joined(counts, sources, np.int64),
                         _joined(tokens, sources, np.int64) if self.lengths is not None else None,
                         starts, _joined(used, sources, np.float64))

    def _merged_by_tokens(self, epoch: int, start_step: int, starts: tuple[int, ...], caps: list[int | None],
                          limit: int | None) -> EpochPlan:
        """By tokens at constant weights: every source's draws merged in the order of the mixture's token count at
        which each is due (a draw is due when the source's tokens before it, plus half its own, reach its share:
        ``(tokens before + length / 2) / weight``), so at every block boundary each source's tokens are within
        about a row of its share. The epoch ends at ``limit`` rows, or with the block that takes the last rows of
        a source that stops."""
        weights = np.asarray([self.mixture.weights[name] for name in self.mixture.names])
        shares = np.where(weights > 0, weights / np.asarray(self.means), 0.0)
        shares = shares / shares.sum()  # each source's expected share of the rows
        horizon = limit if limit is not None else min(
            (cap / share for cap, share in zip(caps, shares) if cap is not None and share > 0), default=0)
        if limit is None and not any(cap is not None and weight > 0 for cap, weight in zip(caps, weights)):
            stopping = [name for name, cap in zip(self.mixture.names, caps) if cap is not None]
            raise ValueError(f"the mixture's epoch would never end: the sources that stop ({stopping}) have weight "
                             f"0 and the others cycle; give samples_per_epoch=..., or a stopping source a weight")
        draws = self._new_draws(epoch, starts)
        margin = 1.25
        while True:
            wanted = [0 if share == 0 else int(np.ceil(horizon * share * margin)) + 2 * self.block + 64
                      for share in shares]
            wanted = [want if cap is None else min(want, cap) for want, cap in zip(wanted, caps)]
            keys, labels, lengths = [], [], []
            for index, (one, want) in enumerate(zip(draws, wanted)):
                if want == 0:
                    continue
                own = self.lengths[index][one.rows(want)]
                before = np.cumsum(own) - own
                keys.append((before + own / 2) / weights[index])
                labels.append(np.full(want, index, dtype=np.int64))
                lengths.append(own)
            merged = np.argsort(np.concatenate(keys), kind="stable")
            label, length = np.concatenate(labels)[merged], np.concatenate(lengths)[merged]
            size = len(label) if limit is None else min(limit, len(label))
            ran_out = [index for index, (want, cap) in enumerate(zip(wanted, caps)) if want and want == cap]
            ends = [int(np.flatnonzero(label == index)[-1]) + 1 for index in ran_out]  # past a stopping source
            if ends and min(ends) <= size:
                size = min(-(-min(ends) // self.block) * self.block, size)
            short = [index for index, (want, cap) in enumerate(zip(wanted, caps))
                     if want and want != cap and (label[:size] == index).sum() >= want]
            if not short:
                break
            margin *= 2  # a cycling source drew all the draws taken out for it: take more
        blocks = -(-size // self.block)
        block_of = np.arange(size) // self.block
        sources = len(self.sizes)
        counts = np.bincount(block_of * sources + label[:size], minlength=blocks * sources).reshape(blocks, sources)
        tokens = np.bincount(block_of * sources + label[:size], weights=length[:size],
                             minlength=blocks * sources).reshape(blocks, sources).astype(np.int64)
        return EpochPlan(epoch, start_step, counts.astype(np.int64), tokens, starts,
                         np.tile(weights, (blocks, 1)))

    def _stretch(self, weights: list[float], targets: list[float], served: list[int], room: list[float],
                 step: int, limit: int | None, total: int) -> np.ndarray | None:
        """The counts of the full blocks from ``step`` on while the weights hold and no source runs out, computed
        at once: each block's running counts are the largest-remainder apportionment of the running targets, which
        is what the block-by-block rule gives while every source's target grows by at least a row a block. None
        when that does not hold (a source below a row a block, a ramp, a source about to run out)."""
        block = self.block
        if any(weight * block < 1 for weight in weights):
            return None
        until = self.mixture.constant_until(step)
        if until is None:
            return None
        blocks = (limit - total) // block if limit is not None else math.inf
        blocks = min(blocks, until - step)
        for weight, left in zip(weights, room):
            if left != math.inf:
                blocks = min(blocks, int(left // (weight * block)) + 1)
        if blocks == math.inf or blocks < 2:
            return None
        w = np.asarray(weights)
        steps = np.arange(1, int(blocks) + 1)
        running = np.asarray(targets)[None, :] + (steps * block)[:, None] * w[None, :]
        whole = np.floor(running)
        left_over = (sum(served) + steps * block) - whole.sum(axis=1).astype(np.int64)
        ranks = np.empty_like(whole, dtype=np.int64)
        ranks[np.arange(len(steps))[:, None], np.argsort(-(running - whole), axis=1, kind="stable")] = \
            np.arange(len(w))[None, :]
        cumulative = whole.astype(np.int64) + (ranks < left_over[:, None])
        counts = np.diff(np.vstack([np.asarray(served, dtype=np.int64)[None, :], cumulative]), axis=0)
        if (counts < 0).any():
            return None
        drawn = np.cumsum(counts, axis=0)
        within = np.ones(len(counts), dtype=bool)
        for s, left in enumerate(room):
            if left != math.inf:
                within &= drawn[:, s] < left  # the block that takes a source's last rows is left to the loop
        keep = int(np.argmin(within)) if not within.all() else len(counts)
        return counts[:keep] if keep >= 1 else None

    def _token_wants(self, weights: list[float], served: list[int], size: int) -> list[float]:
        """Rows of each source that bring its token count to its share after a block of ``size`` rows."""
        per_row = 1.0 / sum(weight / mean for weight, mean in zip(weights, self.means))  # tokens a mixed row
        total = sum(served) + size * per_row
        return [(weight * total - count) / mean for weight, count, mean in zip(weights, served, self.means)]


def _rows_and_steps(per_rank: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's batches as one array of rows and the step of each row: straight from the rows array of the
    plain sampler's batches (no Python list per batch), else batch by batch."""
    rows, steps = [], []
    for batches in per_rank:
        if isinstance(getattr(batches, "rows", None), np.ndarray) and len(batches):
            count = min(len(batches) * batches.size, len(batches.rows))
            rows.append(batches.rows[:count].astype(np.int64))
            steps.append(np.arange(count, dtype=np.int64) // batches.size)
            continue
        for step, batch in enumerate(batches):
            rows.append(np.asarray(batch, dtype=np.int64))
            steps.append(np.full(len(batch), step, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate(rows or [empty]), np.concatenate(steps or [empty])


def _joined(chunks: list[Any], sources: int, dtype: type) -> np.ndarray:
    """``[blocks, sources]`` from chunks that are arrays (stretches) or lists of one block's values, in order;
    runs of single blocks are joined as lists first (one array for many blocks, not one each)."""
    parts, run = [], []
    for chunk in chunks:
        if isinstance(chunk, np.ndarray):
            if run:
                parts.append(np.asarray(run, dtype=dtype).reshape(-1, sources))
                run = []
            parts.append(chunk.astype(dtype, copy=False))
        else:
            run.extend(chunk)
    if run:
        parts.append(np.asarray(run, dtype=dtype).reshape(-1, sources))
    return np.concatenate(parts) if parts else np.zeros((0, sources), dtype=dtype)


def _apportion(want: list[float], weights: list[float], size: int, room: list[float]) -> list[int]:
    """``size`` seats among sources: the whole part of each one's ``want`` first, then the largest remainders,
    never more than a source's ``room``; sources of weight 0 get none while others have room."""
    sources = len(want)
    seats = [min(room[s], max(0, math.floor(want[s]))) if weights[s] > 0 else 0 for s in range(sources)]
    seats = [int(seat) for seat in seats]
    left = size - sum(seats)
    if left < 0:  # more whole parts than seats (sources ahead of their share gave none): trim the smallest wants
        for s in sorted(range(sources), key=lambda s: (want[s] - seats[s], s)):
            take = min(seats[s], -left)
            seats[s] -= take
            left += take
            if left == 0:
                break
    while left > 0:
        open_ = [s for s in range(sources) if weights[s] > 0 and seats[s] < room[s]]
        if not open_:
            open_ = [s for s in range(sources) if seats[s] < room[s]]
        if not open_:
            break  # every source ran out: the epoch's last block is short
        order = sorted(open_, key=lambda s: (-(want[s] - seats[s]), s))
        for s in order[:left]:
            seats[s] += 1
        left = size - sum(seats)
    return seats


class ServedMeter:
    """What a mixture's sampler has served, over all ranks, per source: rows and tokens since the start of
    training. It is a function of the sampler's position (the order is), read from per-epoch running totals, so a
    state carries it in a few numbers and a resumed run goes on counting from the saved totals."""

    def __init__(self, order: MixtureOrder) -> None:
        self.order = order
        self.base = np.zeros((2, len(order.sizes)), dtype=np.int64)
        self.base_point: tuple[int, tuple[tuple[int, int], ...], int] = (0, (), 0)
        self._running: dict[tuple[object, ...], np.ndarray] = {}

    def served(self, sampler: Any) -> np.ndarray:
        """``[rows, tokens] x sources`` served up to the sampler's position (epochs are taken to run in turn)."""
        state = sampler._pass
        epoch, segments, position = state.epoch, state.served, state.position
        base_epoch, base_segments, base_position = self.base_point
        if epoch < base_epoch:
            return self.base.copy()
        first = self._totals(sampler, base_epoch, base_segments)
        if epoch == base_epoch and segments == base_segments:
            return self.base + first[min(position, len(first) - 1)] - first[min(base_position, len(first) - 1)]
        served = self.base + first[-1] - first[min(base_position, len(first) - 1)]
        for between in range(base_epoch + 1, epoch):
            served = served + self._totals(sampler, between, ())[-1]
        now = self._totals(sampler, epoch, segments)
        return served + now[min(position, len(now) - 1)]

    def rebase(self, sampler: Any, served: np.ndarray) -> None:
        """Count on from ``served`` (a loaded state's totals) at the sampler's loaded position."""
        state = sampler._pass
        self.base, self.base_point = np.asarray(served, dtype=np.int64), (state.epoch, state.served, state.position)

    def _totals(self, sampler: Any, epoch: int, segments: tuple[tuple[int, int], ...]) -> np.ndarray:
        """``[steps + 1, 2, sources]``: served after each step of ``epoch`` on the sampler's ranks (all of them),
        after the ``segments`` served on other numbers of ranks."""
        key = (epoch, segments, sampler.num_replicas, sampler.per_rank_size)
        if key not in self._running:
            order, total = self.order.order(epoch), sampler.num_replicas * sampler.per_rank_size
            before = np.zeros((2, len(self.order.sizes)), dtype=np.int64)
            for replicas, position in segments:
                rows = np.concatenate([np.asarray(row, dtype=np.int64) for rank in range(replicas) for row in
                                       sampler.batches_of(order, epoch, replicas, rank, total // replicas)[:position]]
                                      or [np.zeros(0, dtype=np.int64)])
                before += self._tally(rows, np.zeros(len(rows), dtype=np.int64), 1)[0]
                order = without(order, rows)
            per_rank = [sampler.batches_of(order, epoch, sampler.num_replicas, rank, total // sampler.num_replicas)
                        for rank in range(sampler.num_replicas)]
            steps = max((len(batches) for batches in per_rank), default=0)
            flat, step_of = _rows_and_steps(per_rank)
            per_step = self._tally(flat, step_of, steps)
            kept = list(self._running.items())[-2:]  # the base epoch's and the current one's, and one more
            self._running = {**dict(kept), key: np.concatenate([before[None], before + np.cumsum(per_step, axis=0)])}
        return self._running[key]

    def _tally(self, rows: np.ndarray, step_of: np.ndarray, steps: int) -> np.ndarray:
        """``[steps, 2, sources]``: rows and tokens of each source in each step."""
        sources = len(self.order.sizes)
        which = self.order.source_of(rows)
        out = np.zeros((max(steps, 1), 2, sources), dtype=np.int64)
        out[:, 0] = np.bincount(step_of * sources + which, minlength=max(steps, 1) * sources).reshape(-1, sources)
        if self.order.lengths is not None and len(rows):
            lengths = np.concatenate(self.order.lengths)[rows]
            out[:, 1] = np.bincount(step_of * sources + which, weights=lengths,
                                    minlength=max(steps, 1) * sources).reshape(-1, sources).astype(np.int64)
        return out[:steps] if steps else out[:0]
