"""A sharded corpus in object storage (moto's S3 server on 127.0.0.1) trained with Lightning DDP on 2 processes,
stopped mid-epoch and resumed on 1 device: every row of the epoch is served exactly once."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.distributed._lightning_elastic import Recorder, trainer
from tests.distributed._lightning_shards import module
from tests.engine.sources.shards.shard_corpus import write_corpus

ROOT = Path(__file__).resolve().parents[2]


def test_a_ddp_run_on_s3_shards_resumes_on_one_device(tmp_path, s3_bucket):
    write_corpus(tmp_path / "corpus", files=3, rows_per_file=40, row_group_rows=16)  # 120 rows
    s3_bucket.upload_folder(tmp_path / "corpus", "corpus/")
    url = s3_bucket.url("corpus/")
    options = {key: s3_bucket.storage_options[key] for key in ("key", "secret", "client_kwargs")}  # pyarrow's client
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed" / "_lightning_shards.py"),
                             str(tmp_path), url, json.dumps(options)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    served = [row for r in range(2) for row in json.loads((tmp_path / f"rank{r}.json").read_text())]
    assert len(served) == len(set(served)) == 48  # 3 steps of 2 ranks x 8 rows
    resumed = Recorder("doc", vocab=50257)
    steps = 3 + 5  # the rest of the epoch on 1 device: 72 rows in 5 steps of 16 rows, the last of 8
    trainer(1, steps).fit(resumed, datamodule=module(1, url, options, str(tmp_path / "cache")),
                          ckpt_path=tmp_path / "ddp.ckpt")
    assert len(resumed.rows) == 72
    assert not set(resumed.rows) & set(served) and sorted(resumed.rows + served) == list(range(120))
