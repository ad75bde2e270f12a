"""Elastic resume with real processes (gloo on CPU): a state saved mid-epoch by a plain loop on W ranks is
resumed on W' ranks (1, 2 or 4, with or without workers); the rest of the epoch serves every row not served yet,
once (the pad rule repeats fewer than W' rows so that ranks stay equal), and the next epoch is a fresh W' run's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed._elastic_resume import module, row_ids
from tests.distributed._lightning_elastic import Recorder
from tests.distributed._lightning_elastic import module as lightning_module
from tests.distributed._lightning_elastic import trainer as lightning_trainer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "_elastic_resume.py"


def launch(ranks, out, *args, timeout=240):
    """The script on ``ranks`` processes (torchrun for more than one, a plain process for one); each rank's report."""
    runner = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
              if ranks > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*runner, str(SCRIPT), args[0], str(out), *map(str, args[1:])], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"{args[0]}{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize(("before", "workers_before", "after", "workers_after"),
                         [(2, 0, 1, 2), (4, 0, 2, 0), (2, 0, 4, 0)])
def test_a_state_saved_on_some_ranks_finishes_its_epoch_on_others(tmp_path, before, workers_before, after,
                                                                  workers_after):
    train_rows = set(row_ids(module(1, 0).train_dataloader()))  # 37 rows: 8 of the 45 are validation
    saved = launch(before, tmp_path, "save", workers_before, 2)
    assert all(r["sampler"] == saved[0]["sampler"] for r in saved)  # rank 0's checkpoint is every rank's
    served = [row for r in saved for row in r["served"]]
    assert len(served) == len(set(served)) == 2 * 8  # two global batches
    resumed = launch(after, tmp_path, "resume", workers_after)
    rest = [row for r in resumed for row in r["rest"]]
    assert len({len(r["rest"]) for r in resumed}) == 1  # equal counts: no rank waits for another
    assert not set(rest) & set(served)
    assert set(rest) | set(served) == train_rows
    assert len(rest) - len(set(rest)) < after  # the pad rule's repeats only
    for r in resumed:
        assert r["next"] == r["fresh_next"]  # the next epoch is what a fresh run on these ranks serves


def test_a_lightning_ddp_checkpoint_resumes_on_one_device(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed" / "_lightning_elastic.py"),
                             str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    served = [row for r in range(2) for row in json.loads((tmp_path / f"rank{r}.json").read_text())]
    assert len(served) == len(set(served)) == 16  # 2 steps of 2 ranks x 4 rows
    train_rows = set(row_ids(module(1, 0).train_dataloader()))
    resumed = Recorder()
    lightning_trainer(1, 5).fit(resumed, datamodule=lightning_module(1), ckpt_path=tmp_path / "ddp.ckpt")
    assert len(resumed.rows) == 21  # the rest of the epoch on 1 device: 3 steps of 8 rows, the last of 5
    assert not set(resumed.rows) & set(served) and set(resumed.rows) | set(served) == train_rows
