"""Run under `torchrun --nproc_per_node=2`: both ranks build a module over the same raw text with a counting
tokenizer and one cache folder; each writes its split sizes and first batch to <out>/rank<r>.json."""

import json
import sys
from pathlib import Path

import datasets
import torch.distributed as dist

from engine import UniversalDataModule
from task_spec import TaskSpec
from tests.distributed._counting_tokenizer import counting_tokenizer

TEXTS = [f"the fox {i} ran over the hill to the lake " * (1 + i % 4) for i in range(60)]

if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    spec = TaskSpec.lm_tiny().replace(additional_config={"max_seq_len": 24})
    dm = UniversalDataModule(datasets.Dataset.from_dict({"text": TEXTS}), task_spec=spec, val_split=6,
                             tokenizer=counting_tokenizer(out / "counter.txt"), cache_dir=out / "cache",
                             long_rows="split", stride=4, batch_size=4, seed=1)
    batches = [batch["input_ids"].tolist() for batch in dm.train_dataloader()]
    report = {"sizes": dm.split_sizes, "batches": len(batches), "report": dm.long_rows_report["train"]}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
