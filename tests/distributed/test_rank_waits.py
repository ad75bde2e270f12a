"""Two real processes (gloo on CPU): every rank's wait for data is gathered into one table that holds both ranks,
each row what that rank measured itself, with the imbalance (max/mean wait) in the table and the monitor's summary."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gathered_table_holds_each_ranks_own_wait(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(ROOT / "tests" / "distributed" / "_rank_waits.py"), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    own = [report["own"] for report in reports]
    assert [row[0] for row in own] == [0, 1]
    for report in reports:  # both ranks gathered the same table: one row per rank, each that rank's own numbers
        table = report["table"]
        assert [row[:5] for row in table] == [row[:5] for row in own]
        assert all(row[1] > 0 and row[2] > 0 for row in table)  # batches served and waited for, on each rank
        waits = [row[2] for row in table]
        assert report["imbalance"] == max(waits) / (sum(waits) / 2)
        assert all("wait imbalance across 2 ranks" in report[shown] for shown in ("text", "summary"))
        assert report["html"].count("<tr>") == 3  # the header and both ranks
    decode = [row[5 + 1] for row in reports[0]["table"]]  # the decode stage: only rank 1 has a transform
    assert math.isnan(decode[0]) and decode[1] > 0


def test_the_lightning_callback_gathers_both_ranks_at_the_end_of_the_epoch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "tests" / "distributed" / "_rank_waits_lightning.py"), str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["table"] == [[other["rank"], other["batches"], other["wait_s"]] for other in reports]
        assert report["imbalance"] == max(row[2] for row in report["table"]) / (
            sum(row[2] for row in report["table"]) / 2)
        assert {"data/wait_imbalance", "data/stage_fetch_ms", "data/stage_collate_ms",
                "data/stage_transfer_ms"} <= set(report["logged"])
        assert report["transfer_ms"] > 0  # each rank's copy to its device, a stage of its own
