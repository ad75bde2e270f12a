"""A mixture of two sources trained with Lightning DDP on 2 processes, stopped mid-epoch and resumed on 1 device:
every step holds the declared shares on both topologies, and every row of the epoch is served exactly once."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.distributed._lightning_elastic import Recorder, trainer
from tests.distributed._lightning_mixture import CODE, GLOBAL_BATCH, module

ROOT = Path(__file__).resolve().parents[2]


def test_a_ddp_run_of_a_mixture_resumes_on_one_device(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed" / "_lightning_mixture.py"),
                             str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for step in range(2):  # each step: 4 rows on each rank, 6 of web and 2 of code in all
        rows = [row for served in ranks for row in served[4 * step:4 * step + 4]]
        assert sum(row >= CODE for row in rows) == 2
    served = [row for served in ranks for row in served]
    resumed = Recorder()
    trainer(1, 5).fit(resumed, datamodule=module(1), ckpt_path=tmp_path / "ddp.ckpt")  # the epoch's 5 steps
    assert len(resumed.rows) == 3 * GLOBAL_BATCH
    for step in range(3):
        assert sum(row >= CODE for row in resumed.rows[8 * step:8 * step + 8]) == 2
    assert sorted(served + resumed.rows) == list(range(30)) + list(range(CODE, CODE + 10))
