"""DataMonitorCallback: the data path's metrics (:class:`~engine.tools.monitor.DataMonitor`) logged during a
Lightning ``fit``. Its own module, so the monitor itself never imports Lightning."""

from __future__ import annotations

import time
from typing import Any

from engine.core.checks import check_int
from engine.core.compat import lightning
from engine.core.stage_times import StageTimes, TimesItsStages
from engine.tools.monitor import DataMonitor
from engine.tools.rank_waits import RankWaits


class DataMonitorCallback(lightning().Callback):
    """Logs the data-path metrics during ``fit`` as ``data/<name>`` through ``pl_module.log``.

    The wait for a batch is the time from the end of the previous training batch (or the start of the epoch)
    to ``on_train_batch_start``, less the batch's transfer: Lightning fetches the next batch, and copies it to the
    device, in that gap, and a :class:`~engine.datamodule.universal.UniversalDataModule` times the copy and its
    hooks as the train loader's ``transfer`` stage. The train loader's stage times (fetch, decode, collate where an
    engine loader runs them; transfer) are logged as ``data/stage_<name>_ms``. Metrics cover the current epoch and
    are logged every ``log_every_n_steps`` batches and at the end of each epoch; ``self.monitor`` holds them. At the
    end of each epoch every rank's wait is gathered (a few floats per rank over gloo) into ``self.rank_waits``, and
    its imbalance (max/mean wait) is logged as ``data/wait_imbalance``.

    Args:
        log_every_n_steps: Log every this many training batches.
        memory_every: Sample memory every this many batches (each sample is a few psutil system calls).
        prefix: Prefix of the logged names.
    """

    def __init__(self, *, log_every_n_steps: int = 50, memory_every: int = 50, prefix: str = "data/") -> None:
        check_int("log_every_n_steps", log_every_n_steps, minimum=1)
        self.log_every_n_steps, self.prefix = log_every_n_steps, prefix
        self.monitor = DataMonitor(memory_every=memory_every)
        self._last_end: float | None = None
        self._stage_times: StageTimes | None = None  # the train loader's, where it times its stages
        self._transfer_s = 0.0  # its transfer seconds at the end of the last batch
        self.last_logged: dict[str, float] = {}
        self.rank_waits: RankWaits | None = None
        """Every rank's wait for data in the last epoch (:class:`~engine.tools.rank_waits.RankWaits`)."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.reset()
        loader = trainer.train_dataloader
        self._stage_times = loader.stage_times if isinstance(loader, TimesItsStages) else None
        if self._stage_times is not None:
            self.monitor.watch(self._stage_times)
        self._mark_end()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_end is None:
            self.monitor.record(batch)
            return
        transfer = self._stage_times.total("transfer") - self._transfer_s if self._stage_times is not None else 0.0
        self.monitor.record(batch, wait_s=now - self._last_end - transfer, transfer_s=transfer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._mark_end()
        self.monitor.end_step(self._last_end)
        if self.monitor.batches % self.log_every_n_steps == 0:
            self._log(pl_module, on_step=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.rank_waits = self.monitor.rank_waits()  # every rank calls this hook: the gather is collective
        if self.monitor.batches:
            self._log(pl_module, on_step=False)

    def _mark_end(self) -> None:
        """A batch's step ended (or the epoch started): the next batch's wait and transfer count from now."""
        self._last_end = time.perf_counter()
        self._transfer_s = self._stage_times.total("transfer") if self._stage_times is not None else 0.0

    def _log(self, pl_module: Any, *, on_step: bool) -> None:
        stats = self.monitor.stats().as_dict()
        if not on_step and self.rank_waits is not None:
            stats["wait_imbalance"] = self.rank_waits.imbalance
        self.last_logged = {f"{self.prefix}{key}": value for key, value in stats.items()}
        for name, value in self.last_logged.items():
            pl_module.log(name, value, on_step=on_step, on_epoch=not on_step, batch_size=1)
