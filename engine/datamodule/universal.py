"""UniversalDataModule: :class:`~engine.datamodule.module.DataModule` as a ``LightningDataModule``.

The Trainer checks ``isinstance(dm, LightningDataModule)``, so the Lightning class is a subclass; it adds only what a
Trainer calls: the hyperparameters its checkpoints hold, the trainer's ranks, its sampler replacement turned off
for our rank-aware loaders, ``limit_train_batches`` in the saved position, and the batch hooks around the copy to
the device (timed as the ``transfer`` stage). Every argument, batch and state is the plain class's.
"""

from __future__ import annotations

import time
from typing import Any

from engine.core.compat import lightning
from engine.core.distributed import keep_our_samplers, resolve_world, restore_samplers
from engine.core.stage_times import TimesItsStages
from engine.datamodule import options
from engine.datamodule.module import NOT_CHECKPOINTED, DataModule

__all__ = ["NOT_CHECKPOINTED", "UniversalDataModule"]


class UniversalDataModule(DataModule, lightning().LightningDataModule):
    """A LightningDataModule that builds its collator from a TaskSpec and its loaders from a seed: a
    :class:`~engine.datamodule.module.DataModule` (same arguments, see there) that a Lightning ``Trainer`` takes.

    Also usable without a Trainer: ``dm.train_dataloader()`` works in a plain loop (setup runs on demand), and
    iterating the same train loader again gives the next epoch's order; a loop that never uses a Trainer can use
    ``DataModule`` and not import Lightning at all.

    Example:
        >>> import torch
        >>> from task_spec import TaskSpec
        >>> rows = [torch.randint(0, 100, (n,)) for n in range(5, 25)]
        >>> dm = UniversalDataModule(rows, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0.2)
        >>> sorted(next(iter(dm.train_dataloader())))
        ['attention_mask', 'input_ids', 'labels']
    """

    _samplers_kept = False
    """Whether setup turned the trainer's ``use_distributed_sampler`` off, until teardown."""
    _transfer_start: float | None = None
    """When the batch being copied to the device entered ``on_before_batch_transfer``."""

    def _record_configuration(self, configuration: dict[str, Any]) -> None:
        """Also where Lightning's checkpoints read the hyperparameters (``datamodule_hyper_parameters``)."""
        super()._record_configuration(configuration)
        options.record_configuration(self, configuration)

    def _world(self) -> tuple[int, int]:
        """(rank, world size) from the attached trainer, else as the plain module reads them."""
        return resolve_world(self.trainer)

    def setup(self, stage: str | None = None) -> None:
        """Tokenize raw text and compute the splits, once; later calls (any stage) do nothing. Thread-safe: calls
        from several threads at once set up once, the others wait for it."""
        with self._lock:
            # Our loaders shard by rank: Lightning's DDP must not replace their samplers (on until our teardown)
            self._samplers_kept = keep_our_samplers(self.trainer) or self._samplers_kept
            super().setup(stage)

    def teardown(self, stage: str | None = None) -> None:
        """Give the trainer back its replacement of samplers (``use_distributed_sampler``), which :meth:`setup`
        turned off for this module's loaders, for the loaders of its later runs without this module."""
        if self._samplers_kept:
            restore_samplers(self.trainer)
            self._samplers_kept = False

    def _epoch_batches(self) -> int | None:
        """The attached trainer's batches per epoch where it ends its epochs before the train loader's pass ends
        (``limit_train_batches``); None otherwise."""
        limit = getattr(self.trainer, "num_training_batches", None)
        loader = self._position.loader
        if not isinstance(limit, int) or loader is None or self._stream is not None:
            return None
        return limit if limit < len(loader) else None

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning hook, before the copy: the transfer stage starts (see :meth:`on_after_batch_transfer`); decode
        the JPEGs a vision-language collator left encoded (``decode_device``) on that device; other batches
        unchanged."""
        self._transfer_start = time.perf_counter()
        return self._before_transfer(batch)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning hook, on the device: finish uint8 image batches (``device_normalize``); others unchanged.

        A training batch's transfer, from :meth:`on_before_batch_transfer` to here (the hooks and the copy, as the
        step's thread spends them: a copy from pinned memory to CUDA runs on asynchronously), is added to the train
        loader's stage times as ``transfer``, which the training step's wait for its batch then leaves out
        (:class:`~engine.tools.monitor_callback.DataMonitorCallback`)."""
        batch = self._after_transfer(batch)
        start, self._transfer_start = self._transfer_start, None
        trainer = self.trainer
        if start is not None and trainer is not None and trainer.training:
            loader = trainer.train_dataloader
            if isinstance(loader, TimesItsStages):
                loader.stage_times.add_stage("transfer", time.perf_counter() - start)
        return batch
