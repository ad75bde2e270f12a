"""Compiled loop (numba) of a mixture's epoch drawn by tokens under a schedule: each block's draws merged in the
order in which they fall due (the rule :func:`engine.sampling.mixtures.plan._scheduled_by_tokens` describes), block
after block.

Every block's merge depends on the tokens of the blocks before it (the targets add each block's tokens at its
step's weights), so the blocks are computed in turn; in Python each costs dozens of numpy calls, here a few
hundred compares. The arithmetic is that of the rule in numpy, operation for operation (the same float64 values,
the same ties: a stable sort's, as each source's keys only grow), so the order is the same bit for bit. Compiled
on first use (about a second) and cached on disk, like the collators' loops (:func:`collators._kernels.compiled`).

Two one-pass loops serve every epoch's order: :func:`merge_due` merges the sources' draws by tokens at constant
weights (where a stable sort of all the keys took several passes), and :func:`place_rows` lays each source's rows
at its positions (where a mask per source took two passes each).
"""

from __future__ import annotations

import numpy as np

from collators.compiled import compiled

GO_ON, LIMIT, EMPTY, LAST, DRAWS, STEPS, NEVER = 0, 1, 2, 3, 4, 5, 6
"""Why :func:`token_blocks` returned: the blocks go on past its steps (``STEPS``) or a source needs more draws
at hand (``DRAWS``); the epoch ended at its row limit (``LIMIT``), with a block that took nothing (``EMPTY``), or
with a source's last rows or a short block (``LAST``); or it would never end (``NEVER``)."""


@compiled
def token_blocks(running: np.ndarray, bases: np.ndarray, have: np.ndarray, weights: np.ndarray, block: int,
                 limit: int, caps: np.ndarray, last_change: int, step: int, total: int, served: np.ndarray,
                 token_served: np.ndarray, targets: np.ndarray, counts: np.ndarray,
                 tokens: np.ndarray) -> tuple[int, int, int, int]:
    """Blocks from ``step`` on, each drawn by tokens at its row of ``weights`` (``weights[k]``: step ``step + k``).

    Source ``s``'s running tokens (before each of its draws, and after the last at hand) are
    ``running[bases[s]:bases[s] + have[s] + 1]``; ``served`` (rows: the draws taken), ``token_served`` and
    ``targets`` (each source's tokens the weights asked for so far) are the walk's state, updated in place;
    ``limit`` < 0: none; ``caps[s]`` < 0: the source cycles. Block ``k``'s rows and tokens are written to
    ``counts[k]`` and ``tokens[k]``. Returns ``(reason, blocks written, step, total rows)``.
    """
    sources = len(bases)
    keys = np.empty(sources, dtype=np.float64)
    offsets = np.empty(sources, dtype=np.float64)
    room = np.empty(sources, dtype=np.int64)
    count = np.empty(sources, dtype=np.int64)
    picked = np.empty(sources, dtype=np.int64)
    written = 0
    while True:
        size = block if limit < 0 else min(block, limit - total)
        if size <= 0:
            return LIMIT, written, step, total
        if written == len(weights):
            return STEPS, written, step, total
        w = weights[written]
        if limit < 0 and step >= last_change:
            stops = False
            for s in range(sources):
                if w[s] > 0 and caps[s] >= 0:
                    stops = True
            if not stops:
                return NEVER, written, step, total
        for s in range(sources):
            if served[s] + size > have[s]:
                return DRAWS, written, step, total
        # the block: each source's next draws merged by the token count at which each falls due
        for s in range(sources):
            room[s] = size if caps[s] < 0 else caps[s] - served[s]
            count[s] = max(0, min(size, room[s]))
            picked[s] = 0
            at = bases[s] + served[s]
            offsets[s] = (np.float64(token_served[s]) - targets[s]) - np.float64(running[at])
            if count[s] > 0:
                keys[s] = _due(running, at, offsets[s], w[s])
        drawn = 0
        while drawn < size:
            best = -1
            for s in range(sources):
                if picked[s] < count[s] and (best < 0 or keys[s] < keys[best]):
                    best = s
            if best < 0:
                break
            picked[best] += 1
            drawn += 1
            if picked[best] < count[best]:
                keys[best] = _due(running, bases[best] + served[best] + picked[best], offsets[best], w[best])
        if drawn == 0:
            return EMPTY, written, step, total
        block_tokens = 0
        for s in range(sources):
            at = bases[s] + served[s]
            tokens[written, s] = running[at + picked[s]] - running[at]
            counts[written, s] = picked[s]
            block_tokens += tokens[written, s]
        last = drawn < size
        for s in range(sources):
            if caps[s] >= 0 and picked[s] >= room[s]:
                last = True
            served[s] += picked[s]
            token_served[s] += tokens[written, s]
            targets[s] = targets[s] + w[s] * np.float64(block_tokens)
        total += drawn
        step += 1
        written += 1
        if last:
            return LAST, written, step, total


@compiled
def _due(running: np.ndarray, at: int, offset: float, weight: float) -> float:
    """The token count of the mixture at which the draw at ``at`` falls due (inf for a source of weight 0)."""
    if weight > 0:
        return ((running[at] + running[at + 1]) * 0.5 + offset) / weight
    return np.inf


