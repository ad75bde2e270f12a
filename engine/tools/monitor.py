"""A data-path monitor: throughput, padding, time spent waiting for data, where the loader's time goes, and memory
of the process and workers.

Use it around any loader (``for batch in monitor.wrap(loader)``) or as a Lightning callback
(:class:`~engine.tools.monitor_callback.DataMonitorCallback`, in a module of its own so the monitor needs no
Lightning). Waiting time is the time spent inside ``next()`` on the loader: the part of a training step lost to
data; the copy to the device (``wrap(loader, device=...)``, or a data module's hooks in Lightning) is the
``transfer`` stage, timed apart from it. The engine's loaders time each batch's stages where they run, in workers
too (:mod:`engine.core.stage_times`); the monitor reports their means per batch.
:meth:`DataMonitor.rank_waits` gathers every rank's wait into one table (:mod:`engine.tools.rank_waits`). Memory
is the resident set size (psutil) of this process and of its child processes, which are the loader's workers (and
any other children the process started).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import psutil
import torch

from engine.core.checks import check_int
from engine.core.distributed import rank_and_world
from engine.core.stage_times import StageTimes, TimesItsStages
from engine.tools.inline import InlineFigure
from engine.tools.rank_waits import RankWait, RankWaits, gather_waits
from engine.tools.transfer import move_to_device

MB = 1024 * 1024


@dataclass(frozen=True)
class MonitorStats:
    """What the monitor measured since it started (or was reset)."""

    batches: int
    samples: int
    tokens: int
    """Real tokens: ``attention_mask`` sum, else ``input_ids`` element count; 0 for batches without either."""
    elapsed_s: float
    wait_s: float
    """Time spent inside ``next()`` on the loader (the transfer to the device left out: a stage of its own)."""
    batches_per_s: float
    samples_per_s: float
    tokens_per_s: float
    wait_share: float
    """``wait_s / elapsed_s``: 0 means data was always ready, 1 means the loop only waited."""
    padding_share: float | None
    """``1 - mean(attention_mask)`` over all batches; None when no batch had a mask."""
    rss_mb: float
    """Resident memory of this process, at the last sample."""
    worker_rss_mb: float
    """Resident memory of the child processes (loader workers), summed, at the last sample."""
    peak_rss_mb: float
    """Largest process + children total seen."""
    stages_ms: dict[str, float] = field(default_factory=dict)
    """Milliseconds per batch of each stage the loader timed (fetch, decode, collate; transfer with ``device=``
    or in Lightning), where it ran (in a worker, that worker's time: it overlaps the step)."""
    ranks: RankWaits | None = None
    """Every rank's wait and stages, from ``stats(gather=True)``; None otherwise."""

    def as_dict(self) -> dict[str, float]:
        """The stats as numbers (``padding_share`` left out when unknown; ``stage_<name>_ms`` per stage, and
        ``wait_imbalance`` when gathered), ready for a logger."""
        numbers = {item.name: float(getattr(self, item.name)) for item in fields(self)
                   if item.name not in ("stages_ms", "ranks") and getattr(self, item.name) is not None}
        numbers.update({f"stage_{stage}_ms": value for stage, value in self.stages_ms.items()})
        if self.ranks is not None:
            numbers["wait_imbalance"] = self.ranks.imbalance
        return numbers

    def __str__(self) -> str:
        padding = "n/a" if self.padding_share is None else f"{self.padding_share:.1%}"
        stages = ", ".join(f"{stage} {ms:.2f} ms" for stage, ms in self.stages_ms.items())
        return (f"{self.batches} batches in {self.elapsed_s:.2f}s: {self.batches_per_s:.1f} batches/s, "
                f"{self.samples_per_s:.1f} samples/s, {self.tokens_per_s:.0f} tokens/s; waited for data "
                f"{self.wait_s:.2f}s ({self.wait_share:.0%}); padding {padding}; RSS {self.rss_mb:.0f} MB + "
                f"workers {self.worker_rss_mb:.0f} MB (peak {self.peak_rss_mb:.0f} MB)"
                + (f"; per batch: {stages}" if stages else "")
                + (f"; {self.ranks.summary()}" if self.ranks is not None else ""))


def batch_counts(batch: Any) -> tuple[int, int, int, int]:
    """``(samples, tokens, mask ones, mask positions)`` of one batch (a dict, a sequence or a tensor)."""
    if isinstance(batch, Mapping):
        mask, ids = batch.get("attention_mask"), batch.get("input_ids")
        tensors = [v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    else:
        mask = ids = None
        items = batch if isinstance(batch, (list, tuple)) else [batch]
        tensors = [v for v in items if isinstance(v, torch.Tensor) and v.dim() > 0]
    samples = int(tensors[0].shape[0]) if tensors else 0
    if isinstance(mask, torch.Tensor):
        ones = int(mask.sum())
        return samples, ones, ones, mask.numel()
    tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
    return samples, tokens, 0, 0


class DataMonitor:
    """Counts batches, samples and tokens, times the wait for data and samples memory every ``memory_every`` batches.

    Example:
        >>> import torch
        >>> loader = [{"input_ids": torch.ones(4, 8, dtype=torch.long), "attention_mask": torch.ones(4, 8)}] * 3
        >>> monitor = DataMonitor()
        >>> for batch in monitor.wrap(loader):
        ...     pass
        >>> stats = monitor.stats()
        >>> stats.batches, stats.samples, stats.tokens, stats.padding_share
        (3, 12, 96, 0.0)
    """

    def __init__(self, *, memory_every: int = 50) -> None:
        check_int("memory_every", memory_every, minimum=1)
        self.memory_every = memory_every
        self._process = psutil.Process()
        self._loader_times: StageTimes | None = None  # the watched loader's, kept across resets
        self.reset()

    def reset(self) -> None:
        """Forget everything measured; the clock restarts now."""
        self.batches = self.samples = self.tokens = self._mask_ones = self._mask_positions = 0
        self.wait_s = 0.0
        self._waits: list[float] = []
        self._fetch_starts: list[float] = []  # when each batch was asked for: its step starts there
        self._last_end: float | None = None
        self.rss_mb = self.worker_rss_mb = self.peak_rss_mb = 0.0
        self._transfer = StageTimes()  # the copies to the device this monitor made
        self._since: tuple[dict[str, float], dict[str, int]] | None = None
        if self._loader_times is not None:
            self.watch(self._loader_times)
        self._start = time.perf_counter()
        self._stop: float | None = None

    def __enter__(self) -> DataMonitor:
        self.reset()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop = time.perf_counter()
        self.sample_memory()

    def watch(self, stage_times: StageTimes) -> None:
        """Report the stage times a loader adds up (``loader.stage_times``) from now on; :meth:`wrap` does this for
        the engine's loaders, and the Lightning callback for the trainer's train loader."""
        self._loader_times, self._since = stage_times, stage_times.snapshot()

    def wrap(self, loader: Iterable[Any], *, device: torch.device | str | None = None,
             transfer: Callable[[Any, torch.device | str], Any] | None = None) -> Iterator[Any]:
        """Iterate ``loader``, timing each ``next()`` and recording each batch. With ``device``, each batch is
        yielded as ``transfer(batch, device)`` makes it (by default :func:`~engine.tools.transfer.move_to_device`;
        a data module's hooks with ``transfer=dm.transfer``), timed as the ``transfer`` stage and left out of the
        wait (a CUDA copy is synchronized to be timed).

        Raises:
            ValueError: ``transfer`` without ``device`` (there is nowhere to copy to).
        """
        if transfer is not None and device is None:
            raise ValueError("device should be given with transfer= (it copies each batch there), but got "
                             "device=None; pass device=...")
        transfer = transfer or move_to_device
        if isinstance(loader, TimesItsStages):
            self.watch(loader.stage_times)
        iterator = iter(loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self.wait_s += time.perf_counter() - start
                self.end_step(start)  # the last step ended when the loop asked for one more batch
                return
            copied, transfer_s = time.perf_counter(), 0.0
            if device is not None:
                batch = transfer(batch, device)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize(device)
                transfer_s = time.perf_counter() - copied
                self._transfer.add_stage("transfer", transfer_s)
            self.record(batch, wait_s=copied - start, transfer_s=transfer_s)
            yield batch

    def stages_ms(self) -> dict[str, float]:
        """Milliseconds per batch of each stage timed since :meth:`watch` (or the reset), and of the transfer."""
        means = self._loader_times.mean_ms(self._since) if self._loader_times is not None else {}
        return {**means, **self._transfer.mean_ms()}

    def rank_wait(self) -> RankWait:
        """This rank's wait and stage times since the start (its rank from ``torch.distributed``, else 0)."""
        rank = (rank_and_world() or (0, 1))[0]
        elapsed = (self._stop or time.perf_counter()) - self._start
        return RankWait(rank, self.batches, self.wait_s, elapsed, 1000 * max(self._waits, default=0.0),
                        self.stages_ms())

    def rank_waits(self, group: Any = None) -> RankWaits:
        """Every rank's :meth:`rank_wait` in one table, with the imbalance (max/mean wait). A collective: every rank
        calls it (at report time; a few floats per rank over gloo). One process: this rank alone."""
        return gather_waits(self.rank_wait(), group)

    def record(self, batch: Any, wait_s: float = 0.0, transfer_s: float = 0.0) -> None:
        """Count one batch that took ``wait_s`` seconds to arrive, then ``transfer_s`` to reach the device (its step
        starts where the wait did)."""
        samples, tokens, ones, positions = batch_counts(batch)
        self._fetch_starts.append(time.perf_counter() - wait_s - transfer_s)
        self._waits.append(wait_s)
        self.batches += 1
        self.samples += samples
        self.tokens += tokens
        self._mask_ones += ones
        self._mask_positions += positions
        self.wait_s += wait_s
        if self.batches % self.memory_every == 1 or self.memory_every == 1:
            self.sample_memory()

    def end_step(self, now: float | None = None) -> None:
        """Mark the end of the last batch's step (``wrap`` and the callback do this); it closes the timeline."""
        self._last_end = time.perf_counter() if now is None else now

    def timeline(self) -> tuple[list[float], list[float]]:
        """``(wait_s, step_s)`` per batch: the wait for the batch, and its whole step (the wait plus the work
        until the next batch was asked for). A last step not yet ended is left out of both."""
        ends = [*self._fetch_starts[1:], *([self._last_end] if self._last_end is not None else [])]
        steps = [end - start for start, end in zip(self._fetch_starts, ends)]
        return self._waits[: len(steps)], steps

    def plot_timeline(self) -> InlineFigure:
        """The data-wait timeline as a figure (inline SVG): per step, the wait for data beside the step's time.

        Raises:
            ValueError: no step has been timed yet.
        """
        from engine.tools.figures import wait_timeline

        waits, steps = self.timeline()
        if not steps:
            raise ValueError("the monitor has timed no step yet; iterate monitor.wrap(loader) (or train with "
                             "DataMonitorCallback) before plot_timeline()")
        return InlineFigure(wait_timeline(waits, steps), title="data-wait timeline")

    def sample_memory(self) -> None:
        """Read the RSS of this process and of its children now."""
        try:
            children = self._process.children(recursive=True)
            self.rss_mb = self._process.memory_info().rss / MB
        except psutil.Error:  # the process table changed under us; keep the previous sample
            return
        worker = 0
        for child in children:
            try:
                worker += child.memory_info().rss
            except psutil.Error:  # a worker exited between listing and reading
                continue
        self.worker_rss_mb = worker / MB
        self.peak_rss_mb = max(self.peak_rss_mb, self.rss_mb + self.worker_rss_mb)

    def stats(self, *, gather: bool = False) -> MonitorStats:
        """The totals and rates so far (memory sampled now unless the monitor was closed); with ``gather``, also
        every rank's wait (:meth:`rank_waits`, a collective: every rank must ask)."""
        if self._stop is None:
            self.sample_memory()
        elapsed = max((self._stop or time.perf_counter()) - self._start, 1e-9)
        padding = 1 - self._mask_ones / self._mask_positions if self._mask_positions else None
        return MonitorStats(
            batches=self.batches, samples=self.samples, tokens=self.tokens, elapsed_s=elapsed, wait_s=self.wait_s,
            batches_per_s=self.batches / elapsed, samples_per_s=self.samples / elapsed,
            tokens_per_s=self.tokens / elapsed, wait_share=min(self.wait_s / elapsed, 1.0), padding_share=padding,
            rss_mb=self.rss_mb, worker_rss_mb=self.worker_rss_mb, peak_rss_mb=self.peak_rss_mb,
            stages_ms=self.stages_ms(), ranks=self.rank_waits() if gather else None,
        )
