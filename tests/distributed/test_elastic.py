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


CASES = [(2, 0, 1, 2), (4, 0, 2, 0), (2, 0, 4, 0)]
"""(ranks, workers) that save, then (ranks, workers) that resume."""
STEPS = 2


def launch(ranks, *jobs, timeout=240):
    """The script's ``jobs`` (each a tuple: mode, then its arguments) on ``ranks`` processes (torchrun for more than
    one, a plain process for one), one after another; each job's report of each rank."""
    runner = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
              if ranks > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*runner, str(SCRIPT), *(str(arg) for job in jobs for arg in job)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [[json.loads((job[1 if job[0] == "save" else 2] / f"{job[0]}{r}.json").read_text()) for r in range(ranks)]
            for job in jobs]


@pytest.fixture(scope="module")
def elastic_runs(tmp_path_factory):
    """Each case of CASES: the reports of its save and of its resume. Four launches in place of two a case (most of
    a launch's time is its processes importing torch and lightning): the two cases that save on 2 ranks share one
    save, and the 4-rank launch that resumes one of them runs the other case's save after it."""
    root = tmp_path_factory.mktemp("elastic")
    folders = {name: root / "-".join(map(str, name)) for name in [(2, 0), (4, 0), *CASES]}
    for folder in folders.values():
        folder.mkdir()
    [saved_on_2] = launch(2, ("save", folders[2, 0], 0, STEPS))
    resumed_on_4, saved_on_4 = launch(4, ("resume", folders[2, 0], folders[2, 0, 4, 0], 0),
                                      ("save", folders[4, 0], 0, STEPS))
    [resumed_on_2] = launch(2, ("resume", folders[4, 0], folders[4, 0, 2, 0], 0))
    [resumed_on_1] = launch(1, ("resume", folders[2, 0], folders[2, 0, 1, 2], 2))
    return {(2, 0, 1, 2): (saved_on_2, resumed_on_1), (4, 0, 2, 0): (saved_on_4, resumed_on_2),
            (2, 0, 4, 0): (saved_on_2, resumed_on_4)}


@pytest.mark.parametrize(("before", "workers_before", "after", "workers_after"), CASES)
def test_a_state_saved_on_some_ranks_finishes_its_epoch_on_others(elastic_runs, before, workers_before, after,
                                                                  workers_after):
    train_rows = set(row_ids(module(1, 0).train_dataloader()))  # 37 rows: 8 of the 45 are validation
    saved, resumed = elastic_runs[before, workers_before, after, workers_after]
    assert len(saved) == before and len(resumed) == after
    assert all(r["sampler"] == saved[0]["sampler"] for r in saved)  # rank 0's checkpoint is every rank's
    served = [row for r in saved for row in r["served"]]
    assert len(served) == len(set(served)) == STEPS * 8  # two global batches
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
