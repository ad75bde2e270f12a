"""Data shared by the distributed scripts: rows that carry their own id, so each rank can report what it saw."""

import torch
from torch.utils.data import Dataset

from task_spec import TaskSpec

ROWS = 45
SPEC = TaskSpec.lm_tiny().replace(special_tokens={"pad_token_id": 0}, additional_config={"vocab_size": 64})


class IdRows(Dataset):
    def __len__(self):
        return ROWS

    def __getitem__(self, index):
        return {"input_ids": torch.full((1 + index % 7,), 1 + index % 60), "row_id": index}
