"""Lightning DDP on CPU with 2 processes (gloo) over a sharded corpus in S3: ``<out> <url> <storage options as
JSON>`` trains 3 steps (mid-epoch), writes <out>/ddp.ckpt, and each rank writes the corpus rows it trained on to
<out>/rank<r>.json. tests/distributed/test_sharded_elastic.py resumes the checkpoint on 1 device. The global batch
is 16 rows: batch_size is 16 // devices."""

import json
import sys
from pathlib import Path

from engine import Shards, UniversalDataModule
from tests.distributed._lightning_elastic import Recorder, trainer
from tests.engine.sources.shards.shard_corpus import SPEC

GLOBAL_BATCH = 16


def module(devices, url, options, cache_dir, workers=0):
    return UniversalDataModule(Shards(url, storage_options=options, cache_dir=cache_dir, shuffle_window=64),
                               task_spec=SPEC, batch_size=GLOBAL_BATCH // devices, val_split=0, seed=5,
                               num_workers=workers)


if __name__ == "__main__":
    out, url, options = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    model, run = Recorder("doc", vocab=50257), trainer(2, 3)
    run.fit(model, datamodule=module(2, url, options, str(out / "cache")))
    run.save_checkpoint(out / "ddp.ckpt")
    (out / f"rank{run.global_rank}.json").write_text(json.dumps(model.rows))
