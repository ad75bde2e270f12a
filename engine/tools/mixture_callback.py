"""A mixture's served rows and tokens per source, in Lightning's log."""

from __future__ import annotations

from typing import Any

import torch

from engine.core.checks import check_int
from engine.core.compat import lightning
from engine.tools.report_mixture import served_summary

LOGGED = ("weight", "target_share", "rows", "row_share", "tokens", "token_share")
"""The numbers logged per source (tokens and their share only where the rows' token counts are known)."""


def mixture_metrics(summary: dict[str, Any], prefix: str) -> dict[str, float]:
    """``{prefix + source + '/' + number: value}`` of a served summary
    (:func:`~engine.tools.report_mixture.served_summary`)."""
    shown = [key for key in LOGGED if summary["tokens_known"] or not key.startswith("token")]
    return {f"{prefix}{name}/{key}": float(source[key]) for name, source in summary["sources"].items()
            for key in shown}


class MixtureCallback(lightning().Callback):
    """Logs, per source of the data module's mixture, the rows and tokens served since the start of training (all
    ranks; they go on from a checkpoint's counts after a resume), their shares, the share the weights asked for
    and the weight of the current step, as ``mixture/<source>/<number>``.

    The counts are those of the train loader's state: the batches handed to training, not those its workers
    prepared ahead. They are the same on every rank, so nothing is reduced across ranks.

    Args:
        log_every_n_steps: Log after every this many training batches; None: on the steps Lightning writes its
            logs (the trainer's ``log_every_n_steps``).
        prefix: Prefix of the logged names.

    Example:
        >>> callback = MixtureCallback(log_every_n_steps=10)  # Trainer(callbacks=[callback]).fit(model, datamodule=dm)
        >>> callback.prefix
        'mixture/'
    """

    def __init__(self, *, log_every_n_steps: int | None = None, prefix: str = "mixture/") -> None:
        if log_every_n_steps is not None:
            check_int("log_every_n_steps", log_every_n_steps, minimum=1)
        self.log_every_n_steps, self.prefix = log_every_n_steps, prefix
        self.last_logged: dict[str, float] = {}
        self._batches = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and getattr(trainer.datamodule, "mixture", None) is None:
            raise TypeError(f"MixtureCallback logs the served shares of a UniversalDataModule's mixture, but the "
                            f"trainer's datamodule is {type(trainer.datamodule).__name__} without one; pass "
                            f"datamodule=UniversalDataModule({{name: data}}, mix=...) to fit")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        if self.log_every_n_steps is None:
            due = trainer._logger_connector.should_update_logs  # Lightning's own choice of the steps it writes
        else:
            due = self._batches % self.log_every_n_steps == 0
        if due:
            self.log_now(trainer, pl_module)

    def log_now(self, trainer: Any, pl_module: Any) -> dict[str, float]:
        """Log the mixture's numbers now; returns them (also kept as ``last_logged``)."""
        summary = served_summary(trainer.datamodule.train_dataloader())
        if summary is None:
            return {}
        self.last_logged = mixture_metrics(summary, self.prefix)
        # float64: token counts pass 2**24 early in training, beyond what float32 holds exactly (MPS has no float64)
        dtype = torch.float32 if getattr(pl_module.device, "type", "cpu") == "mps" else torch.float64
        values = {name: torch.tensor(value, dtype=dtype) for name, value in self.last_logged.items()}
        pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=1)
        return self.last_logged
