"""Two real processes (gloo on CPU): train shards are disjoint, cover the data and have equal batch counts;
validation reads every row exactly once across ranks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed._data import ROWS

ROOT = Path(__file__).resolve().parents[2]
VAL_ROWS = 8
TRAIN_ROWS = ROWS - VAL_ROWS


def launch(args, out, timeout=180):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def torchrun(script, out, *args):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(ROOT / "tests" / "distributed" / script), str(out), *args]
    return launch(command, out)


LOOP_CASES = [("pad", "0"), ("drop", "2"), ("pad", "threads=1")]
STREAM_CASE = "stream:0"


@pytest.fixture(scope="module")
def torchrun_cases(tmp_path_factory):
    """Each rank's report of every case of LOOP_CASES and of STREAM_CASE: one torchrun launch runs them all, one
    after another (most of a launch's time is its processes importing torch and lightning)."""
    out = tmp_path_factory.mktemp("torchrun")
    return torchrun("_torchrun_loop.py", out, *(f"{uneven}:{mode}" for uneven, mode in LOOP_CASES), STREAM_CASE)


@pytest.mark.parametrize(("uneven", "mode"), LOOP_CASES)
def test_torchrun_loop_shards_train_and_reads_val_once(torchrun_cases, uneven, mode):
    ranks = [r["cases"][f"{uneven}:{mode}"] for r in torchrun_cases]
    assert all(r["world_size"] == 2 for r in ranks)
    assert TRAIN_ROWS % 2 == 1  # so that 'pad' repeats one row and 'drop' leaves one out
    for epoch in range(2):
        shards = [r["train"][epoch] for r in ranks]
        assert len(shards[0]) == len(shards[1])  # equal counts: no rank waits for the other
        assert len(set(shards[0])) == len(shards[0]) and len(set(shards[1])) == len(shards[1])
        overlap, union = set(shards[0]) & set(shards[1]), set(shards[0]) | set(shards[1])
        if uneven == "pad":
            assert len(overlap) == 1 and len(union) == TRAIN_ROWS
        else:
            assert not overlap and len(union) == TRAIN_ROWS - 1
    assert ranks[0]["train"][0] != ranks[0]["train"][1]  # a new order each epoch
    val = ranks[0]["val"] + ranks[1]["val"]
    assert sorted(val) == sorted(set(val)) and len(val) == VAL_ROWS
    assert ranks[0]["val_batches"] == ranks[1]["val_batches"]
    if mode.startswith("threads="):  # each rank sees the rows of num_workers=0, in the same batches and order
        for rank in ranks:
            assert {key: rank[key] for key in ("train", "val", "val_batches")} == \
                {key: rank["workers_0"][key] for key in ("train", "val", "val_batches")}


def test_lightning_ddp_with_our_samplers(tmp_path):
    ranks = launch([sys.executable, str(ROOT / "tests" / "distributed" / "_lightning_ddp.py"), str(tmp_path)],
                   tmp_path)
    for epoch in range(2):
        shards = [r["train"][epoch] for r in ranks]
        assert len(shards[0]) == len(shards[1])
        assert len(set(shards[0]) | set(shards[1])) == TRAIN_ROWS and len(set(shards[0]) & set(shards[1])) == 1
    val = ranks[0]["val"] + ranks[1]["val"]
    assert len(val) == VAL_ROWS and len(set(val)) == VAL_ROWS


def test_stream_ranks_get_equal_batch_counts_and_disjoint_rows(torchrun_cases):
    ranks = [r["cases"][STREAM_CASE] for r in torchrun_cases]
    for epoch in range(2):
        counts = [r["batches"][epoch] for r in ranks]
        shards = [r["train"][epoch] for r in ranks]
        assert counts == [5, 5]  # 21 and 20 rows: the rank with a 6th batch stops with the other
        assert not set(shards[0]) & set(shards[1])
        assert len(set(shards[0]) | set(shards[1])) == 40  # one row of the longer rank's last batch is dropped
