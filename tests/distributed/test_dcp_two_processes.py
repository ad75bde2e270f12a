"""The data state in torch.distributed.checkpoint with real processes (gloo on CPU): a plain loop over a DataModule
saves with DCP on 2 ranks with a loader worker each (one leaf, the same on both, written once) and a fresh module on
1 rank without workers loads it and serves the rest of the epoch, every row once, as the uninterrupted 2-rank run
would; and 1 rank to 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from tests.distributed._dcp_resume import module, row_ids

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "_dcp_resume.py"
STEPS = 2


def launch(ranks, *job, timeout=240):
    """The script's ``job`` arguments on ``ranks`` processes (torchrun for more than one, a plain process for one)."""
    runner = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
              if ranks > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*runner, str(SCRIPT), *(str(arg) for arg in job)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def reports(folder, mode, ranks):
    return [json.loads((folder / f"{mode}{rank}.json").read_text()) for rank in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Saved on 2 ranks and resumed on 1, and saved on 1 and resumed on 2: three launches."""
    root = tmp_path_factory.mktemp("dcp")
    folders = {name: root / name for name in ("saved2", "saved1", "resumed1", "resumed2")}
    for folder in folders.values():
        folder.mkdir()
    launch(2, "save", folders["saved2"], STEPS, 1)
    launch(1, "resume", folders["saved2"], folders["resumed1"], "save", folders["saved1"], STEPS, 0)
    launch(2, "resume", folders["saved1"], folders["resumed2"])
    return folders


def test_a_state_saved_on_two_ranks_is_one_leaf_written_once(runs):
    saved = reports(runs["saved2"], "save", 2)
    assert saved[0]["leaf"] == saved[1]["leaf"] and list(saved[0]["leaf"]) == ["state"]  # rank 0's is every rank's
    metadata = dcp.FileSystemReader(runs["saved2"] / "dcp").read_metadata()
    assert list(metadata.state_dict_metadata) == ["data.state"]
    assert len({item.relative_path for item in metadata.storage_data.values()}) == 1


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_state_saved_on_some_ranks_finishes_its_epoch_on_others(runs, before, after):
    train_rows = set(row_ids(module(1).train_dataloader()))  # 37 rows: 8 of the 45 are validation
    saved = reports(runs[f"saved{before}"], "save", before)
    resumed = reports(runs[f"resumed{after}"], "resume", after)
    served = [row for r in saved for row in r["served"]]
    assert len(served) == len(set(served)) == STEPS * 8  # two global batches
    uninterrupted = {row for r in saved for row in r["rest"]}
    rest = [row for r in resumed for row in r["rest"]]
    assert len({len(r["rest"]) for r in resumed}) == 1  # equal counts: no rank waits for another
    # what the uninterrupted run serves, but the rows its pad rule repeats from the steps already served
    assert set(rest) == uninterrupted - set(served) == train_rows - set(served)
    assert len(rest) - len(set(rest)) < after  # every row once, but the pad rule's repeats (fewer than the ranks)
