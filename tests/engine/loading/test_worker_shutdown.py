"""The worker processes of a pass that a garbage collection finds in a reference cycle (a kept traceback, a
notebook's last error) are stopped at once, not after torch's wait of its status interval per worker."""

import gc

import torch
from torch.utils.data import _utils

from engine import UniversalDataModule
from task_spec import TaskSpec
from tests.engine.sources.test_bad_rows import no_hang


def test_the_workers_of_a_pass_in_a_reference_cycle_are_stopped_by_the_collection(monkeypatch):
    monkeypatch.setattr(_utils, "MP_STATUS_CHECK_INTERVAL", 600.0)  # torch joins each worker this long: a wait hangs
    data = [torch.arange(1, 2 + index % 5) for index in range(32)]
    dm = UniversalDataModule(data, task_spec=TaskSpec.lm_tiny(), batch_size=4, val_split=0, num_workers=2,
                             persistent_workers=True)
    batches = iter(dm.train_dataloader())
    next(batches)
    workers = list(batches._workers)
    cycle = {"module": dm, "batches": batches}
    cycle["itself"] = cycle
    gc.disable()
    try:
        del dm, batches, cycle
        with no_hang():
            gc.collect()
    finally:
        gc.enable()
    assert len(workers) == 2 and not any(worker.is_alive() for worker in workers)
