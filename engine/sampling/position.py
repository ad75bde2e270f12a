"""Where training stands in its epochs: one immutable value, changed only by the transitions of its events.

A batch sampler (:class:`engine.sampling.base.EpochBatchSampler`) holds one :class:`PassState` and replaces it
at each event; its ``state_dict`` is the value's :meth:`PassState.as_state` and its seed (and, for samplers that
can resume on another number of ranks, the ranks and global batch). "Resume state" in ``docs/architecture.md``
describes the whole of a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.checks import check_saved_int
from engine.sampling.elastic import Segment


@dataclass(frozen=True)
class PassState:
    """The epoch and position of a batch sampler, and what it needs to read its callers' ``set_epoch``.

    A *pass* is one iteration over the sampler; it serves the batches of one (data) epoch from a start position.
    Callers number epochs their own way: after a resume of a pass they had counted as finished (Lightning stops
    at ``max_steps`` mid-epoch and counts that epoch), their numbers run ``offset`` ahead of the data's.

    ========================= ========================  ==================================================
    event                     transition                what changes
    ========================= ========================  ==================================================
    ``set_epoch(e)``          :meth:`pinned`            ``pinned_epoch = e``; ``loaded_epoch`` cleared.
                                                        ``e`` past the loaded pass: ``offset`` only, so
                                                        that ``e`` names that pass, which goes on. Else
                                                        ``offset`` 0 if ``e`` is below it, ``epoch = e -
                                                        offset``, ``resume`` 0 if that is another epoch
                                                        (``served`` cleared) or a pass had started
    a pass's first ``next()`` :meth:`started`           after a started pass: ``epoch + 1``, ``position``
                                                        0, ``served`` cleared; else ``position = resume``.
                                                        ``resume`` None, ``pinned_epoch`` cleared,
                                                        ``loaded_epoch`` kept only for the loaded pass
    each batch handed out     :meth:`advanced`          ``position``
    the end of the pass       :meth:`finished`          ``epoch`` = the pass's + 1, ``position`` 0,
                                                        ``served`` cleared, ``resume`` 0 unless set
    ``load_state_dict``       :meth:`loaded`            ``epoch``, ``position`` (and ``resume``),
                                                        ``offset`` and ``served`` from the saved value,
                                                        read against ``pinned_epoch``; ``loaded_epoch`` set
                                                        for a pass loaded part-way with none pinned
    ``state_dict``            :meth:`as_state`          nothing
    ========================= ========================  ==================================================
    """

    epoch: int = 0
    """The data epoch of the pass under way, or of the next pass while ``resume`` is set."""
    position: int = 0
    """Batches of ``epoch`` handed out: the position a checkpoint saves. ``set_epoch`` leaves it until a pass
    starts."""
    resume: int | None = 0
    """Where the next pass starts in ``epoch``; None once a pass started: the next one is the following epoch,
    even if this one is abandoned part-way."""
    offset: int = 0
    """The callers' epoch minus the data's; nonzero after resuming a pass the caller counted as finished."""
    pinned_epoch: int | None = None
    """The epoch the caller last pinned, in its numbering, until the next pass starts."""
    loaded_epoch: int | None = None
    """The epoch of a pass loaded part-way with no epoch pinned, until the caller pins one."""
    served: tuple[Segment, ...] = ()
    """The parts of ``epoch`` served on other numbers of ranks before this pass (:mod:`engine.sampling.elastic`)."""

    def _with(self, **changes: Any) -> PassState:
        """This value with ``changes``: ``dataclasses.replace`` without running ``__init__`` again, the costly part,
        since :meth:`advanced` runs on every batch."""
        changed = object.__new__(PassState)
        changed.__dict__.update(self.__dict__, **changes)
        return changed

    def pinned(self, epoch: int) -> PassState:
        """The caller pinned ``epoch`` (its numbering) for the next pass. A pin past a pass loaded part-way means
        the caller counted that pass as finished: the pass goes on, and later pins shift onto the data's epochs."""
        loaded = self.loaded_epoch
        if loaded is not None and epoch - self.offset > loaded:  # the loaded pass may already run, for a prefetch
            return self._with(pinned_epoch=epoch, loaded_epoch=None, offset=epoch - loaded)
        offset = self.offset if epoch >= self.offset else 0  # a caller that restarted its count is followed
        data_epoch = epoch - offset
        if data_epoch != self.epoch:
            return self._with(epoch=data_epoch, resume=0, served=(), offset=offset, pinned_epoch=epoch,
                           loaded_epoch=None)
        return self._with(resume=self.resume or 0, offset=offset, pinned_epoch=epoch, loaded_epoch=None)

    def started(self) -> PassState:
        """A pass started (its first ``next()``): it serves ``epoch`` from ``resume``, or the following epoch."""
        if self.resume is None:
            epoch, start, served = self.epoch + 1, 0, ()
        else:
            epoch, start, served = self.epoch, self.resume, self.served
        loaded = self.loaded_epoch if self.loaded_epoch == epoch and (start or served) else None
        return self._with(epoch=epoch, position=start, resume=None, served=served, pinned_epoch=None,
                       loaded_epoch=loaded)

    def advanced(self, position: int) -> PassState:
        """The pass handed out its batch ``position - 1``: ``position`` batches of its epoch are out."""
        return self._with(position=position)

    def finished(self, epoch: int) -> PassState:
        """The pass over ``epoch`` served its last batch and ended: the next pass starts the following epoch."""
        return self._with(epoch=epoch + 1, position=0, resume=self.resume or 0, served=())

    def loaded(self, saved: PassState, count: int) -> PassState:
        """Continue from ``saved`` (a value of :meth:`at`), a pass of ``count`` batches on this sampler's ranks.

        A state is applied after the caller's ``set_epoch`` for this run when the loader applies it lazily, at
        ``iter()`` (torchdata), and before it otherwise, so both orders mean the same. Against a pinned epoch that
        is not the saved one: a pass saved part-way that the caller counts as finished (pinned past it) goes on,
        with the offset between the numberings; a later epoch pinned at an epoch boundary wins. With no epoch
        pinned, a state saved after the pass's last batch was handed out (worker snapshots are taken then, before
        the pass ends) goes on with the next epoch rather than an empty pass; a caller that pins that very epoch
        (a multi-loader finishing a child's pass) gets the empty rest.
        """
        epoch, start, offset, served = saved.epoch, saved.position, saved.offset, saved.served
        part_way = (start > 0 or bool(served)) and start < count
        pinned = self.pinned_epoch
        if pinned is not None and pinned - offset != epoch:
            if part_way and pinned > epoch:
                offset = pinned - epoch
            elif pinned - offset > epoch:
                epoch, start, served, part_way = pinned - offset, 0, (), False
        elif pinned is None and start >= count:
            epoch, start, served = epoch + 1, 0, ()
        return PassState(epoch=epoch, position=start, resume=start, offset=offset, pinned_epoch=pinned,
                         loaded_epoch=epoch if part_way and pinned is None else None, served=served)

    def as_state(self) -> dict[str, int]:
        """The saved part: the epoch of the next batch, the batches of it handed out, and the callers' offset."""
        return {"epoch": self.epoch, "position": self.position, "epoch_offset": self.offset}

    @classmethod
    def at(cls, epoch: int, position: int, offset: int = 0, served: tuple[Segment, ...] = ()) -> PassState:
        """A saved value: the next pass serves ``epoch`` from ``position`` (after the parts ``served``)."""
        return cls(epoch=epoch, position=position, resume=position, offset=offset, served=served)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PassState:
        """The value :meth:`as_state` saved, its numbers checked (``epoch_offset`` is 0 when absent); the position
        is checked against the epoch's batches by the sampler."""
        epoch = check_saved_int("sampler state", "epoch", state["epoch"])
        position = check_saved_int("sampler state", "position", state["position"])
        return cls.at(epoch, position, check_saved_int("sampler state", "epoch_offset", state.get("epoch_offset", 0)))
