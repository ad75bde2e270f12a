"""The rows a data module left out (``on_error='skip'`` or ``'warn'``), in Lightning's log."""

from __future__ import annotations

import warnings
from typing import Any

from engine.core.compat import lightning
from engine.core.skipped_rows import SkippedRow, SkipReport


def skip_reports(datamodule: Any) -> dict[str, SkipReport]:
    """``{name: report}`` of a data module: ``{"": dm.skipped}``, or one per named dataset (``dm.children``)."""
    children = getattr(datamodule, "children", None) or {}
    if children:
        return {name: child.skipped for name, child in children.items()}
    report = getattr(datamodule, "skipped", None)
    if not isinstance(report, SkipReport):
        raise TypeError(f"SkippedRowsCallback reads the rows left out from a UniversalDataModule's dm.skipped, but "
                        f"the trainer's datamodule is {type(datamodule).__name__}; pass "
                        f"datamodule=UniversalDataModule(..., on_error='skip') to fit")
    return {"": report}


class SkippedRowsCallback(lightning().Callback):
    """Logs how many rows the data module left out as ``data/skipped_rows`` (summed over ranks) at the end of each
    training and validation epoch, and warns once per epoch with the rows left out since its last warning.

    Args:
        name: The logged metric's name.

    Example:
        >>> callback = SkippedRowsCallback()  # lightning.Trainer(callbacks=[callback]).fit(model, datamodule=dm)
        >>> callback.name
        'data/skipped_rows'
    """

    def __init__(self, *, name: str = "data/skipped_rows") -> None:
        self.name = name
        self._reported: dict[str, int] = {}
        self.last_logged: float | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        skip_reports(trainer.datamodule)  # refuses a trainer without our data module now, not after an epoch

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._report(trainer, pl_module)

    def _report(self, trainer: Any, pl_module: Any) -> None:
        reports = skip_reports(trainer.datamodule)
        new: list[tuple[str, SkippedRow]] = []
        for name, report in reports.items():
            new += [(name, row) for row in report.records[self._reported.get(name, 0):]]
            self._reported[name] = len(report.records)
        self.last_logged = float(sum(report.count for report in reports.values()))
        pl_module.log(self.name, self.last_logged, on_step=False, on_epoch=True, batch_size=1, sync_dist=True,
                      reduce_fx="sum")
        if new:
            shown = "; ".join(f"{name + ': ' if name else ''}{row}" for name, row in new[:5])
            more = f" and {len(new) - 5} more" if len(new) > 5 else ""
            warnings.warn(f"{len(new)} rows were left out of their batches since the last report: {shown}{more}. "
                          f"All are listed in dm.skipped", RuntimeWarning, stacklevel=2)
