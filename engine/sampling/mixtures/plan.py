"""The counts of a mixture's epoch: how many rows of each source every block takes, and which draws they are.

Block by block, the counts keep every source's running count within one row of its target share (rows), and under
a schedule its running token count near its share (tokens): each block gives each source the whole part of its
deficit and the rest of the block to the largest remainders. Full blocks at constant weights are apportioned in one
vectorized step (the block-by-block rule's result), mixing by tokens at constant weights merges the sources'
draws in the order their shares make them due, and by tokens under a schedule the blocks are walked in a compiled
loop (:mod:`engine.sampling.mixtures._kernels`). :mod:`engine.sampling.mixtures.order` turns the counts into an
order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.rng import derive_seed
from engine.sampling.blocks import BlockOrder


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


class Draws:
    """One source's draws in one epoch: its rows pass after pass, each pass a seeded permutation (read ahead in
    growing steps, with the running token count of the draws when lengths are known)."""

    def __init__(self, seed: int, name: str, size: int, start: int, fresh_epoch: int | None,
                 lengths: np.ndarray | None, within: BlockOrder | None = None, skip: np.ndarray | None = None) -> None:
        self.seed, self.name, self.size, self.start = seed, name, size, start
        self.fresh_epoch, self.lengths, self.within = fresh_epoch, lengths, within
        self.skip = np.zeros(0, dtype=np.int64) if skip is None else skip
        """Draws after ``start`` (their numbers in the source's stream) not to draw again: served in this epoch
        under another mixture (``on_change='continue'``)."""
        self.taken = 0
        self._next = start  # the number in the stream of the next draw read ahead
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
            number, within = divmod(self._next, self.size)
            chunk = self._permutation(number)[within:]
            if len(self.skip):
                chunk = chunk[~np.isin(np.arange(self._next, self._next + len(chunk)), self.skip)]
            self._next += self.size - within
            chunks.append(chunk)
            have += len(chunk)
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


def walk(order: Any, epoch: int, start_step: int, starts: tuple[int, ...], rows_before: int = 0) -> EpochPlan:
    """Block by block: each source's rows so that its running share stays within a row of its target.

    ``rows_before``: rows the epoch served before ``start_step`` under another mixture (``on_change='continue'``);
    they count towards the epoch's rows, and a capped source's ``start`` (its draws served in the epoch) towards
    its passes."""
    mixture, sources = order.mixture, len(order.sizes)
    skips = order._skips[epoch]  # set before the walk (the epoch's plan is being made)
    caps = [None if mixture.passes(name) is None else mixture.passes(name) * int(size) - start - len(skip)
            for name, size, start, skip in zip(mixture.names, order.sizes, starts, skips)]
    limit = mixture.samples_per_epoch
    if limit is None and all(cap is None for cap in caps):
        limit = int(order.sizes.sum())
    if rows_before:
        limit = None if limit is None else limit - rows_before
        if (limit is not None and limit <= 0) or any(cap is not None and cap <= 0 for cap in caps):
            empty = np.zeros((0, sources), dtype=np.int64)  # the epoch was over: a source stopped, or its rows
            return EpochPlan(epoch, start_step, empty, empty if order.lengths is not None else None, starts,
                             np.zeros((0, sources)))
    if mixture.by == "tokens":
        return (_scheduled_by_tokens if mixture.points else _merged_by_tokens)(order, epoch, start_step, starts,
                                                                              caps, limit)
    draws = order._new_draws(epoch, starts)
    targets, served = [0.0] * sources, [0] * sources
    counts, tokens, used, total, step = [], [], [], 0, start_step  # chunks of [blocks, sources]
    cached_step, weights = None, None
    last_change = mixture.points[-1][0] if mixture.points else 0
    while True:
        if mixture.constant_until(step) is None:  # inside a linear ramp: block by block, in the compiled loop
            served, targets, step, total, going = _ramp_blocks(order, draws, caps, limit, step, total, served,
                                                                    targets, (counts, tokens, used))
            if going:
                continue
            break
        size = order.block if limit is None else min(order.block, limit - total)
        if size <= 0:
            break
        if cached_step is None or mixture.points:
            weights = mixture.weights_at(step).tolist()
            cached_step = step
        if limit is None and not any(weight > 0 and cap is not None for weight, cap in zip(weights, caps)) \
                and step >= last_change:
            raise _never_ends(mixture, caps, step)
        room = [math.inf if cap is None else cap - taken for cap, taken in zip(caps, served)]
        stretch = _stretch(order, weights, targets, served, room, step, limit, total)
        if stretch is not None:  # blocks at constant weights, in one vectorized step
            targets = [target + weight * order.block * len(stretch) for target, weight in zip(targets, weights)]
            chunk_tokens = np.stack([one.take_blocks(stretch[:, s]) for s, one in enumerate(draws)], axis=1)
            counts.append(stretch)
            used.append(np.tile(weights, (len(stretch), 1)))
            tokens.append(chunk_tokens)
            served = [count + int(taken) for count, taken in zip(served, stretch.sum(axis=0))]
            total += int(stretch.sum())
            step += len(stretch)
            continue
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
        total += sum(block)
        step += 1
        if sum(block) < size or any(r != math.inf and taken >= r for r, taken in zip(room, block)):
            break  # a source ran out (its last rows are in this block), or every source did
    return EpochPlan(epoch, start_step, _joined(counts, sources, np.int64),
                     _joined(tokens, sources, np.int64) if order.lengths is not None else None,
                     starts, _joined(used, sources, np.float64))

def _ramp_blocks(order: Any, draws: list[Draws], caps: list[int | None], limit: int | None, step: int, total: int,
                 served: list[int], targets: list[float], out: tuple[list[Any], list[Any], list[Any]]
                 ) -> tuple[list[int], list[float], int, int, bool]:
    """The blocks of the linear ramp that ``step`` is in, by rows, one by one in the compiled loop
    :func:`engine.sampling.mixtures._kernels.row_blocks` (the block-by-block rule of :func:`walk`, bit for bit),
    appended to ``out`` (counts, tokens, weights). Returns the walk's state after the blocks
    (served, targets, step, total) and whether the epoch goes on past the ramp."""
    from engine.sampling.mixtures import _kernels  # numba, compiled on first use: mixtures with a ramp

    mixture, sources, block = order.mixture, len(draws), order.block
    end = next(point for point, _, _ in mixture.points if point > step)
    counted = order.lengths is not None
    capped = np.asarray([-1 if cap is None else cap for cap in caps], dtype=np.int64)
    served_now, targets_now = np.asarray(served, dtype=np.int64), np.asarray(targets, dtype=np.float64)
    span = 1024
    while True:
        if counted:
            for s, one in enumerate(draws):
                one._ensure(int(served_now[s]) + block)
            running = np.concatenate([one._running for one in draws])
            bases = np.r_[0, np.cumsum([len(one._running) for one in draws])[:-1]].astype(np.int64)
            have = np.asarray([len(one._rows) for one in draws], dtype=np.int64)
        else:
            running, bases, have = (np.zeros(0, dtype=np.int64), np.zeros(sources, dtype=np.int64),
                                    np.zeros(sources, dtype=np.int64))
        weights = mixture.weights_over(np.arange(step, min(end, step + span)))
        chunk_counts, chunk_tokens = (np.empty((len(weights), sources), dtype=np.int64),
                                      np.empty((len(weights), sources), dtype=np.int64))
        reason, written, step, total = _kernels.row_blocks(
            running, bases, have, weights, block, -1 if limit is None else limit, capped, mixture.points[-1][0],
            step, total, served_now, targets_now, chunk_counts, chunk_tokens)
        for chunks, chunk in zip(out, (chunk_counts, chunk_tokens, weights)):
            chunks.append(chunk[:written])
        for s, one in enumerate(draws):
            one.taken = int(served_now[s])  # the draws taken, as Draws.take counts them
        if reason == _kernels.NEVER:
            raise _never_ends(mixture, caps, step)
        if reason == _kernels.STEPS and step < end:
            span = min(2 * span, 1 << 16)
        elif reason != _kernels.DRAWS:
            return served_now.tolist(), targets_now.tolist(), step, total, reason == _kernels.STEPS


def _never_ends(mixture: Any, caps: list[int | None], step: int) -> ValueError:
    stopping = [name for name, cap in zip(mixture.names, caps) if cap is not None]
    return ValueError(f"the mixture's epoch would never end: from step {step} on, the sources that stop "
                      f"({stopping}) have weight 0 and the others cycle; give samples_per_epoch=..., or a "
                      f"stopping source a weight")


def _scheduled_by_tokens(order: Any, epoch: int, start_step: int, starts: tuple[int, ...], caps: list[int | None],
                         limit: int | None) -> EpochPlan:
    """By tokens under a schedule: block by block, each at its step's weights, in the compiled loop
    :func:`engine.sampling.mixtures._kernels.token_blocks`: the sources' next draws merged in the order in which
    they fall due, as at constant weights, counting from each source's tokens beyond its target so far (the
    targets add each block's tokens at the weights of its own step). A draw is due when the block's token count
    reaches (the source's tokens beyond its target, plus its tokens in the block before the draw, plus half its
    own) over its weight; a source of weight 0 is drawn only when the others ran out. Not the weights times all
    the tokens so far: after a switch, that starves a source until its share of the whole run catches up with
    its new weight.
    The loop runs over a span of steps with the draws at hand; between runs the draws are read ahead (doubling)
    and the next span's weights computed at once."""
    from engine.sampling.mixtures import _kernels  # numba, compiled on first use: mixtures by tokens that change

    mixture, sources, block = order.mixture, len(order.sizes), order.block
    draws = order._new_draws(epoch, starts)
    for one in draws:
        one._ensure(block)
    capped = np.asarray([-1 if cap is None else cap for cap in caps], dtype=np.int64)
    served, token_served = np.zeros(sources, dtype=np.int64), np.zeros(sources, dtype=np.int64)
    targets = np.zeros(sources)
    counts, tokens, used = [], [], []
    step, total, span = start_step, 0, 1024
    while True:
        running = np.concatenate([one._running for one in draws])
        bases = np.r_[0, np.cumsum([len(one._running) for one in draws])[:-1]].astype(np.int64)
        have = np.asarray([len(one._rows) for one in draws], dtype=np.int64)
        weights = mixture.weights_over(np.arange(step, step + span))
        chunk_counts, chunk_tokens = np.empty((span, sources), dtype=np.int64), np.empty((span, sources), np.int64)
        reason, written, step, total = _kernels.token_blocks(
            running, bases, have, weights, block, -1 if limit is None else limit, capped,
            mixture.points[-1][0], step, total, served, token_served, targets, chunk_counts, chunk_tokens)
        counts.append(chunk_counts[:written])
        tokens.append(chunk_tokens[:written])
        used.append(weights[:written])
        if reason == _kernels.NEVER:
            raise _never_ends(mixture, caps, step)
        if reason == _kernels.DRAWS:
            for s, one in enumerate(draws):
                one._ensure(int(served[s]) + block)
        elif reason == _kernels.STEPS:
            span = min(2 * span, 1 << 16)
        else:
            break
    return EpochPlan(epoch, start_step, np.concatenate(counts), np.concatenate(tokens), starts, np.concatenate(used))


def _merged_by_tokens(order: Any, epoch: int, start_step: int, starts: tuple[int, ...], caps: list[int | None],
                      limit: int | None) -> EpochPlan:
    """By tokens at constant weights: every source's draws merged in the order of the mixture's token count at
    which each is due (a draw is due when the source's tokens before it, plus half its own, reach its share:
    ``(tokens before + length / 2) / weight``), so at every block boundary each source's tokens are within
    about a row of its share. The epoch ends at ``limit`` rows, or with the block that takes the last rows of
    a source that stops."""
    weights = np.asarray([order.mixture.weights[name] for name in order.mixture.names])
    shares = np.where(weights > 0, weights / np.asarray(order.means), 0.0)
    shares = shares / shares.sum()  # each source's expected share of the rows
    horizon = limit if limit is not None else min(
        (cap / share for cap, share in zip(caps, shares) if cap is not None and share > 0), default=0)
    if limit is None and not any(cap is not None and weight > 0 for cap, weight in zip(caps, weights)):
        stopping = [name for name, cap in zip(order.mixture.names, caps) if cap is not None]
        raise ValueError(f"the mixture's epoch would never end: the sources that stop ({stopping}) have weight "
                         f"0 and the others cycle; give samples_per_epoch=..., or a stopping source a weight")
    from engine.sampling.mixtures import _kernels  # numba, compiled on first use

    draws = order._new_draws(epoch, starts)
    margin = 1.25
    while True:
        wanted = [0 if share == 0 else int(np.ceil(horizon * share * margin)) + 2 * order.block + 64
                  for share in shares]
        wanted = [want if cap is None else min(want, cap) for want, cap in zip(wanted, caps)]
        keys, numbers, lengths = [], [], []
        for index, (one, want) in enumerate(zip(draws, wanted)):
            if want == 0:
                continue
            one.rows(want)
            before = one._running[:want]  # the tokens of the source's draws before each (from its first)
            own = one._running[1:want + 1] - before
            keys.append((before + own / 2) / weights[index])
            numbers.append(index)
            lengths.append(own)
        label, length = _kernels.merge_due(tuple(keys), np.asarray(numbers, dtype=np.int64), tuple(lengths))
        size = len(label) if limit is None else min(limit, len(label))
        ran_out = [index for index, (want, cap) in enumerate(zip(wanted, caps)) if want and want == cap]
        ends = [int(np.flatnonzero(label == index)[-1]) + 1 for index in ran_out]  # past a stopping source
        if ends and min(ends) <= size:
            size = min(-(-min(ends) // order.block) * order.block, size)
        drawn = np.bincount(label[:size], minlength=len(wanted))
        short = [index for index, (want, cap) in enumerate(zip(wanted, caps))
                 if want and want != cap and drawn[index] >= want]
        if not short:
            break
        margin *= 2  # a cycling source drew all the draws taken out for it: take more
    blocks = -(-size // order.block)
    block_of = np.arange(size) // order.block
    sources = len(order.sizes)
    counts = np.bincount(block_of * sources + label[:size], minlength=blocks * sources).reshape(blocks, sources)
    tokens = np.bincount(block_of * sources + label[:size], weights=length[:size],
                         minlength=blocks * sources).reshape(blocks, sources).astype(np.int64)
    return EpochPlan(epoch, start_step, counts.astype(np.int64), tokens, starts,
                     np.tile(weights, (blocks, 1)))

def _stretch(order: Any, weights: list[float], targets: list[float], served: list[int], room: list[float],
             step: int, limit: int | None, total: int) -> np.ndarray | None:
    """The counts of the full blocks from ``step`` on while the weights hold and no source runs out, computed
    at once: each block's running counts are the largest-remainder apportionment of the running targets, which
    is what the block-by-block rule gives while every source's target grows by at least a row a block. None
    when that does not hold (a source below a row a block, a ramp, a source about to run out)."""
    block = order.block
    if any(weight * block < 1 for weight in weights):
        return None
    until = order.mixture.constant_until(step)
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