@compiled
def row_blocks(running: np.ndarray, bases: np.ndarray, have: np.ndarray, weights: np.ndarray, block: int,
               limit: int, caps: np.ndarray, last_change: int, step: int, total: int, served: np.ndarray,
               targets: np.ndarray, counts: np.ndarray, tokens: np.ndarray) -> tuple[int, int, int, int]:
    """Blocks from ``step`` on drawn by rows, one by one (a ramp's steps), each at its row of ``weights``: every
    source's target grows by its weight times the block, and the block's rows go to the whole part of each
    source's deficit, then the largest remainders (:func:`engine.sampling.mixtures.plan._apportion`'s rule,
    operation for operation). Arguments and result as :func:`token_blocks`'s (``targets``: rows; ``running``
    empty when the rows' lengths are unknown: no tokens are counted)."""
    sources = len(bases)
    room = np.empty(sources, dtype=np.float64)
    want = np.empty(sources, dtype=np.float64)
    seats = np.empty(sources, dtype=np.int64)
    done = np.empty(sources, dtype=np.bool_)
    counted = len(running) > 0
    written = 0
    while True:
        size = block if limit < 0 else min(block, limit - total)
        if size <= 0:
            return LIMIT, written, step, total
        if written == len(weights):
            return STEPS, written, step, total
        w = weights[written]
        if limit < 0 and step >= last_change:
            stops = False
            for s in range(sources):
                if w[s] > 0 and caps[s] >= 0:
                    stops = True
            if not stops:
                return NEVER, written, step, total
        if counted:
            for s in range(sources):
                if served[s] + size > have[s]:
                    return DRAWS, written, step, total
        for s in range(sources):
            room[s] = np.inf if caps[s] < 0 else np.float64(caps[s] - served[s])
            targets[s] = targets[s] + w[s] * size
            want[s] = targets[s] - served[s]
        _apportion(want, w, size, room, seats, done)
        drawn = 0
        for s in range(sources):
            drawn += seats[s]
        if drawn == 0:
            return EMPTY, written, step, total
        last = drawn < size
        for s in range(sources):
            counts[written, s] = seats[s]
            if counted:
                at = bases[s] + served[s]
                tokens[written, s] = running[at + seats[s]] - running[at]
            else:
                tokens[written, s] = 0
            if room[s] != np.inf and seats[s] >= room[s]:
                last = True
            served[s] += seats[s]
        total += drawn
        step += 1
        written += 1
        if last:
            return LAST, written, step, total


@compiled
def _apportion(want: np.ndarray, weights: np.ndarray, size: int, room: np.ndarray, seats: np.ndarray,
               done: np.ndarray) -> None:
    """``size`` seats among sources into ``seats``: the whole part of each one's ``want`` first, then the largest
    remainders (ties to the first source), never more than a source's ``room``; sources of weight 0 get none
    while others have room. More whole parts than seats: the smallest wants give theirs back first."""
    sources = len(want)
    left = size
    for s in range(sources):
        seats[s] = int(min(room[s], max(0.0, np.floor(want[s])))) if weights[s] > 0 else 0
        left -= seats[s]
    if left < 0:
        done[:] = False
        for _ in range(sources):
            pick = -1
            for s in range(sources):
                if not done[s] and (pick < 0 or want[s] - seats[s] < want[pick] - seats[pick]):
                    pick = s
            done[pick] = True
            take = min(seats[pick], -left)
            seats[pick] -= take
            left += take
            if left == 0:
                break
    while left > 0:
        weighted = False
        for s in range(sources):
            if weights[s] > 0 and seats[s] < room[s]:
                weighted = True
        opened = 0
        for s in range(sources):  # open: sources with room (of weight > 0, while one has room)
            done[s] = not (seats[s] < room[s] and (weights[s] > 0 or not weighted))
            opened += not done[s]
        if opened == 0:
            return
        for _ in range(min(left, opened)):  # a seat each to the largest remainders
            pick = -1
            for s in range(sources):
                if not done[s] and (pick < 0 or -(want[s] - seats[s]) < -(want[pick] - seats[pick])):
                    pick = s
            done[pick] = True
            seats[pick] += 1
        left = size - seats.sum()


@compiled
def merge_due(keys: tuple[np.ndarray, ...], numbers: np.ndarray, lengths: tuple[np.ndarray, ...]
              ) -> tuple[np.ndarray, np.ndarray]:
    """The draws of several sources merged in the order of their keys (each source's keys only grow): the source
    number ``numbers[s]`` and the length ``lengths[s][j]`` of each draw in turn. Ties go to the earlier source,
    as a stable sort of the keys laid end to end gives them (one pass, where a sort takes several)."""
    size = 0
    for s in range(len(keys)):
        size += len(keys[s])
    label = np.empty(size, dtype=np.int64)
    length = np.empty(size, dtype=np.int64)
    at = np.zeros(len(keys), dtype=np.int64)
    for i in range(size):
        best = -1
        for s in range(len(keys)):
            if at[s] < len(keys[s]) and (best < 0 or keys[s][at[s]] < keys[best][at[best]]):
                best = s
        label[i], length[i] = numbers[best], lengths[best][at[best]]
        at[best] += 1
    return label, length


@compiled
def place_rows(labels: np.ndarray, rows: tuple[np.ndarray, ...], offsets: np.ndarray, out: np.ndarray) -> None:
    """``out[labels == s] = rows[s] + offsets[s]`` for every source ``s``, in one pass over the positions."""
    taken = np.zeros(len(rows), dtype=np.int64)
    for i in range(len(labels)):
        source = labels[i]
        out[i] = rows[source][taken[source]] + offsets[source]
        taken[source] += 1
