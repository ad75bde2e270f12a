"""Lightning DDP on CPU with 2 processes (gloo) over a mixture of two sources: trains 2 steps (mid-epoch), writes
<out>/ddp.ckpt, and each rank writes the row ids it trained on to <out>/rank<r>.json.
tests/distributed/test_mixture_elastic.py resumes the checkpoint on 1 device. The global batch is 8 rows: 6 of web
and 2 of code in every step."""

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

from engine import UniversalDataModule
from tests.distributed._data import SPEC
from tests.distributed._lightning_elastic import Recorder, trainer

GLOBAL_BATCH = 8
CODE = 1000
"""Row ids of the code source start here."""


class Source(Dataset):
    def __init__(self, first_id, count, token):
        self.first_id, self.count, self.token = first_id, count, token

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return {"input_ids": torch.full((1 + index % 7,), self.token), "row_id": self.first_id + index}


def module(devices):
    return UniversalDataModule({"web": Source(0, 30, 5), "code": Source(CODE, 10, 9)}, task_spec=SPEC, seed=5,
                               mix={"web": 0.75, "code": 0.25}, batch_size=GLOBAL_BATCH // devices)


if __name__ == "__main__":
    from tests.distributed._lightning_mixture import module as imported  # Source of its module, as the test has it

    out = Path(sys.argv[1])
    model, run = Recorder(), trainer(2, 2)
    run.fit(model, datamodule=imported(2))
    run.save_checkpoint(out / "ddp.ckpt")
    (out / f"rank{run.global_rank}.json").write_text(json.dumps(model.rows))
